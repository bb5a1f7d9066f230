"""The launcher (``rljob_trainer.launch``) without a training run: torch's LaunchConfig with or without
``shutdown_timeout``, how ranks are started, the fork server stopped while it imports, the agent's bounded
stop, and a process that dies with its starter."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import pytest
from rljob_trainer.errors import PermanentError
from rljob_trainer.launch import (
    NodeSettings,
    Rounds,
    bounded_worker_shutdown,
    build_launch_config,
    rank_start_method,
    run_redialling,
)

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


def test_node_rank_0_hosts_the_rendezvous_store_and_the_others_dial_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node announces its FQDN (torch's default): group ranks follow the sorted descriptors, so worker 0
    (``<job>-worker-0.<job>…`` sorts first) is rank 0 again after any replacement, and its name is the one the
    job's Service resolves for the others (the ranks' own store is rank 0's)."""
    from rljob_contract import pod as contract
    from torch.distributed.launcher.api import LaunchConfig

    def config(rank: int) -> Any:
        monkeypatch.setenv(contract.NODE_RANK_ENV, str(rank))
        return build_launch_config(LaunchConfig, NodeSettings.from_env(default_nproc=1), 30)[0]

    assert [config(r).rdzv_configs["is_host"] for r in (0, 1, 2)] == [True, False, False]
    assert config(1).local_addr is None


class _Agent:
    """``run_redialling``'s ``run``: each call plays one agent run from ``script``: "lost" (ranks started, then
    the store went away), "unreachable" (no store answered), "done" (the gang finished)."""

    def __init__(self, rounds: Rounds, script: list[str]) -> None:
        self.rounds, self.script, self.calls = rounds, list(script), 0

    def __call__(self) -> None:
        from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

        self.calls += 1
        what = self.script.pop(0)
        if what == "done":
            return
        if what == "lost":
            self.rounds.started()
        raise RendezvousConnectionError("The connection to the C10d store has failed.")


def _redial(script: list[str], node: NodeSettings, clock_step: float = 1.0) -> tuple[_Agent, list[str], BaseException | None]:
    rounds, refreshed, now = Rounds(), [], [0.0]
    agent = _Agent(rounds, script)

    def clock() -> float:
        now[0] += clock_step
        return now[0]

    try:
        run_redialling(agent, node, rounds, lambda: refreshed.append("fetched"), clock=clock, sleep=lambda _: None)
        return agent, refreshed, None
    except Exception as e:  # noqa: BLE001 - the test looks at what went up
        return agent, refreshed, e


def test_a_node_that_lost_worker_0s_store_dials_it_again_after_fetching_the_newest_checkpoint() -> None:
    node = dataclasses.replace(NODE, in_place_restarts=2, rdzv_timeout=30)
    # Worker 0 lost, nobody there for three tries, then its replacement's store: the gang finishes.
    agent, refreshed, error = _redial(["lost", "unreachable", "unreachable", "unreachable", "done"], node)
    assert (error, agent.calls, refreshed) == (None, 5, ["fetched"])
    # Each loss of a store the ranks met counts against in_place_restarts: a third loss goes up.
    agent, refreshed, error = _redial(["lost", "lost", "lost", "done"], node)
    assert type(error).__name__ == "RendezvousConnectionError" and agent.calls == 3 and len(refreshed) == 2
    # No store answers for longer than the rendezvous timeout: up (the node ends with EXIT_PEER_LOST).
    agent, _, error = _redial(["lost", *["unreachable"] * 40, "done"], node)
    assert error is not None and 30 <= agent.calls - 1 <= 32
    # Worker 0 itself, or a node that may not restart its ranks, never dials again.
    for other in (dataclasses.replace(node, node_rank=0), dataclasses.replace(node, in_place_restarts=0)):
        agent, _, error = _redial(["lost", "done"], other)
        assert error is not None and agent.calls == 1
