"""Object storage for models, datasets and checkpoints (``s3://`` through boto3).

Credentials come from the environment boto3 already understands (``AWS_*``, IRSA web
identity, instance roles) — never from the manifest. ``AWS_ENDPOINT_URL`` and
``AWS_REGION`` select any S3-compatible endpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rljob_trainer.errors import PermanentError


def split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def s3_client(endpoint_url: str | None = None, region: str | None = None) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        region_name=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}),
    )


def _permanent_from(e: Exception, uri: str, where: str) -> PermanentError:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    return PermanentError(where, f"{code} on {uri}")


def download_object(uri: str, dest: str, where: str = "spec.training.dataset.name") -> str:
    """Download one object to ``dest`` (atomically); returns ``dest``."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3(uri)
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{dest}.part-{os.getpid()}"
    try:
        s3_client().download_file(bucket, key, tmp)
    except (ClientError, BotoCoreError) as e:
        raise _permanent_from(e, uri, where) from e
    os.replace(tmp, dest)
    return dest


def download_prefix(uri: str, dest: str, where: str = "spec.training.model") -> str:
    """Download every object under an ``s3://bucket/prefix/`` to ``dest``; returns ``dest``."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(uri.rstrip("/") + "/")
    client = s3_client()
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
        if not keys:
            raise PermanentError(where, f"no objects under {uri}")
        for key in keys:
            target = Path(dest) / key[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target))
    except (ClientError, BotoCoreError) as e:
        raise _permanent_from(e, uri, where) from e
    return dest


def local_staging_dir(cfg: Any) -> str:
    """Local folder where checkpoints are written before upload to object storage."""
    return os.path.join(cfg.output_dir, "checkpoint-staging")
