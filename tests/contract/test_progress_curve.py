"""The progress curve a job's status keeps (``decisions.curve``) and the heartbeat's metrics (contract)."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError
from rljob_contract.job import Progress
from rljob_contract.pod import MAX_HEARTBEAT_METRICS, HeartbeatBody, finite_metrics
from rljob_operator.decisions.curve import MAX_CURVE_POINTS, curve_point, decimate, merge_curve, series


def _run(steps: range, curve: list | None = None) -> list:
    curve = curve or []
    for step in steps:
        curve = merge_curve(curve, [{"step": step, "reward": step / 10}])
    return curve


def test_a_long_run_stays_bounded_and_evenly_spaced_with_the_latest_step_last() -> None:
    curve = _run(range(1, 5001))
    steps = [p["step"] for p in curve]
    assert MAX_CURVE_POINTS // 2 < len(curve) <= MAX_CURVE_POINTS
    assert steps[0] == 1 and steps[-1] == 5000 and steps == sorted(set(steps))
    gaps = {b - a for a, b in zip(steps[:-1], steps[1:-1], strict=False)}
    assert len(gaps) == 1, gaps  # evenly spaced but for the moving tail
    assert steps[-1] - steps[-2] <= gaps.pop()
    Progress.model_validate({"curve": curve})  # what the CRD's maxItems accepts


def test_only_finite_numbers_and_points_with_a_value_are_kept() -> None:
    assert curve_point(3) is None
    assert curve_point(3, reward=math.nan, loss=math.inf) is None
    assert curve_point(3, reward=1, loss=math.nan, metrics={"kl": math.inf, "x": 2}) == {
        "step": 3, "reward": 1.0, "metrics": {"x": 2.0}}
    # Junk already in a status (hand-written, older writers) is cleaned, never trusted.
    junk = [{"step": "7", "reward": 1}, {"step": -1, "reward": 1}, {"step": True, "reward": 1}, {"step": 2, "reward": 2}]
    assert merge_curve(junk, []) == [{"step": 2, "reward": 2.0}]


def test_steps_increase_a_repeated_step_merges_and_a_resume_drops_the_abandoned_points() -> None:
    curve = _run(range(1, 11))
    curve = merge_curve(curve, [{"step": 10, "loss": 0.5, "metrics": {"kl": 0.1}}])
    assert curve[-1] == {"step": 10, "reward": 1.0, "loss": 0.5, "metrics": {"kl": 0.1}}
    resumed = merge_curve(curve, [{"step": 6, "loss": 0.7}])
    assert [p["step"] for p in resumed] == [1, 2, 3, 4, 5, 6] and resumed[-1] == {"step": 6, "loss": 0.7}
    resumed = merge_curve(resumed, [{"step": 6, "reward": 0.66}])  # the same run's step: merged
    assert resumed[-1] == {"step": 6, "loss": 0.7, "reward": 0.66}
    assert series(resumed)[-2:] == [(5, 0.5), (6, 0.66)]
    assert series(curve, "kl") == [(10, 0.1)] and series(curve, "loss") == [(10, 0.5)]


def test_heartbeat_metrics_are_bounded_named_and_numbers() -> None:
    ok = HeartbeatBody.model_validate({"step": 1, "metrics": {"kl": 0.1, "rewards/accuracy/mean": 1, "a:b.c-d_e": 2}})
    assert ok.metrics == {"kl": 0.1, "rewards/accuracy/mean": 1.0, "a:b.c-d_e": 2.0}
    for bad in ({f"m{i}": 1.0 for i in range(MAX_HEARTBEAT_METRICS + 1)}, {"": 1.0}, {"a b": 1.0},
                {"x" * 65: 1.0}, {"kl": "high"}, {"kl": [1]}):
        with pytest.raises(ValidationError, match="metrics"):
            HeartbeatBody.model_validate({"step": 1, "metrics": bad})
    # An older trainer's body (no metrics) is still valid, and the wire form leaves NaN and empty maps out.
    assert HeartbeatBody.model_validate({"step": 1}).metrics is None
    assert "metrics" not in HeartbeatBody(step=1, metrics={"kl": math.nan}).wire()
    assert HeartbeatBody(step=1, metrics={"kl": 0.5, "x": math.inf}).wire()["metrics"] == {"kl": 0.5}
    wire = HeartbeatBody(step=1, reward=math.nan, loss=math.inf, best_metric=-math.inf).wire()
    assert wire["reward"] is None and wire["loss"] is None and wire["best_metric"] is None
    json.dumps(wire, allow_nan=False)  # what requests sends


def test_finite_metrics_picks_the_numbers_a_heartbeat_may_carry_from_trainer_logs() -> None:
    logs = {"loss": 0.1, "reward": 1.0, "kl": 0.01, "epoch": 1, "flag": True, "note": "x", "bad name": 1.0,
            "grad_norm": math.nan, **{f"m{i}": float(i) for i in range(40)}}
    out = finite_metrics(logs, skip=frozenset({"loss", "reward"}))
    assert list(out)[:3] == ["kl", "epoch", "m0"] and len(out) == MAX_HEARTBEAT_METRICS
    assert "flag" not in out and "note" not in out and "bad name" not in out and "grad_norm" not in out
    HeartbeatBody(step=1, metrics=out)  # always what the contract accepts
    # Over the bound, each reward function's metrics are kept before the rest.
    many = {**{f"m{i}": 1.0 for i in range(40)}, "rewards/accuracy/mean": 0.5, "rewards/accuracy/std": 0.1}
    assert list(finite_metrics(many))[:2] == ["rewards/accuracy/mean", "rewards/accuracy/std"]


def _names(prefix: str) -> list[str]:
    """MAX_HEARTBEAT_METRICS metric names of the longest length a heartbeat may carry."""
    return [f"{prefix}{i:02d}".ljust(64, "x") for i in range(MAX_HEARTBEAT_METRICS)]


def _hostile_run() -> list:
    """A run at the maxima: every point carries 32 metrics of 64-character names; the last step is
    repeated with 32 other names each time (a trainer logging other keys at one step, or resuming),
    and steps go back after a resume and forward again."""
    curve: list = []
    for step in range(1, 2 * MAX_CURVE_POINTS + 1):
        curve = merge_curve(curve, [{"step": step, "reward": 1e308, "loss": -1e308,
                                     "metrics": dict.fromkeys(_names("a"), -1.5e-308)}])
    for round_ in range(5):
        for repeat in range(3):
            names = _names(f"r{round_}{repeat}")
            curve = merge_curve(curve, [{"step": curve[-1]["step"], "metrics": dict.fromkeys(names, 2.0)}])
            assert set(curve[-1]["metrics"]) == set(names)  # the newest names win, none added beyond 32
        curve = merge_curve(curve, [{"step": curve[-1]["step"] - 7, "reward": 0.5,
                                     "metrics": dict.fromkeys(_names("b"), 1.0)}])
    return curve


def test_a_repeated_step_keeps_at_most_the_metrics_the_crd_allows() -> None:
    curve = merge_curve([{"step": 1, "metrics": {"kl": 0.1, "old": 1.0}}], [{"step": 1, "metrics": {"kl": 0.2}}])
    assert curve == [{"step": 1, "metrics": {"kl": 0.2, "old": 1.0}}]  # fewer than 32: the earlier names stay
    curve = _hostile_run()
    assert len(curve) <= MAX_CURVE_POINTS
    assert max(len(p.get("metrics", {})) for p in curve) == MAX_HEARTBEAT_METRICS
    Progress.model_validate({"curve": curve})  # the model the CRD is generated from: maxProperties, maxItems


def _evaluated_run(steps: int, every: int) -> tuple[list, list[int]]:
    """A run's curve as heartbeats build it: a point per step, an evaluation every ``every`` steps (and at 0),
    merged into the step's point; and the evaluations missing from the curve after any step."""
    curve: list = []
    missing: list[int] = []
    for step in range(0, steps + 1):
        points = [curve_point(step, metrics={"eval/accuracy": step / steps})] if step % every == 0 else []
        if step:
            points.append(curve_point(step, reward=0.1, loss=0.2))
        curve = merge_curve(curve, points)
        kept = {s for s, _ in series(curve, "eval/accuracy")}
        missing += [s for s in range(0, step + 1, every) if s not in kept]
    return curve, missing


@pytest.mark.parametrize(("steps", "every"), [(200, 20), (300, 7), (500, 10)])
def test_every_evaluation_survives_the_thinning_while_they_are_few(steps: int, every: int) -> None:
    """An eval/ objective, and the rungs pruning judges it at, need every evaluation in the curve: the
    thinning keeps them (at most 50), and the moving tail never replaces the latest one."""
    curve, missing = _evaluated_run(steps, every)
    assert missing == []
    assert [s for s, _ in series(curve, "eval/accuracy")] == list(range(0, steps + 1, every))
    assert len(curve) <= MAX_CURVE_POINTS and curve[-1]["step"] == steps
    rewards = [s for s, _ in series(curve)]  # the training curve still spans the run, as finely as the evaluations
    assert rewards[0] <= every and rewards[-1] == steps
    assert max(b - a for a, b in zip(rewards, rewards[1:], strict=False)) <= every


def test_many_evaluations_are_thinned_evenly_with_the_rest() -> None:
    curve, missing = _evaluated_run(600, 1)  # an evaluation every step: 601 of them
    steps = [p["step"] for p in curve]
    assert MAX_CURVE_POINTS // 2 < len(curve) <= MAX_CURVE_POINTS and steps[-1] == 600
    gaps = {b - a for a, b in zip(steps[:-1], steps[1:-1], strict=False)}
    assert len(gaps) == 1, gaps  # evenly spaced but for the moving tail
    assert missing  # thinned like any point


def test_thinning_drops_the_other_points_however_the_evaluations_fall() -> None:
    # An evaluation at every odd index: halving by index alone would keep everything (and never end).
    points = [{"step": i, "reward": 0.1, **({"metrics": {"eval/accuracy": 1.0}} if i % 2 else {})} for i in range(101)]
    thinned = decimate(points)
    assert len(thinned) <= MAX_CURVE_POINTS and thinned[-1]["step"] == 100
    assert [p["step"] for p in thinned if "metrics" in p] == list(range(1, 100, 2))
