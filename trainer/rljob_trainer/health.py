"""RL health signals from what TRL logs (pure: no torch, no clock): logged steps in, tripped signals out.

A run can fail while every process stays up. Each signal of ``rljob_contract.health.HealthSignal`` compares
the median of its input's last ``window`` logged values with a threshold (``spec.training.health``), so one
noisy step neither trips nor clears it:

* ``entropyCollapse``: TRL's ``entropy`` below ``fractionOfStart`` × its start (the median of its first
  ``window`` values). A step whose every completion was masked out of the loss logs entropy 0 (no token
  counted), so a mostly masked run trips it too: nothing is learned from such steps, and ``maskedBatch``
  says why.
* ``noLearningSignal``: ``frac_reward_zero_std`` (groups whose rewards are all equal, so their advantages
  are 0) at least ``fraction``.
* ``maskedBatch``: the fraction of completions masked out of the loss at least ``fraction``: TRL's
  ``completions/clipped_ratio`` when ``mask_truncated_completions`` is on (DAPO), else nothing is masked.
* ``klBlowUp``: ``kl`` above ``threshold``, only with a reference model (``beta`` > 0).
* ``gradNormSpike``: ``grad_norm`` above ``factor`` × the median of the previous ``history`` non-zero
  norms (at least 3 of them; a step that trained on nothing logs 0), and above ``minimum``.

``entropyCollapse`` and ``noLearningSignal`` hold only while the reward has not risen by ``rewardGain``
over its start: a policy that solved its task converges (low entropy, every completion rewarded alike),
and that is success. Inputs logged only on some steps (``frac_reward_zero_std`` and
``completions/clipped_ratio`` once per generation) count one value per logged value. A signal stays
reported once tripped (``active`` false once it stopped holding), so a run that collapsed and wandered
off is still marked.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rljob_contract.health import HealthReport, HealthSignal, HealthSpec

#: Fewest earlier non-zero gradient norms a spike is judged against.
MIN_GRAD_NORM_HISTORY = 3
#: Most values of one input kept (the largest window a manifest may set).
MAX_WINDOW = 1000


@dataclass
class Series:
    """One input's logged values: its start (the median of its first ``window``) and its last ``window``."""

    window: int
    first: list[float] = field(default_factory=list)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_WINDOW))

    def add(self, value: float) -> None:
        if len(self.first) < self.window:
            self.first.append(value)
        self.recent.append(value)

    @property
    def start(self) -> float | None:
        """The median of the first ``window`` values: a step that trained on nothing (entropy 0) does not lower it."""
        return statistics.median(self.first) if len(self.first) >= self.window else None

    def median(self) -> float | None:
        """The median of the last ``window`` values (None until there are that many)."""
        if len(self.recent) < self.window:
            return None
        return statistics.median(list(self.recent)[-self.window:])

    def mean(self, window: int) -> float | None:
        return statistics.fmean(list(self.recent)[-window:]) if len(self.recent) >= window else None


@dataclass
class HealthInputs:
    """The inputs of the latest logged step (None: not logged at that step), for the gauges."""

    entropy: float | None = None
    entropy_start: float | None = None
    reward_zero_std_ratio: float | None = None
    clipped_ratio: float | None = None
    masked_ratio: float | None = None
    grad_norm: float | None = None


@dataclass
class HealthMonitor:
    """The window state of every signal of one run; :meth:`observe` takes each logged step."""

    spec: HealthSpec
    masks_truncated: bool = False  # TRL's mask_truncated_completions
    uses_reference: bool = False  # beta > 0: a reference model, so kl is logged
    reports_by_signal: dict[HealthSignal, HealthReport] = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)
    inputs: HealthInputs = field(default_factory=HealthInputs)

    @classmethod
    def for_args(cls, spec: HealthSpec, args: Any) -> HealthMonitor:
        """A monitor for the TRL config ``args`` (what it masks, whether it has a reference model)."""
        return cls(spec, masks_truncated=bool(getattr(args, "mask_truncated_completions", False)),
                   uses_reference=float(getattr(args, "beta", 0.0) or 0.0) > 0)

    def observe(self, step: int, logs: Mapping[str, Any]) -> list[HealthReport]:
        """Take the logs of ``step``; the signals that trip at it (ones already active are not repeated)."""
        self.inputs = HealthInputs()
        if (reward := finite(logs.get("reward"))) is not None:
            self._series("reward", max(self.spec.entropy_collapse.window, self.spec.no_learning_signal.window)).add(
                reward)
        tripped = []
        for check in (self._entropy, self._no_learning_signal, self._masked_batch, self._kl, self._grad_norm):
            verdict = check(logs)
            if verdict is not None and (report := self._judge(step, *verdict)) is not None:
                tripped.append(report)
        return tripped

    def reports(self) -> list[HealthReport]:
        """Every signal that tripped during the run, in the order of HealthSignal."""
        return [self.reports_by_signal[s] for s in HealthSignal if s in self.reports_by_signal]

    def _series(self, name: str, window: int) -> Series:
        return self.series.setdefault(name, Series(window))

    def _judge(self, step: int, signal: HealthSignal, holds: bool, value: float, threshold: float) -> HealthReport | None:
        """Record whether ``signal`` holds at ``step``; its report when it trips here (it was not active)."""
        old = self.reports_by_signal.get(signal)
        if not holds:
            if old is not None and old.active:
                self.reports_by_signal[signal] = old.model_copy(update={"active": False})
            return None
        was_active = old is not None and old.active
        report = HealthReport(signal=signal, step=old.step if was_active and old else step, last_step=step,
                              active=True, value=value, threshold=threshold)
        self.reports_by_signal[signal] = report
        return None if was_active else report

    def _reward_rose(self, gain: float, window: int) -> bool:
        """The reward's mean over the last ``window`` values is at least ``gain`` above its start."""
        rewards = self.series.get("reward")
        start = rewards.start if rewards is not None else None
        recent = rewards.mean(window) if rewards is not None else None
        return start is not None and recent is not None and recent >= start + gain

    def _entropy(self, logs: Mapping[str, Any]) -> tuple[HealthSignal, bool, float, float] | None:
        settings = self.spec.entropy_collapse
        entropy = finite(logs.get("entropy"))
        if entropy is None or not settings.enabled:
            return None
        series = self._series("entropy", settings.window)
        series.add(entropy)
        self.inputs.entropy, self.inputs.entropy_start = entropy, series.start
        median = series.median()
        if series.start is None or median is None or len(series.recent) <= settings.window:
            return None  # still measuring the start
        bound = settings.fraction_of_start * series.start
        holds = median < bound and not self._reward_rose(settings.reward_gain, settings.window)
        return HealthSignal.entropy_collapse, holds, median, bound

    def _no_learning_signal(self, logs: Mapping[str, Any]) -> tuple[HealthSignal, bool, float, float] | None:
        settings = self.spec.no_learning_signal
        verdict = self._at_least(HealthSignal.no_learning_signal, "reward_zero_std_ratio",
                                 finite(logs.get("frac_reward_zero_std")), settings.fraction, settings.window)
        if verdict is None or not settings.enabled:
            return None
        signal, holds, value, bound = verdict
        return signal, holds and not self._reward_rose(settings.reward_gain, settings.window), value, bound

    def _masked_batch(self, logs: Mapping[str, Any]) -> tuple[HealthSignal, bool, float, float] | None:
        settings = self.spec.masked_batch
        clipped = finite(logs.get("completions/clipped_ratio"))
        self.inputs.clipped_ratio = clipped
        masked = (clipped if self.masks_truncated else 0.0) if clipped is not None else None
        verdict = self._at_least(HealthSignal.masked_batch, "masked_ratio", masked, settings.fraction, settings.window)
        return verdict if settings.enabled else None

    def _at_least(self, signal: HealthSignal, name: str, value: float | None, bound: float,
                  window: int) -> tuple[HealthSignal, bool, float, float] | None:
        """``signal`` holds when the median of input ``name``'s last ``window`` values is at least ``bound``."""
        if value is None:
            return None
        setattr(self.inputs, name, value)
        series = self._series(name, window)
        series.add(value)
        median = series.median()
        return None if median is None else (signal, median >= bound, median, bound)

    def _kl(self, logs: Mapping[str, Any]) -> tuple[HealthSignal, bool, float, float] | None:
        settings = self.spec.kl_blow_up
        kl = finite(logs.get("kl"))
        if kl is None or not self.uses_reference or not settings.enabled:
            return None
        series = self._series("kl", settings.window)
        series.add(kl)
        median = series.median()
        return None if median is None else (HealthSignal.kl_blow_up, median > settings.threshold, median,
                                            settings.threshold)

    def _grad_norm(self, logs: Mapping[str, Any]) -> tuple[HealthSignal, bool, float, float] | None:
        settings = self.spec.grad_norm_spike
        norm = finite(logs.get("grad_norm"))
        if norm is None:
            return None
        self.inputs.grad_norm = norm
        earlier = self._series("grad_norm_history", settings.history)
        recent = self._series("grad_norm", settings.window)
        recent.add(norm)
        base = statistics.median(list(earlier.recent)[-settings.history:]) if len(earlier.recent) >= \
            MIN_GRAD_NORM_HISTORY else None
        if norm > 0:
            earlier.add(norm)
        median = recent.median()
        if base is None or median is None or not settings.enabled:
            return None
        bound = max(settings.factor * base, settings.minimum)
        return HealthSignal.grad_norm_spike, median > bound, median, bound


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def tripped_lines(reports: list[HealthReport], say: Callable[[str], None]) -> None:
    """Tell people of each newly tripped signal, one line each (``rljob train``'s output, a pod's log)."""
    for report in reports:
        say(f"rljob: health: {report.message()}")
