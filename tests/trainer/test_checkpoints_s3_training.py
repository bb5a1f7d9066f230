"""Checkpoints on object storage with real torchrun ranks, killed at the worst moments: the endpoint mid-upload,
the trainer by SIGKILL (the rest, without a run: ``tests/trainer/test_checkpoints_s3.py``)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from rljob_trainer import checkpoints as ck

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
    kill_group,
    quickstart_doc,
    run_rljob,
    start_rljob,
    wait_until,
    write_manifest,
    write_runtime,
)
from tests.trainer.test_checkpoints_s3 import s3

#: Where a runtime puts the quickstart job's checkpoints under its storage prefix (``<namespace>/<job>``).
OWN = "default/quickstart"


def s3_job(tmp_path: Path, name: str, max_steps: int, cadence: dict[str, Any], storage: dict[str, Any]) -> list[str]:
    """``rljob train`` arguments: the quickstart for ``max_steps`` with this checkpoint ``cadence``, on a runtime
    whose checkpoint ``storage`` is given (each location's prefix; the job's own path is ``<prefix>/{OWN}``)."""
    doc = deep_update(quickstart_doc(), {"spec": {
        "training": {"maxSteps": max_steps},
        "checkpoint": {"everySteps": 5, "keepLast": 2, **cadence},
    }})
    runtime = write_runtime(tmp_path / f"{name}-runtime.yaml", storage)
    return [str(write_manifest(tmp_path / f"{name}.yaml", doc)), "--runtime", str(runtime)]


def expected_after(kept: dict[int, float], saves: list[tuple[int, float]], keep_last: int, keep_best: int) -> list[str]:
    """Replay retention over a sequence of (step, reward) publishes, starting from what was kept."""
    state = dict(kept)
    for step, reward in saves:
        state[step] = reward
        infos = [ck.CheckpointInfo(f"checkpoint-{s}", s, {"reward": r}) for s, r in state.items()]
        keep = ck.retention_keep(infos, keep_last, keep_best)
        state = {s: r for s, r in state.items() if f"checkpoint-{s}" in keep}
    return [f"checkpoint-{s}" for s in sorted(state)]


def rewards_of(listing: ck.Listing) -> dict[int, float]:
    return {c.step: c.metrics["reward"] for c in listing.complete}


@s3
@pytest.mark.trainer
def test_s3_resume_after_sigkill_skips_a_corrupt_checkpoint_and_retention_stays_exact(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None
) -> None:
    env = {**S3_ENV, "AWS_ENDPOINT_URL": s3_server.endpoint}  # endpoint from the environment, as boto3 users expect
    manifest = s3_job(tmp_path, "job", 30, {"keepBest": 1}, {"storage": f"s3://{bucket}/job"})
    remote = ck.S3Location(f"s3://{bucket}/job/{OWN}", endpoint_url=s3_server.endpoint)
    first = start_rljob("train", *manifest, "--output", str(tmp_path / "pod-1"), "--metrics-port", "0",
                        log=tmp_path / "first.txt", **env)
    try:
        wait_until(lambda: (ck.step_of(remote.listing().latest or "") or 0) >= 15, timeout=400,
                   what="checkpoint-15 on S3")
    finally:
        kill_group(first, signal.SIGKILL)
    assert first.returncode == -signal.SIGKILL

    # Uploaded and verified: every complete checkpoint matches its manifest; latest is complete.
    listing = remote.listing()
    assert listing.latest in {c.name for c in listing.complete}
    for info in listing.complete:
        assert remote.verify(info, listing) == []
    # Retention ran after every publish (the kill may land between the last one and its retention).
    assert ck.retention_plan(listing.complete[:-1], [], 2, 1) == []
    kept_at_kill = rewards_of(listing)
    # Corrupt the newest: the resume must fall back to the previous complete one.
    newest, previous = listing.complete[-1], listing.complete[-2]
    key = f"job/{OWN}/{newest.name}/model.safetensors"
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=b"\0" * newest.files["model.safetensors"]["size"])

    out = tmp_path / "pod-2"  # a new pod: nothing local, everything comes from S3
    second = run_rljob("train", *manifest, "--output", str(out), "--metrics-port", "0", timeout=600, **env)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-3000:]
    assert f"{newest.name} failed verification" in log and "falling back" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == previous.name
    assert summary["steps"] == 30
    history = dict((int(s), r) for s, r in summary["reward_history"])  # restored up to the resume point

    # Retention across the kill and the restart: exactly the set a replay of the publishes gives.
    saves = [(s, history[s]) for s in range(previous.step + 5, 31, 5)]
    expected = expected_after(kept_at_kill, saves, keep_last=2, keep_best=1)
    final = remote.listing()
    assert [c.name for c in final.complete] == expected and final.incomplete() == []
    assert final.latest == "checkpoint-30"
    assert summary["checkpoints"] == expected
    assert summary["latest_checkpoint"]["name"] == "checkpoint-30"
    best = max(final.complete, key=lambda c: (c.metrics["reward"], c.step))
    assert summary["best_checkpoint"]["name"] == best.name
    assert summary["checkpoint_upload_failures"] == 0
    # The local staging copy keeps only what a fast resume needs, and it matches S3 file by file.
    staging = out / "checkpoint-staging"
    assert sorted(p.name for p in staging.glob("checkpoint-*")) == ["checkpoint-30"]
    assert cli.main(["checkpoints", "verify", f"s3://{bucket}/job/{OWN}/checkpoint-30", "--local",
                     str(staging / "checkpoint-30"), "--endpoint-url", s3_server.endpoint]) == 0


@s3
@pytest.mark.trainer
def test_endpoint_killed_mid_upload_never_exposes_a_partial_checkpoint_and_resume_uses_the_mirror(
    s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None
) -> None:
    # The trainer reaches the primary through a throttled proxy, so an upload is in flight for seconds.
    proxy = EndpointProxy(s3_server.port, rate=800_000).start()
    manifest = s3_job(tmp_path, "job", 30, {"uploadRetries": 2}, {
        "storage": f"s3://{bucket}/run", "endpointUrl": proxy.endpoint,
        "mirrors": [{"location": f"s3://{bucket}/mirror", "endpointUrl": s3_server.endpoint}],
    })
    primary = ck.S3Location(f"s3://{bucket}/run/{OWN}", endpoint_url=s3_server.endpoint)  # the test looks directly
    mirror = ck.S3Location(f"s3://{bucket}/mirror/{OWN}", endpoint_url=s3_server.endpoint)
    seen_latest: list[tuple[str, bool]] = []

    def upload_in_flight() -> bool:
        listing = primary.listing()
        if listing.latest:
            seen_latest.append((listing.latest, listing.latest in {c.name for c in listing.complete}))
        return bool(listing.latest and listing.incomplete())

    port = free_port()
    run = start_rljob("train", *manifest, "--output", str(tmp_path / "pod-1"), "--metrics-port", str(port),
                      log=tmp_path / "first.txt", **S3_ENV)
    try:
        wait_until(upload_in_flight, timeout=400, interval=0.05, what="an upload in flight after a complete one")
        proxy.kill()  # the endpoint dies mid-request
        at_kill = primary.listing()
        partial = at_kill.incomplete()
        assert partial and at_kill.latest in {c.name for c in at_kill.complete}
        for info in at_kill.complete:
            assert primary.verify(info, at_kill) == []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # training goes on while the endpoint is down
            upload_in_flight()
            time.sleep(0.2)
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "rljob_trainer_checkpoint_upload_failures_total" in text
        proxy.start()
        while run.poll() is None:
            upload_in_flight()
            time.sleep(0.2)
    finally:
        kill_group(run)
        proxy.kill()
    assert run.returncode == 0, (tmp_path / "first.txt").read_text()[-3000:]
    assert seen_latest and all(complete for _, complete in seen_latest), seen_latest
    summary = json.loads((tmp_path / "pod-1" / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["checkpoint_upload_failures"] >= 1
    # The partial upload was retried or skipped, then cleaned up; the final checkpoint made it.
    final = primary.listing()
    assert final.incomplete() == [] and final.latest == "checkpoint-30"
    assert len(final.complete) == 2 and all(primary.verify(c, final) == [] for c in final.complete)
    assert [c.name for c in mirror.listing().complete] == ["checkpoint-25", "checkpoint-30"]  # never down

    # The primary endpoint is down for the next attempt: resume from the mirror, keep mirroring.
    manifest = s3_job(tmp_path, "job-2", 40, {"uploadRetries": 1}, {
        "storage": f"s3://{bucket}/run", "endpointUrl": proxy.endpoint,
        "mirrors": [{"location": f"s3://{bucket}/mirror", "endpointUrl": s3_server.endpoint}],
    })
    out = tmp_path / "pod-2"
    second = run_rljob("train", *manifest, "--output", str(out), "--metrics-port", "0", timeout=600, **S3_ENV)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-3000:]
    assert f"{proxy.endpoint}" in log or "unreachable" in log
    assert f"s3://{bucket}/mirror/{OWN}/checkpoint-30" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == "checkpoint-30" and summary["steps"] == 40
    assert summary["latest_checkpoint"]["location"] == f"s3://{bucket}/mirror/{OWN}/checkpoint-40"
    assert summary["checkpoint_upload_failures"] >= 2
    assert [c.name for c in mirror.listing().complete] == ["checkpoint-35", "checkpoint-40"]
    assert primary.listing().latest == "checkpoint-30"  # untouched while down
    # Each run left its record in every location it could reach: the second's only on the mirror.
    from rljob_trainer.history import read_records

    on_mirror, bad = read_records(mirror)
    assert bad == [] and [(r.steps, r.phase) for _, r in on_mirror] == [(30, "Succeeded"), (40, "Succeeded")]
    assert on_mirror[-1][1].latest_checkpoint.location == summary["latest_checkpoint"]["location"]
    assert [r.steps for _, r in read_records(primary)[0]] == [30]
