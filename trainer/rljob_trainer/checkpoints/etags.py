"""S3's ETags, predicted: what a listing of object storage reports for a file uploaded in parts.

The manifest records each file's expected ETag for the upload's part size, so an upload is verified by a
listing, without downloading it (``S3Location`` uploads with exactly these part sizes).
"""

from __future__ import annotations

import hashlib


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
