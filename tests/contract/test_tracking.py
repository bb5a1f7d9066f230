"""spec.training.tracking: typed MLflow and W&B settings, refused in every spelling the API does not have,
never a credential; and the run record ``rljob history`` reads back, as hostile as any file on storage."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from rljob_contract.history import (
    MAX_RECORD_BYTES,
    BadRecord,
    RunRecord,
    dump_record,
    is_record_key,
    parse_record,
    record_name,
    spec_hash,
)
from rljob_contract.job import ManifestError, parse_job
from rljob_contract.pod import warning_reason
from rljob_contract.spec import TrainingSpec

from tests.support.trainer import deep_update, quickstart_doc


def job_with(tracking: Any, **training: Any) -> Any:
    return parse_job(deep_update(quickstart_doc(), {"spec": {"training": {"tracking": tracking, **training}}}))


def refusal(tracking: Any, **training: Any) -> str:
    with pytest.raises(ManifestError) as e:
        job_with(tracking, **training)
    return "\n".join(e.value.problems)


def test_tracking_takes_mlflow_and_wandb_by_their_typed_fields() -> None:
    job = job_with({"mlflow": {"trackingUri": "https://mlflow.example.com/team", "experiment": "grpo tiny"},
                    "wandb": {"project": "rl-runs", "entity": "ml-team", "mode": "offline"}})
    tracking = job.spec.training.tracking
    assert tracking.integrations() == ["mlflow", "wandb"]
    assert tracking.mlflow.tracking_uri == "https://mlflow.example.com/team" and tracking.wandb.mode == "offline"
    assert job_with({"mlflow": {}}).spec.training.tracking.mlflow.experiment is None  # the job's name, later


@pytest.mark.parametrize("tracking, path, says", [
    ({"mlflow": {"tracking_uri": "http://m"}}, "tracking.mlflow.tracking_uri", "write 'trackingUri'"),
    ({"MLflow": {}}, "tracking.MLflow", "unknown field"),
    ({"mlflow": {"trackingUri": "http://user:pw@m:5000"}}, "tracking.mlflow.trackingUri", "credentials never go"),
    ({"mlflow": {"trackingUri": "ftp://m"}}, "tracking.mlflow.trackingUri", "not an http(s)://host"),
    ({"mlflow": {"token": "s3cr3t"}}, "tracking.mlflow.token", "MLFLOW_TRACKING_TOKEN"),
    ({"wandb": {"project": "p", "apiKey": "k"}}, "tracking.wandb.apiKey", "WANDB_API_KEY"),
    ({"wandb": {"project": "p", "api_key": "k"}}, "tracking.wandb.api_key", "credentials never go"),
    ({"wandb": {"project": "p", "mode": "dryrun"}}, "tracking.wandb.mode", "'online' or 'offline'"),
    ({"wandb": {}}, "tracking.wandb.project", "Field required"),
    ({"wandb": {"project": "a/b"}}, "tracking.wandb.project", "pattern"),
    ({"mlflow": {"experiment": "x\ny"}}, "tracking.mlflow.experiment", "pattern"),
    ({"mlflow": {"experiment": 7}}, "tracking.mlflow.experiment", "valid string"),
    ({"tensorboard": {}}, "tracking.tensorboard", "unknown field"),
])
def test_tracking_refuses_spellings_credentials_and_bad_values_naming_the_field(
        tracking: dict[str, Any], path: str, says: str) -> None:
    problems = refusal(tracking)
    assert f"spec.training.{path}" in problems and says in problems


def test_report_to_under_trl_points_at_spec_training_tracking() -> None:
    problems = refusal(None, trl={"report_to": ["wandb"]})
    assert "spec.training.trl.report_to" in problems and "spec.training.tracking" in problems


def test_tracking_warnings_get_their_own_event_reason() -> None:
    assert warning_reason("tracking: mlflow: MLflow at http://m did not answer") == "TrackingUnavailable"
    assert warning_reason("checkpoint s3://b/c failed verification") == "CheckpointFallback"


def record(**changes: Any) -> RunRecord:
    now = datetime(2026, 12, 5, 6, 15, tzinfo=UTC)
    fields: dict[str, Any] = {"job": "quickstart", "namespace": "team-a", "spec_hash": spec_hash(TrainingSpec()),
                              "phase": "Succeeded", "started": now, "finished": now, "wall_seconds": 12.5,
                              "steps": 120, "algorithm": "grpo", "model": "builtin:tiny", "final": {"reward": 0.9}}
    return RunRecord(**{**fields, **changes})


def test_a_record_round_trips_and_is_named_by_its_start_and_spec() -> None:
    r = record()
    assert parse_record(dump_record(r), "x") == r
    assert record_name(r) == f"runs/20261205T061500Z-{r.spec_hash[:12]}.json"
    assert is_record_key("team-a/quickstart/" + record_name(r)) and is_record_key(record_name(r))
    assert not is_record_key("team-a/quickstart/runs/../../evil.json") and not is_record_key("checkpoint-40/x.json")
    assert spec_hash(TrainingSpec()) != spec_hash(TrainingSpec(max_steps=7))


@pytest.mark.parametrize("mutate, says", [
    (lambda d: d.update(steps="120"), "steps: Input should be a valid integer"),
    (lambda d: d.update(job="evil\x1b[31m"), "job: String should match pattern"),
    (lambda d: d.update(extra="x"), "extra: unknown field"),
    (lambda d: d.update(kind="v1/Pod"), "kind: Input should be 'rljob.dev/RunRecord'"),
    (lambda d: d.update(phase="Failed"), "phase: Input should be 'Succeeded' or 'Stopped'"),
    (lambda d: d["final"].update({"reward": "NaN"}), "final.reward"),
    (lambda d: d.update(spec_hash="../.."), "spec_hash: String should match pattern"),
    (lambda d: d.update(latest_checkpoint={"name": "c", "step": -1}), "latest_checkpoint.step"),
])
def test_a_hostile_record_is_refused_naming_the_file_and_field(mutate: Any, says: str) -> None:
    document = json.loads(dump_record(record()))
    mutate(document)
    with pytest.raises(BadRecord) as e:
        parse_record(json.dumps(document).encode(), "s3://b/team-a/x/runs/r.json")
    assert str(e.value).startswith("s3://b/team-a/x/runs/r.json: ") and says in str(e.value)


def test_an_oversized_or_unreadable_record_is_refused_without_parsing() -> None:
    with pytest.raises(BadRecord, match="more than a record's"):
        parse_record(b"{" + b" " * MAX_RECORD_BYTES + b"}", "big.json")
    with pytest.raises(BadRecord, match="Invalid JSON"):
        parse_record(b"\xff\xfe not json", "junk.json")
