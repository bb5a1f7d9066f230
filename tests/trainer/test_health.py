"""The RL health signals (``rljob_trainer.health``: logged steps in, tripped signals out), pure: no torch, no run.

The logs below have the shapes TRL logs: ``entropy`` and ``grad_norm`` every step, ``reward``,
``frac_reward_zero_std`` and ``completions/clipped_ratio`` once per generation. The real runs are in
``test_health_training.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from rljob_contract.health import HealthSignal, HealthSpec
from rljob_trainer.health import HealthMonitor, tripped_lines


def run(monitor: HealthMonitor, steps: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Feed ``steps`` (step 1, 2, ...); the signals that tripped at each step that tripped any."""
    tripped = {}
    for step, logs in enumerate(steps, start=1):
        names = [r.signal for r in monitor.observe(step, logs)]
        if names:
            tripped[step] = names
    return tripped


def dapo_step(step: int) -> dict[str, Any]:
    """The issue's DAPO run: nearly every completion truncated and masked, so more and more steps train on nothing
    (entropy and grad_norm logged as 0) while the reward stays at chance."""
    masked_all = step > 8
    return {"entropy": 0.0 if masked_all else 3.9, "grad_norm": 0.0 if masked_all else 1.0, "reward": 0.02,
            "frac_reward_zero_std": 0.4, "completions/clipped_ratio": 0.97}


def converging_step(step: int) -> dict[str, Any]:
    """The quickstart: the reward rises to 1 and the entropy falls to near 0 as the policy solves its task; at the
    end every group is rewarded alike (frac_reward_zero_std 1)."""
    progress = min(step / 40, 1.0)
    return {"entropy": 3.9 * (1 - progress) + 0.02, "grad_norm": 0.5, "reward": 0.02 + 0.98 * progress,
            "frac_reward_zero_std": 1.0 if progress == 1.0 else 0.2, "completions/clipped_ratio": 1.0}


def test_the_issues_dapo_run_trips_masked_batch_then_entropy_collapse() -> None:
    monitor = HealthMonitor(HealthSpec(), masks_truncated=True)
    tripped = run(monitor, [dapo_step(s) for s in range(1, 31)])
    assert tripped[3] == [HealthSignal.masked_batch]  # the third value's median: 3 is maskedBatch's window
    collapse = [s for s, names in tripped.items() if HealthSignal.entropy_collapse in names]
    assert collapse == [11]  # the start is steps 1-5; the median of 5 values is 0 once 3 of them are (9, 10, 11)
    assert {r.signal: r.active for r in monitor.reports()} == {HealthSignal.entropy_collapse: True,
                                                               HealthSignal.masked_batch: True}
    report = monitor.reports()[0]
    assert report.step == 11 and report.last_step == 30 and report.value == 0.0
    assert report.threshold == pytest.approx(0.39)  # 0.1 x the start, 3.9


def test_the_same_truncation_without_masking_trips_nothing() -> None:
    """GRPO trains on truncated completions: clipped_ratio 0.97 masks nothing."""
    monitor = HealthMonitor(HealthSpec(), masks_truncated=False)
    steps = [{**dapo_step(s), "entropy": 3.9, "grad_norm": 1.0} for s in range(1, 31)]
    assert run(monitor, steps) == {}
    assert monitor.inputs.masked_ratio == 0.0 and monitor.inputs.clipped_ratio == 0.97


def test_a_policy_that_solved_its_task_converges_without_tripping_collapse_or_no_learning_signal() -> None:
    monitor = HealthMonitor(HealthSpec())
    assert run(monitor, [converging_step(s) for s in range(1, 121)]) == {}


def test_entropy_collapse_without_a_reward_gain_trips() -> None:
    """The same entropy curve with the reward stuck at chance: it stopped exploring before it learned."""
    monitor = HealthMonitor(HealthSpec())
    steps = [{**converging_step(s), "reward": 0.02, "frac_reward_zero_std": 0.2} for s in range(1, 61)]
    tripped = run(monitor, steps)
    assert list(tripped.values()) == [[HealthSignal.entropy_collapse]]
    # The median of the last 5 entropies falls below 0.1 x start (3.53 at steps 1-5) near the end of the fall.
    assert 35 <= next(iter(tripped)) <= 40


def test_equal_rewards_in_every_group_without_a_reward_gain_trip_no_learning_signal() -> None:
    monitor = HealthMonitor(HealthSpec())
    steps = [{"reward": 0.0, "frac_reward_zero_std": 1.0 if s > 5 else 0.5} for s in range(1, 31)]
    assert run(monitor, steps) == {11: [HealthSignal.no_learning_signal]}  # 6 of the last 10 at step 11


def test_one_noisy_step_neither_trips_nor_clears_a_signal() -> None:
    monitor = HealthMonitor(HealthSpec(), masks_truncated=True)
    ratios = [0.1, 0.9, 0.1, 0.1, 0.9, 0.9, 0.9, 0.1, 0.9, 0.9]
    tripped = run(monitor, [{"completions/clipped_ratio": r} for r in ratios])
    assert tripped == {6: [HealthSignal.masked_batch]}  # step 2's 0.9 alone tripped nothing
    assert monitor.reports()[0].active  # step 8's 0.1 alone cleared nothing


def test_a_cleared_signal_stays_reported_inactive_and_a_new_trip_is_told_again() -> None:
    monitor = HealthMonitor(HealthSpec(masked_batch={"window": 1}), masks_truncated=True)
    tripped = run(monitor, [{"completions/clipped_ratio": r} for r in (0.9, 0.9, 0.1, 0.1, 0.8)])
    assert tripped == {1: [HealthSignal.masked_batch], 5: [HealthSignal.masked_batch]}
    monitor.observe(6, {"completions/clipped_ratio": 0.0})
    (report,) = monitor.reports()
    assert (report.step, report.last_step, report.active, report.value) == (5, 5, False, 0.8)


def test_kl_blow_up_only_with_a_reference_model() -> None:
    steps = [{"kl": 0.01}] * 5 + [{"kl": 3.0}] * 5
    assert run(HealthMonitor(HealthSpec(), uses_reference=False), steps) == {}
    assert run(HealthMonitor(HealthSpec(), uses_reference=True), steps) == {7: [HealthSignal.kl_blow_up]}


def test_a_grad_norm_spike_is_judged_against_the_median_of_earlier_non_zero_norms() -> None:
    # Steps that trained on nothing log 0: they neither make a spike out of the next norm nor count as history.
    norms = [1.0, 0.0, 1.2, 0.0, 0.0, 0.9, 5.0, 1.1, 12.0, 1.0]
    tripped = run(HealthMonitor(HealthSpec()), [{"grad_norm": n} for n in norms])
    assert tripped == {9: [HealthSignal.grad_norm_spike]}


def test_tiny_norms_jumping_by_a_large_factor_are_no_spike_below_the_minimum() -> None:
    """Measured on healthy tiny-model runs: 4.8e-6 against a median of 8.3e-7 (5.8×); here 100×."""
    norms = [1e-6] * 5 + [1e-4]
    assert run(HealthMonitor(HealthSpec()), [{"grad_norm": n} for n in norms]) == {}
    spec = HealthSpec(grad_norm_spike={"minimum": 0})
    assert run(HealthMonitor(spec), [{"grad_norm": n} for n in norms]) == {6: [HealthSignal.grad_norm_spike]}


def test_a_disabled_signal_never_trips_and_the_rest_still_do() -> None:
    spec = HealthSpec(masked_batch={"enabled": False})
    monitor = HealthMonitor(spec, masks_truncated=True)
    tripped = run(monitor, [dapo_step(s) for s in range(1, 31)])
    assert [n for names in tripped.values() for n in names] == [HealthSignal.entropy_collapse]


def test_thresholds_come_from_the_manifest() -> None:
    spec = HealthSpec.model_validate({"maskedBatch": {"fraction": 0.99, "window": 2}})
    monitor = HealthMonitor(spec, masks_truncated=True)
    assert run(monitor, [{"completions/clipped_ratio": 0.97}] * 5) == {}
    assert run(HealthMonitor(spec, masks_truncated=True), [{"completions/clipped_ratio": 1.0}] * 5) == {
        2: [HealthSignal.masked_batch]}


def test_non_finite_and_non_numeric_values_are_not_observations() -> None:
    monitor = HealthMonitor(HealthSpec(masked_batch={"window": 1}), masks_truncated=True)
    for logs in ({"completions/clipped_ratio": float("nan")}, {"completions/clipped_ratio": True},
                 {"completions/clipped_ratio": "0.9"}, {"entropy": float("inf"), "grad_norm": None}):
        assert monitor.observe(1, logs) == []
    assert monitor.reports() == [] and monitor.series.get("masked_ratio") is None


def test_the_monitor_reads_masking_and_the_reference_model_from_trls_config() -> None:
    monitor = HealthMonitor.for_args(HealthSpec(), SimpleNamespace(mask_truncated_completions=True, beta=0.04))
    assert monitor.masks_truncated and monitor.uses_reference
    plain = HealthMonitor.for_args(HealthSpec(), SimpleNamespace(beta=0.0))
    assert not plain.masks_truncated and not plain.uses_reference


def test_each_newly_tripped_signal_is_one_line_naming_it_and_the_guide() -> None:
    monitor = HealthMonitor(HealthSpec(masked_batch={"window": 1}), masks_truncated=True)
    lines: list[str] = []
    tripped_lines(monitor.observe(7, {"completions/clipped_ratio": 0.97}), lines.append)
    tripped_lines(monitor.observe(8, {"completions/clipped_ratio": 0.97}), lines.append)  # still active: silent
    assert lines == ["rljob: health: maskedBatch at step 7: most completions are masked out of the loss "
                     "(0.97 vs 0.5, step 7); see docs/guides/health.md"]


def test_a_resumed_runs_curve_is_compared_without_its_health_values() -> None:
    """The resume tests compare every logged value of a resumed run with an uninterrupted one; a resumed run starts
    its health windows afresh, so its ``health/`` values are left out of that comparison (and only those)."""
    import json
    import tempfile
    from pathlib import Path

    from rljob_contract.health import HEALTH_LOG_PREFIX

    from tests.support.trainer import HEALTH_PREFIX, logged_curve

    assert HEALTH_PREFIX == HEALTH_LOG_PREFIX
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "metrics.jsonl"
        log.write_text(json.dumps({"step": 3, "loss": 0.5, "step_time": 1.0, "health/gradNormSpike": 1.0}) + "\n")
        assert logged_curve(log) == {3: {"step": 3, "loss": 0.5}}
