"""Shared pieces of the benchmarks: running rljob and plain TRL, and writing results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PLAIN = REPO / "tests" / "support" / "plain_trl_grpo.py"


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update({"RLJOB_PROGRESS": "0", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
    e.pop("RLJOB_STATUS_URL", None)
    e.update(extra)
    return e


def run(cmd: list[str], **extra: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env(**extra), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - started


def rljob_train(manifest: dict[str, Any], out: Path, nproc: int | None = None,
                runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """``rljob train`` of ``manifest`` (on ``runtime``, a ClusterRLTrainingRuntime's spec, when given)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    cmd = [sys.executable, "-m", "rljob", "train", str(path), "--output", str(out / "run")]
    if runtime is not None:
        (out / "runtime.yaml").write_text(yaml.safe_dump({
            "apiVersion": "rljob.dev/v1alpha1", "kind": "ClusterRLTrainingRuntime", "metadata": {"name": "bench"},
            "spec": {"image": "ghcr.io/rljob/trainer:0.1.0", **runtime}}, sort_keys=False))
        cmd += ["--runtime", str(out / "runtime.yaml")]
    if nproc:
        cmd += ["--nproc", str(nproc)]
    wall = run(cmd)
    summary = json.loads((out / "run" / "summary.json").read_text())
    summary["process_wall_seconds"] = wall
    return summary


def plain_trl(out: Path, steps: int, nproc: int, *extra_args: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--standalone", str(PLAIN), str(out), str(steps)]
    else:
        cmd = [sys.executable, str(PLAIN), str(out), str(steps)]
    # Not the script's folder first on sys.path, where a helper module could shadow the standard library's
    # (tests/support/operator.py, now operator_process.py, once stood in for `operator`).
    wall = run([*cmd, *extra_args], PYTHONSAFEPATH="1")
    data: dict[str, Any] = json.loads((out / "runtime.json").read_text())
    data["process_wall_seconds"] = wall
    return data


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write bench/results/NAME.json. ``data["summary"]`` is a list of rows for bench/README.md:
    {"metric", "value", "unit", "target", "met"}."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(), **data}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
