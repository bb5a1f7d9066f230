"""What ``rljob checkpoints`` needs beyond the locations: URIs naming one checkpoint, and file-by-file
comparison of a stored checkpoint with its manifest and a local copy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rljob_contract.plugins.storage import is_bare_scheme

from rljob_trainer.checkpoints.etags import s3_part_size
from rljob_trainer.checkpoints.locations import Listing, Location
from rljob_trainer.checkpoints.manifest import MANIFEST, CheckpointInfo, file_digests, step_of


def split_checkpoint_uri(uri: str) -> tuple[str, str | None]:
    """``…/prefix`` → (``…/prefix``, None); ``…/prefix/checkpoint-40`` → (``…/prefix``, ``checkpoint-40``)."""
    uri = uri.rstrip("/")
    parent, _, last = uri.rpartition("/")
    if step_of(last) is not None and parent and not is_bare_scheme(parent):
        return parent, last
    return uri, None


@dataclass(frozen=True)
class FileCheck:
    """One file of a checkpoint compared across manifest, stored copy and (optionally) a local copy."""

    checkpoint: str
    file: str
    ok: bool
    detail: str


def compare_checkpoint(
    loc: Location, listing: Listing, info: CheckpointInfo, local_dir: Path | None = None
) -> list[FileCheck]:
    """File by file: the stored copy against its manifest (size, ETag or MD5) and, with ``local_dir``,
    the local copy's size, MD5 and expected ETag against the manifest and the stored object."""
    stored = {p.split(": ", 1)[0]: p.split(": ", 1)[1] for p in loc.verify(info, listing) if ": " in p}
    objects = listing.objects.get(info.name, {})
    part_size = listing.manifests.get(info.name, {}).get("part_size")
    checks = []
    for rel, meta in sorted(info.files.items()):
        problems = [f"stored copy: {stored[rel]}"] if rel in stored else []
        detail = f"size {meta['size']} md5 {meta['md5']}"
        if local_dir is not None:
            path = local_dir / rel
            if not path.is_file():
                problems.append("local copy: missing")
            elif path.stat().st_size != meta["size"]:
                problems.append(f"local copy: size {path.stat().st_size} != {meta['size']}")
            else:
                part = s3_part_size(part_size, meta["size"]) if part_size else None
                md5, etag = file_digests(path, part)
                remote_etag = objects.get(rel, (0, None))[1]
                if md5 != meta["md5"]:
                    problems.append(f"local md5 {md5} != manifest {meta['md5']}")
                elif remote_etag is not None and part_size and etag != remote_etag:
                    problems.append(f"local ETag {etag} != stored {remote_etag}")
        checks.append(FileCheck(info.name, rel, not problems, "; ".join(problems) or detail))
    if local_dir is not None and local_dir.is_dir():
        for p in sorted(local_dir.rglob("*")):
            rel = p.relative_to(local_dir).as_posix()
            if p.is_file() and rel not in info.files and p.name != MANIFEST and not p.name.startswith("."):
                checks.append(FileCheck(info.name, rel, False, "local file not in the manifest"))
    return checks
