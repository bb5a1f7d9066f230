"""Checkpoints on object storage: a prefix in a bucket on any S3-compatible endpoint, through boto3.

The ``s3://`` storage backend's implementation (its descriptor: ``rljob_contract.plugins.storage.s3``).
The layout and protocol are :mod:`rljob_trainer.checkpoints.locations`'s; this module moves the
bytes (boto3's transfer manager, with part sizes — and so ETags — the manifest predicts), and
downloads models and datasets named by an ``s3://`` URI.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rljob_contract.plugins.storage.s3 import split_s3

from rljob_trainer.checkpoints.locations import (
    ACCESS_PROBE,
    Listing,
    Location,
    StorageError,
    download_target,
    storage_errors,
)
from rljob_trainer.checkpoints.manifest import (
    LATEST,
    MANIFEST,
    MAX_LATEST_BYTES,
    MAX_MANIFEST_BYTES,
    CheckpointInfo,
    InvalidManifest,
    info_from_manifest,
    listing_problems,
    parse_latest,
    parse_manifest,
    step_of,
)
from rljob_trainer.errors import PermanentError
from rljob_trainer.storage import UnsafePath, error_code, path_under, s3_client, safe_relpath

log = logging.getLogger("rljob.checkpoints")

MiB = 1 << 20


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


def etag_is_opaque(head: Mapping[str, Any]) -> bool:
    """Whether a HeadObject response describes an object whose ETag is not an MD5 of its bytes."""
    return str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or bool(head.get("SSECustomerAlgorithm"))


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
        self.named = uri  # as given: what messages about a model's or a dataset's download say
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

    def warm_up(self) -> None:
        with contextlib.suppress(Exception):
            _ = self.client

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
        with storage_errors(self.uri):
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._root(), MaxKeys=1)
            self.client.put_object(Bucket=self.bucket, Key=self.key(ACCESS_PROBE), Body=b"rljob\n")
        try:
            with storage_errors(self.uri):
                self.client.delete_object(Bucket=self.bucket, Key=self.key(ACCESS_PROBE))
        except StorageError as e:
            log.warning("checkpoint storage %s: cannot delete objects (%s); retention will fail there", self.uri, e)

    def listing(self) -> Listing:
        out = Listing()
        root = self._root()
        with storage_errors(self.uri):
            # `latest` first: it only ever names a checkpoint whose manifest was written before it,
            # so the object listing that follows contains that checkpoint. (Read last, it could name
            # one completed after the listing, which would then look incomplete.)
            out.latest = self._latest()
            for obj in self._keys(root):
                rel = obj["Key"][len(root):]
                if rel == LATEST:
                    continue
                name, _, rest = rel.partition("/")
                if step_of(name) is not None and rest:
                    out.objects.setdefault(name, {})[rest] = (int(obj["Size"]), str(obj["ETag"]).strip('"'))
            for name, files in out.objects.items():
                if MANIFEST not in files:
                    continue  # no manifest: incomplete
                try:
                    body = self._manifest_body(name, files[MANIFEST][1])
                    if body is None:  # deleted (by retention) since the listing: incomplete
                        continue
                    data, info = parse_manifest(body, name)
                except InvalidManifest as e:
                    log.warning("checkpoint %s: manifest cannot be trusted (%s); treated as corrupt",
                                self.child_uri(name), e)
                    out.corrupt[name] = str(e)
                    continue
                out.complete.append(info)
                out.manifests[name] = data
        out.complete.sort(key=lambda c: c.step)
        return out

    def _latest(self) -> str | None:
        """Where ``latest`` points, or None (absent, too large, or naming no checkpoint: ignored)."""
        where = f"{self.uri}/{LATEST}"
        try:
            return parse_latest(self._get(self.key(LATEST), MAX_LATEST_BYTES), where)
        except InvalidManifest as e:
            log.warning("%s: ignored (%s)", where, e)
            return None

    def _manifest_body(self, name: str, etag: str | None) -> bytes | None:
        """A manifest's bytes; unchanged manifests (same ETag) are not fetched again."""
        cached = self._manifest_cache.get((name, etag))
        if cached is None:
            cached = self._get(self.key(name, MANIFEST), MAX_MANIFEST_BYTES)
            if cached is not None and len(self._manifest_cache) < 10_000:
                self._manifest_cache[(name, etag)] = cached
        return cached

    def _get(self, key: str, limit: int) -> bytes | None:
        """An object's bytes, or None when it does not exist (any more). One larger than ``limit`` is
        not read (:class:`InvalidManifest`): whoever can write the bucket could make it any size."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            if error_code(e) in ("NoSuchKey", "404"):
                return None
            raise
        with resp["Body"] as body:
            if int(resp.get("ContentLength") or 0) > limit:
                raise InvalidManifest(f"s3://{self.bucket}/{key} is {resp['ContentLength']} bytes, more than {limit}")
            data = bytes(body.read(limit + 1))
        if len(data) > limit:
            raise InvalidManifest(f"s3://{self.bucket}/{key} is larger than {limit} bytes")
        return data

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
        with storage_errors(self.child_uri(name)):
            existing = self._objects(name)
            if MANIFEST in existing:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(name, MANIFEST))
            self._delete_keys([self.key(name, rel) for rel in existing if rel != MANIFEST])

    def upload(self, local_dir: Path, manifest: dict[str, Any]) -> None:
        from boto3.s3.transfer import create_transfer_manager

        name = manifest["name"]
        target = self.child_uri(name)
        with storage_errors(target):
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

    def put_small(self, rel: str, body: bytes) -> str:
        with storage_errors(self.uri):
            self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=body, ContentType="application/json")
        return f"{self.uri}/{rel}"

    def small_files(self, matches: Callable[[str], bool], limit: int, most: int) -> Iterator[tuple[str, bytes | None]]:
        root = self._root()
        with storage_errors(self.uri):
            keys = sorted(o["Key"] for o in self._keys(root) if matches(o["Key"][len(root):]))
        for key in keys[-most:]:
            with storage_errors(self.uri):
                try:
                    yield f"s3://{self.bucket}/{key}", self._get(key, limit)
                except InvalidManifest:  # larger than limit: the caller names it
                    yield f"s3://{self.bucket}/{key}", b" " * (limit + 1)

    def set_latest(self, name: str) -> None:
        with storage_errors(self.uri):
            self.client.put_object(Bucket=self.bucket, Key=self.key(LATEST), Body=f"{name}\n".encode(),
                                   ContentType="text/plain")

    def download(self, info: CheckpointInfo, dest: Path) -> None:
        from boto3.s3.transfer import create_transfer_manager

        with storage_errors(self.child_uri(info.name)), create_transfer_manager(
            self.client, self.transfer.config()
        ) as tm:
            futures = []
            for rel in info.files:  # names from a manifest in the bucket: each checked to stay under dest
                target = download_target(dest, rel, self.child_uri(info.name))
                futures.append(tm.download(self.bucket, self.key(info.name, rel), str(target)))
            for f in futures:
                f.result()

    # ------------------------------------------------------------------ models and datasets

    def _plain_client(self) -> Any:
        """A client with the default settings downloads of models and datasets have always had."""
        return s3_client(self.endpoint_url, self.region, credentials=self.credentials)

    def _permanent(self, e: Exception) -> PermanentError:
        return PermanentError(self.where, f"{error_code(e)} on {self.named}")

    def download_file(self, dest: Path) -> None:
        """Download the one object (atomically: a partial file never has ``dest``'s name)."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = split_s3(self.named)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{dest}.part-{os.getpid()}"
        try:
            self._plain_client().download_file(bucket, key, tmp)
        except (ClientError, BotoCoreError) as e:
            raise self._permanent(e) from e
        os.replace(tmp, dest)

    def download_folder(self, dest: Path) -> None:
        """Download every object under the prefix.

        Object keys are untrusted (anyone who can write the bucket chooses them): every key is checked
        before anything is downloaded, and one that is not a plain relative path under the prefix
        (``..``, empty segments, backslashes, control characters) is a PermanentError naming the key.
        Keys ending in ``/`` are folder markers (S3 consoles create them) and are skipped.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        uri, where = self.named, self.where
        bucket, prefix = split_s3(uri.rstrip("/") + "/")
        client = self._plain_client()
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
            if not keys:
                raise PermanentError(where, f"no objects under {uri}")
            files = []
            for key in keys:  # all checked before anything is written
                rel = key[len(prefix) :]
                if rel == "" or rel.endswith("/"):
                    continue
                try:
                    files.append((key, safe_relpath(rel, f"object key {key!r}")))
                except UnsafePath as e:
                    raise PermanentError(where, f"{e} (under {uri}); remove or rename that object, or point {where} "
                                                "at a prefix without it") from e
            for key, rel in files:
                target = path_under(dest, rel, f"object key {key!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                path_under(dest, rel, f"object key {key!r}")  # no link planted meanwhile
                client.download_file(bucket, key, str(target))
        except (ClientError, BotoCoreError) as e:
            raise self._permanent(e) from e
        except UnsafePath as e:
            raise PermanentError(where, f"{e} (under {uri})") from e
