"""Checkpoints a resume can trust: a manifest of checksums, an atomic ``latest`` pointer, retention.

A checkpoint is a folder ``checkpoint-<step>`` written by the HF Trainer. It counts only
once ``rljob-manifest.json`` lists every file with its size and MD5 — the manifest is
written last, atomically, after every rank has finished saving. Only then does the
``latest`` pointer move (also atomically). Anything without a manifest is incomplete and
ignored by resume and retention alike; a resume verifies checksums and falls back to the
previous complete checkpoint when one does not match.

The same layout and rules hold on object storage (``rljob_trainer.checkpoint_store``); for
that the manifest also records each file's expected S3 ETag (``etag``) for the multipart part
size the uploader uses, so a bucket listing alone verifies an upload.
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


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives a multipart upload: MD5 of the parts' binary MD5s, then ``-<parts>``."""
    return f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def file_digests(path: str | os.PathLike[str], part_size: int | None) -> tuple[str, str]:
    """(MD5, expected S3 ETag) of a file in one read.

    ``part_size`` is the multipart part size the upload uses for this file, or None for a single
    PUT (whose ETag is the MD5 itself).
    """
    whole = hashlib.md5(usedforsecurity=False)
    parts: list[bytes] = []
    with open(path, "rb") as f:
        while True:
            part = hashlib.md5(usedforsecurity=False)
            remaining = part_size or (1 << 62)
            read = 0
            while remaining > 0 and (block := f.read(min(1 << 20, remaining))):
                whole.update(block)
                part.update(block)
                remaining -= len(block)
                read += len(block)
            if read == 0:
                break
            parts.append(part.digest())
            if part_size is None or remaining > 0:
                break
    md5 = whole.hexdigest()
    return md5, (multipart_etag(parts) if part_size is not None else md5)


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


S3_MIN_PART = 5 << 20
S3_MAX_PART = 5 << 30
S3_MAX_PARTS = 10_000


def s3_part_size(part_size: int, file_size: int) -> int | None:
    """The part size boto3's transfer manager uses for a file (None: one PUT, when smaller than
    ``part_size``), as s3transfer's ``ChunksizeAdjuster`` computes it: doubled until the parts fit
    S3's 10,000-part limit, then clamped to 5 MiB..5 GiB."""
    if file_size < part_size:
        return None
    chunk = part_size
    while -(-file_size // chunk) > S3_MAX_PARTS:
        chunk *= 2
    return min(max(chunk, S3_MIN_PART), S3_MAX_PART)


def build_manifest(
    ckpt_dir: str | os.PathLike[str], step: int, metrics: dict[str, float], part_size: int | None = None
) -> dict[str, Any]:
    """The manifest of a checkpoint folder. With ``part_size`` (the uploader's multipart part size),
    each file also gets the ETag S3 will report for it, computed in the same read as the MD5."""
    ckpt_dir = Path(ckpt_dir)
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(ckpt_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith("."):
            rel = p.relative_to(ckpt_dir).as_posix()
            size = p.stat().st_size
            if part_size is None:
                files[rel] = {"size": size, "md5": file_md5(p)}
            else:
                md5, etag = file_digests(p, s3_part_size(part_size, size))
                files[rel] = {"size": size, "md5": md5, "etag": etag}
    manifest: dict[str, Any] = {
        "format": 1,
        "name": ckpt_dir.name,
        "step": step,
        "metrics": metrics,
        "files": files,
        "created": time.time(),
    }
    if part_size is not None:
        manifest["part_size"] = part_size
    return manifest


def seal_checkpoint(
    ckpt_dir: str | os.PathLike[str], step: int, metrics: dict[str, float], part_size: int | None = None
) -> CheckpointInfo:
    """Write the manifest (making the checkpoint complete) and move ``latest`` to it."""
    ckpt_dir = Path(ckpt_dir)
    manifest = build_manifest(ckpt_dir, step, metrics, part_size)
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


def retention_plan(
    complete: list[CheckpointInfo],
    incomplete: list[str],
    keep_last: int,
    keep_best: int = 0,
    best_metric: str = "reward",
    protect: set[str] | None = None,
) -> list[str]:
    """Names to delete at one location: complete checkpoints outside the kept set, and incomplete
    ones older than the newest complete one (debris of a crash or a failed upload; a newer incomplete
    one may still be being written). Pure, so local folders and bucket listings share it."""
    if not complete:
        return []
    keep = retention_keep(complete, keep_last, keep_best, best_metric, protect)
    newest = max(c.step for c in complete)
    doomed = [c.name for c in complete if c.name not in keep]
    doomed += [n for n in incomplete if (s := step_of(n)) is not None and s < newest and n not in keep]
    return sorted(doomed, key=lambda n: step_of(n) or 0)


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
    complete_names = {c.name for c in complete}
    incomplete = [c.name for c in root.iterdir() if c.is_dir() and step_of(c.name) is not None
                  and c.name not in complete_names] if root.is_dir() else []
    deleted = retention_plan(complete, incomplete, keep_last, keep_best, best_metric, protect)
    for name in deleted:
        delete_checkpoint(root / name)
    return deleted


def delete_checkpoint(ckpt_dir: str | os.PathLike[str]) -> None:
    """Remove the manifest first, so a crash mid-delete leaves an incomplete (ignored) folder."""
    ckpt_dir = Path(ckpt_dir)
    (ckpt_dir / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
