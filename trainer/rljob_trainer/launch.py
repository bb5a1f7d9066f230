"""Launch a training run: pre-flight checks, then torchrun's elastic agent over the worker.

``rljob train MANIFEST`` (a laptop) and the in-pod entrypoint
(``python -m rljob_trainer.launch --config /etc/rljob/trainer.yaml``) both end in ``launch()``.
In a pod the operator sets the node's place in the gang through the environment
(``rljob_contract.pod``: gang size, node rank, processes per node, rendezvous endpoint and id,
output folder), and mounts the config the operator wrote with ``contract.dump_config``.

The exit code of the whole node is the most telling of its ranks' codes: permanent (78)
beats out-of-memory (200) beats anything else; a rank killed by signal N counts as 128+N.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rljob_contract import pod as contract
from rljob_contract.plugins.storage import backend_for
from rljob_contract.pod import EXIT_CUDA_OOM, EXIT_PERMANENT, EXIT_RETRYABLE
from rljob_contract.spec import TrainerConfig

from rljob_trainer.errors import PermanentError, report_fatal, write_termination_message
from rljob_trainer.known_warnings import silence_known_warnings
from rljob_trainer.storage import use_mounted_credentials

CONFIG_FILE = "trainer-config.json"


@dataclass(frozen=True)
class NodeSettings:
    """Where this process sits in the torchrun gang."""

    nnodes: int = 1
    nproc_per_node: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = "127.0.0.1:29500"
    run_id: str = "rljob"
    rdzv_timeout: int = 900
    in_place_restarts: int = 0
    """Restarts of this node's ranks to meet a replaced peer (``contract.IN_PLACE_RESTARTS_ENV``)."""

    @property
    def is_host(self) -> bool:
        """``is_host`` of torch's c10d rendezvous: node rank 0's agent serves the store, the others dial it."""
        return self.node_rank == 0

    @classmethod
    def from_env(cls, default_nproc: int) -> NodeSettings:
        env = os.environ
        return cls(
            nnodes=int(env.get(contract.NNODES_ENV, "1")),
            nproc_per_node=int(env.get(contract.NPROC_PER_NODE_ENV, str(default_nproc))),
            node_rank=int(env.get(contract.NODE_RANK_ENV, "0")),
            rdzv_endpoint=env.get(contract.RDZV_ENDPOINT_ENV, "127.0.0.1:29500"),
            run_id=env.get(contract.RUN_ID_ENV, "rljob"),
            rdzv_timeout=int(env.get(contract.RDZV_TIMEOUT_ENV, "900")),
            in_place_restarts=max(int(env.get(contract.IN_PLACE_RESTARTS_ENV, "0") or 0), 0),
        )

    @classmethod
    def local(cls, nproc: int, run_id: str) -> NodeSettings:
        return cls(nnodes=1, nproc_per_node=nproc, node_rank=0, rdzv_endpoint=f"127.0.0.1:{free_port()}",
                   run_id=run_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def preflight(cfg: TrainerConfig) -> dict[str, str]:
    """Checks that need no GPU and no peers, so bad input fails before any process starts.

    Returns environment additions for the ranks (the materialised model path, the checkpoint
    to resume from).
    """
    from rljob_trainer.checkpoints.resume import StorageUnavailable, prepare_checkpoint_storage
    from rljob_trainer.data import check_dataset_source
    from rljob_trainer.rewards import prepare_reward_sources, resolve_rewards

    reward_env = prepare_reward_sources(cfg)
    resolve_rewards(cfg.training.rewards)
    check_dataset_source(cfg.training.dataset)
    evaluation = cfg.training.evaluation
    if evaluation is not None:  # its reward metrics import, its dataset file exists
        from rljob_trainer.evaluation import Scorer

        Scorer(evaluation, cfg.training.rewards)
        if evaluation.dataset is not None:
            check_dataset_source(evaluation.dataset, "spec.training.evaluation.dataset")
    # spec.training.trl was checked against TRL's config fields when the config was loaded
    # (trl_fields.TRL_FIELDS, generated from the installed TRL); each rank checks it against the
    # class itself again. Importing TRL here would cost every node ~15 s of start-up (trl pulls
    # in transformers' trainer stack, torch.distributed.tensor, dynamo, sympy, pandas) before
    # the ranks, which import it anyway, could start.
    try:
        # A denied or missing bucket is a PermanentError here, before any rank starts; every node
        # fetches (and verifies) its own copy of the checkpoint to resume from.
        env = {**reward_env, **prepare_checkpoint_storage(cfg)}
    except StorageUnavailable as e:
        report_fatal(f"spec.checkpoint.storage: {e}")
        raise SystemExit(EXIT_RETRYABLE) from e

    model = cfg.training.model
    cache = os.path.join(cfg.output_dir, ".cache")
    if model.startswith("builtin:"):
        if model != "builtin:tiny":
            raise PermanentError("spec.training.model", f"unknown built-in model {model!r}; use builtin:tiny")
        from rljob_trainer.builtin.tiny_model import materialize_builtin_model

        path = materialize_builtin_model(cache, cfg.training.model_overrides, cfg.training.seed)
        return {**env, contract.MODEL_PATH_ENV: str(path)}
    if backend_for(model).remote:  # object storage (s3://): downloaded through its backend's location
        from rljob_trainer.checkpoints.backends import download_folder

        return {**env, contract.MODEL_PATH_ENV: download_folder(model, os.path.join(cache, "model"))}
    if model.startswith(("/", "./", "../")) and not os.path.isdir(model):
        raise PermanentError("spec.training.model", f"model folder {model!r} does not exist")
    return env


def exit_code_for(failures: dict[int, Any], recorded: dict[int, int] | None = None) -> tuple[int, int | None]:
    """(node exit code, rank whose failure decided it) from torchrun's per-rank failures.

    ``recorded``: the codes ranks wrote themselves (:func:`recorded_exit_codes`). A spawned gang's
    failures list every rank that had exited when the agent looked; a forked gang's (multiprocessing)
    only the first it saw, which may be a peer that lost its connection to the rank that ran out of
    memory, so what the ranks recorded counts too."""
    codes = {rank: (contract.exit_code_for_signal(-f.exitcode) if f.exitcode < 0 else f.exitcode)
             for rank, f in failures.items()}
    for rank, code in (recorded or {}).items():
        codes.setdefault(rank, code)
    for wanted in (EXIT_PERMANENT, EXIT_CUDA_OOM):
        for rank, code in sorted(codes.items()):
            if code == wanted:
                return code, rank
    if not failures:
        return 1, None
    # A rank that only lost a peer explains nothing while another of this node failed on its own.
    first = min(failures, key=lambda r: (codes[r] == contract.EXIT_PEER_LOST, failures[r].timestamp, r))
    return (codes[first] or 1), first


def recorded_exit_codes(error_dir: str) -> dict[int, int]:
    """``rank-N.exit`` files the ranks left in the error folder (``worker.record_exit_code``)."""
    codes = {}
    for path in Path(error_dir).glob("rank-*.exit"):
        with contextlib.suppress(OSError, ValueError):
            codes[int(path.name[len("rank-"):-len(".exit")])] = int(path.read_text(encoding="utf-8").strip())
    return codes


def build_launch_config(launch_config_cls: Any, node: NodeSettings, shutdown_timeout: int,
                        start_method: str = "spawn") -> tuple[Any, bool]:
    """(torchrun's ``LaunchConfig`` for this node, whether the shutdown bound must be applied elsewhere).

    ``shutdown_timeout`` (seconds between the agent's SIGTERM to the ranks and its SIGKILL) is a field
    of ``LaunchConfig`` only from torch 2.12 (pytorch#172596); torch 2.11 and older have no such
    field (passing it is a TypeError) and a fixed 30 s in ``PContext.close``. There the second value
    is True and the caller applies the bound with :func:`bounded_worker_shutdown`.
    """
    kwargs: dict[str, Any] = {
        "min_nodes": node.nnodes,
        "max_nodes": node.nnodes,
        "nproc_per_node": node.nproc_per_node,
        "run_id": node.run_id,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": node.rdzv_endpoint,
        "rdzv_configs": {"timeout": node.rdzv_timeout, "is_host": node.is_host},
        # The operator owns restarts: a failed node ends (its pod fails). With in-place restarts on, the
        # survivors of a lost peer restart their ranks to meet its replacement (``in_place_agent``).
        "max_restarts": node.in_place_restarts,
        "monitor_interval": 0.2,
        "start_method": start_method,
    }
    has_field = "shutdown_timeout" in {f.name for f in dataclasses.fields(launch_config_cls)}
    if has_field:
        kwargs["shutdown_timeout"] = shutdown_timeout
    return launch_config_cls(**kwargs), not has_field


@contextlib.contextmanager
def bounded_worker_shutdown(timeout: int, pcontext_cls: Any = None) -> Iterator[bool]:
    """On a torch whose ``LaunchConfig`` has no ``shutdown_timeout`` (2.11 and older), give the agent's
    stop of the ranks the same bound: the agent calls ``PContext.close(death_sig)`` and takes that
    method's default (30 s) between SIGTERM and SIGKILL; while this is active a call that names no
    timeout gets ``timeout`` instead (only in this launcher process; restored on exit). Yields False,
    and changes nothing, when ``close`` has no ``timeout`` parameter to default."""
    if pcontext_cls is None:
        from torch.distributed.elastic.multiprocessing.api import PContext as pcontext_cls
    original = pcontext_cls.__dict__.get("close")
    if original is None or "timeout" not in inspect.signature(original).parameters:
        yield False
        return

    def close(self: Any, death_sig: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not args and "timeout" not in kwargs:
            kwargs["timeout"] = timeout
        return original(self, death_sig, *args, **kwargs)

    pcontext_cls.close = close
    try:
        yield True
    finally:
        pcontext_cls.close = original


def peers_lost(failures: dict[int, Any], recorded: dict[int, int]) -> bool:
    """Whether every rank of this node that failed did so because a peer was lost (``EXIT_PEER_LOST``).

    ``failures``: torchrun's per-rank failures; ``recorded``: the codes the ranks wrote themselves,
    which win (a forked gang's failures name only the first rank the agent saw)."""
    codes = {rank: f.exitcode for rank, f in failures.items()}
    codes.update(recorded)
    return bool(codes) and all(code == contract.EXIT_PEER_LOST for code in codes.values())


@contextlib.contextmanager
def in_place_agent(error_dir: str, refresh: Any, launcher_api: Any = None,
                   on_round: Callable[[], None] | None = None) -> Iterator[None]:
    """While active, torchrun's agent restarts its ranks only when they lost a peer.

    A node whose ranks all exited with ``EXIT_PEER_LOST`` (another worker died under a collective)
    restarts them, within ``max_restarts``: they rendezvous again with the pod the operator creates
    in the dead one's place, and resume from the newest checkpoint (``refresh`` fetches it and
    returns the ranks' new environment). Any other failure (this node's own crash, out of memory, a
    permanent error) disables the restarts, as torch's own agent does for a wedged worker: the node
    ends, its pod fails, and the operator replaces that pod. ``launcher_api`` (tests): the module
    whose ``LocalElasticAgent`` ``elastic_launch`` builds; patched only in this process, restored on exit.
    ``on_round``: called each time a rendezvous round started this node's ranks (:func:`run_redialling`).
    """
    if launcher_api is None:
        import torch.distributed.launcher.api as launcher_api
    base = launcher_api.LocalElasticAgent

    class InPlaceAgent(base):  # type: ignore[misc, valid-type]
        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if result.is_failed() and not peers_lost(result.failures, recorded_exit_codes(error_dir)):
                self._remaining_restarts = 0
            return result

        def _restart_workers(self, worker_group: Any) -> None:
            for f in Path(error_dir).glob("*"):  # the last round's codes and errors are not this one's
                f.unlink(missing_ok=True)
            refresh()
            super()._restart_workers(worker_group)

        def _start_workers(self, worker_group: Any) -> Any:
            if on_round is not None:
                on_round()
            return super()._start_workers(worker_group)

    launcher_api.LocalElasticAgent = InPlaceAgent
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = base


#: Seconds between a node's attempts to reach the rendezvous store again (:func:`run_redialling`).
REDIAL_PAUSE = 1.0


@dataclass
class Rounds:
    """How many rendezvous rounds have started this node's ranks (``in_place_agent``'s ``on_round``), and at
    which count the newest checkpoint was last fetched (``_launch``'s ``refresh`` sets it)."""

    count: int = 0
    refreshed: int = -1

    def started(self) -> None:
        self.count += 1


def run_redialling(run: Callable[[], None], node: NodeSettings, rounds: Rounds, refresh: Callable[[], None],
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Run torchrun's agent (``run``); while the rendezvous store cannot be reached, run it again.

    Worker 0's agent hosts the store (c10d ``is_host``). When worker 0 is lost, every other agent's
    rendezvous fails with ``RendezvousConnectionError`` (its ranks lost their peer too) and the agent
    ends. Ending the node would cost its pod as well, so a node that may restart its ranks to meet a
    replaced peer (``in_place_restarts``) runs its agent again instead: it fetches the newest checkpoint
    (``refresh``) and dials the same endpoint, where the operator's replacement for worker 0 hosts a
    new store (the ``<job>-rendezvous`` EndpointSlice follows worker 0's address) for the same run id.
    Each loss of a store the ranks had met counts as one of ``in_place_restarts``; attempts that reach
    no store are repeated for up to ``rdzv_timeout`` seconds after the loss (or the start: a node that
    starts before worker 0 listens waits for it as long). Past either bound, and on worker 0 itself,
    the error goes up (``_launch`` ends the node with ``EXIT_PEER_LOST``).
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    redials, since = 0, clock()
    while True:
        before = rounds.count
        try:
            run()
            return
        except RendezvousConnectionError:
            if node.is_host or not node.in_place_restarts:
                raise
            if rounds.count > before:  # the store went away under running ranks: worker 0 was lost
                redials += 1
                if redials > node.in_place_restarts:
                    raise
                since = clock()
                print(f"rljob: node {node.node_rank} lost the rendezvous store at {node.rdzv_endpoint} "
                      f"(worker 0): meeting its replacement there", file=sys.stderr, flush=True)
                if rounds.refreshed != rounds.count:  # the agent's own restart may have fetched it already
                    refresh()
            elif clock() - since > node.rdzv_timeout:
                raise
        sleep(REDIAL_PAUSE)


#: Device files whose presence means "this node has a GPU" (NVIDIA, AMD ROCm).
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")
#: The preload of the fork server: what every rank imports.
RANK_STACK = "rljob_trainer.rank_stack"


def rank_start_method(environ: dict[str, str] | os._Environ[str] = os.environ,
                      gpu_device_files: tuple[str, ...] = GPU_DEVICE_FILES) -> str:
    """``forkserver`` or ``spawn``: how the elastic agent starts this node's ranks.

    A spawned rank is a new interpreter that imports TRL, transformers and torch (8.4 s of one core
    each, see ``bench/startup.py``); with ``forkserver`` a server process imports them once, while
    the pre-flight runs, and each rank is a fork of it. ``auto`` forks only on nodes without a GPU:
    CUDA must not be initialised before a fork, and an import of the stack may query the devices.
    """
    value = environ.get(contract.RANK_START_ENV, "auto").strip() or "auto"
    if value not in ("auto", "spawn", "forkserver"):
        raise PermanentError(contract.RANK_START_ENV, f"unknown value {value!r}; use auto, spawn or forkserver")
    if value != "auto":
        return value
    return "spawn" if any(os.path.exists(f) for f in gpu_device_files) else "forkserver"


def start_fork_server() -> None:
    """Start multiprocessing's fork server with the ranks' imports preloaded (returns at once).

    The server keeps the environment it starts with; :func:`launch` hands the ranks what it adds
    later. Its preload (``rljob_trainer.rank_stack``) first asks Linux to kill the server with this
    launcher, and each rank asks the same of the server, so no rank outlives a killed launcher. The server
    is a new interpreter: it finds ``rljob_trainer`` where the launcher's environment says (an installed
    package, ``PYTHONPATH``), not on a ``sys.path`` changed at run time, which Python 3.11 does not hand on.
    """
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload([RANK_STACK])
    multiprocessing.forkserver.ensure_running()


@contextlib.contextmanager
def fork_server() -> Iterator[None]:
    """The fork server of one launch: started on entry (it imports the training stack while the
    pre-flight runs), stopped on exit."""
    start_fork_server()
    try:
        yield
    finally:
        stop_fork_server()


def stop_fork_server() -> None:
    """Stop this launch's fork server at once, so a later launch in this process starts one with its own
    environment, and a pre-flight that failed does not wait for the server's imports to finish.

    By now the elastic agent has joined or killed the ranks; SIGKILL ends a server still importing
    (it would notice its closed pipe only after the imports) and, through each rank's death signal,
    anything it forked. ``_forkserver_pid`` and ``_stop`` are CPython's own (3.9+); without them the
    server stays until this process exits, and dies with it.
    """
    import multiprocessing.forkserver
    import signal

    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        with contextlib.suppress(OSError):
            stop()


def launch(cfg: TrainerConfig, node: NodeSettings, extra_env: dict[str, str] | None = None) -> int:
    """Run the gang's processes on this node; returns the node's exit code."""
    silence_known_warnings()
    try:
        start_method = rank_start_method()
    except PermanentError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    # The fork server and spawned ranks check that this process is still their parent.
    os.environ[contract.PARENT_PID_ENV] = str(os.getpid())
    from rljob_trainer.tracking import untracked_env

    os.environ.update(untracked_env(cfg, os.environ))  # before the fork server imports TRL
    with fork_server() if start_method == "forkserver" else contextlib.nullcontext():
        return _launch(cfg, node, extra_env or {}, start_method)


def _launch(cfg: TrainerConfig, node: NodeSettings, extra_env: dict[str, str], start_method: str) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        env = preflight(cfg)  # every pod has its own filesystem, so every node prepares its model
    except PermanentError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    config_path = out / CONFIG_FILE
    config_path.write_text(cfg.model_dump_json(by_alias=True, indent=1), encoding="utf-8")

    error_dir = tempfile.mkdtemp(prefix="rljob-errors-")
    # What the ranks get beyond the launcher's own environment (a fork server has the environment of
    # the moment it started, so it is handed to forked ranks explicitly as well).
    env = {**env, **extra_env, contract.ERROR_DIR_ENV: error_dir}
    os.environ.update(env)
    # On SIGTERM the ranks save a checkpoint and stop (worker.StopOnSignal); wait that long for them.
    shutdown_timeout = int(os.environ.get(contract.SHUTDOWN_TIMEOUT_ENV, "110"))
    launch_config, bound_by_patch = build_launch_config(LaunchConfig, node, shutdown_timeout, start_method)

    rounds = Rounds()

    def refresh() -> None:  # a restart after a lost peer resumes from the newest checkpoint
        from rljob_trainer.checkpoints.resume import prepare_checkpoint_storage

        fresh = prepare_checkpoint_storage(cfg)  # fetched and verified as by the pre-flight
        env.update(fresh)
        os.environ.update(fresh)
        rounds.refreshed = rounds.count  # once per round: a redial after the agent's own restart skips it

    if node.in_place_restarts:
        # The ranks' store is then hosted by rank 0 and made anew by each round, not shared with the
        # rendezvous: torch's shared store kept the dead round's keys, and a restarted gang hung in
        # init_process_group (measured: until killed) instead of meeting the replacement.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    def run_agent() -> None:
        if start_method == "forkserver":
            from rljob_trainer.worker import forked_main

            elastic_launch(launch_config, forked_main)(str(config_path), env)
        else:
            elastic_launch(launch_config, sys.executable)("-m", "rljob_trainer.worker", str(config_path))

    try:
        with bounded_worker_shutdown(shutdown_timeout) if bound_by_patch else contextlib.nullcontext(), \
                in_place_agent(error_dir, refresh, on_round=rounds.started) if node.in_place_restarts \
                else contextlib.nullcontext():
            run_redialling(run_agent, node, rounds, refresh)
        return 0
    except RendezvousConnectionError:
        code = contract.EXIT_PEER_LOST
        message = (f"lost the rendezvous store at {node.rdzv_endpoint} (worker 0's agent hosts it) and none "
                   f"answered there again within {node.rdzv_timeout} s")
        print(f"rljob: node {node.node_rank} {message} (exit {code})", file=sys.stderr, flush=True)
        write_termination_message(message)
        return code
    except SignalException as e:
        code = contract.exit_code_for_signal(e.sigval)
        message = f"stopped by {e.sigval.name}: the ranks saved a checkpoint where they could and exited"
        print(f"rljob: node {node.node_rank} {message} (exit {code})", file=sys.stderr, flush=True)
        write_termination_message(message)
        return code
    except ChildFailedError as e:
        code, rank = exit_code_for(e.failures, recorded_exit_codes(error_dir))
        message = _rank_error(error_dir, rank) or f"rank {rank} exited with code {code}"
        print(f"rljob: node {node.node_rank} failed: {message} (exit {code})", file=sys.stderr, flush=True)
        write_termination_message(message)
        return code
    finally:
        for f in Path(error_dir).glob("*"):
            f.unlink(missing_ok=True)
        os.rmdir(error_dir)


def _rank_error(error_dir: str, rank: int | None) -> str | None:
    if rank is None:
        return None
    path = Path(error_dir) / f"rank-{rank}.txt"
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def load_trainer_config(path: str) -> TrainerConfig:
    """The config the operator mounted (``contract.load_config``); a bad one is a PermanentError."""
    try:
        return contract.load_config(path)
    except contract.ConfigError as e:
        raise PermanentError(e.where, e.message) from e


def main(argv: list[str] | None = None) -> int:
    """In-pod entrypoint: ``python -m rljob_trainer.launch --config FILE``."""
    parser = argparse.ArgumentParser(prog="rljob-trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="trainer config (YAML/JSON) from the job's ConfigMap")
    args = parser.parse_args(argv)
    try:
        cfg = load_trainer_config(args.config)
    except PermanentError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    output = os.environ.get(contract.OUTPUT_DIR_ENV)
    if output:
        cfg = cfg.model_copy(update={"output_dir": output})
    mounted = os.environ.get(contract.CREDENTIALS_DIR_ENV)
    if mounted:
        try:  # before any rank or download: they all read the same credentials file
            use_mounted_credentials(Path(mounted) / contract.credentials_folder())
        except PermanentError as e:
            report_fatal(str(e))
            return EXIT_PERMANENT
    try:
        node = NodeSettings.from_env(default_nproc=1)
    except PermanentError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    return launch(cfg, node)


def _exit_now(code: int) -> None:
    """End the in-pod launcher as soon as the node's exit code is known.

    By now the ranks are gone (the elastic agent joined or killed them), the termination message is
    written and the checkpoint saved. A normal interpreter exit would still tear down torch,
    transformers, TRL and the rendezvous objects module by module: measured at 1.3 s on an idle
    2-core machine and 3.6-9 s under load, after the node had already printed its exit code. On
    SIGTERM that time comes out of the pod's grace period (the test gives a node 20 s from the
    signal, node 0's rank saves the checkpoint), and a node killed in it loses its 143. So flush
    what is buffered and skip the teardown: ``os._exit`` runs no atexit handlers, and none of ours
    has work left (logging is flushed here, multiprocessing's children were joined by the agent).
    """
    import contextlib
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
