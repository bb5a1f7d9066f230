"""Checkpoints a resume can trust: a manifest of checksums, an atomic ``latest`` pointer, retention.

A checkpoint is a folder ``checkpoint-<step>`` written by the HF Trainer. It counts only
once ``rljob-manifest.json`` lists every file with its size and MD5 — the manifest is
written last, atomically, after every rank has finished saving. Only then does the
``latest`` pointer move (also atomically). Anything without a manifest is incomplete and
ignored by resume and retention alike; a resume verifies checksums and falls back to the
previous complete checkpoint when one does not match.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("rljob.checkpoints")

MANIFEST = "rljob-manifest.json"
LATEST = "latest"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint as its manifest describes it."""

    name: str
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)


def file_md5(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` so readers see the old content or the new, never a torn file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_of(name: str) -> int | None:
    m = CHECKPOINT_RE.match(name)
    return int(m.group(1)) if m else None


def build_manifest(ckpt_dir: str | os.PathLike[str], step: int, metrics: dict[str, float]) -> dict[str, Any]:
    ckpt_dir = Path(ckpt_dir)
    files = {}
    for p in sorted(ckpt_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith("."):
            rel = p.relative_to(ckpt_dir).as_posix()
            files[rel] = {"size": p.stat().st_size, "md5": file_md5(p)}
    return {
        "format": 1,
        "name": ckpt_dir.name,
        "step": step,
        "metrics": metrics,
        "files": files,
        "created": time.time(),
    }


def seal_checkpoint(ckpt_dir: str | os.PathLike[str], step: int, metrics: dict[str, float]) -> CheckpointInfo:
    """Write the manifest (making the checkpoint complete) and move ``latest`` to it."""
    ckpt_dir = Path(ckpt_dir)
    manifest = build_manifest(ckpt_dir, step, metrics)
    atomic_write_text(ckpt_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    atomic_write_text(ckpt_dir.parent / LATEST, ckpt_dir.name + "\n")
    return CheckpointInfo(ckpt_dir.name, step, metrics, manifest["files"])


def read_manifest(ckpt_dir: str | os.PathLike[str]) -> CheckpointInfo | None:
    path = Path(ckpt_dir) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return CheckpointInfo(data["name"], int(data["step"]), dict(data.get("metrics", {})), dict(data["files"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify_checkpoint(ckpt_dir: str | os.PathLike[str]) -> list[str]:
    """Problems found comparing the folder with its manifest (empty when it is intact)."""
    ckpt_dir = Path(ckpt_dir)
    info = read_manifest(ckpt_dir)
    if info is None:
        return [f"{ckpt_dir}: no readable {MANIFEST} (incomplete checkpoint)"]
    problems = []
    for rel, meta in info.files.items():
        p = ckpt_dir / rel
        if not p.is_file():
            problems.append(f"{p}: missing")
        elif p.stat().st_size != meta["size"]:
            problems.append(f"{p}: size {p.stat().st_size} != {meta['size']}")
        elif file_md5(p) != meta["md5"]:
            problems.append(f"{p}: md5 mismatch")
    return problems


def complete_checkpoints(root: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """Complete checkpoints under ``root`` (those with a manifest), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        if child.is_dir() and step_of(child.name) is not None:
            info = read_manifest(child)
            if info is not None:
                found.append(info)
    return sorted(found, key=lambda c: c.step)


def find_resume_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint whose files match its manifest, or None.

    A corrupt one is skipped with a warning and the previous one is tried.
    """
    for info in reversed(complete_checkpoints(root)):
        path = Path(root) / info.name
        problems = verify_checkpoint(path)
        if not problems:
            return path
        log.warning("checkpoint %s failed verification, falling back: %s", path, "; ".join(problems[:3]))
    return None


def retention_keep(
    checkpoints: list[CheckpointInfo],
    keep_last: int,
    keep_best: int = 0,
    best_metric: str = "reward",
    protect: set[str] | None = None,
) -> set[str]:
    """Names to keep: the newest ``keep_last``, the best ``keep_best`` by ``best_metric``
    (higher is better), the newest one always, and any in ``protect`` (a resume source)."""
    ordered = sorted(checkpoints, key=lambda c: c.step)
    keep = {c.name for c in ordered[-max(1, keep_last) :]}
    if keep_best > 0:
        scored = [c for c in ordered if best_metric in c.metrics]
        scored.sort(key=lambda c: (c.metrics[best_metric], c.step), reverse=True)
        keep |= {c.name for c in scored[:keep_best]}
    return keep | (protect or set())


def apply_retention(
    root: str | os.PathLike[str],
    keep_last: int,
    keep_best: int = 0,
    best_metric: str = "reward",
    protect: set[str] | None = None,
) -> list[str]:
    """Delete complete checkpoints outside the kept set, and incomplete folders older than the
    newest complete one (debris of a crash; a newer incomplete one may still be being written).
    Returns the names deleted."""
    root = Path(root)
    complete = complete_checkpoints(root)
    if not complete:
        return []
    keep = retention_keep(complete, keep_last, keep_best, best_metric, protect)
    newest = complete[-1].step
    complete_names = {c.name for c in complete}
    deleted = []
    for child in sorted(root.iterdir()):
        step = step_of(child.name)
        if step is None or not child.is_dir() or child.name in keep:
            continue
        if child.name in complete_names or step < newest:
            # Remove the manifest first so a crash mid-delete leaves an incomplete (ignored) folder.
            (child / MANIFEST).unlink(missing_ok=True)
            shutil.rmtree(child, ignore_errors=True)
            deleted.append(child.name)
    return deleted
