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

Whatever is read back from storage is untrusted: anyone who can write the bucket (a shared mirror)
can write a manifest or ``latest``. :func:`parse_manifest` checks a manifest's types and sizes, that
every file name is a plain relative path (``rljob_trainer.storage.safe_relpath``) and that its name is
its folder's; anything else is an :class:`InvalidManifest`, i.e. a corrupt checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from rljob_contract.pod import format_validation_error

from rljob_trainer.checkpoints.etags import multipart_etag, s3_part_size
from rljob_trainer.storage import UnsafePath, safe_relpath

log = logging.getLogger("rljob.checkpoints")

MANIFEST = "rljob-manifest.json"
LATEST = "latest"
# ASCII digits only and at most 18 of them (``\d`` takes any Unicode digit, and int() refuses over
# 4300 digits), ``\Z`` as ``$`` also matches before a trailing newline.
CHECKPOINT_RE = re.compile(r"^checkpoint-([0-9]{1,18})\Z")

#: Bounds on what is read back from storage: far above what the HF Trainer writes, far below what
#: would exhaust a pod's memory.
MAX_MANIFEST_BYTES = 64 << 20
MAX_LATEST_BYTES = 1024
MAX_FILES = 100_000


class InvalidManifest(ValueError):
    """A manifest (or ``latest`` pointer) read back from storage that is not as rljob writes it: wrong
    types, a file name that would leave its folder, a name other than its folder's, too large. The
    checkpoint counts as corrupt: resume falls back to the previous complete one."""


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


def build_manifest(
    ckpt_dir: str | os.PathLike[str], step: int, metrics: dict[str, float], part_size: int | None = None,
    base_model: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The manifest of a checkpoint folder. With ``part_size`` (the uploader's multipart part size),
    each file also gets the ETag S3 will report for it, computed in the same read as the MD5.
    ``base_model``: for an adapter checkpoint, the identity of the model it was trained on, as the
    trainer knew it (:func:`rljob_trainer.checkpoints.export.base_identity`), not as a file says."""
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
    if base_model is not None:
        manifest["base_model"] = dict(base_model)
    return manifest


class _FileEntry(BaseModel):
    """One file of a manifest. Strict: a size of ``"1"`` or ``true`` is no size."""

    model_config = ConfigDict(strict=True, extra="allow")

    size: StrictInt = Field(ge=0, le=1 << 50)
    md5: str = Field(pattern=r"^[0-9a-f]{32}$")
    etag: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}(-[0-9]{1,5})?$")


class BaseModelIdentity(BaseModel):
    """The model an adapter checkpoint was trained on: the name or path the trainer loaded it from and,
    for a folder, the SHA-256 of its ``config.json``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name_or_path: str = Field(min_length=1, max_length=4096)
    config_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class _Manifest(BaseModel):
    """``rljob-manifest.json`` as :func:`build_manifest` writes it (unknown fields are allowed, so a
    newer trainer's additions do not make a checkpoint corrupt to an older one)."""

    model_config = ConfigDict(strict=True, extra="allow")

    format: Literal[1] = 1
    name: str = Field(pattern=CHECKPOINT_RE.pattern.replace("\\Z", "$"))
    step: StrictInt = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict, max_length=1000)
    files: dict[str, _FileEntry] = Field(max_length=MAX_FILES)
    part_size: StrictInt | None = Field(default=None, gt=0, le=5 << 30)
    created: float | None = None
    base_model: BaseModelIdentity | None = None

    @field_validator("files")
    @classmethod
    def _plain_paths(cls, files: dict[str, _FileEntry]) -> dict[str, _FileEntry]:
        for rel in files:
            try:
                safe_relpath(rel, "file name")
            except UnsafePath as e:
                raise ValueError(str(e)) from None
            if rel == MANIFEST:
                raise ValueError(f"file name {rel!r} is the manifest itself")
        return files

    @model_validator(mode="after")
    def _step_matches_name(self) -> _Manifest:
        if step_of(self.name) != self.step:
            raise ValueError(f"step {self.step} is not the step of name {self.name!r}")
        return self


def info_from_manifest(data: Any, folder: str | None = None) -> CheckpointInfo:
    """The :class:`CheckpointInfo` a parsed manifest describes, after checking it (:class:`_Manifest`)
    and, with ``folder``, that its name is the folder it was read from. Raises :class:`InvalidManifest`
    naming each bad field (a ValueError, as for unreadable JSON)."""
    try:
        m = _Manifest.model_validate(data)
    except ValidationError as e:
        raise InvalidManifest("; ".join(format_validation_error(e))) from None
    if folder is not None and m.name != folder:
        raise InvalidManifest(f"name: {m.name!r} is not the name of its folder {folder!r}")
    return CheckpointInfo(m.name, m.step, dict(m.metrics), dict(data["files"]))


def parse_manifest(body: bytes | str, folder: str | None = None) -> tuple[dict[str, Any], CheckpointInfo]:
    """(the raw manifest, its :class:`CheckpointInfo`) from a manifest's bytes read back from storage.
    Raises :class:`InvalidManifest` when it is too large, not JSON, or fails :func:`info_from_manifest`."""
    if len(body) > MAX_MANIFEST_BYTES:
        raise InvalidManifest(f"{MANIFEST} is {len(body)} bytes, more than {MAX_MANIFEST_BYTES}")
    try:
        data = json.loads(body)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidManifest(f"{MANIFEST} is not JSON: {e}") from None
    return data, info_from_manifest(data, folder)


def read_bounded(path: Path, limit: int) -> bytes:
    """A regular file's bytes, refusing links, FIFOs and devices (``/dev/zero`` behind a symlink would
    never end) and anything over ``limit`` bytes (:class:`InvalidManifest`). FileNotFoundError when
    absent."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidManifest(f"{path} is not a regular file")
        body = f.read(limit + 1)
    if len(body) > limit:
        raise InvalidManifest(f"{path} is larger than {limit} bytes")
    return body


def load_manifest(ckpt_dir: str | os.PathLike[str], name: str | None = None) -> tuple[dict[str, Any], CheckpointInfo]:
    """The manifest of a local checkpoint folder, which must name ``name`` (default: the folder's name).
    FileNotFoundError when there is none (an incomplete checkpoint); :class:`InvalidManifest` (or
    another OSError) when it cannot be trusted (a corrupt one)."""
    ckpt_dir = Path(ckpt_dir)
    try:
        body = read_bounded(ckpt_dir / MANIFEST, MAX_MANIFEST_BYTES)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise InvalidManifest(f"{ckpt_dir / MANIFEST} is a symbolic link") from None
        raise
    return parse_manifest(body, name or ckpt_dir.name)


def read_manifest(ckpt_dir: str | os.PathLike[str], name: str | None = None) -> CheckpointInfo | None:
    """The manifest of a local checkpoint folder, or None when it has none or one that cannot be
    trusted (:func:`load_manifest`)."""
    try:
        return load_manifest(ckpt_dir, name)[1]
    except (OSError, ValueError):
        return None


def parse_latest(body: bytes | None, where: str) -> str | None:
    """The checkpoint a ``latest`` pointer names, or None when there is none or it names anything but
    a ``checkpoint-<step>`` (``../x``, a path, junk): such a pointer is ignored with a warning."""
    if body is None:
        return None
    value = body[: MAX_LATEST_BYTES + 1].decode("utf-8", "replace").strip()
    if not value:
        return None
    if len(body) > MAX_LATEST_BYTES or step_of(value) is None:
        log.warning("%s: %r is not a checkpoint name; ignored", where, value[:100])
        return None
    return value


def verify_checkpoint(ckpt_dir: str | os.PathLike[str], name: str | None = None) -> list[str]:
    """Problems found comparing the folder with its manifest (empty when it is intact). The manifest
    must name ``name`` (default: the folder's name); a file reached through a symbolic link leading
    out of the folder is a problem, never read."""
    ckpt_dir = Path(ckpt_dir)
    try:
        info = load_manifest(ckpt_dir, name)[1]
    except FileNotFoundError:
        return [f"{ckpt_dir}: no {MANIFEST} (incomplete checkpoint)"]
    except (OSError, ValueError) as e:
        return [f"{ckpt_dir}: {MANIFEST} cannot be trusted: {e}"]
    problems = []
    base = ckpt_dir.resolve()
    for rel, meta in info.files.items():
        p = ckpt_dir / rel
        if not p.resolve().is_relative_to(base):
            problems.append(f"{p}: a symbolic link out of the checkpoint folder")
        elif not p.is_file():
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
    """Remove the manifest first, so a crash mid-delete leaves an incomplete (ignored) folder. A
    symbolic link in place of the folder is removed itself, never followed."""
    ckpt_dir = Path(ckpt_dir)
    if ckpt_dir.is_symlink():
        ckpt_dir.unlink()
        return
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
