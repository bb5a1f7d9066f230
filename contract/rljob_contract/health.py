"""RL health signals: the names, the thresholds (``spec.training.health``) and what a heartbeat reports.

A run can go wrong while every process stays up: the policy's entropy collapses, every group's
rewards are equal (no advantage, so no gradient), most completions are masked out of the loss, the KL
to the reference model blows up, or the gradient norm spikes. The trainer computes these signals from
what TRL logs (``rljob_trainer.health``); this module is what the trainer, the operator and the CLI
agree on:

* :class:`HealthSignal`: the signals' names, the same everywhere (manifest keys, ``status.progress.health``,
  the Prometheus label ``signal`` of ``rljob_trainer_health_tripped``, the alerts' names);
* :class:`HealthSpec`: the thresholds, with defaults, settable in the manifest (unknown keys refused);
* :class:`HealthReport`: one tripped signal as a heartbeat carries it; the status API bounds and
  validates it (a pod runs user code: its heartbeat is hostile input).

The guide ``docs/guides/health.md`` says what each signal means and what to do about it.
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    # The spec's settings (rljob_contract.spec.Model), which imports this module.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              use_enum_values=True)


class HealthSignal(StrEnum):
    """A health signal's name (camelCase, as manifests and status spell it)."""

    entropy_collapse = "entropyCollapse"
    no_learning_signal = "noLearningSignal"
    masked_batch = "maskedBatch"
    kl_blow_up = "klBlowUp"
    grad_norm_spike = "gradNormSpike"


#: The Prometheus alert of each signal (charts/rljob/files/alerts.yaml): ``RLTrainingJob`` + the signal's name.
ALERTS = {signal: "RLTrainingJob" + signal.value[0].upper() + signal.value[1:] for signal in HealthSignal}
#: The signals that say the policy itself collapsed: an experiment marks such a trial (and may prune it).
COLLAPSE_SIGNALS = frozenset({HealthSignal.entropy_collapse})


_WINDOW = "Logged values of the signal's input whose median is compared to its threshold (1: each value alone)."
_REWARD_GAIN = ("Not while the mean reward of the last window logged values is at least this much above its start "
                "(the median of its first values, as many as the larger window of entropyCollapse and "
                "noLearningSignal): a policy that learned its task may converge.")


class SignalSpec(_Model):
    enabled: bool = Field(True, description="Compute this signal (false: never trips).")
    window: int = Field(5, ge=1, le=1000, description=_WINDOW)


class EntropyCollapseSpec(SignalSpec):
    """The policy's entropy fell far below its start while the reward did not rise: it stopped exploring
    before it learned (or its batches were masked out of the loss, which logs entropy 0)."""

    fraction_of_start: float = Field(
        0.1, gt=0, lt=1,
        description="Trips when the median entropy of the last window steps is below this fraction of its start "
                    "(the median of the first window).")
    reward_gain: float = Field(0.1, ge=0, description=_REWARD_GAIN)


class NoLearningSignalSpec(SignalSpec):
    """Nearly every group's rewards are equal (TRL's frac_reward_zero_std) while the reward did not rise:
    no advantage, so no gradient."""

    fraction: float = Field(
        0.9, gt=0, le=1,
        description="Trips when the median fraction of groups whose rewards are all equal is at least this.")
    window: int = Field(10, ge=1, le=1000, description=_WINDOW)
    reward_gain: float = Field(0.1, ge=0, description=_REWARD_GAIN)


class MaskedBatchSpec(SignalSpec):
    """Most completions are left out of the loss (truncated ones with mask_truncated_completions)."""

    fraction: float = Field(
        0.5, gt=0, le=1,
        description="Trips when the median fraction of a step's completions masked out of the loss is at least this.")
    window: int = Field(3, ge=1, le=1000, description=_WINDOW)


class KlBlowUpSpec(SignalSpec):
    """The KL divergence to the reference model (beta > 0) grows past a bound."""

    threshold: float = Field(
        1.0, gt=0, description="Trips when the median logged kl is above this (only with beta > 0).")
    window: int = Field(3, ge=1, le=1000, description=_WINDOW)


class GradNormSpikeSpec(SignalSpec):
    """The gradient norm jumps far above its recent level."""

    factor: float = Field(
        10.0, gt=1,
        description="Trips when grad_norm exceeds this many times the median of the previous history non-zero norms.")
    history: int = Field(20, ge=3, le=1000, description="Logged steps whose median grad_norm a step is compared to.")
    minimum: float = Field(
        1.0, ge=0,
        description=("A grad_norm at or below this is never a spike, however far above the median: tiny norms "
                     "jump by large factors (4.8e-6 against a median of 8.3e-7 was measured on a healthy run), "
                     "and TRL's default max_grad_norm, 1.0, leaves a step under it unclipped."))
    window: int = Field(1, ge=1, le=1000, description=_WINDOW)


class HealthSpec(_Model):
    """Thresholds of the health signals (``docs/guides/health.md``): each has a default and can be turned off."""

    entropy_collapse: EntropyCollapseSpec = Field(default_factory=EntropyCollapseSpec,
                                                  description=EntropyCollapseSpec.__doc__)
    no_learning_signal: NoLearningSignalSpec = Field(default_factory=NoLearningSignalSpec,
                                                     description=NoLearningSignalSpec.__doc__)
    masked_batch: MaskedBatchSpec = Field(default_factory=MaskedBatchSpec, description=MaskedBatchSpec.__doc__)
    kl_blow_up: KlBlowUpSpec = Field(default_factory=KlBlowUpSpec, description=KlBlowUpSpec.__doc__)
    grad_norm_spike: GradNormSpikeSpec = Field(default_factory=GradNormSpikeSpec, description=GradNormSpikeSpec.__doc__)

    def of(self, signal: HealthSignal | str) -> SignalSpec:
        """The settings of ``signal``."""
        return {
            HealthSignal.entropy_collapse: self.entropy_collapse,
            HealthSignal.no_learning_signal: self.no_learning_signal,
            HealthSignal.masked_batch: self.masked_batch,
            HealthSignal.kl_blow_up: self.kl_blow_up,
            HealthSignal.grad_norm_spike: self.grad_norm_spike,
        }[HealthSignal(signal)]


class HealthReport(BaseModel):
    """One signal that tripped during the run, as rank 0's heartbeat carries it (``HeartbeatBody.health``).

    Every field is bounded: the status API writes these into the job's status, and a pod runs user code.
    Unknown fields are ignored (a newer trainer talks to an older operator).
    """

    model_config = ConfigDict(extra="ignore", use_enum_values=True)

    signal: HealthSignal = Field(..., description="Which signal.")
    step: int = Field(..., ge=0, le=10**12, description="The step at which it tripped (this time).")
    last_step: int = Field(..., ge=0, le=10**12, description="The last step at which it held.")
    active: bool = Field(..., description="It holds at the latest logged step (false: it tripped and cleared).")
    value: float = Field(..., description="The value that tripped it (at last_step).")
    threshold: float = Field(..., description="The bound it crossed.")

    @field_validator("value", "threshold")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    def message(self) -> str:
        """One line for people (status, Events, ``rljob train``'s output): what tripped and where to read more."""
        state = "" if self.active else " (cleared since)"
        return (f"{self.signal} at step {self.step}: {DESCRIBE[HealthSignal(self.signal)]} "
                f"({self.value:.4g} vs {self.threshold:.4g}, step {self.last_step}){state}; "
                "see docs/guides/health.md")


#: What a tripped signal means, in words (``HealthReport.message``).
DESCRIBE = {
    HealthSignal.entropy_collapse: "entropy collapsed far below its start while the reward did not rise",
    HealthSignal.no_learning_signal: "nearly every group's rewards are equal while the reward did not rise: "
                                     "no advantage to learn from",
    HealthSignal.masked_batch: "most completions are masked out of the loss",
    HealthSignal.kl_blow_up: "KL to the reference model blew up",
    HealthSignal.grad_norm_spike: "gradient norm spiked far above its recent median",
}
#: What the metrics log's health values start with (``contract.METRICS_LOG``): ``health/entropyCollapse`` is 1
#: while the signal holds and 0 once it cleared; a signal that never tripped is not in the record.
HEALTH_LOG_PREFIX = "health/"
#: Most health reports one heartbeat (and status.progress.health) may carry: one per signal.
MAX_HEALTH_REPORTS = len(HealthSignal)
