"""Where checkpoints live: the layout and protocol shared by local folders and object storage.

A location (a local folder, or ``s3://bucket/prefix`` on any S3-compatible endpoint —
:mod:`rljob_trainer.checkpoints.s3`) holds::

    <prefix>/checkpoint-<step>/<file>...            the HF Trainer's files, copied first
    <prefix>/checkpoint-<step>/rljob-manifest.json  written only once every file is verified
    <prefix>/latest                                 "checkpoint-<step>\\n", one write after the manifest

A checkpoint is complete only when its manifest exists; everyone (resume, retention, the CLI)
lists manifests and ignores folders without one. The manifest gives each file's ``size``,
``md5`` and (for object storage) ``etag`` — the ETag S3 reports for the multipart ``part_size``
the uploader used — so a bucket listing verifies an upload without downloading it, and a download
is verified by MD5. Deleting goes manifest first, so a crash mid-delete leaves an incomplete
(ignored) checkpoint.

What a location holds is untrusted input (anyone who can write a shared bucket or mirror folder
wrote it): a manifest that fails :func:`~rljob_trainer.checkpoints.manifest.parse_manifest` makes its
checkpoint corrupt (:attr:`Listing.corrupt`; resume falls back past it with a warning), a ``latest``
that names no checkpoint is ignored, and every file a download or copy writes is checked to stay
under its destination (:func:`~rljob_trainer.storage.path_under`), symbolic links included.

The folder the HF Trainer saves into is a :class:`LocalLocation` too: sealing a checkpoint is
publishing it there in place (:func:`seal_checkpoint`), and its retention is the same
:meth:`Location.apply_retention` every other location uses.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rljob_trainer.checkpoints.manifest import (
    LATEST,
    MANIFEST,
    MAX_LATEST_BYTES,
    CheckpointInfo,
    InvalidManifest,
    atomic_write_text,
    build_manifest,
    delete_checkpoint,
    file_md5,
    listing_problems,
    load_manifest,
    parse_latest,
    read_bounded,
    read_manifest,
    step_of,
    verify_checkpoint,
)
from rljob_trainer.checkpoints.retention import RetentionPolicy, retention_plan
from rljob_trainer.storage import PERMANENT_CODES, UnsafePath, error_code, is_permanent, path_under

log = logging.getLogger("rljob.checkpoints")

ACCESS_PROBE = ".rljob-access-check"


class StorageError(Exception):
    """An operation on a location failed. ``permanent`` when retrying cannot help (denied, no bucket)."""

    def __init__(self, code: str, uri: str, detail: str = "") -> None:
        super().__init__(f"{code} on {uri}" + (f": {detail}" if detail else ""))
        self.code = code
        self.uri = uri
        self.permanent = code in PERMANENT_CODES or code in {"PermissionDenied", "ReadOnlyFilesystem"}


class CorruptCheckpoint(Exception):
    """A checkpoint's files do not match its manifest."""

    def __init__(self, where: str, problems: list[str]) -> None:
        super().__init__(f"{where}: " + "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)"
                                                                   if len(problems) > 3 else ""))
        self.problems = problems


@contextlib.contextmanager
def storage_errors(uri: str) -> Iterator[None]:
    """Turn boto/OS errors into :class:`StorageError` naming the code and the location."""
    try:
        yield
    except (StorageError, CorruptCheckpoint):
        raise
    except PermissionError as e:
        raise StorageError("PermissionDenied", uri, str(e)) from e
    except OSError as e:
        raise StorageError("ReadOnlyFilesystem" if e.errno == errno.EROFS else type(e).__name__, uri, str(e)) from e
    except Exception as e:
        detail = "" if is_permanent(e) else str(e)
        raise StorageError(error_code(e), uri, detail) from e


@dataclass
class Listing:
    """What one location holds: each checkpoint's objects (relative path → (size, etag)), the
    complete ones with their manifests (oldest first), where ``latest`` points, and the checkpoints
    whose manifest cannot be trusted (name → why; they count as incomplete, and resume warns)."""

    objects: dict[str, dict[str, tuple[int, str | None]]] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    complete: list[CheckpointInfo] = field(default_factory=list)
    latest: str | None = None
    corrupt: dict[str, str] = field(default_factory=dict)

    def incomplete(self) -> list[str]:
        done = {c.name for c in self.complete}
        return sorted((n for n in self.objects if n not in done), key=lambda n: step_of(n) or 0)

    def without(self, names: list[str]) -> Listing:
        gone = set(names)
        return Listing(
            {n: o for n, o in self.objects.items() if n not in gone},
            {n: m for n, m in self.manifests.items() if n not in gone},
            [c for c in self.complete if c.name not in gone],
            self.latest,
            {n: why for n, why in self.corrupt.items() if n not in gone},
        )


class Location:
    """Where complete checkpoints are kept. Subclasses move bytes; the protocol lives here."""

    uri: str
    where: str

    def warm_up(self) -> None:
        """Get ready to move bytes (a client built) before the first checkpoint's clock; never raises."""

    def check_access(self) -> None:
        """Fail with :class:`StorageError` unless this location can be listed and written."""
        raise NotImplementedError

    def listing(self) -> Listing:
        """What this location holds now."""
        raise NotImplementedError

    def upload(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        """Copy the files, verify them, then write the manifest (making the copy complete)."""
        raise NotImplementedError

    def set_latest(self, name: str) -> None:
        """Point ``latest`` at ``name`` (one atomic write)."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Delete a checkpoint, manifest first (a crash mid-delete leaves an ignored, incomplete one)."""
        raise NotImplementedError

    def download(self, info: CheckpointInfo, dest: Path) -> None:
        """Copy a checkpoint's files (not its manifest) into ``dest``."""
        raise NotImplementedError

    def download_file(self, dest: Path) -> None:
        """Copy the one object this location names (a dataset file) to ``dest``; a PermanentError naming
        ``where`` when it cannot. Only remote locations are asked: a folder is read where it is."""
        raise NotImplementedError(f"{type(self).__name__}.download_file")

    def download_folder(self, dest: Path) -> None:
        """Copy every object under this location (a model's files) into ``dest``, each name checked to stay
        under it; a PermanentError naming ``where`` when it cannot. Only remote locations are asked."""
        raise NotImplementedError(f"{type(self).__name__}.download_folder")

    def verify(self, info: CheckpointInfo, listing: Listing) -> list[str]:
        """Problems of a stored checkpoint against its manifest, as cheaply as the location allows."""
        return listing_problems(info, listing.objects.get(info.name, {}))

    def put_small(self, rel: str, body: bytes) -> str:
        """Write a small file (a run record) at ``rel`` under this location in one atomic write; its URI."""
        raise NotImplementedError(f"{type(self).__name__}.put_small")

    def small_files(self, matches: Callable[[str], bool], limit: int, most: int) -> Iterator[tuple[str, bytes | None]]:
        """(URI, bytes) of every file under this location, at any depth, whose relative path ``matches``: at most
        ``most`` of them (the last by path), each read only up to ``limit`` + 1 bytes (None when it vanished)."""
        raise NotImplementedError(f"{type(self).__name__}.small_files")

    def child_uri(self, name: str) -> str:
        """The URI (or path) of checkpoint ``name`` at this location."""
        return f"{self.uri.rstrip('/')}/{name}"

    def publish(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        """Make ``local_dir`` a complete checkpoint here: files, verification, manifest, then ``latest``."""
        self.upload(local_dir, manifest)
        self.set_latest(manifest["name"])

    def apply_retention(
        self,
        policy: RetentionPolicy,
        protect: set[str] | None = None,
        *,
        dry_run: bool = False,
        on_delete: Callable[[str], None] | None = None,
    ) -> tuple[list[str], Listing]:
        """Delete what ``policy`` does not keep (:func:`retention_plan`; ``protect`` names are kept too).

        The one place retention is applied, whatever the location: the trainer's folder, a bucket, a
        mirror, ``rljob checkpoints prune``. ``on_delete`` is called with each name before it is deleted
        (or, with ``dry_run``, instead of deleting it). Returns (the names deleted — or that would be —,
        the listing after)."""
        listing = self.listing()
        doomed = retention_plan(listing.complete, listing.incomplete(), policy.keep_last, policy.keep_best,
                                policy.best_metric, protect)
        for name in doomed:
            if on_delete is not None:
                on_delete(name)
            if not dry_run:
                self.delete(name)
        return doomed, listing.without(doomed)

    def fetch(self, info: CheckpointInfo, listing: Listing, dest_root: Path) -> Path:
        """A verified local copy of a complete checkpoint under ``dest_root`` (reused when one is there)."""
        problems = self.verify(info, listing)
        if problems:
            raise CorruptCheckpoint(self.child_uri(info.name), problems)
        manifest = listing.manifests.get(info.name)
        if manifest is None or step_of(info.name) is None:  # a CheckpointInfo this listing did not check
            raise CorruptCheckpoint(self.child_uri(info.name), [f"no checked {MANIFEST} in this listing"])
        target = dest_root / info.name
        cached = read_manifest(target)
        if cached is not None and cached.files == info.files and not target.is_symlink() and not verify_checkpoint(target):
            return target
        tmp = dest_root / f".fetch-{info.name}"
        _remove(tmp)
        tmp.mkdir(parents=True)
        try:
            self.download(info, tmp)
            atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            problems = verify_checkpoint(tmp, info.name)
            if problems:
                raise CorruptCheckpoint(self.child_uri(info.name), [p.replace(str(tmp) + "/", "") for p in problems])
            _remove(target)
            os.replace(tmp, target)
        finally:
            _remove(tmp)
        return target


def _remove(path: Path) -> None:
    """Remove a folder, file or symbolic link (the link itself, never what it points at); quietly."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def download_target(dest: Path, rel: str, uri: str) -> Path:
    """Where a download writes file ``rel`` of a checkpoint: ``dest / rel``, its folders created, once
    checked to stay under ``dest`` (:func:`~rljob_trainer.storage.path_under`, before and after creating
    them). A name that would leave it makes the checkpoint at ``uri`` corrupt."""
    try:
        target = path_under(dest, rel, "file name")
        target.parent.mkdir(parents=True, exist_ok=True)
        return path_under(dest, rel, "file name")
    except UnsafePath as e:
        raise CorruptCheckpoint(uri, [f"{e} (not written under {dest})"]) from None


def _files(folder: Path) -> dict[str, tuple[int, str | None]]:
    """Relative path → (size, None) of the files under ``folder``; ones deleted meanwhile are skipped
    (``os.walk`` already skips folders that vanish)."""
    found: dict[str, tuple[int, str | None]] = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                if stat.S_ISREG(st.st_mode):
                    found[path.relative_to(folder).as_posix()] = (st.st_size, None)
    return found


class LocalLocation(Location):
    """A folder (a mounted volume, another disk): same layout, files copied and MD5-verified."""

    def __init__(self, path: str | os.PathLike[str], *, where: str = "spec.checkpoint.storage") -> None:
        self.root = Path(path)
        self.uri = str(self.root)
        self.where = where

    def check_access(self) -> None:
        with storage_errors(self.uri):
            self.root.mkdir(parents=True, exist_ok=True)
            # One probe per node and process: on a shared folder (a ReadWriteMany claim) every worker pod
            # checks at once, and a common name would let one pod delete another's probe mid-check.
            probe = self.root / f"{ACCESS_PROBE}-{socket.gethostname()}-{os.getpid()}"
            probe.write_text("rljob\n")
            probe.unlink()

    def listing(self) -> Listing:
        """What the folder holds. A file or folder vanishing while it is listed (a save or a delete in
        progress: the trainer lists its own folder while it writes there) is left out, not an error."""
        out = Listing()
        if not self.root.is_dir():
            return out
        with storage_errors(self.uri):
            out.latest = self._latest()  # first, as for S3Location.listing
            for child in self.root.iterdir():
                if step_of(child.name) is None or not child.is_dir():
                    continue
                out.objects[child.name] = _files(child)
                try:
                    if child.is_symlink():  # its files would be read (and deleted) wherever it points
                        raise InvalidManifest(f"{child} is a symbolic link")
                    data, info = load_manifest(child)
                except FileNotFoundError:
                    continue  # no manifest: incomplete
                except (OSError, ValueError) as e:
                    log.warning("checkpoint %s: manifest cannot be trusted (%s); treated as corrupt", child, e)
                    out.corrupt[child.name] = str(e)
                    continue
                out.complete.append(info)
                out.manifests[info.name] = data
        out.complete.sort(key=lambda c: c.step)
        return out

    def _latest(self) -> str | None:
        try:
            body = read_bounded(self.root / LATEST, MAX_LATEST_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("%s: ignored (%s)", self.root / LATEST, e)
            return None
        return parse_latest(body, str(self.root / LATEST))

    def verify(self, info: CheckpointInfo, listing: Listing) -> list[str]:
        return [p.replace(str(self.root / info.name) + "/", "") for p in verify_checkpoint(self.root / info.name)]

    def put_small(self, rel: str, body: bytes) -> str:
        target = self.root / rel
        with storage_errors(self.uri):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(body)
            os.replace(tmp, target)
        return str(target)

    def small_files(self, matches: Callable[[str], bool], limit: int, most: int) -> Iterator[tuple[str, bytes | None]]:
        if not self.root.is_dir():
            return
        with storage_errors(self.uri):
            found = sorted(p for p in self.root.rglob("*.json")
                           if not p.is_symlink() and matches(p.relative_to(self.root).as_posix()))
        for path in found[-most:]:
            try:
                with path.open("rb") as f:
                    yield str(path), f.read(limit + 1)
            except FileNotFoundError:
                yield str(path), None

    def upload(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        """Copy and MD5-verify the files, then write the manifest. When ``local_dir`` already is the
        checkpoint's place here (the folder the HF Trainer saved into), only the manifest is written:
        it was just computed from those very files, which is what sealing a checkpoint means."""
        name = manifest["name"]
        target = self.root / name
        with storage_errors(str(target)):
            if Path(local_dir).resolve() == target.resolve():
                atomic_write_text(target / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
                return
            self.delete(name)
            for rel in manifest["files"]:  # checked from the root: a link planted as the folder is caught
                shutil.copyfile(local_dir / rel, download_target(self.root, f"{name}/{rel}", str(target)))
            for rel, meta in manifest["files"].items():
                if file_md5(target / rel) != meta["md5"]:
                    raise StorageError("VerificationFailed", str(target / rel), "md5 mismatch after copy")
            atomic_write_text(target / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))

    def set_latest(self, name: str) -> None:
        with storage_errors(self.uri):
            atomic_write_text(self.root / LATEST, name + "\n")

    def delete(self, name: str) -> None:
        with storage_errors(self.child_uri(name)):
            delete_checkpoint(self.root / name)

    def download(self, info: CheckpointInfo, dest: Path) -> None:
        """Copy the files, each read from under this checkpoint's folder (a symbolic link leading out
        of it is refused) and written under ``dest``."""
        uri = self.child_uri(info.name)
        with storage_errors(uri):
            for rel in info.files:
                try:
                    src = path_under(self.root / info.name, rel, "file name")
                except UnsafePath as e:
                    raise CorruptCheckpoint(uri, [str(e)]) from None
                shutil.copyfile(src, download_target(dest, rel, uri))

    def fetch(self, info: CheckpointInfo, listing: Listing, dest_root: Path) -> Path:
        if dest_root.resolve() == self.root.resolve():  # the trainer's own folder: verify in place
            problems = self.verify(info, listing)
            if problems:
                raise CorruptCheckpoint(self.child_uri(info.name), problems)
            return self.root / info.name
        return super().fetch(info, listing, dest_root)


def seal_checkpoint(
    ckpt_dir: str | os.PathLike[str], step: int, metrics: dict[str, float], part_size: int | None = None
) -> CheckpointInfo:
    """Make a folder the HF Trainer saved complete where it is: publish it in place to the folder
    holding it (manifest, then ``latest``). With ``part_size``, the manifest also gets each file's
    expected S3 ETag, computed in the same read as the MD5."""
    ckpt_dir = Path(ckpt_dir)
    manifest = build_manifest(ckpt_dir, step, metrics, part_size)
    LocalLocation(ckpt_dir.parent).publish(ckpt_dir, manifest)
    return CheckpointInfo(ckpt_dir.name, step, metrics, manifest["files"])
