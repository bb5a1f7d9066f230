"""Tracking's pure parts and run records on storage: what transformers' MLflow and W&B callbacks are told, the
spec as parameters, a tracking server that does not answer, records read back (a folder and real S3), and a
concluded cluster experiment's verdict written on its parent run (a real MLflow server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rljob_contract.experiment import BestTrial, LeaderboardEntry, RLExperimentStatus, Winner
from rljob_contract.history import dump_record, record_name
from rljob_contract.pod import TRACKING_WARNING_PREFIX, validate_document
from rljob_contract.spec import TrainerConfig
from rljob_trainer import checkpoints as ck
from rljob_trainer.history import read_records, run_record, write_record
from rljob_trainer.tracking import (
    RunTracking,
    flat_spec,
    parent_run,
    probe,
    report_to,
    tracking_env,
    untracked_env,
)

from tests.support.mlflow_server import MlflowServer, mlflow_server_fixture  # noqa: F401 - registers the fixture
from tests.support.s3_server import (  # noqa: F401 - fixtures register by import
    S3_ENV,
    MotoServer,
    bucket_fixture,
    free_port,
    s3_env_fixture,
    s3_server_fixture,
)
from tests.support.trainer import REPO, trainer_env


def config(tracking: dict[str, Any] | None, **fields: Any) -> TrainerConfig:
    return validate_document(TrainerConfig, {"jobName": "grpo-a", "namespace": "team-a", "outputDir": "/tmp/out",
                                             "training": {"tracking": tracking} if tracking else {}, **fields})


def test_mlflow_and_wandb_are_told_the_spec_through_their_own_environment() -> None:
    cfg = config({"mlflow": {"trackingUri": "http://mlflow:5000"}, "wandb": {"project": "rl", "mode": "offline"}})
    env = tracking_env(cfg, {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60"})
    assert report_to(cfg) == ["tensorboard", "mlflow", "wandb"]
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert env["MLFLOW_EXPERIMENT_NAME"] == "grpo-a"  # the job's name when the spec names no experiment
    assert json.loads(env["MLFLOW_TAGS"]) == {"mlflow.runName": "grpo-a", "rljob.job": "grpo-a",
                                              "rljob.algorithm": "grpo", "rljob.namespace": "team-a"}
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in env and env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"  # theirs wins
    assert (env["WANDB_PROJECT"], env["WANDB_MODE"], env["WANDB_DIR"]) == ("rl", "offline", "/tmp/out")
    assert "WANDB_ENTITY" not in env and "WANDB_RUN_GROUP" not in env and env["WANDB_NAME"] == "grpo-a"


def test_no_tracking_reports_to_tensorboard_only_and_sets_nothing() -> None:
    cfg = config(None)
    assert report_to(cfg) == ["tensorboard"] and tracking_env(cfg, {}) == {}


def test_a_run_without_mlflow_keeps_trls_import_from_importing_it() -> None:
    skip = {"DISABLE_MLFLOW_INTEGRATION": "TRUE"}
    assert untracked_env(config(None), {}) == skip and untracked_env(config({"wandb": {"project": "rl"}}), {}) == skip
    assert untracked_env(config({"mlflow": {"experiment": "sweeps"}}), {}) == {}
    assert untracked_env(config(None), {"DISABLE_MLFLOW_INTEGRATION": "false"}) == {}  # the environment's own wins
    # What it buys: TRL's import leaves MLflow out, though it is installed (the tracked runs use it).
    import importlib.util

    probe_import = "import sys; from trl import GRPOTrainer; print('mlflow' in sys.modules)"
    seen = subprocess.run([sys.executable, "-c", probe_import], env={**os.environ, **skip}, capture_output=True,
                          text=True, timeout=300)
    assert importlib.util.find_spec("mlflow") is not None and seen.stdout.strip() == "False", seen.stderr[-2000:]


def test_a_trial_names_its_experiment_and_an_unset_uri_leaves_the_runtimes_environment() -> None:
    cfg = config({"mlflow": {"experiment": "sweeps"}, "wandb": {"project": "rl"}}, experiment="lr-sweep")
    env = tracking_env(cfg, {})
    assert "MLFLOW_TRACKING_URI" not in env  # MLFLOW_TRACKING_URI from the runtime's podTemplate env stays
    assert env["MLFLOW_EXPERIMENT_NAME"] == "sweeps"
    assert json.loads(env["MLFLOW_TAGS"])["rljob.experiment"] == "team-a/lr-sweep"
    assert env["WANDB_RUN_GROUP"] == "team-a/lr-sweep"  # W&B groups the trials


def test_the_spec_becomes_flat_parameters_by_its_api_names() -> None:
    params = flat_spec(config({"mlflow": {}}))
    assert params["spec.training.rewards.0.name"] == "repeat_char"
    assert params["spec.training.maxSteps"] == "100" and params["spec.training.learningRate"] == "1e-05"
    assert params["spec.training.tracking.mlflow"] == "{}" and params["spec.training.trl"] == "{}"  # set, empty
    assert all(len(v) <= 6000 for v in params.values())


def test_a_server_that_never_answers_is_tried_then_named() -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    why = probe(uri, attempts=2, backoff=0.0)
    assert why is not None and uri in why and "did not answer 2 tries" in why and "ConnectionError" in why
    assert probe("file:///tmp/mlruns") is None  # a local store is not probed


def test_an_integration_error_leaves_it_out_warns_the_operator_and_never_raises() -> None:
    heartbeat = SimpleNamespace(warnings=[])
    tracking = RunTracking(config({"mlflow": {}}), heartbeat)
    tracking.active["mlflow"] = True

    def broken() -> None:
        raise ConnectionError("server went away")

    assert tracking.guard("mlflow", broken) is None
    assert tracking.guard("mlflow", lambda: pytest.fail("a left-out integration is not called again")) is None
    (warning,) = heartbeat.warnings
    assert warning.startswith(TRACKING_WARNING_PREFIX + "mlflow: ConnectionError: server went away")
    assert tracking.finish({"best_checkpoint": None}) == {"runs": {}, "warnings": [warning]}


def summary(location: str) -> dict[str, Any]:
    best = {"name": "checkpoint-20", "step": 20, "location": f"{location}/checkpoint-20", "metric": "reward",
            "value": 0.75}
    return {"steps": 40, "wall_seconds": 3.0, "reward_last": 0.5, "reward_history": [[1, 0.1], [20, 0.75], [40, 0.5]],
            "eval": {"latest": {"step": 40, "eval/exact_match": 0.5}, "best": {"step": 20, "eval/exact_match": 0.8}},
            "latest_checkpoint": {**best, "name": "checkpoint-40", "step": 40}, "best_checkpoint": best,
            "checkpoints": ["checkpoint-20", "checkpoint-40"], "algorithm": {"name": "grpo"},
            "tracking": {"runs": {"mlflow_run_id": "abc"}, "warnings": []}}


def test_a_finished_runs_record_holds_final_and_best_metrics_and_checkpoint_locations(tmp_path: Path) -> None:
    location = ck.LocalLocation(tmp_path / "ckpt")
    record = run_record(config(None), summary(location.uri), started=1_796_000_000.0, stopped=False)
    assert record.final == {"reward": 0.5, "eval/exact_match": 0.5}
    assert record.best == {"reward": 0.75, "eval/exact_match": 0.8}
    assert record.best_checkpoint.location == f"{location.uri}/checkpoint-20" and record.tracking == {"mlflow_run_id": "abc"}
    (written,) = write_record(record, [location])
    assert written == str(tmp_path / "ckpt" / record_name(record))
    assert read_records(location) == ([(written, record)], [])


def test_history_skips_and_names_bad_files_and_reads_every_depth(tmp_path: Path) -> None:
    root = tmp_path / "prefix"
    good = run_record(config(None), summary("x"), started=1_796_000_000.0, stopped=True)
    write_record(good, [ck.LocalLocation(root / "team-a" / "grpo-a")])
    bad = root / "team-b" / "evil" / "runs" / "20261205T000000Z-000000000000.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({**json.loads(dump_record(good)), "steps": -1}))
    outside = tmp_path / "secret.json"
    outside.write_bytes(dump_record(good))
    (root / "team-b" / "evil" / "runs" / "20261205T000001Z-000000000000.json").symlink_to(outside)
    records, problems = read_records(ck.LocalLocation(root))
    assert [r.phase for _, r in records] == ["Stopped"]
    (problem,) = problems
    assert problem.where == str(bad) and "steps: Input should be greater than or equal to 0" in str(problem)


@pytest.mark.s3
def test_rljob_history_lists_records_on_s3_after_the_jobs_are_gone(
        s3_server: MotoServer, bucket: str, s3_env: None) -> None:
    import subprocess

    first = run_record(config(None), summary("s3://x"), started=1_796_000_000.0, stopped=False)
    second = run_record(config(None, jobName="grpo-b"), summary("s3://y"), started=1_796_000_100.0, stopped=False)
    for record, job in ((first, "grpo-a"), (second, "grpo-b")):
        write_record(record, [ck.S3Location(f"s3://{bucket}/runs-root/team-a/{job}", endpoint_url=s3_server.endpoint)])
    s3_server.client().put_object(Bucket=bucket, Key="runs-root/team-a/grpo-c/runs/20261205T000000Z-aaaaaaaaaaaa.json",
                                  Body=b'{"kind": "rljob.dev/RunRecord", "job": 1}')
    env = {**os.environ, **S3_ENV}
    result = subprocess.run([sys.executable, "-m", "rljob", "history", f"s3://{bucket}/runs-root",
                             "--endpoint-url", s3_server.endpoint, "--json"],
                            capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    runs = json.loads(result.stdout)["runs"]
    assert [(r["job"], r["best"]["reward"]) for r in runs] == [("grpo-a", 0.75), ("grpo-b", 0.75)]
    assert runs[0]["record"].startswith(f"s3://{bucket}/runs-root/team-a/grpo-a/runs/")
    assert f"skipped s3://{bucket}/runs-root/team-a/grpo-c/runs/" in result.stderr and "job: Input should be" in result.stderr
    table = subprocess.run([sys.executable, "-m", "rljob", "history", f"s3://{bucket}/runs-root", "--job", "grpo-b",
                            "--endpoint-url", s3_server.endpoint], capture_output=True, text=True, timeout=120,
                           env=env, cwd=REPO)
    assert table.returncode == 0 and "team-a/grpo-b" in table.stdout and "grpo-a" not in table.stdout
    assert datetime.fromtimestamp(1_796_000_100.0, UTC).strftime("%Y-%m-%d %H:%M:%S") in table.stdout


def test_a_run_whose_training_raised_is_ended_failed_not_finished(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    # MLflow's own SQLite store, in this process; through the environment, so no global URI outlives the test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = mlflow.start_run()
    tracking = RunTracking(config({"mlflow": {}}))
    tracking.active["mlflow"] = True
    tracking.fail()
    assert mlflow.active_run() is None
    assert mlflow.MlflowClient().get_run(run.info.run_id).info.status == "FAILED"


def concluded_experiment(phase: str = "Succeeded") -> dict[str, Any]:
    """An RLExperiment as ``kubectl get -o json`` shows it, its status as the operator writes it (camelCase)."""
    status = RLExperimentStatus(
        phase=phase, reason="TrialsFinished", trials_total=2, trials_done=2,
        leaderboard=[LeaderboardEntry(rank=1, name="fast", objective=0.9), LeaderboardEntry(rank=2, name="slow",
                                                                                             objective=0.4)],
        best=BestTrial(trial="lr-ab-fast-s0", objective=0.9, checkpoint="s3://ckpt/team-a/lr-ab-fast-s0/checkpoint-8",
                       arm="fast"),
        best_name="fast", best_objective=0.9,
        winner=Winner(arm="fast", runner_up="slow", message="arm fast is better than slow (p=0.01)"))
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment",
            "metadata": {"name": "lr-ab", "namespace": "team-a"},
            "status": status.model_dump(by_alias=True, mode="json", exclude_none=True)}


def record(server: MlflowServer, document: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m rljob_trainer.tracking record`` with the status on stdin, as a pod or a user would run it."""
    return subprocess.run([sys.executable, "-m", "rljob_trainer.tracking", "record", *args, "--status", "-"],
                          input=json.dumps(document), capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=trainer_env(MLFLOW_TRACKING_URI=server.uri))


def test_a_concluded_cluster_experiments_verdict_lands_on_the_parent_run_its_trials_share(
        tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    client = mlflow_server.client()
    parent = parent_run("lr-ab", "team-a/lr-ab")  # as the trials find it
    for trial in ("lr-ab-fast-s0", "lr-ab-slow-s0"):
        client.create_run(client.get_experiment_by_name("lr-ab").experiment_id,
                          tags={"mlflow.parentRunId": parent, "rljob.job": trial})
    for _ in range(2):  # each write is whole and a second changes nothing
        done = record(mlflow_server, concluded_experiment(), "--name", "lr-ab", "--namespace", "team-a")
        assert done.returncode == 0, done.stderr[-2000:]
        assert parent in done.stdout
    parents = [r for r in mlflow_server.runs("lr-ab") if r.data.tags.get("rljob.role") == "experiment"]
    assert [r.info.run_id for r in parents] == [parent]  # the trials' run, never a second one
    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.tags["rljob.winner"] == "fast" and "p=0.01" in run.data.tags["rljob.winner_message"]
    assert run.data.tags["rljob.best_trial"] == "lr-ab-fast-s0"
    assert run.data.tags["rljob.best_checkpoint"] == "s3://ckpt/team-a/lr-ab-fast-s0/checkpoint-8"
    assert run.data.metrics["best_objective"] == 0.9
    board = json.loads(Path(client.download_artifacts(parent, "leaderboard.json", str(tmp_path))).read_text())
    assert [e["name"] for e in board["leaderboard"]] == ["fast", "slow"] and board["winner"]["arm"] == "fast"


@pytest.mark.parametrize(("document", "args", "named"), [
    (concluded_experiment("Running"), ("--name", "lr-cd"), "status.phase"),  # no winner before the last trial
    ({"status": {**concluded_experiment()["status"], "bestObjective": "high"}}, ("--name", "lr-cd"),
     "status.bestObjective"),
    ({"status": {**concluded_experiment()["status"], "best_objective": 0.9, "winner": {"arm": 3}}},
     ("--name", "lr-cd"), "status.winner.arm"),
    (concluded_experiment(), ("--name", "lr-cd' or tags.x = 'y"), "--name"),  # no filter injection
    (["not", "a", "status"], ("--name", "lr-cd"), "status: not an object"),
])
def test_a_hostile_or_unconcluded_status_is_refused_by_name_and_writes_nothing(
        mlflow_server: MlflowServer, document: Any, args: tuple[str, ...], named: str) -> None:
    refused = record(mlflow_server, document, *args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert named in refused.stderr
    assert mlflow_server.runs("lr-cd") == []  # no experiment, no run
