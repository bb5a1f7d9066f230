"""Object storage for models, datasets and checkpoints (``s3://`` through boto3).

Credentials come from the environment boto3 already understands (``AWS_*``, IRSA web
identity, instance roles) — never from the manifest. ``AWS_ENDPOINT_URL`` and
``AWS_REGION`` select any S3-compatible endpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rljob_trainer.errors import PermanentError


def split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def s3_client(
    endpoint_url: str | None = None,
    region: str | None = None,
    *,
    credentials: dict[str, str] | None = None,
    max_attempts: int = 3,
    connect_timeout: float = 10,
    read_timeout: float = 60,
    max_pool_connections: int = 10,
) -> Any:
    """An S3 client. Credentials come from boto3's chain (``AWS_*`` env, IRSA web identity,
    instance roles) unless ``credentials`` (from :func:`credentials_from_env`) names other keys."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(**(credentials or {}))
    return session.client(
        "s3",
        endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        region_name=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
        config=Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
        ),
    )


def credentials_from_env(prefix: str, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``aws_access_key_id``/``aws_secret_access_key``/``aws_session_token`` from ``<prefix>AWS_*``
    variables (a Secret the operator exposes with an ``envFrom`` prefix), or None when absent."""
    env = os.environ if environ is None else environ
    key, secret = env.get(f"{prefix}AWS_ACCESS_KEY_ID"), env.get(f"{prefix}AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    out = {"aws_access_key_id": key, "aws_secret_access_key": secret}
    if env.get(f"{prefix}AWS_SESSION_TOKEN"):
        out["aws_session_token"] = env[f"{prefix}AWS_SESSION_TOKEN"]
    return out


#: Error codes no retry can fix: wrong bucket, wrong or missing credentials, no permission.
PERMANENT_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket",
    "InvalidBucketName", "AccountProblem", "InvalidToken", "NoCredentials", "PermanentRedirect",
    "AuthorizationHeaderMalformed",
})


def error_code(e: BaseException) -> str:
    """The S3 error code of a botocore error (``AccessDenied``…), or a name for a client-side one."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get(
            "HTTPStatusCode", type(e).__name__))
    name = type(e).__name__
    return "NoCredentials" if name in ("NoCredentialsError", "PartialCredentialsError") else name


def is_permanent(e: BaseException) -> bool:
    return error_code(e) in PERMANENT_CODES


def _permanent_from(e: Exception, uri: str, where: str) -> PermanentError:
    return PermanentError(where, f"{error_code(e)} on {uri}")


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

