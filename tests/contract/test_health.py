"""The health signals' contract (``rljob_contract.health``): thresholds in the manifest, and what the status API
accepts of a heartbeat's health reports (a pod runs user code: hostile input) and writes into status."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError
from rljob_contract.health import ALERTS, HealthSignal, HealthSpec
from rljob_contract.job import ManifestError, parse_job
from rljob_contract.pod import HeartbeatBody
from rljob_operator.server.statusapi import HEALTH_EVENT_REASONS, heartbeat_progress, newly_tripped


def job(health: Any) -> dict[str, Any]:
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "j"},
            "spec": {"training": {"health": health}}}


def report(signal: str = "maskedBatch", **fields: Any) -> dict[str, Any]:
    return {"signal": signal, "step": 5, "last_step": 9, "active": True, "value": 0.97, "threshold": 0.5, **fields}


def test_every_signal_has_defaults_and_each_threshold_can_be_set_in_the_manifest() -> None:
    spec = parse_job(job({"entropyCollapse": {"fractionOfStart": 0.05, "window": 8, "rewardGain": 0.2},
                          "maskedBatch": {"enabled": False}, "klBlowUp": {"threshold": 0.5}})).spec.training.health
    assert (spec.entropy_collapse.fraction_of_start, spec.entropy_collapse.window,
            spec.entropy_collapse.reward_gain) == (0.05, 8, 0.2)
    assert not spec.masked_batch.enabled and spec.kl_blow_up.threshold == 0.5
    assert spec.no_learning_signal == HealthSpec().no_learning_signal  # the rest keep their defaults
    assert {s.value for s in HealthSignal} == set(HealthSpec().model_dump(by_alias=True))


@pytest.mark.parametrize("health,expected", [
    ({"entropyColapse": {}}, "spec.training.health.entropyColapse: unknown field"),
    ({"masked_batch": {}}, "spec.training.health.masked_batch: unknown field (field names are camelCase: write "
                           "'maskedBatch')"),
    ({"maskedBatch": {"fraction": 1.5}}, "spec.training.health.maskedBatch.fraction: Input should be less than or "
                                         "equal to 1"),
    ({"entropyCollapse": {"window": 0}}, "spec.training.health.entropyCollapse.window: Input should be greater "
                                         "than or equal to 1"),
    ({"gradNormSpike": {"factor": "10"}}, "spec.training.health.gradNormSpike.factor: Input should be a valid number"),
    ({"klBlowUp": None}, "spec.training.health.klBlowUp: Input should be an object"),
])
def test_bad_thresholds_are_refused_naming_the_field(health: Any, expected: str) -> None:
    with pytest.raises(ManifestError) as e:
        parse_job(job(health))
    assert any(line.startswith(expected) for line in e.value.problems), e.value.problems


def test_each_signal_has_one_alert_and_one_event_reason_named_after_it() -> None:
    assert ALERTS[HealthSignal.masked_batch] == "RLTrainingJobMaskedBatch"
    assert len(set(ALERTS.values())) == len(HealthSignal)
    assert HEALTH_EVENT_REASONS["entropyCollapse"] == "EntropyCollapse"


@pytest.mark.parametrize("health,why", [
    ([report("everythingFine")], "signal"),  # only the known signals
    ([report(value=math.nan)], "finite"),
    ([report(threshold=math.inf)], "finite"),
    ([report(step=-1)], "greater than or equal to 0"),
    ([report(step=10**13)], "less than or equal to"),
    ([report(active="yes please")], "boolean"),
    ([report(), report()], "at most one report per signal"),
    ([report(s.value) for s in HealthSignal] + [report()], "at most 5 items"),
    ({"signal": "maskedBatch"}, "list"),
])
def test_the_status_api_refuses_hostile_health_reports(health: Any, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        HeartbeatBody.model_validate({"step": 9, "health": health})


def test_health_reports_become_status_warnings_whose_messages_the_operator_writes() -> None:
    """A pod sends numbers and a known signal, never text: the message comes from the operator, bounded."""
    body = HeartbeatBody.model_validate({"step": 9, "health": [
        report("maskedBatch", step=9, message="<script>rm -rf</script>", extra="x" * 10_000),
        report("entropyCollapse", step=4, active=False, value=0.0, threshold=0.39)]})
    progress = heartbeat_progress(body, datetime(2026, 12, 5, tzinfo=UTC))
    assert progress["health"] == [
        {"signal": "maskedBatch", "step": 9, "lastStep": 9, "active": True, "value": 0.97, "threshold": 0.5,
         "message": "maskedBatch at step 9: most completions are masked out of the loss (0.97 vs 0.5, step 9); "
                    "see docs/guides/health.md"},
        {"signal": "entropyCollapse", "step": 4, "lastStep": 9, "active": False, "value": 0.0, "threshold": 0.39,
         "message": "entropyCollapse at step 4: entropy collapsed far below its start while the reward did not "
                    "rise (0 vs 0.39, step 9) (cleared since); see docs/guides/health.md"}]
    # Only the signal that tripped at this heartbeat's step becomes an Event.
    assert [r.signal for r in newly_tripped(body)] == ["maskedBatch"]


def test_a_heartbeat_without_health_leaves_the_status_warnings_alone_and_an_empty_list_clears_them() -> None:
    now = datetime(2026, 12, 5, tzinfo=UTC)
    assert "health" not in heartbeat_progress(HeartbeatBody(step=3), now)  # an older trainer
    assert heartbeat_progress(HeartbeatBody(step=3, health=[]), now)["health"] == []
    assert HeartbeatBody(step=3, health=[]).wire()["health"] == []
