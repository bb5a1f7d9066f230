"""An arm's mean objective ± a 95 % confidence interval over seeds, and the winner's significance (pure).

The interval is Student's t interval of the mean (``scipy.stats.t``): with n seeds and sample
standard deviation s it is mean ± t(0.975, n-1)·s/√n. The winner is compared with the runner-up
by Welch's two-sample t-test (unequal variances; ``scipy.stats.ttest_ind(equal_var=False)``),
two-sided, significant when p < 0.05. One seed gives no interval and no test: the status says
"not enough seeds" instead of inventing one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05
WELCH = "Welch's two-sample t-test (two-sided, unequal variances)"
NOT_ENOUGH_SEEDS = "not enough seeds for an interval (n=1; set seeds ≥ 2)"


@dataclass(frozen=True)
class Interval:
    """Mean of n values and its 95 % confidence interval (None with fewer than 2 values)."""

    n: int
    mean: float | None
    low: float | None = None
    high: float | None = None
    note: str | None = None


def mean_ci95(values: Sequence[float]) -> Interval:
    """The mean of ``values`` and its Student-t 95 % confidence interval."""
    from scipy import stats

    n = len(values)
    if n == 0:
        return Interval(0, None, note="no finished trial yet")
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(1, mean, note=NOT_ENOUGH_SEEDS)
    sem = statistics.stdev(values) / math.sqrt(n)
    if sem == 0:
        return Interval(n, mean, mean, mean)  # every seed gave the same value
    low, high = stats.t.interval(1 - ALPHA, n - 1, loc=mean, scale=sem)
    return Interval(n, mean, float(low), float(high))


@dataclass(frozen=True)
class Comparison:
    """Whether the best arm is significantly better than the runner-up."""

    significant: bool
    test: str
    p_value: float | None
    message: str


def compare(best: Sequence[float], runner_up: Sequence[float], best_name: str, runner_name: str) -> Comparison:
    """Welch's t-test of ``best`` against ``runner_up`` (their objectives over seeds).

    ``best`` is already the arm with the better mean (the caller ranks by direction), so a
    two-sided p < 0.05 means it is significantly better.
    """
    from scipy import stats

    if len(best) < 2 or len(runner_up) < 2:
        return Comparison(False, "none: " + NOT_ENOUGH_SEEDS, None,
                          f"{best_name} leads {runner_name}, but with fewer than 2 seeds per arm nothing is tested")
    result = stats.ttest_ind(best, runner_up, equal_var=False)
    p = float(result.pvalue)
    if math.isnan(p):
        # Both arms gave identical values on every seed: no variance to test against.
        differ = statistics.fmean(best) != statistics.fmean(runner_up)
        return Comparison(differ, WELCH + " (undefined: no variance within either arm)", None,
                          f"{best_name} beat {runner_name} on every seed by a constant margin" if differ
                          else f"{best_name} and {runner_name} are identical")
    significant = p < ALPHA
    verdict = "significantly better than" if significant else "not significantly better than"
    return Comparison(significant, WELCH, p, f"{best_name} is {verdict} {runner_name} (p={p:.3g})")
