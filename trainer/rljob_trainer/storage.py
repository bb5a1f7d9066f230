"""What every location needs: names read back from storage made safe, an S3 client, credentials.

Models, datasets and checkpoints on object storage are opened as locations
(``rljob_trainer.checkpoints.backends``). Credentials come from the environment boto3 already
understands (``AWS_*``, IRSA web identity, instance roles) — never from the manifest.
``AWS_ENDPOINT_URL`` and ``AWS_REGION`` select any S3-compatible endpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rljob_trainer.errors import PermanentError

#: Longest relative path (and path segment) accepted from storage, in UTF-8 bytes: Linux's PATH_MAX
#: and NAME_MAX. Longer names would fail at open() anyway, with a less helpful error.
MAX_PATH_BYTES = 4096
MAX_SEGMENT_BYTES = 255


class UnsafePath(ValueError):
    """A file name read back from storage (a manifest entry, an object key) that is not a plain path
    inside its folder, or whose resolved path would leave the destination."""


def safe_relpath(rel: object, what: str) -> str:
    """``rel`` when it is a plain relative POSIX path that stays inside any folder it is joined to.

    Names come from storage anyone with write access to the bucket (or a shared mirror) controls, so
    refused are: non-strings, empty names, absolute paths, empty, ``.`` and ``..`` segments,
    backslashes (a separator elsewhere), NUL and other control characters, and names longer than
    Linux allows. Raises :class:`UnsafePath` naming ``what`` (the manifest field, the object key).
    """
    def refuse(why: str) -> UnsafePath:
        return UnsafePath(f"{what}: {rel!r} {why}; only plain relative paths are accepted")

    if not isinstance(rel, str) or not rel:
        raise refuse("is not a non-empty string")
    if rel.startswith("/"):
        raise refuse("is an absolute path")
    if "\\" in rel:
        raise refuse("contains a backslash")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in rel):
        raise refuse("contains a control character (NUL, newline, ...)")
    if len(rel.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise refuse(f"is longer than {MAX_PATH_BYTES} bytes")
    for segment in rel.split("/"):
        if segment in ("", ".", ".."):
            raise refuse("has an empty, '.' or '..' segment")
        if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise refuse(f"has a segment longer than {MAX_SEGMENT_BYTES} bytes")
    return rel


def path_under(root: str | os.PathLike[str], rel: str, what: str) -> Path:
    """``root / rel`` after checking that ``rel`` is safe (:func:`safe_relpath`) and that the path,
    with every symlink already on disk resolved, stays under ``root`` (resolved too). Call it again
    after creating the parent folders: a symlink planted meanwhile is caught then."""
    safe_relpath(rel, what)
    base = Path(root).resolve()
    target = Path(root) / rel
    if not target.resolve().is_relative_to(base):
        raise UnsafePath(f"{what}: {rel!r} resolves to {target.resolve()}, outside {base} (a symbolic link on "
                         "the way); remove the link")
    if target.is_symlink():  # the last segment itself: writing would follow it
        raise UnsafePath(f"{what}: {target} is a symbolic link; remove it")
    return target


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


#: A mounted Secret's key files → boto3's credential arguments.
CREDENTIAL_FILES = {"AWS_ACCESS_KEY_ID": "aws_access_key_id", "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
                    "AWS_SESSION_TOKEN": "aws_session_token"}
_MAX_CREDENTIAL_BYTES = 16 << 10


def credentials_from_folder(folder: Path, field: str = "spec.checkpoint.credentialsSecret") -> dict[str, str] | None:
    """boto3's credential arguments from a mounted Secret (one file per key, as a kubelet writes a
    ``secret`` volume: :data:`rljob_contract.pod.CREDENTIALS_DIR`), or None when the folder holds no
    key pair. A value that is not one line of text is refused (PermanentError naming ``field`` and the file)."""
    out: dict[str, str] = {}
    for key, argument in CREDENTIAL_FILES.items():
        path = folder / key
        if not path.is_file():
            continue
        with path.open("rb") as f:  # a secret volume's keys are links into its ..data folder
            raw = f.read(_MAX_CREDENTIAL_BYTES + 1)
        try:
            value = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            value = ""
        if not value or len(raw) > _MAX_CREDENTIAL_BYTES or any(c in value for c in "\r\n\0"):
            raise PermanentError(field, f"{path}: not one line of text (the Secret's key {key})")
        out[argument] = value
    if "aws_access_key_id" not in out or "aws_secret_access_key" not in out:
        return None
    return out


def use_mounted_credentials(folder: Path) -> str | None:
    """Make spec.checkpoint's mounted credentials the default ones of this process and its children: an
    AWS shared credentials file (profile ``default``, mode 0600, in a 0700 folder on the pod's memory-backed
    /dev/shm when there is one) named by ``AWS_SHARED_CREDENTIALS_FILE``, so the keys themselves are never
    in the environment. Returns the file's path, or None when nothing is mounted."""
    import tempfile

    creds = credentials_from_folder(folder)
    if creds is None:
        return None
    shm = Path("/dev/shm")
    where = tempfile.mkdtemp(prefix="rljob-aws-", dir=str(shm) if os.access(shm, os.W_OK) else None)
    path = Path(where) / "credentials"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("[default]\n" + "".join(f"{k} = {v}\n" for k, v in creds.items()))
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(path)
    os.environ.pop("AWS_PROFILE", None)
    return str(path)


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
