"""Helpers for trainer tests: manifests from the quickstart, and `rljob` run as a real process."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"


def quickstart_doc() -> dict[str, Any]:
    return yaml.safe_load(QUICKSTART.read_text())


def deep_update(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write_manifest(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def trainer_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RLJOB_PROGRESS": "0", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.pop("RLJOB_STATUS_URL", None)
    env.update(extra)
    return env


def rljob_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rljob", *args]


def run_rljob(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rljob_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=trainer_env(**env), cwd=REPO)


def start_rljob(*args: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """Start `rljob` in its own process group (so a test can SIGKILL the whole gang)."""
    f = open(log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(rljob_cmd(*args), stdout=f, stderr=subprocess.STDOUT, env=trainer_env(**env),
                            cwd=REPO, start_new_session=True)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    proc.wait(timeout=60)


def wait_until(predicate: Any, timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
