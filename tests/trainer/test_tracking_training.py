"""Tracking for real: ``rljob train`` and ``rljob experiment`` logging to an MLflow server on loopback (SQLite
behind it) and to W&B's offline run files, and a tracking server that is down, which never fails training.

Runs are short (the tiny model, a few steps): what is checked is what reaches the server, not learning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.mlflow_server import MlflowServer, mlflow_server_fixture  # noqa: F401 - registers the fixture
from tests.support.s3_server import free_port
from tests.support.trainer import REPO, rljob_cmd, run_rljob, trainer_env, write_manifest

pytestmark = pytest.mark.trainer

STEPS = 4
TRAINING: dict[str, Any] = {
    "model": "builtin:tiny",
    "dataset": {"name": "builtin:repeat-char", "size": 128},
    "rewards": [{"name": "repeat_char", "kwargs": {"length": 6}}],
    "batchSize": 8, "numGenerations": 4, "maxCompletionLength": 6, "learningRate": 0.01, "maxSteps": STEPS,
    "evaluation": {"heldOutFraction": 0.1, "everySteps": 2, "maxPrompts": 4},
    "trl": {"lr_scheduler_type": "constant"},
}


def job(name: str, tracking: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": name},
            "spec": {"workers": {"replicas": 1, "procsPerWorker": 1}, "training": {**TRAINING, "tracking": tracking},
                     "checkpoint": {"everySteps": 2, "keepLast": 2, "keepBest": 1}}}


def train(tmp_path: Path, doc: dict[str, Any], **env: str) -> dict[str, Any]:
    out = tmp_path / "out"
    result = run_rljob("train", str(write_manifest(tmp_path / "job.yaml", doc)), "--output", str(out), **env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_a_local_run_lands_in_mlflow_and_wandb_files_and_leaves_a_record_rljob_history_lists(
        tmp_path: Path, mlflow_server: MlflowServer) -> None:
    summary = train(tmp_path, job("tracked", {"mlflow": {"trackingUri": mlflow_server.uri, "experiment": "local"},
                                              "wandb": {"project": "rljob-tests", "mode": "offline"}}))
    (run,) = mlflow_server.runs("local")
    client = mlflow_server.client()
    assert run.info.status == "FINISHED" and summary["tracking"]["warnings"] == []
    assert summary["tracking"]["runs"]["mlflow_run_id"] == run.info.run_id
    params, tags = run.data.params, run.data.tags
    assert params["spec.training.maxSteps"] == str(STEPS) and params["spec.training.rewards.0.name"] == "repeat_char"
    assert params["spec.training.evaluation.everySteps"] == "2" and params["learning_rate"] == "0.01"  # TRL's too
    assert {"rljob.version", "rljob.trl_version", "rljob.torch_version", "rljob.transformers_version"} <= set(tags)
    assert tags["rljob.job"] == "tracked" and tags["rljob.best_checkpoint"] == summary["best_checkpoint"]["location"]
    assert run.info.run_name == "tracked"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward")] == list(range(1, STEPS + 1))
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/repeat_char")] == [0, 2, 4]
    assert {"summary.json", "reward_curve.png"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert not any(a.path.startswith("checkpoint") for a in client.list_artifacts(run.info.run_id))  # no weights
    (wandb_run,) = (tmp_path / "out" / "wandb").glob("offline-run-*")
    (events,) = wandb_run.glob("run-*.wandb")
    assert summary["tracking"]["runs"]["wandb_run_id"] in wandb_run.name
    assert b"eval/repeat_char" in events.read_bytes() and b"spec.training.maxSteps" in events.read_bytes()
    listed = run_rljob("history", str(tmp_path / "out" / "checkpoints"), "--json")
    assert listed.returncode == 0, listed.stderr
    (record,) = json.loads(listed.stdout)["runs"]
    assert (record["job"], record["phase"], record["steps"]) == ("tracked", "Succeeded", STEPS)
    assert record["tracking"]["mlflow_run_id"] == run.info.run_id
    assert record["best_checkpoint"]["location"] == summary["best_checkpoint"]["location"]
    assert record["final"]["eval/repeat_char"] == summary["eval"]["latest"]["eval/repeat_char"]


def test_a_tracking_server_that_is_down_is_retried_warned_about_and_the_run_finishes(
        tmp_path: Path, receiver: Any) -> None:
    url, received = receiver
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    summary = train(tmp_path, job("untracked", {"mlflow": {"trackingUri": down}}), RLJOB_STATUS_URL=url)
    assert summary["steps"] == STEPS
    (warning,) = summary["tracking"]["warnings"]
    assert warning.startswith(f"tracking: mlflow: MLflow at {down} did not answer 3 tries")
    assert summary["tracking"]["runs"] == {}
    sent = [w for body, _ in received for w in body.get("warnings", [])]
    assert warning in sent  # the operator makes it a TrackingUnavailable Warning Event on the job
    assert (tmp_path / "out" / "checkpoints" / "runs").is_dir()  # the record does not need the server


def test_an_experiments_trials_are_child_runs_and_its_run_holds_the_leaderboard_and_winner(
        tmp_path: Path, mlflow_server: MlflowServer) -> None:
    template = job("x", {"mlflow": {"trackingUri": mlflow_server.uri}})["spec"]
    template["training"].pop("evaluation")
    doc = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": "lr-ab"},
           "spec": {"template": template, "seeds": 1, "objective": {"k": 2},
                    "arms": [{"name": "slow", "overrides": {"training": {"learningRate": 1e-5}}},
                             {"name": "fast", "overrides": {"training": {"learningRate": 0.01}}}]}}
    manifest, out = tmp_path / "exp.yaml", tmp_path / "out"
    manifest.write_text(yaml.safe_dump(doc))
    import subprocess

    proc = subprocess.run(rljob_cmd("experiment", str(manifest), "--output", str(out), "--parallel", "1"),
                          capture_output=True, text=True, timeout=1200, env=trainer_env(), cwd=REPO)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    status = json.loads((out / "summary.json").read_text())["status"]
    runs = mlflow_server.runs("lr-ab")  # the trials' MLflow experiment is the RLExperiment's name
    (parent,) = [r for r in runs if r.data.tags.get("rljob.role") == "experiment"]
    trials = {r.data.tags["rljob.job"]: r for r in runs if r is not parent}
    assert set(trials) == {"lr-ab-slow-s0", "lr-ab-fast-s0"}
    assert {r.data.tags["mlflow.parentRunId"] for r in trials.values()} == {parent.info.run_id}
    assert {r.data.params["spec.training.learningRate"] for r in trials.values()} == {"1e-05", "0.01"}
    assert parent.info.status == ("FINISHED" if status["phase"] == "Succeeded" else "FAILED")
    board = mlflow_server.client().download_artifacts(parent.info.run_id, "leaderboard.json", str(tmp_path))
    leaderboard = json.loads(Path(board).read_text())["leaderboard"]
    assert [e["name"] for e in leaderboard] == [e["name"] for e in status["leaderboard"]]
    assert parent.data.tags["rljob.best_trial"] == status["best"]["trial"]
    assert parent.data.tags.get("rljob.winner") == (status.get("winner") or {}).get("arm")
