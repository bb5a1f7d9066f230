"""The manifest that makes a checkpoint complete: checksums, the ``latest`` pointer, folder checks.

A checkpoint is a folder ``checkpoint-<step>`` written by the HF Trainer. It counts only
once ``rljob-manifest.json`` lists every file with its size and MD5 — the manifest is
written last, atomically, after every rank has finished saving. Only then does the
``latest`` pointer move (also atomically). Anything without a manifest is incomplete and
ignored by resume and retention alike; a resume verifies checksums and falls back to the
previous complete checkpoint when one does not match.

The same layout and rules hold at every location (``rljob_trainer.checkpoints.locations``); for
object storage the manifest also records each file's expected S3 ETag (``etag``) for the multipart part
size the uploader uses, so a bucket listing alone verifies an upload.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """The hex MD5 of a file, read in ``chunk``-sized blocks."""
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
    """The step of a ``checkpoint-<step>`` name, or None for any other name."""
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


def info_from_manifest(data: dict[str, Any]) -> CheckpointInfo:
    """The :class:`CheckpointInfo` a parsed manifest describes (KeyError/TypeError when malformed)."""
    return CheckpointInfo(str(data["name"]), int(data["step"]), dict(data.get("metrics", {})), dict(data["files"]))


def read_manifest(ckpt_dir: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The manifest of a local checkpoint folder, or None when it has none (or an unreadable one)."""
    path = Path(ckpt_dir) / MANIFEST
    try:
        return info_from_manifest(json.loads(path.read_text(encoding="utf-8")))
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


def delete_checkpoint(ckpt_dir: str | os.PathLike[str]) -> None:
    """Remove the manifest first, so a crash mid-delete leaves an incomplete (ignored) folder."""
    ckpt_dir = Path(ckpt_dir)
    (ckpt_dir / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(ckpt_dir, ignore_errors=True)


def listing_problems(info: CheckpointInfo, objects: Mapping[str, tuple[int, str | None]]) -> list[str]:
    """Files of a manifest that are missing at a location, or whose size or ETag differ from it."""
    problems = []
    for rel, meta in sorted(info.files.items()):
        found = objects.get(rel)
        if found is None:
            problems.append(f"{rel}: missing")
            continue
        size, etag = found
        if size != meta["size"]:
            problems.append(f"{rel}: size {size} != {meta['size']}")
        elif etag is not None and meta.get("etag") and etag != meta["etag"]:
            problems.append(f"{rel}: ETag {etag} != {meta['etag']}")
    return problems
