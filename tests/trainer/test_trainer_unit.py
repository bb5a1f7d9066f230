"""Pure pieces of the trainer: checkpoints, rewards, exit codes, config and error messages."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from rljob_contract.job import API_VERSION, KIND, ManifestError, parse_job
from rljob_contract.pod import EXIT_PEER_LOST
from rljob_contract.spec import RewardSpec
from rljob_trainer import checkpoints as ck
from rljob_trainer.builtin import rewards as builtin
from rljob_trainer.errors import EXIT_CUDA_OOM, EXIT_PERMANENT, PermanentError, is_cuda_oom, is_peer_loss
from rljob_trainer.launch import (
    NodeSettings,
    bounded_worker_shutdown,
    build_launch_config,
    exit_code_for,
    peers_lost,
    rank_start_method,
    recorded_exit_codes,
)
from rljob_trainer.rewards import RewardFunctionError, checked_reward, resolve_rewards


def make_checkpoint(root: Path, step: int, reward: float | None = None, seal: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(bytes([step % 256]) * 1000)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if seal:
        ck.seal_checkpoint(d, step, {"reward": reward} if reward is not None else {})
    return d


def test_sealed_checkpoint_verifies_and_moves_latest(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    assert (tmp_path / ck.LATEST).read_text().strip() == "checkpoint-20"
    assert ck.verify_checkpoint(tmp_path / "checkpoint-20") == []
    manifest = json.loads((tmp_path / "checkpoint-20" / ck.MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "trainer_state.json"}


def test_unsealed_checkpoint_is_ignored_by_resume(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20, seal=False)
    assert [c.name for c in ck.complete_checkpoints(tmp_path)] == ["checkpoint-10"]
    assert ck.find_resume_checkpoint(tmp_path) == tmp_path / "checkpoint-10"


def test_corrupt_checkpoint_falls_back_to_previous_complete_one(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    newest = make_checkpoint(tmp_path, 20)
    (newest / "model.safetensors").write_bytes(b"\x00" * 1000)  # same size, other bytes
    assert "md5 mismatch" in ck.verify_checkpoint(newest)[0]
    assert ck.find_resume_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
    (tmp_path / "checkpoint-10" / "trainer_state.json").unlink()
    assert ck.find_resume_checkpoint(tmp_path) is None


def test_retention_keeps_last_best_newest_and_protected(tmp_path: Path) -> None:
    for step, reward in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3), (50, 0.4)]:
        make_checkpoint(tmp_path, step, reward)
    make_checkpoint(tmp_path, 5, seal=False)   # crash debris older than the newest: removed
    make_checkpoint(tmp_path, 60, seal=False)  # may still be being written: kept
    deleted, after = ck.LocalLocation(tmp_path).apply_retention(ck.RetentionPolicy(keep_last=2, keep_best=1),
                                                                protect={"checkpoint-20"})
    assert sorted(deleted) == ["checkpoint-30", "checkpoint-5"]
    remaining = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert remaining == ["checkpoint-10", "checkpoint-20", "checkpoint-40", "checkpoint-50", "checkpoint-60"]
    assert [c.name for c in after.complete] == ["checkpoint-10", "checkpoint-20", "checkpoint-40", "checkpoint-50"]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (manifests and ``latest`` included)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_prune_dry_run_deletes_nothing_and_names_what_prune_then_deletes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rljob import cli

    for step, reward in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3)]:
        make_checkpoint(tmp_path, step, reward)
    make_checkpoint(tmp_path, 5, seal=False)  # crash debris: pruned too
    before = tree(tmp_path)
    args = ["checkpoints", "prune", str(tmp_path), "--keep-last", "1", "--keep-best", "1"]
    assert cli.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    would = [line.split()[-1] for line in out.splitlines() if line.startswith("would delete")]
    assert would == [str(tmp_path / n) for n in ("checkpoint-5", "checkpoint-20", "checkpoint-30")]
    assert f"kept 2 complete checkpoint(s) at {tmp_path}" in out
    assert tree(tmp_path) == before  # not one file deleted or rewritten
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("deleting")] == would
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-40"]


def test_local_primary_and_a_mirror_folder_share_the_publisher_and_its_retention(tmp_path: Path) -> None:
    from rljob_trainer.checkpoints.publisher import CheckpointPublisher

    primary, mirror = ck.LocalLocation(tmp_path / "pvc"), ck.LocalLocation(tmp_path / "mirror")
    heartbeat = SimpleNamespace(checkpoint=None, best_checkpoint=None, best_metric=None)
    pub = CheckpointPublisher(primary, [mirror], ck.RetentionPolicy(keep_last=2, keep_best=1),
                              transfer=ck.TransferSettings(), folder_is_primary=True, retries=0, heartbeat=heartbeat)
    for step, reward in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3), (50, 0.4)]:
        d = make_checkpoint(primary.root, step, seal=False)
        pub.save(d, step, {"reward": reward})
        # Sealed in place before save returns: a complete checkpoint the moment training goes on.
        assert (primary.root / ck.LATEST).read_text() == f"checkpoint-{step}\n" and ck.verify_checkpoint(d) == []
        assert heartbeat.checkpoint == f"checkpoint-{step}" and heartbeat.best_checkpoint == "checkpoint-10"
    assert pub.close(timeout=60) and pub.failures == 0
    # Retention at the primary keeps what was still being copied, so finish with one more prune pass.
    primary.apply_retention(pub.policy)
    expected = ["checkpoint-10", "checkpoint-40", "checkpoint-50"]
    assert [c.name for c in primary.listing().complete] == expected
    assert [c.name for c in mirror.listing().complete] == expected and mirror.listing().latest == "checkpoint-50"
    fields = pub.summary_fields()
    assert fields["checkpoints"] == expected and fields["checkpoint_upload_failures"] == 0
    assert fields["best_checkpoint"]["location"] == str(primary.root / "checkpoint-10")


def test_retention_never_deletes_the_newest_complete_checkpoint() -> None:
    infos = [ck.CheckpointInfo(f"checkpoint-{s}", s, {"reward": 1.0 - s / 100}) for s in (1, 2, 3)]
    keep = ck.retention_keep(infos, keep_last=0, keep_best=1)
    assert "checkpoint-3" in keep and "checkpoint-1" in keep


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


NODE = NodeSettings(nnodes=2, nproc_per_node=4, node_rank=1, rdzv_endpoint="w0:29500", run_id="job-g3")


@dataclasses.dataclass
class LaunchConfigWithoutShutdown:  # torch <= 2.11: LaunchConfig has no shutdown_timeout
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    run_id: str = ""
    rdzv_backend: str = "etcd"
    rdzv_endpoint: str = ""
    rdzv_configs: dict = dataclasses.field(default_factory=dict)
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"


@dataclasses.dataclass
class LaunchConfigWithShutdown(LaunchConfigWithoutShutdown):  # torch >= 2.12 (pytorch#172596)
    shutdown_timeout: int | None = None


def test_launch_config_passes_shutdown_timeout_only_where_launch_config_has_it() -> None:
    old, patch_needed = build_launch_config(LaunchConfigWithoutShutdown, NODE, 110)
    assert patch_needed and not hasattr(old, "shutdown_timeout")
    new, patch_needed = build_launch_config(LaunchConfigWithShutdown, NODE, 110)
    assert not patch_needed and new.shutdown_timeout == 110
    for cfg in (old, new):
        assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_per_node, cfg.run_id) == (2, 2, 4, "job-g3")
        assert cfg.rdzv_configs == {"timeout": 900, "is_host": False} and cfg.max_restarts == 0
    from torch.distributed.launcher.api import LaunchConfig  # the installed torch, whichever it is

    cfg, patch_needed = build_launch_config(LaunchConfig, NODE, 110)
    assert patch_needed == (not hasattr(cfg, "shutdown_timeout"))
    assert getattr(cfg, "shutdown_timeout", 110) == 110


def test_ranks_are_forked_from_a_fork_server_only_on_a_node_without_a_gpu(tmp_path: Path) -> None:
    gpu = tmp_path / "nvidia0"
    none = (str(tmp_path / "absent"),)
    assert rank_start_method({}, none) == "forkserver"
    assert rank_start_method({"RLJOB_RANK_START": "auto"}, none) == "forkserver"
    gpu.touch()
    assert rank_start_method({}, (*none, str(gpu))) == "spawn"  # CUDA must not be touched before a fork
    assert rank_start_method({"RLJOB_RANK_START": "spawn"}, none) == "spawn"
    assert rank_start_method({"RLJOB_RANK_START": "forkserver"}, (str(gpu),)) == "forkserver"
    with pytest.raises(PermanentError, match=r"RLJOB_RANK_START: unknown value 'fork'"):
        rank_start_method({"RLJOB_RANK_START": "fork"}, none)
    for method in ("spawn", "forkserver"):
        assert build_launch_config(LaunchConfigWithoutShutdown, NODE, 110, method)[0].start_method == method


STOP_WHILE_IMPORTING = """
import multiprocessing, multiprocessing.forkserver, os, sys, time
import psutil
from rljob_trainer.launch import stop_fork_server
multiprocessing.set_forkserver_preload(["rljob_slow_preload"])
multiprocessing.forkserver.ensure_running()
server = psutil.Process(multiprocessing.forkserver._forkserver._forkserver_pid)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
stop_fork_server()
print(server.is_running())
"""


def test_a_fork_server_still_importing_is_stopped_at_once(tmp_path: Path) -> None:
    """A pre-flight that fails must not wait for the server's imports (8 s of TRL here) to finish.

    In a process of its own, as the launcher; the server finds its preload through ``PYTHONPATH`` (it
    is a new interpreter, and before Python 3.12 it ignores the sys.path it is handed)."""
    import os
    import subprocess
    import sys

    importing, done = tmp_path / "importing", tmp_path / "imported"
    (tmp_path / "rljob_slow_preload.py").write_text(
        f"import time\nopen({str(importing)!r}, 'w').close()\ntime.sleep(60)\nopen({str(done)!r}, 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", STOP_WHILE_IMPORTING, str(importing)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert importing.exists()  # the server was importing its preload when it was stopped
    assert proc.stdout.strip() == "False"  # it is gone
    assert not done.exists()  # stopped during its imports, not after them


def test_without_the_field_the_agents_stop_waits_the_shutdown_timeout() -> None:
    calls: list[tuple[object, object]] = []

    class PContext:  # the agent of torch <= 2.11 calls close(death_sig), taking the 30 s default
        def close(self, death_sig: object = None, timeout: float = 30) -> None:
            calls.append((death_sig, timeout))

    with bounded_worker_shutdown(110, PContext) as applied:
        assert applied
        PContext().close(signal.SIGTERM)
        PContext().close()
        PContext().close(signal.SIGKILL, 5)  # an explicit timeout is kept
    PContext().close(signal.SIGTERM)  # restored afterwards
    assert calls == [(signal.SIGTERM, 110), (None, 110), (signal.SIGKILL, 5), (signal.SIGTERM, 30)]

    class NoTimeout:
        def close(self, death_sig: object = None) -> None: ...

    with bounded_worker_shutdown(110, NoTimeout) as applied:
        assert not applied
    from torch.distributed.elastic.multiprocessing.api import PContext as TorchPContext

    original = TorchPContext.__dict__["close"]
    with bounded_worker_shutdown(110) as applied:  # the installed torch's PContext has the parameter
        assert applied and TorchPContext.__dict__["close"] is not original
    assert TorchPContext.__dict__["close"] is original

def test_builtin_rewards_semantics() -> None:
    assert builtin.repeat_char([], ["aaab", "bbbbbb"], target=["a", "a"], length=4) == [0.75, 0.0]
    assert builtin.exact_match([], [" 12 ", "123"], answer=["12", "12"]) == [1.0, 0.0]
    assert builtin.exact_match([], ["123"], answer=["12"], prefix=True) == [1.0]
    assert builtin.regex_match([], ["<a>x</a>", "x"], pattern=r"<a>.*</a>") == [1.0, 0.0]
    assert builtin.length_penalty([], ["x" * 10, "x" * 100], target_length=10) == [0.0, -1.0]
    assert builtin.digit_match([], ["12", "19"], answer=["12", "12"]) == [1.0, 0.5]
    conversational = [[{"role": "assistant", "content": "42"}]]
    assert builtin.exact_match([], conversational, answer=["42"]) == [1.0]


def test_checked_reward_names_the_function_on_each_kind_of_failure() -> None:
    def raises(prompts, completions, **kw):
        raise KeyError("answer")

    with pytest.raises(RewardFunctionError, match="reward function scorer: raised KeyError"):
        checked_reward(raises, "scorer", {})(prompts=["p"], completions=["c"])
    with pytest.raises(RewardFunctionError, match="returned 1 values for 2 completions"):
        checked_reward(lambda prompts, completions, **k: [1.0], "scorer", {})(prompts=["p"] * 2, completions=["c"] * 2)
    with pytest.raises(RewardFunctionError, match="returned NaN"):
        checked_reward(lambda prompts, completions, **k: [float("nan")], "scorer", {})(prompts=["p"], completions=["c"])
    ok = checked_reward(builtin.repeat_char, "repeat_char", {"length": 2})
    assert ok(prompts=["aa"], completions=["ab"], target=["a"]) == [0.5]
    assert ok.__name__ == "repeat_char"


def test_resolve_rewards_keeps_weights_and_distinct_names() -> None:
    funcs, weights = resolve_rewards([RewardSpec(name="exact_match", weight=2.0), RewardSpec(name="exact_match")])
    assert [f.__name__ for f in funcs] == ["exact_match", "exact_match_1"]
    assert weights == [2.0, 1.0]
    with pytest.raises(PermanentError, match=r"spec.training.rewards\[0\].name: cannot import module"):
        resolve_rewards([RewardSpec(name="nope_mod:f")])


def test_manifest_errors_list_every_problem_with_its_path() -> None:
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"},
           "spec": {"training": {"maxSteps": 0, "rewards": [{"name": "repeat_char", "weight": "heavy"}]},
                    "checkpoint": {"keepLast": 0}}}
    with pytest.raises(ManifestError) as e:
        parse_job(doc)
    paths = sorted(p.split(":")[0] for p in e.value.problems)
    assert paths == ["spec.checkpoint.keepLast", "spec.training.maxSteps", "spec.training.rewards[0].weight"]


def test_trainer_config_round_trips_through_json() -> None:
    from rljob_contract.spec import TrainerConfig

    job = parse_job({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"},
                     "spec": {"workers": {"replicas": 2, "procsPerWorker": 4}, "training": {"batchSize": 4}}})
    cfg = job.trainer_config("/out")
    assert cfg.world_size == 8
    again = TrainerConfig.model_validate_json(cfg.model_dump_json(by_alias=True))
    assert again == cfg
    assert cfg.checkpoint_location() == "/out/checkpoints"


def test_known_dependency_warnings_are_silenced_and_nothing_else() -> None:
    import warnings

    from rljob_trainer.known_warnings import silence_known_warnings

    def warn_from(module: str, message: str, category: type[Warning]) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            silence_known_warnings()
            warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
        return [str(w.message) for w in seen]

    deprecated = "`gradient_checkpointing_enable` is deprecated and will be removed in v6. Use `activation_checkpointing_enable` instead."
    assert warn_from("transformers.modeling_utils", deprecated, FutureWarning) == []
    assert warn_from("transformers.training_args", deprecated.replace("_enable", ""), FutureWarning) == []
    omp = "OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at 1 to improve oob performance."
    assert warn_from("accelerate.state", omp, UserWarning) == []
    # The same text from elsewhere, another category, or another deprecation still shows.
    assert warn_from("rljob_trainer.worker", deprecated, FutureWarning) == [deprecated]
    assert warn_from("transformers.modeling_utils", deprecated, DeprecationWarning) == [deprecated]
    other = "`use_cache=True` is deprecated and will be removed in v6."
    assert warn_from("transformers.modeling_utils", other, FutureWarning) == [other]


#: A process that asks to die with its starter, then says it is still alive.
DIE_WITH_STARTER = "from rljob_trainer.worker import die_with_parent; die_with_parent(); print('alive')"


def test_a_process_whose_starter_is_gone_exits_but_one_started_by_pid_1_does_not() -> None:
    import os
    import subprocess
    import sys

    def child(starter: int, wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        script = DIE_WITH_STARTER if wrap is None else (
            # Pid 1 of a new pid namespace (a container's launcher) starts the process.
            "import os, subprocess, sys; env = {**os.environ, 'RLJOB_PARENT_PID': str(os.getpid())}; "
            f"sys.exit(subprocess.run([sys.executable, '-c', {DIE_WITH_STARTER!r}], env=env).returncode)")
        return subprocess.run([*(wrap or []), sys.executable, "-c", script], capture_output=True, text=True,
                              env={**os.environ, "RLJOB_PARENT_PID": str(starter)}, timeout=60)

    assert child(os.getpid()).stdout == "alive\n"
    # Started by this process while the variable names another: its starter died before prctl.
    assert child(os.getppid()).returncode == 137
    # In a container the launcher is pid 1; its fork server and ranks keep running (they all exited).
    inside = child(0, wrap=["unshare", "--pid", "--fork"])
    assert (inside.returncode, inside.stdout) == (0, "alive\n"), inside.stderr
