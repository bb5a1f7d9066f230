"""Helpers for trainer tests: manifests from the quickstart, and `rljob` run as a real process."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
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


def write_runtime(path: Path, checkpoint: dict[str, Any], **spec: Any) -> Path:
    """A runtime file for ``rljob train --runtime``: checkpoints to ``checkpoint`` (storage, endpointUrl, mirrors…)."""
    doc = {"apiVersion": "rljob.dev/v1alpha1", "kind": "ClusterRLTrainingRuntime", "metadata": {"name": "local"},
           "spec": {"image": "ghcr.io/rljob/trainer:0.1.0", "checkpoint": checkpoint, **spec}}
    return write_manifest(path, doc)


def job_location(prefix: str, doc: dict[str, Any]) -> str:
    """Where a runtime whose checkpoint storage is ``prefix`` puts the checkpoints of job ``doc``
    (``<prefix>/<namespace>/<name>[/<subPath>]``, ``rljob_contract.runtime.job_location``)."""
    from rljob_contract.runtime import job_location as located

    meta = doc["metadata"]
    return located(prefix, meta.get("namespace") or "default", meta["name"],
                   ((doc.get("spec") or {}).get("checkpoint") or {}).get("subPath"))


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


#: Per-step values of metrics.jsonl that measure the clock, not the training.
CLOCK_KEYS = frozenset({"step_time"})
#: What the health values of metrics.jsonl start with: a resumed run starts its health windows afresh
#: (docs/guides/health.md), so they are the run's, not the training's (rljob_contract.health.HEALTH_LOG_PREFIX).
HEALTH_PREFIX = "health/"


def logged_curve(metrics: Path, from_line: int = 0) -> dict[int, dict[str, float]]:
    """Step → every value metrics.jsonl logged for it (from line ``from_line``; a step logged again, as
    after a resume, keeps its last record), the clock's and the health windows' values left out."""
    curve: dict[int, dict[str, float]] = {}
    for line in metrics.read_text().splitlines()[from_line:]:
        record = json.loads(line)
        if "step" in record and "loss" in record:  # a training step's record
            curve[int(record["step"])] = {k: v for k, v in record.items()
                                          if k not in CLOCK_KEYS and not k.startswith(HEALTH_PREFIX)}
    return curve


def assert_same_curve(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]) -> int:
    """Every value of every step in ``got`` equals ``want``'s exactly (not approximately: a resume that
    restores everything replays the same floating-point operations). Returns how many values it compared."""
    compared, differ = 0, []
    for step, values in sorted(got.items()):
        assert step in want, f"step {step} is not in the reference run"
        assert set(values) == set(want[step]), (step, set(values) ^ set(want[step]))
        for key, value in values.items():
            compared += 1
            if value != want[step][key]:
                differ.append((step, key, value, want[step][key]))
    assert not differ, f"{len(differ)} of {compared} values differ from the uninterrupted run, first: {differ[:5]}"
    return compared


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The trainer's Prometheus metrics on ``port``: name → labels → value."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out
