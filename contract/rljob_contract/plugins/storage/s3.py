"""``s3://bucket/prefix``: a prefix in a bucket on any S3-compatible endpoint.

The trainer writes each checkpoint to a local staging folder and uploads it in the background (its
implementation, ``rljob_trainer.checkpoints.s3.S3Location``, through boto3's transfer manager), and
downloads models and datasets named by an s3:// URI the same way. Credentials come from the pod's
service account, the ``AWS_*`` environment or a mounted ``credentialsSecret``.
"""

from __future__ import annotations

from rljob_contract.plugins.storage.base import StorageBackend


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``; ValueError for any other URI."""
    if not uri.startswith(S3.prefix):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len(S3.prefix) :].partition("/")
    return bucket, key


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


S3 = S3Backend()
