"""The wrapper must not change the algorithm: rljob and a plain TRL script log the same numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trainer import REPO, deep_update, quickstart_doc, run_rljob, trainer_env, write_manifest

pytestmark = pytest.mark.trainer
STEPS = 6


def test_rljob_and_plain_trl_log_the_same_rewards_and_losses(tmp_path: Path) -> None:
    doc = deep_update(quickstart_doc(), {
        "spec": {"workers": {"procsPerWorker": 1},
                 "training": {"maxSteps": STEPS, "batchSize": 16},
                 "checkpoint": {"everySteps": 1000}},
    })
    manifest = write_manifest(tmp_path / "job.yaml", doc)
    # PYTHONSAFEPATH: the script's own folder is not put first on sys.path, where a helper module could stand
    # in for a standard library module (tests/support/operator.py, now operator_process.py, once did).
    plain = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "plain_trl_grpo.py"), str(tmp_path / "plain"),
                            str(STEPS)], capture_output=True, text=True, env=trainer_env(PYTHONSAFEPATH="1"), cwd=REPO,
                           timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    reference = json.loads((tmp_path / "plain" / "history.json").read_text())
    assert len(reference) == STEPS
    # Rewards vary across steps, so agreement is not two constant series matching by luck.
    assert len({round(r["reward"], 6) for r in reference}) > 1
    ours = run_rljob("train", str(manifest), "--output", str(tmp_path / "rljob"))
    assert ours.returncode == 0, ours.stderr[-3000:]
    summary = json.loads((tmp_path / "rljob" / "summary.json").read_text())
    rewards = dict((int(s), r) for s, r in summary["reward_history"])
    losses = dict((int(s), v) for s, v in summary["loss_history"])
    for row in reference:
        assert rewards[row["step"]] == pytest.approx(row["reward"], abs=1e-6), row
        assert losses[row["step"]] == pytest.approx(row["loss"], abs=1e-6), row
