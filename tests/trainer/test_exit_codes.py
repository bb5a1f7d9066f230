"""The exit-code contract's pure parts: which rank's failure a node exits with, a rank that only lost a
peer, a CUDA out-of-memory error recognised through wrappers. A real ``rljob train`` meeting the failure:
``test_exit_codes_training.py``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rljob_contract.pod import EXIT_PEER_LOST
from rljob_trainer.errors import EXIT_CUDA_OOM, EXIT_PERMANENT, is_cuda_oom, is_peer_loss
from rljob_trainer.launch import exit_code_for, peers_lost, recorded_exit_codes
from rljob_trainer.rewards import checked_reward


def _failure(code: int, ts: int) -> SimpleNamespace:
    return SimpleNamespace(exitcode=code, timestamp=ts)


def test_exit_code_prefers_permanent_then_oom_then_first_failure() -> None:
    assert exit_code_for({0: _failure(-15, 2), 1: _failure(EXIT_PERMANENT, 3)}) == (EXIT_PERMANENT, 1)
    assert exit_code_for({0: _failure(EXIT_CUDA_OOM, 5), 1: _failure(1, 1)}) == (EXIT_CUDA_OOM, 0)
    assert exit_code_for({0: _failure(-9, 2), 1: _failure(1, 1)}) == (1, 1)
    assert exit_code_for({0: _failure(-9, 1)}) == (137, 0)
    # A forked gang's agent names one failure; the ranks' own records decide with it.
    assert exit_code_for({0: _failure(1, 1)}, {1: EXIT_CUDA_OOM}) == (EXIT_CUDA_OOM, 1)
    assert exit_code_for({0: _failure(1, 1)}, {0: 1, 1: 3}) == (1, 0)
    assert exit_code_for({1: _failure(EXIT_CUDA_OOM, 1)}, {0: EXIT_PERMANENT}) == (EXIT_PERMANENT, 0)


def test_a_rank_that_only_lost_a_peer_neither_explains_a_failure_nor_ends_an_in_place_node() -> None:
    # The node's own failure wins over its ranks that merely lost the failed one.
    assert exit_code_for({0: _failure(EXIT_PEER_LOST, 1), 1: _failure(1, 2)}) == (1, 1)
    assert exit_code_for({0: _failure(EXIT_PEER_LOST, 1)}) == (EXIT_PEER_LOST, 0)
    # The in-place agent restarts its ranks only when every failed one lost a peer (the records win).
    assert peers_lost({0: _failure(EXIT_PEER_LOST, 1), 1: _failure(EXIT_PEER_LOST, 1)}, {})
    assert not peers_lost({0: _failure(EXIT_PEER_LOST, 1), 1: _failure(-9, 1)}, {})
    assert not peers_lost({0: _failure(EXIT_PEER_LOST, 1)}, {1: EXIT_CUDA_OOM})
    assert not peers_lost({0: _failure(1, 1)}, {0: 1})
    assert not peers_lost({}, {})


def test_peer_loss_is_told_from_a_rank_s_own_failure() -> None:
    # What gloo raised here when the process at the other end of an all_reduce was SIGKILLed.
    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed "
                        "by peer [127.0.0.1]:11944. This is typically caused by a remote worker crashing.")
    assert is_peer_loss(gloo)
    try:  # wrapped on the way out of TRL or accelerate
        try:
            raise gloo
        except RuntimeError as e:
            raise ValueError("gather failed") from e
    except ValueError as wrapped:
        assert is_peer_loss(wrapped)
    import torch.distributed as dist

    assert is_peer_loss(dist.DistNetworkError("Failed to recv, got 0 bytes"))
    assert not is_peer_loss(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_loss(KeyError("reward"))


def test_ranks_exit_codes_are_read_back_from_the_error_folder(tmp_path: Path) -> None:
    (tmp_path / "rank-1.exit").write_text("200")
    (tmp_path / "rank-3.exit").write_text("78\n")
    (tmp_path / "rank-2.txt").write_text("the first error line")
    (tmp_path / "rank-x.exit").write_text("1")
    (tmp_path / "rank-4.exit").write_text("junk")
    assert recorded_exit_codes(str(tmp_path)) == {1: 200, 3: 78}


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError (matched by name, as the worker does)."""


def test_cuda_oom_is_recognised_through_wrappers_and_not_blamed_on_the_reward() -> None:
    assert is_cuda_oom(OutOfMemoryError("Tried to allocate 2.00 GiB"))
    assert is_cuda_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert not is_cuda_oom(MemoryError("host memory")) and not is_cuda_oom(RuntimeError("CUDA error: misaligned"))
    try:
        try:
            raise OutOfMemoryError("Tried to allocate 2.00 GiB")
        except OutOfMemoryError as inner:
            raise RuntimeError("generation failed") from inner
    except RuntimeError as wrapped:
        assert is_cuda_oom(wrapped)

    def oom(prompts: object, completions: object, **_: object) -> list[float]:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    # Not a RewardFunctionError (permanent, 78): the OOM itself reaches the worker, which exits 200.
    with pytest.raises(OutOfMemoryError):
        checked_reward(oom, "reward_model", {})(prompts=["p"], completions=["c"])


#: A rank whose run blocks before training (loading a model, or in ``init_process_group`` for peers that never
#: come); it says when it got there, so the test signals it then.
_BLOCKED_RANK = """
import signal, sys, time
from rljob_trainer import worker
def blocked(cfg):
    print("blocking", flush=True)
    time.sleep(60)
worker.run = blocked
sys.exit(worker._main([sys.argv[1]]))
"""

_TRAINING_RANK = """
import signal, sys
from rljob_trainer import worker
callback = worker.stop_on_signal_callback(worker.STOP)
before = signal.getsignal(signal.SIGTERM)
callback.on_train_begin(None, None, None)
print(before is signal.SIG_DFL, signal.getsignal(signal.SIGTERM) == worker.STOP._handle, flush=True)
"""


def test_a_rank_signalled_before_training_begins_ends_at_once_and_one_training_waits_for_its_step(
        tmp_path: Path) -> None:
    """A suspend that reaches worker 0's pod first stops its ranks with a checkpoint; worker 1's ranks, told a
    peer stopped, are restarted in place and block in ``init_process_group``; the SIGTERM worker 1's own pod
    then gets must end them at once, not after the agent's shutdown timeout (110 s, past the pod's grace
    period: the real node's suspend test). Once training has begun, a signal waits for the step's end."""
    from rljob_contract.job import parse_job

    from tests.support.trainer import quickstart_doc, trainer_env

    config = tmp_path / "trainer-config.json"
    config.write_text(parse_job(quickstart_doc()).trainer_config(str(tmp_path / "out")).model_dump_json(by_alias=True))
    rank = subprocess.Popen([sys.executable, "-c", _BLOCKED_RANK, str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=trainer_env())
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == b"blocking"
        sent = time.monotonic()
        rank.send_signal(signal.SIGTERM)
        code = rank.wait(timeout=30)
        assert time.monotonic() - sent < 5
    finally:
        rank.kill()
        rank.wait()
    assert code == -signal.SIGTERM  # ended by the signal itself
    training = subprocess.run([sys.executable, "-c", _TRAINING_RANK], capture_output=True, text=True,
                              env=trainer_env(), timeout=300, check=True)
    assert training.stdout.split() == ["True", "True"], training.stderr[-2000:]
