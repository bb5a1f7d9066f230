"""Where checkpoints live: the layout and protocol shared by object storage and local folders.

A location (``s3://bucket/prefix`` on any S3-compatible endpoint, or a local folder) holds::

    <prefix>/checkpoint-<step>/<file>...            the HF Trainer's files, uploaded first
    <prefix>/checkpoint-<step>/rljob-manifest.json  written only once every file is verified
    <prefix>/latest                                 "checkpoint-<step>\\n", one PUT after the manifest

A checkpoint is complete only when its manifest exists; everyone (resume, retention, the CLI)
lists manifests and ignores folders without one. The manifest gives each file's ``size``,
``md5`` and ``etag`` — the ETag S3 reports for the multipart ``part_size`` the uploader used —
so a bucket listing verifies an upload without downloading it, and a download is verified by MD5.
Deleting goes manifest first, so a crash mid-delete leaves an incomplete (ignored) checkpoint.

Who uses it: rank 0's background uploader (``rljob_trainer.checkpoint_upload``), the launcher's
pre-flight and resume (``rljob_trainer.checkpoint_resume``), and ``rljob checkpoints``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rljob_trainer import checkpoints as ck
from rljob_trainer.checkpoints import LATEST, MANIFEST, CheckpointInfo, step_of
from rljob_trainer.storage import (
    PERMANENT_CODES,
    credentials_from_env,
    error_code,
    is_permanent,
    s3_client,
    split_s3,
)

log = logging.getLogger("rljob.checkpoints")

MiB = 1 << 20
#: ``envFrom`` prefix under which the operator exposes mirror ``i``'s credentialsSecret.
MIRROR_ENV_PREFIX = "RLJOB_MIRROR{index}_"
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
def _storage_errors(uri: str) -> Iterator[None]:
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


@dataclass(frozen=True)
class TransferSettings:
    """How uploads and downloads use boto3's transfer manager."""

    part_size: int = 16 * MiB
    concurrency: int = 10

    def config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        # The classic (pure-Python) client, so part sizes — and so ETags — are the ones we predict.
        return TransferConfig(
            multipart_threshold=self.part_size,
            multipart_chunksize=self.part_size,
            max_concurrency=self.concurrency,
            use_threads=True,
            preferred_transfer_client="classic",
        )


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int
    keep_best: int = 0
    best_metric: str = "reward"


@dataclass
class Listing:
    """What one location holds: each checkpoint's objects (relative path → (size, etag)), the
    complete ones with their manifests (oldest first), and where ``latest`` points."""

    objects: dict[str, dict[str, tuple[int, str | None]]] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    complete: list[CheckpointInfo] = field(default_factory=list)
    latest: str | None = None

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
        )


def info_from_manifest(data: dict[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(str(data["name"]), int(data["step"]), dict(data.get("metrics", {})), dict(data["files"]))


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


def etag_is_opaque(head: Mapping[str, Any]) -> bool:
    """Whether a HeadObject response describes an object whose ETag is not an MD5 of its bytes."""
    return str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or bool(head.get("SSECustomerAlgorithm"))


def best_of(complete: list[CheckpointInfo], metric: str) -> CheckpointInfo | None:
    scored = [c for c in complete if metric in c.metrics]
    return max(scored, key=lambda c: (c.metrics[metric], c.step)) if scored else None


class Location:
    """Where complete checkpoints are kept. Subclasses move bytes; the protocol lives here."""

    uri: str
    where: str

    def check_access(self) -> None:
        raise NotImplementedError

    def listing(self) -> Listing:
        raise NotImplementedError

    def upload(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        """Copy the files, verify them, then write the manifest (making the copy complete)."""
        raise NotImplementedError

    def set_latest(self, name: str) -> None:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Delete a checkpoint, manifest first (a crash mid-delete leaves an ignored, incomplete one)."""
        raise NotImplementedError

    def download(self, info: CheckpointInfo, dest: Path) -> None:
        raise NotImplementedError

    def verify(self, info: CheckpointInfo, listing: Listing) -> list[str]:
        """Problems of a stored checkpoint against its manifest, as cheaply as the location allows."""
        return listing_problems(info, listing.objects.get(info.name, {}))

    def child_uri(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"

    def publish(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        self.upload(local_dir, manifest)
        self.set_latest(manifest["name"])

    def apply_retention(self, policy: RetentionPolicy, protect: set[str] | None = None) -> tuple[list[str], Listing]:
        """Delete what the policy does not keep; returns (deleted names, the listing after)."""
        listing = self.listing()
        doomed = ck.retention_plan(listing.complete, listing.incomplete(), policy.keep_last, policy.keep_best,
                                   policy.best_metric, protect)
        for name in doomed:
            self.delete(name)
        return doomed, listing.without(doomed)

    def fetch(self, info: CheckpointInfo, listing: Listing, dest_root: Path) -> Path:
        """A verified local copy of a complete checkpoint under ``dest_root`` (reused when one is there)."""
        problems = self.verify(info, listing)
        if problems:
            raise CorruptCheckpoint(self.child_uri(info.name), problems)
        target = dest_root / info.name
        cached = ck.read_manifest(target)
        if cached is not None and cached.files == info.files and not ck.verify_checkpoint(target):
            return target
        tmp = dest_root / f".fetch-{info.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            self.download(info, tmp)
            ck.atomic_write_text(tmp / MANIFEST, json.dumps(listing.manifests[info.name], indent=1, sort_keys=True))
            problems = ck.verify_checkpoint(tmp)
            if problems:
                raise CorruptCheckpoint(self.child_uri(info.name), [p.replace(str(tmp) + "/", "") for p in problems])
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target


class S3Location(Location):
    """A prefix in a bucket on any S3-compatible endpoint, spoken to through boto3."""

    def __init__(
        self,
        uri: str,
        *,
        where: str = "spec.checkpoint.storage",
        endpoint_url: str | None = None,
        region: str | None = None,
        credentials: dict[str, str] | None = None,
        transfer: TransferSettings | None = None,
        max_attempts: int = 3,
    ) -> None:
        self.bucket, prefix = split_s3(uri)
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.where = where
        self.endpoint_url = endpoint_url
        self.region = region
        self.credentials = credentials
        self.transfer = transfer or TransferSettings()
        self.max_attempts = max_attempts
        self._client: Any = None
        self._lock = threading.Lock()
        self._manifest_cache: dict[tuple[str, str | None], bytes] = {}  # (name, manifest ETag) → body

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = s3_client(
                    self.endpoint_url, self.region, credentials=self.credentials, max_attempts=self.max_attempts,
                    connect_timeout=5, max_pool_connections=self.transfer.concurrency + 2,
                )
            return self._client

    def key(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts]) if self.prefix else "/".join(parts)

    def _keys(self, prefix: str) -> Iterator[dict[str, Any]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            yield from page.get("Contents", [])

    def _root(self) -> str:
        return self.prefix + "/" if self.prefix else ""

    def check_access(self) -> None:
        """List, write and delete a probe object: a denied or missing bucket fails here, before training."""
        with _storage_errors(self.uri):
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._root(), MaxKeys=1)
            self.client.put_object(Bucket=self.bucket, Key=self.key(ACCESS_PROBE), Body=b"rljob\n")
        try:
            with _storage_errors(self.uri):
                self.client.delete_object(Bucket=self.bucket, Key=self.key(ACCESS_PROBE))
        except StorageError as e:
            log.warning("checkpoint storage %s: cannot delete objects (%s); retention will fail there", self.uri, e)

    def listing(self) -> Listing:
        out = Listing()
        root = self._root()
        with _storage_errors(self.uri):
            # `latest` first: it only ever names a checkpoint whose manifest was written before it,
            # so the object listing that follows contains that checkpoint. (Read last, it could name
            # one completed after the listing, which would then look incomplete.)
            latest = self._get(self.key(LATEST))
            if latest is not None:
                out.latest = latest.decode("utf-8", "replace").strip() or None
            for obj in self._keys(root):
                rel = obj["Key"][len(root):]
                if rel == LATEST:
                    continue
                name, _, rest = rel.partition("/")
                if step_of(name) is not None and rest:
                    out.objects.setdefault(name, {})[rest] = (int(obj["Size"]), str(obj["ETag"]).strip('"'))
            for name, files in out.objects.items():
                body = self._manifest_body(name, files[MANIFEST][1]) if MANIFEST in files else None
                if body is None:  # no manifest, or deleted (by retention) since the listing: incomplete
                    continue
                try:
                    data = json.loads(body)
                    out.complete.append(info_from_manifest(data))
                    out.manifests[name] = data
                except (ValueError, KeyError, TypeError) as e:
                    log.warning("checkpoint %s: unreadable manifest (%s); treated as incomplete", self.child_uri(name), e)
        out.complete.sort(key=lambda c: c.step)
        return out

    def _manifest_body(self, name: str, etag: str | None) -> bytes | None:
        """A manifest's bytes; unchanged manifests (same ETag) are not fetched again."""
        cached = self._manifest_cache.get((name, etag))
        if cached is None:
            cached = self._get(self.key(name, MANIFEST))
            if cached is not None and len(self._manifest_cache) < 10_000:
                self._manifest_cache[(name, etag)] = cached
        return cached

    def _get(self, key: str) -> bytes | None:
        """An object's bytes, or None when it does not exist (any more)."""
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except Exception as e:
            if error_code(e) in ("NoSuchKey", "404"):
                return None
            raise

    def _objects(self, name: str) -> dict[str, tuple[int, str | None]]:
        prefix = self.key(name) + "/"
        return {o["Key"][len(prefix):]: (int(o["Size"]), str(o["ETag"]).strip('"')) for o in self._keys(prefix)}

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if resp.get("Errors"):
                err = resp["Errors"][0]
                raise StorageError(err.get("Code", "DeleteFailed"), f"s3://{self.bucket}/{err.get('Key')}",
                                   err.get("Message", ""))

    def delete(self, name: str) -> None:
        with _storage_errors(self.child_uri(name)):
            existing = self._objects(name)
            if MANIFEST in existing:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(name, MANIFEST))
            self._delete_keys([self.key(name, rel) for rel in existing if rel != MANIFEST])

    def upload(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        from boto3.s3.transfer import create_transfer_manager

        name = manifest["name"]
        target = self.child_uri(name)
        with _storage_errors(target):
            if self._objects(name):  # a stale or partial copy: its manifest goes first
                self.delete(name)
            with create_transfer_manager(self.client, self.transfer.config()) as tm:
                futures = [tm.upload(str(local_dir / rel), self.bucket, self.key(name, rel)) for rel in manifest["files"]]
                for f in futures:
                    f.result()
            objects = self._objects(name)
            manifest = self._without_opaque_etags(name, manifest, objects)
            problems = listing_problems(info_from_manifest(manifest), objects)
            if problems:
                raise StorageError("VerificationFailed", target, "; ".join(problems[:3]))
            self.client.put_object(Bucket=self.bucket, Key=self.key(name, MANIFEST),
                                   Body=json.dumps(manifest, indent=1, sort_keys=True).encode(),
                                   ContentType="application/json")

    def _without_opaque_etags(
        self, name: str, manifest: dict[str, Any], objects: Mapping[str, tuple[int, str | None]]
    ) -> dict[str, Any]:
        """Under SSE-KMS or SSE-C an ETag is not an MD5. For such objects, size and the checksum the
        server validated on upload (botocore sends one with every request) stand in for it, and this
        location's manifest records no ETag; downloads are still verified by MD5."""
        opaque = []
        for rel, meta in manifest["files"].items():
            found = objects.get(rel)
            if found and meta.get("etag") and found[1] != meta["etag"] and found[0] == meta["size"]:
                head = self.client.head_object(Bucket=self.bucket, Key=self.key(name, rel))
                if etag_is_opaque(head):
                    opaque.append(rel)
        if not opaque:
            return manifest
        files = {rel: ({k: v for k, v in meta.items() if k != "etag"} if rel in opaque else meta)
                 for rel, meta in manifest["files"].items()}
        return {**manifest, "files": files}

    def set_latest(self, name: str) -> None:
        with _storage_errors(self.uri):
            self.client.put_object(Bucket=self.bucket, Key=self.key(LATEST), Body=f"{name}\n".encode(),
                                   ContentType="text/plain")

    def download(self, info: CheckpointInfo, dest: Path) -> None:
        from boto3.s3.transfer import create_transfer_manager

        with _storage_errors(self.child_uri(info.name)), create_transfer_manager(
            self.client, self.transfer.config()
        ) as tm:
            futures = []
            for rel in info.files:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                futures.append(tm.download(self.bucket, self.key(info.name, rel), str(dest / rel)))
            for f in futures:
                f.result()


class LocalLocation(Location):
    """A folder (a mounted volume, another disk): same layout, files copied and MD5-verified."""

    def __init__(self, path: str | os.PathLike[str], *, where: str = "spec.checkpoint.storage") -> None:
        self.root = Path(path)
        self.uri = str(self.root)
        self.where = where

    def check_access(self) -> None:
        with _storage_errors(self.uri):
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / ACCESS_PROBE
            probe.write_text("rljob\n")
            probe.unlink()

    def listing(self) -> Listing:
        out = Listing()
        if not self.root.is_dir():
            return out
        with _storage_errors(self.uri):
            latest = self.root / LATEST  # first, as for S3Location.listing
            if latest.exists():
                out.latest = latest.read_text(encoding="utf-8").strip() or None
            for child in self.root.iterdir():
                if child.is_dir() and step_of(child.name) is not None:
                    out.objects[child.name] = {p.relative_to(child).as_posix(): (p.stat().st_size, None)
                                               for p in child.rglob("*") if p.is_file()}
            out.complete = ck.complete_checkpoints(self.root)
            for info in out.complete:
                out.manifests[info.name] = json.loads((self.root / info.name / MANIFEST).read_text(encoding="utf-8"))
        return out

    def verify(self, info: CheckpointInfo, listing: Listing) -> list[str]:
        return [p.replace(str(self.root / info.name) + "/", "") for p in ck.verify_checkpoint(self.root / info.name)]

    def upload(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        name = manifest["name"]
        target = self.root / name
        with _storage_errors(str(target)):
            self.delete(name)
            for rel in manifest["files"]:
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local_dir / rel, target / rel)
            for rel, meta in manifest["files"].items():
                if ck.file_md5(target / rel) != meta["md5"]:
                    raise StorageError("VerificationFailed", str(target / rel), "md5 mismatch after copy")
            ck.atomic_write_text(target / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))

    def set_latest(self, name: str) -> None:
        with _storage_errors(self.uri):
            ck.atomic_write_text(self.root / LATEST, name + "\n")

    def delete(self, name: str) -> None:
        with _storage_errors(self.child_uri(name)):
            ck.delete_checkpoint(self.root / name)

    def download(self, info: CheckpointInfo, dest: Path) -> None:
        with _storage_errors(self.child_uri(info.name)):
            for rel in info.files:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.root / info.name / rel, dest / rel)

    def fetch(self, info: CheckpointInfo, listing: Listing, dest_root: Path) -> Path:
        if dest_root.resolve() == self.root.resolve():  # the trainer's own folder: verify in place
            problems = self.verify(info, listing)
            if problems:
                raise CorruptCheckpoint(self.child_uri(info.name), problems)
            return self.root / info.name
        return super().fetch(info, listing, dest_root)


def location_for(
    uri: str,
    *,
    where: str = "spec.checkpoint.storage",
    endpoint_url: str | None = None,
    region: str | None = None,
    credentials: dict[str, str] | None = None,
    transfer: TransferSettings | None = None,
) -> Location:
    if uri.startswith("s3://"):
        return S3Location(uri, where=where, endpoint_url=endpoint_url, region=region, credentials=credentials,
                          transfer=transfer)
    return LocalLocation(uri, where=where)


@dataclass
class StoragePlan:
    """Where a run's checkpoints go: the primary, the mirrors, and the folder the HF Trainer writes to
    (a staging folder when the primary is remote, the primary itself when it is a local path)."""

    primary: Location
    mirrors: list[Location]
    local_root: Path
    transfer: TransferSettings

    @property
    def remote_primary(self) -> bool:
        return isinstance(self.primary, S3Location)

    @property
    def locations(self) -> list[Location]:
        return [self.primary, *self.mirrors]

    @property
    def publish_to(self) -> list[Location]:
        """Where rank 0's background publisher copies each checkpoint (a local primary is sealed in place)."""
        return self.locations if self.remote_primary else self.mirrors

    @property
    def managed(self) -> bool:
        """Whether object storage or mirrors are involved (else the plain local behaviour applies)."""
        return self.remote_primary or bool(self.mirrors)


def storage_plan(cfg: Any, environ: Mapping[str, str] | None = None) -> StoragePlan:
    from rljob_trainer.storage import local_staging_dir

    spec = cfg.checkpoint
    transfer = TransferSettings(part_size=spec.part_size_mib * MiB, concurrency=spec.upload_concurrency)
    location = cfg.checkpoint_location()
    primary = location_for(location, endpoint_url=spec.endpoint_url, region=spec.region, transfer=transfer)
    mirrors = []
    for i, m in enumerate(spec.mirrors):
        creds = credentials_from_env(MIRROR_ENV_PREFIX.format(index=i), environ) if m.credentials_secret else None
        if m.credentials_secret and creds is None:
            log.warning("mirror %s: credentialsSecret %s is not exposed as %sAWS_* in the environment; using the "
                        "default credentials", m.location, m.credentials_secret, MIRROR_ENV_PREFIX.format(index=i))
        mirrors.append(location_for(
            m.location, where=f"spec.checkpoint.mirrors[{i}].location",
            endpoint_url=m.endpoint_url or (spec.endpoint_url if m.location.startswith("s3://") else None),
            region=m.region or spec.region, credentials=creds, transfer=transfer,
        ))
    local_root = Path(local_staging_dir(cfg)) if location.startswith("s3://") else Path(location)
    return StoragePlan(primary, mirrors, local_root, transfer)


# --- the `rljob checkpoints` commands ---------------------------------------------------------


def split_checkpoint_uri(uri: str) -> tuple[str, str | None]:
    """``…/prefix`` → (``…/prefix``, None); ``…/prefix/checkpoint-40`` → (``…/prefix``, ``checkpoint-40``)."""
    uri = uri.rstrip("/")
    parent, _, last = uri.rpartition("/")
    if step_of(last) is not None and parent and parent != "s3:/":
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
                part = ck.s3_part_size(part_size, meta["size"]) if part_size else None
                md5, etag = ck.file_digests(path, part)
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
