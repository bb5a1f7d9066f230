"""Starting and stopping control-plane processes so that none outlive their owner.

Every component runs in its own session (process group == pid), so stopping it
signals the whole group. Each control plane records its processes in a small
JSON file under ``$RLJOB_CACHE/run/``; a later start reaps what a crashed or
SIGKILLed owner left behind (checking /proc/<pid>/exe, so a recycled pid that
now belongs to something else is never touched). Processes started for pytest
also get PR_SET_PDEATHSIG, so the kernel kills them if pytest dies outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def cache_dir() -> Path:
    """Root of rljob's machine-wide cache (binaries, run records)."""
    return Path(os.environ.get("RLJOB_CACHE", Path.home() / ".cache" / "rljob"))


def run_dir() -> Path:
    """Folder of run records, one JSON file per live control plane."""
    directory = cache_dir() / "run"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (tells a live process from a recycled pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def is_running(pid: int, exe: str | None = None) -> bool:
    """Whether ``pid`` is alive (not a zombie) and, if given, runs binary ``exe``."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state in ("Z", "X"):
        return False
    return exe is None or _exe(pid) == exe


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. SIGKILL, not SIGTERM: an owner
    # that died uncleanly leaves nothing worth a graceful shutdown, and
    # kube-apiserver's graceful shutdown outlasts etcd by a long way.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


@dataclass
class ProcessRecord:
    """One started component, as written to the run record."""

    name: str
    pid: int
    exe: str
    stop_timeout: float = 3.0
    """Seconds between SIGTERM and SIGKILL when the whole plane stops (its data goes with it)."""


def start_process(
    name: str, argv: list[str], log_path: Path, *, die_with_parent: bool
) -> tuple[subprocess.Popen, ProcessRecord]:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    return process, ProcessRecord(name, process.pid, os.path.realpath(argv[0]))


#: A component that takes longer than this to stop is named on the real stderr (pytest captures the rest).
SLOW_STOP_S = 3.0


def stop_component(proc: ProcessRecord, timeout: float | None = None) -> None:
    """:func:`stop_process_group` for a recorded component (its own ``stop_timeout`` unless given),
    naming it when it was slow to stop."""
    started = time.monotonic()
    stop_process_group(proc.pid, proc.exe, timeout=proc.stop_timeout if timeout is None else timeout)
    if time.monotonic() - started > SLOW_STOP_S:
        print(f"control plane: {proc.name} took {time.monotonic() - started:.1f} s to stop",
              file=sys.__stderr__, flush=True)


def stop_process_group(pid: int, exe: str | None = None, timeout: float = 10.0) -> None:
    """SIGTERM the group led by ``pid``, then SIGKILL what is left after ``timeout``."""
    if not is_running(pid, exe):
        _reap(pid)
        return
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(pid)
            if not is_running(pid):
                return
            time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    # Collect our own child's exit status so it does not linger as a zombie.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@dataclass
class RunRecord:
    """What a control plane started and what to clean up if its owner vanishes.

    ``owner_pid`` is None for a detached dev cluster, which only ``down`` (or
    the next ``up`` in the same folder) may stop.
    """

    workdir: str
    remove_workdir: bool
    owner_pid: int | None
    owner_start: str | None
    processes: list[ProcessRecord]
    path: str = ""
    real_node: dict[str, Any] | None = None
    """What ``realnode.teardown`` undoes (bridge, mounts, sysctls, ...), once a real node started."""

    @classmethod
    def create(cls, workdir: Path, *, remove_workdir: bool, detached: bool) -> RunRecord:
        """A new, empty record for a control plane in ``workdir``."""
        pid = None if detached else os.getpid()
        record = cls(
            workdir=str(workdir),
            remove_workdir=remove_workdir,
            owner_pid=pid,
            owner_start=_start_time(pid) if pid else None,
            processes=[],
            path=str(run_dir() / f"{uuid.uuid4().hex}.json"),
        )
        record.save()
        return record

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """Read a record written by :meth:`save`."""
        data = json.loads(path.read_text())
        data["processes"] = [ProcessRecord(**p) for p in data["processes"]]
        data["path"] = str(path)
        return cls(**data)

    def save(self) -> None:
        """Write the record atomically, so a reaper never reads half a file."""
        data = asdict(self)
        data.pop("path")
        tmp = Path(self.path + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.path)

    def owner_alive(self) -> bool:
        """Whether the process that owns this control plane still runs."""
        if self.owner_pid is None:
            return True
        return _start_time(self.owner_pid) == self.owner_start

    def stop_all(self) -> None:
        """Stop every recorded process (last started first), then forget the record."""
        if self.real_node is not None:  # first, while containerd may still clean up its own containers
            from tests.cluster import realnode  # it imports this module

            realnode.teardown(self.real_node, self.processes)
        for proc in reversed(self.processes):  # an API server stops cleanly while etcd still answers it
            stop_component(proc)
        if self.remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        Path(self.path).unlink(missing_ok=True)


def reap_stale(*, workdir: Path | None = None) -> list[str]:
    """Stop control planes whose owner died, and any recorded for ``workdir``.

    Returns the work directories cleaned, for logging.
    """
    cleaned = []
    for path in sorted(run_dir().glob("*.json")):
        try:
            record = RunRecord.load(path)
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
            continue
        same_dir = workdir is not None and Path(record.workdir) == workdir
        if record.owner_alive() and not same_dir:
            continue
        record.stop_all()
        cleaned.append(record.workdir)
    return cleaned
