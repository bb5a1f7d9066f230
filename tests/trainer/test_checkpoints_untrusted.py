"""Checkpoints and models read back from storage are untrusted input (issue #14, point 3).

Anyone who can write a bucket (a shared mirror) or a mirror folder chooses the manifests, the
``latest`` pointer and the object keys there. A manifest naming files outside its folder, with an
empty segment, the wrong types, or a name other than its folder's makes its checkpoint corrupt:
resume falls back to the previous complete one with the usual warning (a ``CheckpointFallback``
Event), and nothing is ever written outside the destination — symbolic links included. A model
prefix with such keys is a PermanentError naming the key. Honest checkpoints behave as before.

The S3 tests talk to moto's server on loopback through boto3 (tests/support/s3_server.py).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rljob_contract.pod import RESUME_WARNINGS_ENV
from rljob_trainer import checkpoints as ck
from rljob_trainer.checkpoints import resume
from rljob_trainer.checkpoints import s3 as s3_store
from rljob_trainer.checkpoints.backends import download_folder
from rljob_trainer.errors import PermanentError
from rljob_trainer.storage import UnsafePath, safe_relpath

from tests.support.s3_server import (  # noqa: F401 - fixtures register by import
    S3_ENV,
    MotoServer,
    bucket_fixture,
    s3_env_fixture,
    s3_server_fixture,
)
from tests.trainer.test_checkpoints_s3 import s3_location, sealed, trainer_config

s3 = pytest.mark.s3
PAYLOAD = b"written by whoever can write the bucket\n"


def md5_of(data: bytes) -> str:
    import hashlib

    return hashlib.md5(data).hexdigest()


def entry(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "md5": md5_of(data), "etag": md5_of(data)}




# --- pure: no server ----------------------------------------------------------------------------

@pytest.mark.parametrize(("rel", "why"), [
    ("/etc/passwd", "absolute path"),
    ("../x", "'..' segment"),
    ("a/../../x", "'..' segment"),
    ("a//b", "empty"),
    ("a/", "empty"),
    ("./a", "'.'"),
    ("a\\..\\b", "backslash"),
    ("a\0b", "control character"),
    ("a\nb", "control character"),
    ("", "non-empty string"),
    (7, "non-empty string"),
    ("x" * 256, "segment longer than 255"),
    ("a/" * 2100, "longer than 4096"),
])
def test_unsafe_relative_paths_are_refused_naming_what_and_why(rel: Any, why: str) -> None:
    with pytest.raises(UnsafePath, match=f"^manifest file: .*{why}"):
        safe_relpath(rel, "manifest file")


def test_plain_relative_paths_pass() -> None:
    for rel in ("model.safetensors", "nested/rng_state_0.pth", ".hidden/x", "a..b", "..a/b.", "ümlaut"):
        assert safe_relpath(rel, "f") == rel


def test_checkpoint_names_are_ascii_bounded_and_whole() -> None:
    assert ck.step_of("checkpoint-40") == 40
    for name in ("checkpoint-40\n", "checkpoint-\u0664\u0660", "checkpoint-" + "9" * 5000, "checkpoint-1/..",
                 "../checkpoint-1", "checkpoint--1"):
        assert ck.step_of(name) is None, name


def honest_manifest(tmp_path: Path, step: int = 20) -> dict[str, Any]:
    return sealed(tmp_path / "honest", step, 0.5)[1]


@pytest.mark.parametrize(("patch", "field"), [
    (lambda m: m["files"].update({"../../x": entry(PAYLOAD)}), r"files: file name: '\.\./\.\./x'"),
    (lambda m: m["files"].update({"/abs": entry(PAYLOAD)}), "files: file name: '/abs' is an absolute path"),
    (lambda m: m["files"].update({"a//b": entry(PAYLOAD)}), "files: file name: 'a//b' has an empty"),
    (lambda m: m["files"].update({ck.MANIFEST: entry(PAYLOAD)}), "is the manifest itself"),
    (lambda m: m.update(step="20"), "step: Input should be a valid integer"),
    (lambda m: m.update(step=21), "step 21 is not the step of name 'checkpoint-20'"),
    (lambda m: m.update(name="../checkpoint-20"), "name: String should match pattern"),
    (lambda m: m.update(files=[]), "files: Input should be a valid dictionary"),
    (lambda m: m["files"]["model.safetensors"].update(size="1000"), r"files\.model\.safetensors\.size"),
    (lambda m: m["files"]["model.safetensors"].update(size=True), r"files\.model\.safetensors\.size"),
    (lambda m: m["files"]["model.safetensors"].pop("md5"), r"files\.model\.safetensors\.md5: Field required"),
    (lambda m: m["files"]["model.safetensors"].update(md5="../x"), r"files\.model\.safetensors\.md5"),
    (lambda m: m.update(metrics={"reward": "best"}), r"metrics\.reward"),
    (lambda m: m.update(format=2), "format"),
])
def test_malformed_manifests_are_invalid_naming_the_field(
    tmp_path: Path, patch: Callable[[dict[str, Any]], None], field: str
) -> None:
    manifest = honest_manifest(tmp_path)
    ck.info_from_manifest(manifest, "checkpoint-20")  # the honest one passes
    patch(manifest)
    with pytest.raises(ck.InvalidManifest, match=field):
        ck.info_from_manifest(manifest, "checkpoint-20")


def test_a_manifest_must_name_its_folder(tmp_path: Path) -> None:
    manifest = honest_manifest(tmp_path)
    with pytest.raises(ck.InvalidManifest, match="name: 'checkpoint-20' is not the name of its folder 'checkpoint-30'"):
        ck.info_from_manifest(manifest, "checkpoint-30")
    with pytest.raises(ck.InvalidManifest, match="more than"):
        ck.parse_manifest(b" " * (ck.manifest.MAX_MANIFEST_BYTES + 1), "checkpoint-20")


# --- local folders: a mirror folder anyone may write, symbolic links --------------------------------

def local_store(tmp_path: Path) -> tuple[ck.LocalLocation, Path]:
    """A mirror folder holding honest checkpoint-10 and checkpoint-20, and an empty pod folder."""
    mirror = ck.LocalLocation(tmp_path / "shared" / "mirror")
    for step in (10, 20):
        d, m = sealed(tmp_path / "staging", step, step / 100)
        mirror.publish(d, m)
    dest = tmp_path / "pod" / "checkpoints"
    dest.mkdir(parents=True)
    return mirror, dest


def rewrite_manifest(folder: Path, patch: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((folder / ck.MANIFEST).read_text())
    patch(manifest)
    (folder / ck.MANIFEST).write_text(json.dumps(manifest))


def test_local_mirror_manifest_with_dotdot_falls_back_and_writes_nothing_outside(tmp_path: Path) -> None:
    mirror, dest = local_store(tmp_path)
    (tmp_path / "shared" / "loot.bin").write_bytes(PAYLOAD)  # what ../../loot.bin reads from the mirror
    rewrite_manifest(mirror.root / "checkpoint-20", lambda m: m["files"].update({"../../loot.bin": entry(PAYLOAD)}))
    warnings: list[str] = []
    found = resume.find_and_fetch([mirror], dest, warnings)
    assert found is not None and found[0] == dest / "checkpoint-10"
    assert not (tmp_path / "pod" / "loot.bin").exists()  # where dest/.fetch-…/../../loot.bin would land
    assert sorted(p.name for p in dest.iterdir()) == ["checkpoint-10"]
    assert len(warnings) == 1 and "checkpoint-20 failed verification or download, falling back" in warnings[0]
    assert "'../../loot.bin'" in warnings[0]
    assert "checkpoint-20" in mirror.listing().corrupt


def test_local_mirror_file_symlinked_out_of_its_folder_is_never_read(tmp_path: Path) -> None:
    mirror, dest = local_store(tmp_path)
    victim = mirror.root / "checkpoint-20" / "model.safetensors"
    secret = tmp_path / "secret.bin"
    secret.write_bytes(victim.read_bytes())  # same bytes: only the link gives it away
    victim.unlink()
    victim.symlink_to(secret)
    warnings: list[str] = []
    found = resume.find_and_fetch([mirror], dest, warnings)
    assert found is not None and found[0] == dest / "checkpoint-10"
    assert "symbolic link out of the checkpoint folder" in warnings[0]


def test_symlinks_in_the_destination_are_replaced_never_written_through(tmp_path: Path) -> None:
    mirror, dest = local_store(tmp_path)
    elsewhere, other = tmp_path / "elsewhere", tmp_path / "other"
    elsewhere.mkdir()
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    (dest / ".fetch-checkpoint-20").symlink_to(elsewhere)  # planted where the download stages
    (dest / "checkpoint-20").symlink_to(other)  # planted where the verified copy goes
    found = resume.find_and_fetch([mirror], dest)
    assert found is not None and found[0] == dest / "checkpoint-20"
    assert not (dest / "checkpoint-20").is_symlink() and ck.verify_checkpoint(dest / "checkpoint-20") == []
    assert list(elsewhere.iterdir()) == [] and [p.name for p in other.iterdir()] == ["keep.txt"]


def test_a_mirror_checkpoint_folder_replaced_by_a_symlink_is_not_written_through(tmp_path: Path) -> None:
    mirror, _ = local_store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    d30, m30 = sealed(tmp_path / "staging", 30, 0.3)
    (mirror.root / "checkpoint-30").symlink_to(outside)
    assert "checkpoint-30" in mirror.listing().corrupt  # a linked folder is never trusted
    mirror.publish(d30, m30)  # the link is removed, not followed
    assert list(outside.iterdir()) == []
    assert not (mirror.root / "checkpoint-30").is_symlink()
    assert [c.name for c in mirror.listing().complete] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]


def test_local_resume_skips_a_malformed_manifest_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpts"
    for step in (10, 20):
        sealed(root, step, 0.1)
    rewrite_manifest(root / "checkpoint-20", lambda m: m.update(name="checkpoint-10", step=10))
    caplog.set_level(logging.WARNING, "rljob.checkpoints")
    assert ck.find_resume_checkpoint(root) == root / "checkpoint-10"
    assert "checkpoint-20 failed verification, falling back" in caplog.text
    assert "is not the name of its folder 'checkpoint-20'" in caplog.text


def test_a_latest_pointer_naming_no_checkpoint_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror, _ = local_store(tmp_path)
    caplog.set_level(logging.WARNING, "rljob.checkpoints")
    assert mirror.listing().latest == "checkpoint-20"
    for bad in ("../x\n", "checkpoint-20/../../etc", "/etc/passwd", "checkpoint-20\n" + "x" * 2000):
        (mirror.root / ck.LATEST).write_text(bad)
        assert mirror.listing().latest is None, bad
    assert "is not a checkpoint name; ignored" in caplog.text
    (mirror.root / ck.LATEST).unlink()
    (mirror.root / ck.LATEST).symlink_to(tmp_path / "staging" / "checkpoint-20" / "trainer_state.json")
    assert mirror.listing().latest is None


# --- a real S3 endpoint -------------------------------------------------------------------------

def put_hostile_file(c: Any, bucket: str, manifest: dict[str, Any], rel: str) -> None:
    """An object the manifest lists, with the right size and ETag: verification passes, so only the
    name can stop the download."""
    c.put_object(Bucket=bucket, Key=f"run/checkpoint-20/{rel}", Body=PAYLOAD)
    manifest["files"][rel] = entry(PAYLOAD)


def hostile_dotdot(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    put_hostile_file(c, bucket, m, "../../escape.bin")  # from dest/.fetch-checkpoint-20: tmp_path/pod


def hostile_absolute(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    put_hostile_file(c, bucket, m, str(tmp_path / "pod" / "escape.bin"))


def hostile_empty_segment(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    put_hostile_file(c, bucket, m, "nested//x.bin")


def hostile_backslash(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    put_hostile_file(c, bucket, m, "..\\..\\x.bin")


def hostile_name_mismatch(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    # checkpoint-30 is being uploaded (files, no manifest yet); checkpoint-20's manifest claims to be it.
    d30, m30 = sealed(tmp_path / "staging30", 30, 0.3)
    for rel in m30["files"]:
        c.upload_file(str(d30 / rel), bucket, f"run/checkpoint-30/{rel}")
    m.clear()
    m.update(m30)


def hostile_missing_md5(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    del m["files"]["trainer_state.json"]["md5"]


def hostile_step_string(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    m["step"] = "20"


def hostile_metric_string(c: Any, bucket: str, m: dict[str, Any], tmp_path: Path) -> None:
    m["metrics"] = {"reward": "the best"}


HOSTILE = [
    (hostile_dotdot, "'..' segment"),
    (hostile_absolute, "absolute path"),
    (hostile_empty_segment, "empty"),
    (hostile_backslash, "backslash"),
    (hostile_name_mismatch, "name: 'checkpoint-30' is not the name of its folder 'checkpoint-20'"),
    (hostile_missing_md5, r"files\.trainer_state\.json\.md5: Field required"),
    (hostile_step_string, "step: Input should be a valid integer"),
    (hostile_metric_string, r"metrics\.reward"),
]



def bucket_with_hostile_latest(s3_server: MotoServer, bucket: str, tmp_path: Path,
                               make_hostile: Callable[[Any, str, dict[str, Any], Path], None]) -> Any:
    """``s3://bucket/run`` with honest checkpoints 10 and 20, then 20's manifest made hostile; its Location."""
    loc = s3_location(s3_server, bucket)
    for step in (10, 20):
        d, m = sealed(tmp_path / "staging", step, step / 100)
        loc.publish(d, m)
    c = s3_server.client()
    manifest = json.loads(c.get_object(Bucket=bucket, Key="run/checkpoint-20/rljob-manifest.json")["Body"].read())
    make_hostile(c, bucket, manifest, tmp_path)
    c.put_object(Bucket=bucket, Key="run/checkpoint-20/rljob-manifest.json", Body=json.dumps(manifest).encode())
    return loc


@s3
@pytest.mark.parametrize(("make_hostile", "why"), HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_hostile_manifest_in_the_bucket_falls_back_to_the_previous_checkpoint_writing_nothing_outside(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None,
    make_hostile: Callable[[Any, str, dict[str, Any], Path], None], why: str,
) -> None:
    loc = bucket_with_hostile_latest(s3_server, bucket, tmp_path, make_hostile)

    dest = tmp_path / "pod" / "checkpoints"
    dest.mkdir(parents=True)
    warnings: list[str] = []
    try:
        found = resume.find_and_fetch([loc], dest, warnings)
    finally:  # whatever happened: nothing but checkpoint-10's files was written
        written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and not
                         p.is_relative_to(tmp_path / "staging") and not p.is_relative_to(tmp_path / "staging30"))
        assert written == sorted(f"pod/checkpoints/checkpoint-10/{f}" for f in
                                 ["model.safetensors", "trainer_state.json", "nested/rng_state_0.pth", ck.MANIFEST])
    assert found is not None and found[0] == dest / "checkpoint-10" and ck.verify_checkpoint(found[0]) == []
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"checkpoint s3://{bucket}/run/checkpoint-20 failed verification or download, "
                                  "falling back to the previous complete one: ")
    assert re.search(why, warnings[0]), warnings[0]
    listing = loc.listing()
    assert [i.name for i in listing.complete] == ["checkpoint-10"] and list(listing.corrupt) == ["checkpoint-20"]


@s3
def test_the_launcher_preflight_reports_a_hostile_manifest_as_a_checkpoint_fallback(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None
) -> None:
    cfg = trainer_config(tmp_path / "out", storage=f"s3://{bucket}/run", endpointUrl=s3_server.endpoint)
    bucket_with_hostile_latest(s3_server, bucket, tmp_path, hostile_dotdot)

    env = resume.prepare_checkpoint_storage(cfg)
    assert Path(env[resume.RESUME_ENV]).name == "checkpoint-10"
    (warning,) = json.loads(env[RESUME_WARNINGS_ENV])  # rank 0 forwards it: a CheckpointFallback Event
    assert "checkpoint-20 failed verification or download, falling back" in warning and "'../../escape.bin'" in warning
    assert not any(p.name == "escape.bin" for p in tmp_path.rglob("*"))


@s3
def test_latest_and_manifests_read_from_the_bucket_are_bounded_and_checked(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    loc = s3_location(s3_server, bucket)
    for step in (10, 20):
        d, m = sealed(tmp_path / "staging", step, step / 100)
        loc.publish(d, m)
    c = s3_server.client()
    caplog.set_level(logging.WARNING, "rljob.checkpoints")
    for bad in (b"../x\n", b"checkpoint-20/../../y", b"checkpoint-20" + b" " * 5000 + b"\n"):
        c.put_object(Bucket=bucket, Key="run/latest", Body=bad)
        listing = loc.listing()
        assert listing.latest is None and [i.name for i in listing.complete] == ["checkpoint-10", "checkpoint-20"]
    assert "run/latest" in caplog.text and "ignored" in caplog.text
    # A manifest larger than the bound is not read (whoever writes the bucket chooses its size).
    monkeypatch.setattr(s3_store, "MAX_MANIFEST_BYTES", 64)
    listing = s3_location(s3_server, bucket).listing()
    assert listing.complete == [] and sorted(listing.corrupt) == ["checkpoint-10", "checkpoint-20"]
    assert "more than 64" in listing.corrupt["checkpoint-20"]


# --- s3:// model prefixes (checkpoints.backends.download_folder, the S3 location) ---------------------

@pytest.fixture
def model_env(s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)


@s3
@pytest.mark.parametrize("rel", ["../../escape.bin", "sub/../../../escape.bin", "{tmp}/abs/escape.bin",
                                 "sub//escape.bin", "..\\escape.bin", "sub/./escape.bin"])
def test_a_model_prefix_with_unsafe_keys_is_a_permanent_error_naming_the_key(
    s3_server: MotoServer, bucket: str, tmp_path: Path, model_env: None, rel: str
) -> None:
    rel = rel.format(tmp=tmp_path)  # an absolute path: under tmp_path, should it ever be written
    c = s3_server.client()
    c.put_object(Bucket=bucket, Key="models/tiny/config.json", Body=b"{}")
    c.put_object(Bucket=bucket, Key=f"models/tiny/{rel}", Body=PAYLOAD)
    dest = tmp_path / "cache" / "model"
    with pytest.raises(PermanentError) as err:
        download_folder(f"s3://{bucket}/models/tiny", str(dest))
    assert err.value.where == "spec.training.model"
    assert repr(f"models/tiny/{rel}") in err.value.message and "remove or rename that object" in err.value.message
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # every key checked before any download


@s3
def test_an_honest_model_prefix_downloads_with_folder_markers_and_no_symlink_is_followed(
    s3_server: MotoServer, bucket: str, tmp_path: Path, model_env: None
) -> None:
    c = s3_server.client()
    for key, body in [("models/tiny/config.json", b"{}"), ("models/tiny/sub/", b""),
                      ("models/tiny/sub/weights.bin", PAYLOAD), ("models/tiny/.hidden/x", b"x")]:
        c.put_object(Bucket=bucket, Key=key, Body=body)
    dest = tmp_path / "cache" / "model"
    assert download_folder(f"s3://{bucket}/models/tiny/", str(dest)) == str(dest)
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == [".hidden/x", "config.json", "sub/weights.bin"]
    assert (dest / "sub" / "weights.bin").read_bytes() == PAYLOAD
    # A symlink left in the cache folder (a previous container's) is not written through.
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "sub" / "weights.bin").unlink()
    (dest / "sub").rmdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(PermanentError, match="outside"):
        download_folder(f"s3://{bucket}/models/tiny/", str(dest))
    assert list(outside.iterdir()) == []
