"""``s3://bucket/prefix``: a prefix in a bucket on any S3-compatible endpoint.

The trainer writes each checkpoint to a local staging folder and uploads it in the background
(:class:`~rljob_trainer.checkpoints.s3.S3Location`, boto3's transfer manager); a listing reports each
object's ETag, which the manifest predicts for the upload's part size (:func:`multipart_etag`,
:func:`s3_part_size`), so an upload is verified without downloading it. Credentials come from the pod's
service account, the ``AWS_*`` environment or a mounted ``credentialsSecret``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from rljob_trainer.storage_backends.base import StorageBackend

if TYPE_CHECKING:
    from rljob_trainer.checkpoints.locations import Location


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``; ValueError for any other URI."""
    if not uri.startswith(S3.prefix):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len(S3.prefix) :].partition("/")
    return bucket, key


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives a multipart upload: MD5 of the parts' binary MD5s, then ``-<parts>``."""
    return f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


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


#: Why ``s3://`` alone is refused (pydantic and the CRD's CEL say the same).
NEEDS_BUCKET = "s3:// location needs a bucket, for example s3://my-bucket/run1"


class S3Backend(StorageBackend):
    scheme = "s3"
    form = "s3://bucket/prefix (any S3-compatible endpoint, with endpointUrl)"
    remote = True
    durable = True

    def check(self, uri: str) -> str:
        bucket = uri[len(self.prefix) :]
        if not bucket or bucket.startswith("/"):
            raise ValueError(NEEDS_BUCKET)
        return uri

    def cel_rule(self, expr: str) -> tuple[str, str]:
        return f"{expr} != 's3://'", f"an {NEEDS_BUCKET}"

    def cel_holds(self, uri: str) -> bool:
        return uri != "s3://"

    def location(self, uri: str, *, where: str, **options: Any) -> Location:
        """An :class:`~rljob_trainer.checkpoints.s3.S3Location` (``options``: endpoint_url, region,
        credentials, transfer)."""
        from rljob_trainer.checkpoints.s3 import S3Location

        return S3Location(uri, where=where, **options)


S3 = S3Backend()
