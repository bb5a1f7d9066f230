"""The health signals in a real run (torchrun, CPU): the issue's DAPO setting trips maskedBatch and entropyCollapse,
in the run's output, summary.json and its heartbeats, which the status API turns into status.progress.health.

The setting is ``examples/experiments/strategies.yaml``'s DAPO arm as issue #47 ran it (builtin:first-char,
maxCompletionLength 6, so nearly every completion is truncated, and DAPO masks truncated completions out of the
loss), at its smallest that trips both on every seed tried (0, 1, 2: collapse at step 9 to 22): 2 prompts a step,
30 steps. The healthy quickstart trips none (``test_run_training.py``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rljob_contract.pod import HeartbeatBody
from rljob_operator.server.statusapi import heartbeat_progress, newly_tripped

from tests.support.trainer import run_rljob, write_manifest

pytestmark = pytest.mark.trainer

DAPO_AS_IN_THE_ISSUE = {
    "apiVersion": "rljob.dev/v1alpha1",
    "kind": "RLTrainingJob",
    "metadata": {"name": "dapo"},
    "spec": {
        "workers": {"replicas": 1, "procsPerWorker": 1},
        "training": {
            "strategy": "dapo",
            "model": "builtin:tiny",
            "dataset": {"name": "builtin:first-char", "size": 2048},
            "rewards": [{"name": "repeat_char", "kwargs": {"length": 6}}],
            "batchSize": 16,
            "numGenerations": 8,
            "stepsPerGeneration": 2,
            "maxCompletionLength": 6,
            "learningRate": 0.003,
            "maxSteps": 30,
            "seed": 0,
            "trl": {"lr_scheduler_type": "constant", "temperature": 1.0},
        },
        "checkpoint": {"everySteps": 1000, "keepLast": 1},
    },
}


def test_the_issues_dapo_setting_trips_masked_batch_and_entropy_collapse_everywhere_they_are_told(
    tmp_path: Path, receiver: Any
) -> None:
    url, received = receiver
    manifest = write_manifest(tmp_path / "dapo.yaml", DAPO_AS_IN_THE_ISSUE)
    out = tmp_path / "out"
    done = run_rljob("train", str(manifest), "--output", str(out), RLJOB_STATUS_URL=url)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr

    # The run's output: a line as each trips, and the warnings again at the end.
    tripped_lines = [line for line in output.splitlines() if line.startswith("rljob: health: ")]
    assert [line.split()[2] for line in tripped_lines][:1] == ["maskedBatch"], tripped_lines
    assert any(line.split()[2] == "entropyCollapse" for line in tripped_lines), tripped_lines
    assert "rljob: health warning: maskedBatch at step" in done.stdout
    assert "rljob: health warning: entropyCollapse at step" in done.stdout

    # summary.json: the reports, with the lines people read.
    summary = json.loads((out / "summary.json").read_text())
    health = {r["signal"]: r for r in summary["health"]}
    assert {"maskedBatch", "entropyCollapse"} <= set(health), summary["health"]
    assert health["maskedBatch"]["value"] >= 0.5 and health["maskedBatch"]["step"] <= 10
    assert health["entropyCollapse"]["threshold"] > 0 and health["entropyCollapse"]["value"] < (
        health["entropyCollapse"]["threshold"])
    assert "docs/guides/health.md" in health["entropyCollapse"]["message"]

    # The heartbeats carried them, and the status API makes them the job's status warnings.
    last = HeartbeatBody.model_validate(received[-1][0])
    assert {r.signal for r in last.health or []} >= {"maskedBatch", "entropyCollapse"}
    warnings = heartbeat_progress(last, datetime.now(UTC))["health"]
    assert {w["signal"] for w in warnings} >= {"maskedBatch", "entropyCollapse"}
    assert all(w["message"].startswith(w["signal"]) for w in warnings)
    # Each signal is told as it trips: the heartbeat of its step makes it an Event, later ones do not (a heartbeat
    # sent again after a lost answer tells the same step again, which the EventRecorder counts on one Event).
    told = {(r.signal, r.step) for body, _ in received for r in newly_tripped(HeartbeatBody.model_validate(body))}
    for signal in ("maskedBatch", "entropyCollapse"):
        assert (signal, health[signal]["step"]) in told, told
    assert len([s for s, _ in told if s == "maskedBatch"]) == 1  # it never cleared: told once


def test_an_experiment_marks_the_collapsed_dapo_arm_and_its_winner_says_so(tmp_path: Path) -> None:
    """Issue #47 point 2 for real: `rljob experiment` with the issue's DAPO arm beside GRPO (one seed each). The DAPO
    trial's metrics log says it collapsed; its leaderboard row and the winner's message say so."""
    import subprocess

    import yaml

    from tests.support.trainer import REPO, rljob_cmd, trainer_env

    template = {k: v for k, v in DAPO_AS_IN_THE_ISSUE["spec"].items()}
    template["training"] = {k: v for k, v in template["training"].items() if k != "strategy"}
    doc = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": "strategies"},
           "spec": {"template": template, "arms": [
               {"name": "grpo", "overrides": {"training": {"strategy": "grpo"}}},
               {"name": "dapo", "overrides": {"training": {"strategy": "dapo"}}}]}}
    manifest, out = tmp_path / "exp.yaml", tmp_path / "out"
    manifest.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(rljob_cmd("experiment", str(manifest), "--output", str(out)), capture_output=True,
                          text=True, timeout=900, env=trainer_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = json.loads((out / "summary.json").read_text())["status"]
    health = {t["arm"]: t.get("health", []) for t in status["trials"]}
    assert {"entropyCollapse", "maskedBatch"} <= set(health["dapo"]), health
    assert "entropyCollapse" not in health["grpo"], health
    rows = {e["name"]: e for e in status["leaderboard"]}
    assert rows["dapo"]["collapsed"] == 1 and rows["grpo"].get("collapsed", 0) == 0
    assert "of the runner-up dapo collapsed" in status["winner"]["message"] or \
        "of the winner dapo collapsed" in status["winner"]["message"], status["winner"]
    table = proc.stdout[proc.stdout.index("rank"):]
    dapo_row = next(line for line in table.splitlines() if line.split()[1:2] == ["dapo"])
    assert dapo_row.split()[-1] == "1/1", table
