"""Early stopping by the median rule over curves (pure).

The rule, as Optuna's MedianPruner and Katib's median stop define it: at a rung step r
(``earlyStopping.rungs``, or every ``interval`` steps from ``minSteps``), a trial that has
logged up to r is stopped when its objective so far — the objective of its curve cut at r —
is strictly worse than the median of the other trials' objectives cut at r. Only other trials
whose curves reached r count (running or finished, pruned ones included), and at least
``minTrials`` of them must have, so the first trials are never judged against nothing. The
trial is stopped at the first rung it has passed where enough others have too and it was worse:
what a watcher that looked at every rung in time would have decided. So the decision does not
depend on when the curves were looked at (a late poll, a heartbeat flushed after several steps, a
loaded machine), and it is a function of the curves alone: any process can make it again after a
restart.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from rljob_contract.experiment import EarlyStoppingSpec, ObjectiveSpec

from rljob_operator.experiments.objective import Curve, clean_curve, is_better, objective_value


@dataclass(frozen=True)
class PruneDecision:
    """Stop the trial: at ``step`` its objective ``value`` is worse than the others' ``median``."""

    step: int
    value: float
    median: float
    others: int

    @property
    def message(self) -> str:
        return (f"objective {self.value:.4g} at step {self.step} is worse than the median {self.median:.4g} "
                f"of {self.others} other trial(s) at that step")


def _reached(curve: Curve) -> int:
    points = clean_curve(curve)
    return points[-1][0] if points else 0


def should_prune(
    trial: str,
    curves: Mapping[str, Curve],
    objective: ObjectiveSpec,
    early_stopping: EarlyStoppingSpec | None,
    max_steps: int,
) -> PruneDecision | None:
    """Whether trial ``trial`` (a key of ``curves``, which hold every trial's curve) should stop now."""
    if early_stopping is None or trial not in curves:
        return None
    reached = _reached(curves[trial])
    others = {name: c for name, c in curves.items() if name != trial}
    # The last rung is never max_steps itself: a trial that got there has finished anyway.
    for rung in [r for r in early_stopping.rung_steps(max_steps - 1) if r <= reached]:
        theirs = [v for c in others.values() if _reached(c) >= rung
                  and (v := objective_value(c, objective, upto=rung)) is not None]
        mine = objective_value(curves[trial], objective, upto=rung)
        if len(theirs) < early_stopping.min_trials or mine is None:
            continue
        median = statistics.median(theirs)
        if is_better(median, mine, objective.direction):
            return PruneDecision(rung, mine, median, len(theirs))
    return None
