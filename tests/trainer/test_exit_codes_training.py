"""The exit-code contract end to end: what a failure inside a rank makes the whole node exit with.

The operator's side (exit 200 → retry with half the per-device batch) is tested in the operator
tests; here a real ``rljob train`` (torchrun's elastic launcher, 2 ranks on CPU) meets the failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rljob_trainer.checkpoints.manifest import step_of, verify_checkpoint

from tests.support.trainer import deep_update, quickstart_doc, run_rljob, write_manifest

EXIT_CUDA_OOM = 200

# A reward that works, until rank OOM_RANK's call OOM_CALL: then a CUDA out-of-memory error as torch
# raises it (a reward model on the GPU, say). Checkpoints every 2 steps, so one is sealed before.
OOM_REWARDS = '''
import os

import torch

CALLS = 0


def oom_on_rank(prompts, completions, **kwargs):
    global CALLS
    CALLS += 1
    if os.environ.get("RANK") == os.environ["OOM_RANK"] and CALLS >= int(os.environ["OOM_CALL"]):
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)")
    return [1.0 if isinstance(c, str) and c.startswith(p[-1:]) else 0.0 for p, c in zip(prompts, completions)]
'''


@pytest.mark.trainer
def test_cuda_oom_in_a_rank_makes_the_node_exit_200(tmp_path: Path) -> None:
    (tmp_path / "rljob_oom_rewards.py").write_text(OOM_REWARDS)
    patch = {"spec": {"training": {"maxSteps": 8, "rewards": [{"name": "rljob_oom_rewards:oom_on_rank"}]},
                      "checkpoint": {"everySteps": 2}}}
    manifest = write_manifest(tmp_path / "job.yaml", deep_update(quickstart_doc(), patch))
    out = tmp_path / "out"
    termination = tmp_path / "termination-log"
    termination.write_text("")
    result = run_rljob("train", str(manifest), "--output", str(out), timeout=300,
                       PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
                       RLJOB_TERMINATION_LOG=str(termination), RLJOB_SHUTDOWN_TIMEOUT="20",
                       OOM_RANK="1", OOM_CALL="3")
    log = result.stderr[-3000:]
    assert result.returncode == EXIT_CUDA_OOM, log
    assert "node 0 failed: CUDA out of memory" in result.stderr, log
    # The termination message (what the operator reads with the exit code) names the OOM.
    message = termination.read_text()
    assert message.startswith("CUDA out of memory"), message
    assert "Tried to allocate 2.00 GiB" in message
    # Nothing half-written: every checkpoint folder is sealed and verifies; none from the failed step on.
    folders = sorted(out.glob("checkpoints/checkpoint-*"))
    assert folders, "the checkpoint before the failure was not kept"
    for folder in folders:
        assert verify_checkpoint(folder) == [], folder.name
        assert (step_of(folder.name) or 0) < 3, folder.name
