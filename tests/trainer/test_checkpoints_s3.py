"""Checkpoints on object storage: verified upload, retention, mirrors, resume, credentials, CLI.

Pure parts run without a server. The rest talks to moto's S3 server on loopback in its own
process (tests/support/s3_server.py), always through boto3 as production does; the trainer tests
(``test_checkpoints_s3_training.py``) run real torchrun ranks and kill things (the trainer, the endpoint) at the worst moments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rljob_contract.job import API_VERSION, KIND, ManifestError, parse_job
from rljob_contract.pod import validate_document
from rljob_contract.runtime import parse_runtime
from rljob_contract.spec import TrainerConfig
from rljob_trainer import checkpoints as ck
from rljob_trainer.checkpoints import publisher as upload
from rljob_trainer.checkpoints import resume
from rljob_trainer.checkpoints import s3 as s3_store
from rljob_trainer.errors import PermanentError
from rljob_trainer.storage import credentials_from_env

from rljob import cli
from tests.support.s3_server import (  # noqa: F401 - fixtures register by import
    S3_ENV,
    EndpointProxy,
    MotoServer,
    bucket_fixture,
    free_port,
    s3_env_fixture,
    s3_server_fixture,
)
from tests.support.trainer import (
    deep_update,
    job_location,
    quickstart_doc,
    run_rljob,
    write_manifest,
    write_runtime,
)

MiB = 1 << 20
SMALL_PARTS = ck.TransferSettings(part_size=5 * MiB, concurrency=4)


def make_staged(root: Path, step: int, reward: float | None = None, big: bool = False) -> Path:
    """A checkpoint folder as the HF Trainer leaves it (not sealed)."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(hashlib.sha256(str(step).encode()).digest() * 4000)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "reward": reward}))
    (d / "nested").mkdir()
    (d / "nested" / "rng_state_0.pth").write_bytes(bytes([step % 256]) * 333)
    if big:  # 11 MiB + a bit: three 5 MiB parts with SMALL_PARTS
        (d / "optimizer.pt").write_bytes(os.urandom(11 * MiB + 123))
    return d


def metrics_of(reward: float | None) -> dict[str, float]:
    return {"reward": reward} if reward is not None else {}


def sealed(root: Path, step: int, reward: float | None = None, big: bool = False) -> tuple[Path, dict[str, Any]]:
    d = make_staged(root, step, reward, big)
    ck.seal_checkpoint(d, step, metrics_of(reward), part_size=SMALL_PARTS.part_size)
    return d, json.loads((d / ck.MANIFEST).read_text())


def s3_location(server: MotoServer, bucket: str, prefix: str = "run", **kw: Any) -> ck.S3Location:
    return ck.S3Location(f"s3://{bucket}/{prefix}", endpoint_url=server.endpoint, transfer=SMALL_PARTS,
                         max_attempts=2, **kw)


def dead_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


# --- pure: no server ----------------------------------------------------------------------------


def test_multipart_etag_and_part_size_follow_s3_and_s3transfer(tmp_path: Path) -> None:
    from s3transfer.utils import ChunksizeAdjuster

    data = os.urandom(11 * MiB + 5)
    f = tmp_path / "blob"
    f.write_bytes(data)
    parts = [data[i : i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    expected = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    assert ck.file_digests(f, 5 * MiB) == (hashlib.md5(data).hexdigest(), expected)
    assert ck.file_digests(f, None) == (hashlib.md5(data).hexdigest(),) * 2
    # Same part size as boto3's transfer manager, including the 10,000-part doubling.
    for part, size in [(64 * MiB, 10 * MiB), (5 * MiB, 11 * MiB), (8 * MiB, 100 << 30), (5 * MiB, 5 * MiB)]:
        mine = ck.s3_part_size(part, size)
        if size < part:
            assert mine is None
        else:
            assert mine == ChunksizeAdjuster().adjust_chunksize(part, size), (part, size)


def test_retention_plan_on_a_bucket_listing_keeps_last_best_newest_and_protected() -> None:
    complete = [ck.CheckpointInfo(f"checkpoint-{s}", s, {"reward": r})
                for s, r in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3), (50, 0.4)]]
    incomplete = ["checkpoint-5", "checkpoint-60"]  # crash debris (older) / being uploaded (newer)
    doomed = ck.retention_plan(complete, incomplete, keep_last=2, keep_best=1, protect={"checkpoint-20"})
    assert doomed == ["checkpoint-5", "checkpoint-30"]
    # keepLast counts complete checkpoints only; the newest complete one always stays.
    assert ck.retention_plan(complete[:1], ["checkpoint-20"], keep_last=1) == []


def test_listing_problems_name_missing_resized_and_changed_files() -> None:
    info = ck.CheckpointInfo("checkpoint-10", 10, {}, {
        "a": {"size": 3, "md5": "x", "etag": "e1"}, "b": {"size": 4, "md5": "y", "etag": "e2"},
        "c": {"size": 5, "md5": "z", "etag": "e3-2"},
    })
    problems = ck.listing_problems(info, {"a": (3, "e1"), "b": (5, "e2"), "c": (5, "other-2")})
    assert problems == ["b: size 5 != 4", "c: ETag other-2 != e3-2"]
    assert ck.listing_problems(info, {"a": (3, "e1")}) == ["b: missing", "c: missing"]


def test_kms_encrypted_objects_are_not_held_to_an_md5_etag() -> None:
    assert ck.etag_is_opaque({"ServerSideEncryption": "aws:kms"})
    assert ck.etag_is_opaque({"ServerSideEncryption": "aws:kms:dsse"})
    assert ck.etag_is_opaque({"SSECustomerAlgorithm": "AES256"})
    assert not ck.etag_is_opaque({"ServerSideEncryption": "AES256"})  # SSE-S3 keeps MD5 ETags
    assert not ck.etag_is_opaque({})


def job_doc(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": {"checkpoint": checkpoint}}


def runtime_doc(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ClusterRLTrainingRuntime", "metadata": {"name": "x"},
            "spec": {"image": "ghcr.io/rljob/trainer:0.1.0", "checkpoint": checkpoint}}


def test_credentials_in_a_manifest_are_rejected_with_a_pointer_to_the_secret() -> None:
    with pytest.raises(ManifestError) as e:
        parse_runtime(runtime_doc({"storage": "s3://b/p", "accessKeyId": "AKIA...", "secretAccessKey": "s"}))
    text = "\n".join(e.value.problems)
    assert "spec.checkpoint.accessKeyId: credentials never go in the manifest" in text
    assert "credentialsSecret" in text
    with pytest.raises(ManifestError, match="spec.checkpoint.accessKeyId: credentials never go in the manifest"):
        parse_job(job_doc({"accessKeyId": "AKIA..."}))  # the job's own checkpoint section says the same
    with pytest.raises(ManifestError) as e:
        parse_runtime(runtime_doc({"mirrors": [{"location": "s3://c/p", "secret_access_key": "s"}]}))
    assert "spec.checkpoint.mirrors[0].secret_access_key: credentials never go" in e.value.problems[0]
    with pytest.raises(ManifestError, match="endpointUrl: credentials never go in the endpoint URL"):
        parse_runtime(runtime_doc({"endpointUrl": "https://key:secret@s3.example.com"}))
    with pytest.raises(ManifestError, match="spec.checkpoint.storage: 'gs://b/p': use s3://"):
        parse_runtime(runtime_doc({"storage": "gs://b/p"}))
    ok = parse_runtime(runtime_doc({"storage": "s3://b/p", "credentialsSecret": "s3-creds",
                                    "mirrors": [{"location": "s3://backup/p", "region": "eu-west-1"}]}))
    assert ok.spec.checkpoint.credentials_secret == "s3-creds"
    assert ok.spec.checkpoint.mirrors[0].region == "eu-west-1"


def test_mirror_credentials_come_from_the_prefixed_environment() -> None:
    env = {"RLJOB_MIRROR0_AWS_ACCESS_KEY_ID": "k", "RLJOB_MIRROR0_AWS_SECRET_ACCESS_KEY": "s"}
    assert credentials_from_env("RLJOB_MIRROR0_", env) == {"aws_access_key_id": "k", "aws_secret_access_key": "s"}
    assert credentials_from_env("RLJOB_MIRROR1_", env) is None


def _mount_secret(folder: Path, data: dict[str, str]) -> Path:
    """A Secret volume as a kubelet writes it: each key a link into a ``..data`` folder."""
    real = folder / "..2026_12_03"
    real.mkdir(parents=True)
    (folder / "..data").symlink_to(real.name)
    for key, value in data.items():
        (real / key).write_text(value)
        (folder / key).symlink_to(f"..data/{key}")
    return folder


def test_mounted_credentials_become_a_private_credentials_file_and_mirror_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stat

    import boto3
    from rljob_contract.spec import TrainerConfig
    from rljob_trainer.checkpoints.plan import storage_plan
    from rljob_trainer.errors import PermanentError
    from rljob_trainer.storage import credentials_from_folder, use_mounted_credentials

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    root = tmp_path / "storage"
    _mount_secret(root / "checkpoint", {"AWS_ACCESS_KEY_ID": "AKIAPRIMARY", "AWS_SECRET_ACCESS_KEY": "s3cr3t\n"})
    _mount_secret(root / "mirror-0", {"AWS_ACCESS_KEY_ID": "AKIAMIRROR", "AWS_SECRET_ACCESS_KEY": "m1rr0r",
                                      "AWS_SESSION_TOKEN": "tok"})
    path = Path(use_mounted_credentials(root / "checkpoint") or "")
    # boto3's default chain finds the keys through the file; the environment holds only its path.
    assert os.environ["AWS_SHARED_CREDENTIALS_FILE"] == str(path)
    creds = boto3.Session().get_credentials()
    assert (creds.access_key, creds.secret_key) == ("AKIAPRIMARY", "s3cr3t")
    assert "s3cr3t" not in "".join(os.environ.values())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # A mirror's keys are read from its own folder.
    cfg = TrainerConfig.model_validate({"job_name": "job", "output_dir": str(tmp_path / "out"), "checkpoint": {
        "storage": "s3://bucket/run", "mirrors": [{"location": "s3://backup/run", "credentialsSecret": "m"}]}})
    plan = storage_plan(cfg, {"RLJOB_CREDENTIALS_DIR": str(root)})
    assert plan.mirrors[0].credentials == {"aws_access_key_id": "AKIAMIRROR", "aws_secret_access_key": "m1rr0r",
                                           "aws_session_token": "tok"}
    # Nothing mounted: nothing changes; a key that is not one line is refused, naming the field and file.
    assert use_mounted_credentials(tmp_path / "absent") is None
    _mount_secret(tmp_path / "bad", {"AWS_ACCESS_KEY_ID": "a\nb", "AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(PermanentError, match=r"spec.checkpoint.credentialsSecret: .*bad/AWS_ACCESS_KEY_ID: not one"):
        credentials_from_folder(tmp_path / "bad")


def test_checkpoint_uri_may_name_one_checkpoint() -> None:
    assert ck.split_checkpoint_uri("s3://b/run/checkpoint-40/") == ("s3://b/run", "checkpoint-40")
    assert ck.split_checkpoint_uri("s3://b/run") == ("s3://b/run", None)
    assert ck.split_checkpoint_uri("s3://b/checkpoint-40") == ("s3://b", "checkpoint-40")
    assert ck.split_checkpoint_uri("/data/ckpts") == ("/data/ckpts", None)


# --- a real S3 endpoint, no training ------------------------------------------------------------

s3 = pytest.mark.s3


@s3
def test_publish_uploads_verifies_then_writes_manifest_and_latest(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc = s3_location(s3_server, bucket)
    d10, m10 = sealed(tmp_path, 10, 0.5, big=True)
    loc.publish(d10, m10)
    c = s3_server.client()
    head = c.head_object(Bucket=bucket, Key="run/checkpoint-10/optimizer.pt")
    assert head["ETag"].strip('"') == m10["files"]["optimizer.pt"]["etag"]  # multipart: "<md5>-3"
    assert m10["files"]["optimizer.pt"]["etag"].endswith("-3")
    assert c.get_object(Bucket=bucket, Key="run/latest")["Body"].read() == b"checkpoint-10\n"
    listing = loc.listing()
    assert [i.name for i in listing.complete] == ["checkpoint-10"] and listing.latest == "checkpoint-10"
    assert loc.verify(listing.complete[0], listing) == []

    # An upload that does not verify gets no manifest, and latest stays where it was.
    d20, m20 = sealed(tmp_path, 20, 0.6)
    real = s3_store.listing_problems
    monkeypatch.setattr(s3_store, "listing_problems",
                        lambda info, objs: ["model.safetensors: ETag x != y"] if info.step == 20 else real(info, objs))
    with pytest.raises(ck.StorageError, match="VerificationFailed on s3://.*/run/checkpoint-20"):
        loc.publish(d20, m20)
    monkeypatch.setattr(s3_store, "listing_problems", real)
    listing = loc.listing()
    assert [i.name for i in listing.complete] == ["checkpoint-10"] and listing.incomplete() == ["checkpoint-20"]
    assert listing.latest == "checkpoint-10"
    # A retry replaces the partial copy, manifest last.
    loc.publish(d20, m20)
    assert [i.name for i in loc.listing().complete] == ["checkpoint-10", "checkpoint-20"]


@s3
def test_resume_falls_back_past_corrupt_and_partial_checkpoints_and_to_a_mirror(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    primary, mirror = s3_location(s3_server, bucket, "run"), s3_location(s3_server, bucket, "backup")
    for step in (10, 20, 30):
        d, m = sealed(tmp_path / "staging", step, step / 100)
        primary.publish(d, m)
        if step < 30:
            mirror.publish(d, m)
    c = s3_server.client()
    c.delete_object(Bucket=bucket, Key="run/checkpoint-30/rljob-manifest.json")  # partial: ignored
    key = "run/checkpoint-20/model.safetensors"
    size = c.head_object(Bucket=bucket, Key=key)["ContentLength"]
    c.put_object(Bucket=bucket, Key=key, Body=b"\0" * size)  # same size, other bytes
    dest = tmp_path / "fresh-pod"
    dest.mkdir()

    caplog.set_level(logging.WARNING, "rljob.checkpoints")
    path, loc = resume.find_and_fetch([primary], dest)
    assert path == dest / "checkpoint-10" and loc is primary
    assert ck.verify_checkpoint(path) == []
    assert "checkpoint-20 failed verification" in caplog.text and "falling back" in caplog.text
    # With a mirror, the same step's intact copy there wins over an older one on the primary.
    path, loc = resume.find_and_fetch([primary, mirror], dest)
    assert path == dest / "checkpoint-20" and loc is mirror and ck.verify_checkpoint(path) == []
    # A corrupt download (the object changes after the listing) is caught by MD5 too.
    listing = primary.listing()
    info = next(i for i in listing.complete if i.step == 10)
    c.put_object(Bucket=bucket, Key="run/checkpoint-10/trainer_state.json", Body=b"{}")
    with pytest.raises(ck.CorruptCheckpoint, match="trainer_state.json: size"):
        primary.fetch(info, listing, tmp_path / "other")
    # Primary endpoint down: the mirror answers.
    down = ck.S3Location(f"s3://{bucket}/run", endpoint_url=dead_endpoint(), max_attempts=1)
    assert resume.check_locations([down, mirror]) == [mirror]
    path, loc = resume.find_and_fetch([down, mirror], tmp_path / "third")
    assert loc is mirror and path.name == "checkpoint-20"
    with pytest.raises(resume.StorageUnavailable):
        cfg = trainer_config(tmp_path / "out", storage=f"s3://{bucket}/run", endpointUrl=dead_endpoint())
        resume.prepare_checkpoint_storage(cfg)


def trainer_config(output: Path, **checkpoint: Any) -> Any:
    """The trainer's config with this checkpoint section (as the operator writes it, a runtime's storage resolved)."""
    return validate_document(TrainerConfig, {"jobName": "x", "outputDir": str(output), "checkpoint": checkpoint})


@s3
def test_publisher_applies_retention_remotely_trims_staging_and_reports(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None
) -> None:
    from rljob_trainer.telemetry import TrainerMetrics

    staging = tmp_path / "staging"
    primary = s3_location(s3_server, bucket, "run")
    down = ck.S3Location(f"s3://{bucket}/mirror", endpoint_url=dead_endpoint(), max_attempts=1)
    metrics, heartbeat = TrainerMetrics(), SimpleNamespace(checkpoint=None, best_checkpoint=None, best_metric=None)
    pub = upload.CheckpointPublisher(ck.LocalLocation(staging), [primary, down],
                                     ck.RetentionPolicy(keep_last=2, keep_best=1), transfer=SMALL_PARTS,
                                     folder_is_primary=False, retries=1, backoff=0.01, metrics=metrics,
                                     heartbeat=heartbeat)
    rewards = {10: 0.9, 20: 0.1, 30: 0.2, 40: 0.3, 50: 0.4}
    for step, reward in rewards.items():
        pub.save(make_staged(staging, step), step, metrics_of(reward))
    assert pub.close(timeout=120)

    listing = primary.listing()
    assert [c.name for c in listing.complete] == ["checkpoint-10", "checkpoint-40", "checkpoint-50"]
    assert listing.incomplete() == [] and listing.latest == "checkpoint-50"
    assert sorted(p.name for p in staging.glob("checkpoint-*")) == ["checkpoint-50"]  # newest kept for a fast resume
    fields = pub.summary_fields()
    assert fields["checkpoints"] == ["checkpoint-10", "checkpoint-40", "checkpoint-50"]
    assert fields["latest_checkpoint"]["name"] == "checkpoint-50"
    assert fields["latest_checkpoint"]["location"] == f"s3://{bucket}/run/checkpoint-50"
    assert (fields["best_checkpoint"]["name"], fields["best_checkpoint"]["value"]) == ("checkpoint-10", 0.9)
    assert (heartbeat.checkpoint, heartbeat.best_checkpoint, heartbeat.best_metric) == ("checkpoint-50", "checkpoint-10", 0.9)
    # The dead mirror: 2 attempts for the first checkpoint, one per checkpoint until it recovers, and a
    # last full round for the newest at the end.
    assert fields["checkpoint_upload_failures"] == pub.failures == 2 + 4 + 2
    sample = metrics.registry.get_sample_value
    assert sample("rljob_trainer_checkpoint_upload_failures_total") == 8
    assert time.time() - sample("rljob_trainer_last_checkpoint_upload_timestamp_seconds") < 120
    assert sample("rljob_trainer_last_checkpoint_step") == 50


@s3
def test_local_and_s3_primaries_keep_the_same_checkpoints_through_one_retention_path(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied: list[tuple[str, str]] = []
    real = ck.Location.apply_retention

    def spy(self: ck.Location, *args: Any, **kwargs: Any) -> Any:
        applied.append((type(self).__name__, self.uri))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ck.Location, "apply_retention", spy)
    policy = ck.RetentionPolicy(keep_last=2, keep_best=1)
    pvc, staging, remote = tmp_path / "pvc", tmp_path / "staging", s3_location(s3_server, bucket, "run")
    local_plan = ck.StoragePlan(ck.LocalLocation(pvc), [], pvc, SMALL_PARTS)
    s3_plan = ck.StoragePlan(remote, [], staging, SMALL_PARTS)
    local, on_s3 = (upload.CheckpointPublisher.for_plan(plan, policy, retries=0) for plan in (local_plan, s3_plan))
    for step, reward in {10: 0.9, 20: 0.1, 30: 0.2, 40: 0.3, 50: 0.4, 60: 0.25}.items():
        local.save(make_staged(pvc, step), step, metrics_of(reward))
        on_s3.save(make_staged(staging, step), step, metrics_of(reward))
    assert local.close(timeout=5) and on_s3.close(timeout=120) and on_s3.failures == 0

    expected = ["checkpoint-10", "checkpoint-50", "checkpoint-60"]
    assert [c.name for c in ck.LocalLocation(pvc).listing().complete] == expected
    assert [c.name for c in remote.listing().complete] == expected
    assert local.summary_fields()["checkpoints"] == on_s3.summary_fields()["checkpoints"] == expected
    assert ck.LocalLocation(pvc).listing().latest == remote.listing().latest == "checkpoint-60"
    # Both went through Location.apply_retention: the folder (a local primary), the bucket, and the
    # staging folder in front of it — six checkpoints each.
    assert sorted(set(applied)) == [("LocalLocation", str(pvc)), ("LocalLocation", str(staging)),
                                    ("S3Location", f"s3://{bucket}/run")]
    assert all(applied.count(a) == 6 for a in set(applied))


@s3
def test_local_storage_is_mirrored_to_s3_and_a_folder_and_resumes_from_a_mirror(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = tmp_path / "pvc"
    cfg = trainer_config(tmp_path / "out", storage=str(primary), partSizeMib=5, mirrors=[
        {"location": f"s3://{bucket}/backup", "endpointUrl": s3_server.endpoint},
        {"location": str(tmp_path / "other-disk")},
    ])
    plan = ck.storage_plan(cfg)
    assert not plan.remote_primary and plan.local_root == primary and len(plan.publish_to) == 2
    assert plan.folder is plan.primary  # the HF Trainer saves straight into the local primary
    pub = upload.CheckpointPublisher.for_plan(plan, ck.RetentionPolicy(keep_last=1), retries=0)
    for step in (10, 20):
        d = make_staged(primary, step, big=step == 20)
        pub.save(d, step, {"reward": 0.1})  # sealed in place before it returns (no ETags), then mirrored
        assert (primary / ck.LATEST).read_text() == f"checkpoint-{step}\n" and ck.verify_checkpoint(d) == []
        assert "etag" not in json.loads((d / ck.MANIFEST).read_text())["files"]["model.safetensors"]
    assert pub.close(timeout=120) and pub.failures == 0
    for loc in plan.mirrors:
        listing = loc.listing()
        assert [c.name for c in listing.complete] == ["checkpoint-20"] and listing.latest == "checkpoint-20"
        assert loc.verify(listing.complete[0], listing) == []  # S3: by ETag (multipart computed); folder: by MD5

    # A new volume: the primary is empty, so the pre-flight copies the newest mirror checkpoint into it.
    shutil.rmtree(primary)
    env = resume.prepare_checkpoint_storage(cfg)
    assert env == {resume.RESUME_ENV: str(primary / "checkpoint-20")}
    assert ck.verify_checkpoint(primary / "checkpoint-20") == []
    monkeypatch.setenv(resume.RESUME_ENV, env[resume.RESUME_ENV])
    assert resume.resume_checkpoint(primary) == primary / "checkpoint-20"


@s3
def test_denied_and_missing_buckets_are_permanent_errors_naming_the_location(
    tmp_path: Path, s3_env: None
) -> None:
    server = MotoServer(log=tmp_path / "moto.log").start()
    try:
        name = server.create_bucket()
        no_s3 = server.iam_user_without_s3()
        server.enforce_auth()
        denied = ck.S3Location(f"s3://{name}/run", endpoint_url=server.endpoint, max_attempts=1, credentials={
            "aws_access_key_id": no_s3["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": no_s3["AWS_SECRET_ACCESS_KEY"]})
        with pytest.raises(PermanentError, match=rf"spec.checkpoint.storage: AccessDenied on s3://{name}/run"):
            resume.check_locations([denied])
        missing = ck.S3Location("s3://no-such-bucket/run", endpoint_url=server.endpoint, max_attempts=1,
                                where="spec.checkpoint.mirrors[0].location", credentials={
            "aws_access_key_id": no_s3["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": no_s3["AWS_SECRET_ACCESS_KEY"]})
        with pytest.raises(PermanentError, match=r"mirrors\[0\].location: (AccessDenied|NoSuchBucket) on s3://no-such"):
            resume.check_locations([missing])

        # End to end: unknown keys → the launcher's pre-flight fails with exit 78 before any rank starts.
        doc = deep_update(quickstart_doc(), {"spec": {"training": {"maxSteps": 2}}})
        runtime = write_runtime(tmp_path / "runtime.yaml", {"storage": f"s3://{name}/run",
                                                           "endpointUrl": server.endpoint})
        out = tmp_path / "out"
        result = run_rljob("train", str(write_manifest(tmp_path / "job.yaml", doc)), "--runtime", str(runtime),
                           "--output", str(out), timeout=300,
                           **{**S3_ENV, "AWS_ACCESS_KEY_ID": "AKIANOTAKEY", "AWS_SECRET_ACCESS_KEY": "x"})
        assert result.returncode == 78, result.stderr[-2000:]
        assert f"spec.checkpoint.storage: InvalidAccessKeyId on {job_location(f's3://{name}/run', doc)}" \
            in result.stderr
        assert "credentialsSecret" in result.stderr
        assert not (out / "trainer-config.json").exists()  # no rank was started
    finally:
        server.stop()


@s3
def test_cli_lists_verifies_file_by_file_and_prunes(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = s3_location(s3_server, bucket, "run")
    staging = tmp_path / "staging"
    for step in (10, 20, 30):
        d, m = sealed(staging, step, step / 100, big=step == 30)
        loc.publish(d, m)
    uri, ep = f"s3://{bucket}/run", ["--endpoint-url", s3_server.endpoint]
    assert cli.main(["checkpoints", "list", uri, *ep]) == 0
    out = capsys.readouterr().out
    assert "checkpoint-30" in out and "<- latest" in out and "complete" in out
    assert cli.main(["checkpoints", "list", uri, "--json", *ep]) == 0
    assert json.loads(capsys.readouterr().out)["latest"] == "checkpoint-30"

    assert cli.main(["checkpoints", "verify", uri, "--local", str(staging), *ep]) == 0
    out = capsys.readouterr().out
    assert "0 mismatch(es) in 3 checkpoint(s)" in out and "ok       checkpoint-30/optimizer.pt" in out
    # A local file that differs from the remote one is named.
    (staging / "checkpoint-30" / "nested" / "rng_state_0.pth").write_bytes(b"\1" * 333)
    assert cli.main(["checkpoints", "verify", f"{uri}/checkpoint-30", "--local", str(staging / "checkpoint-30"), *ep]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH checkpoint-30/nested/rng_state_0.pth: local md5" in out
    # A remote object that differs from its manifest is named too.
    s3_server.client().put_object(Bucket=bucket, Key="run/checkpoint-20/trainer_state.json", Body=b"{}")
    assert cli.main(["checkpoints", "verify", uri, *ep]) == 1
    assert "MISMATCH checkpoint-20/trainer_state.json: stored copy: size" in capsys.readouterr().out

    assert cli.main(["checkpoints", "prune", uri, "--keep-last", "1", "--dry-run", *ep]) == 0
    assert [c.name for c in loc.listing().complete] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    assert cli.main(["checkpoints", "prune", uri, "--keep-last", "1", "--protect", "checkpoint-10", *ep]) == 0
    assert [c.name for c in loc.listing().complete] == ["checkpoint-10", "checkpoint-30"]
    capsys.readouterr()
    assert cli.main(["checkpoints", "list", f"s3://{bucket}-nope/run", *ep]) == 1
    assert "NoSuchBucket on s3://" in capsys.readouterr().err


# --- the trainer for real: torchrun ranks, kills at the worst moments ------------------------------


@s3
def test_rljob_evaluate_fetches_a_checkpoint_from_s3_verified_and_refuses_a_changed_object(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rljob evaluate s3://…/checkpoint-N` (#33): the same values as the same checkpoint in a folder; an object
    changed after sealing is refused before any model is loaded."""
    from rljob_trainer.builtin.tiny_model import materialize_builtin_model

    model = materialize_builtin_model(tmp_path / "cache", {}, seed=0)
    staged = tmp_path / "staging" / "checkpoint-5"
    shutil.copytree(model, staged)
    ck.seal_checkpoint(staged, 5, {})
    s3_location(s3_server, bucket).publish(staged, json.loads((staged / ck.MANIFEST).read_text()))
    doc = deep_update(quickstart_doc(), {"spec": {"training": {
        "dataset": {"name": "builtin:first-char", "size": 256},
        "evaluation": {"heldOutFraction": 0.2, "maxPrompts": 16, "metrics": [{"name": "repeat_char"}]}}}})
    manifest = write_manifest(tmp_path / "job.yaml", doc)
    ep = ["--endpoint-url", s3_server.endpoint]

    assert cli.main(["evaluate", str(staged), "--config", str(manifest), "--json", str(tmp_path / "local.json")]) == 0
    assert cli.main(["evaluate", f"s3://{bucket}/run", "--config", str(manifest),  # its latest: checkpoint-5
                     "--json", str(tmp_path / "remote.json"), *ep]) == 0
    local, remote = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("local", "remote"))
    assert remote["checkpoint"] == f"s3://{bucket}/run/checkpoint-5" and remote["step"] == 5
    assert remote["metrics"] == local["metrics"] and remote["prompts"] == 16
    capsys.readouterr()

    s3_server.client().put_object(Bucket=bucket, Key="run/checkpoint-5/config.json", Body=b"{}")
    assert cli.main(["evaluate", f"s3://{bucket}/run/checkpoint-5", "--config", str(manifest), *ep]) == 1
    captured = capsys.readouterr()
    assert "rljob: error: s3://" in captured.err and "config.json: size" in captured.err
    assert "eval/" not in captured.out
