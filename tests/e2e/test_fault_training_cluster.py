"""End to end: the real trainer, run as local processes from the pods the operator builds, survives
a worker killed mid-training — the operator restarts the gang, which resumes from the newest
checkpoint (losing at most one checkpoint interval) in the S3 test server, trains to maxSteps, and
logs exactly the curve an uninterrupted run of the same manifest logs.

As in ``test_operator_contract``, each pod's command and environment (its Secret's keys included) run
here as a process; the fake pod mirrors what the kubelet would report (exit 137 for the SIGKILLed
node), and a pod the operator deletes has its process stopped.
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    annotate_pod,
    create_job,
    get_job,
    job_manifest,
    job_pods,
    on_namespaced_runtime,
    wait_gang,
    wait_phase,
)
from tests.support.pod_harness import PodProcess, logs, start_gang, stop
from tests.support.s3_server import MotoServer, bucket_fixture, s3_server_fixture  # noqa: F401 - fixtures register by import
from tests.support.trainer import assert_same_curve, deep_update, logged_curve, run_rljob, write_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

MAX_STEPS = 10
EVERY = 3
#: The job's storage keys (the S3 test server takes any), distinctive enough to look for.
KEYS = {"AWS_ACCESS_KEY_ID": "AKIARLJOBFAULTE2E", "AWS_SECRET_ACCESS_KEY": "rljob-e2e-secret-9f4c2a"}


def _environments(procs: list[Any]) -> list[bytes]:
    """The environment of every process of the gang's nodes (launchers, fork servers, ranks)."""
    import psutil

    out = []
    for p in procs:
        for proc in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{proc.pid}/environ").read_bytes())
    return out


def test_sigkilled_worker_gang_restarts_resumes_from_its_s3_checkpoint_and_logs_the_uninterrupted_curve(
        kube: Any, namespace: str, operator: Any, tmp_path: Path, s3_server: MotoServer, bucket: str) -> None:
    operator()
    kube.request("POST", kube.core_path(namespace, "secrets"), {"metadata": {"name": "s3-keys"}, "data": {
        k: base64.b64encode(v.encode()).decode() for k, v in KEYS.items()}})
    spec = {
        "training": {"maxSteps": MAX_STEPS},
        "checkpoint": {"everySteps": EVERY, "keepLast": 2},
        "runPolicy": {"backoffBaseSeconds": 0},
    }
    create_job(kube, namespace, job_manifest("e2e", spec=deep_update(spec, on_namespaced_runtime(
        kube, namespace, "s3", {"checkpoint": {"storage": f"s3://{bucket}", "endpointUrl": s3_server.endpoint,
                                               "credentialsSecret": "s3-keys"}}))))
    own = f"{namespace}/e2e"  # the job's own path under the runtime's storage
    wait_gang(kube, namespace, "e2e", 0)
    first = start_gang(kube, namespace, "e2e", 0, tmp_path)
    second: list[PodProcess] = []
    try:
        def checkpointed() -> dict[str, Any] | None:
            assert all(p.poll() is None for p, _, _ in first), logs(first)
            progress = get_job(kube, namespace, "e2e")["status"].get("progress") or {}
            return progress if progress.get("checkpoint") and (progress.get("step") or 0) > EVERY else None

        progress = wait_for(checkpointed, 300, interval=0.2, message="a checkpoint and a step past it")
        # The keys reached the trainer as files (its checkpoints are in the bucket), and no process of the
        # gang has them in its environment: only the path of the credentials file the launcher wrote.
        environs = _environments([p for p, _, _ in first])
        assert not [env for env in environs if KEYS["AWS_SECRET_ACCESS_KEY"].encode() in env]
        assert any(b"AWS_SHARED_CREDENTIALS_FILE=" in env for env in environs)
        killed_at = progress["step"]
        assert killed_at < MAX_STEPS, "training finished before the fault: raise MAX_STEPS"
        stop(first[1:])  # SIGKILL worker 1's node: torchrun and its workers
        annotate_pod(kube, namespace, "e2e-worker-1", fake_pods.exit_annotations(137))  # what the kubelet reports
        wait_for(lambda: not any(p["metadata"]["labels"]["rljob.dev/gang-generation"] == "0"
                                 for p in job_pods(kube, namespace, "e2e")), 60, message="old gang deleted")
        stop(first[:1], signal.SIGTERM)  # the kubelet stops worker 0 when its pod is deleted
        job = wait_gang(kube, namespace, "e2e", 1)
        listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=f"{own}/").get("Contents", [])
        sealed = {int(o["Key"][len(own) + 1:].split("/")[0].split("-")[1]) for o in listed
                  if o["Key"].endswith("/rljob-manifest.json")}
        assert sealed, "the first gang sealed no checkpoint in the bucket"
        # Each rank's RNG states are in it, though each rank saved them in its own pod's folder.
        newest = {o["Key"].rsplit("/", 1)[1] for o in listed if o["Key"].startswith(f"{own}/checkpoint-{max(sealed)}/")}
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= newest, newest
        assert job["status"]["restarts"] == 1 and job["status"]["lastFailure"]["worker"] == "e2e-worker-1"

        second = start_gang(kube, namespace, "e2e", 1, tmp_path)
        codes = [p.wait(timeout=600) for p, _, _ in second]
        assert codes == [0, 0], logs(second)
        summary = json.loads((second[0][2] / "output" / "summary.json").read_text())
        resumed = int(summary["resumed_from"].rsplit("-", 1)[-1])
        assert killed_at - EVERY <= resumed <= killed_at + EVERY, (killed_at, summary["resumed_from"])
        assert summary["steps"] == MAX_STEPS
        assert resumed == max(sealed), (resumed, sealed)  # the newest the bucket held
        # Worker 1 keeps nothing of its own checkpoints (they went to worker 0's), only the resume's copy.
        staging = second[1][2] / "output" / "checkpoint-staging"
        assert sorted(p.name for p in staging.glob("checkpoint-*")) == [summary["resumed_from"]]
        wait_for(lambda: (get_job(kube, namespace, "e2e")["status"].get("progress") or {}).get("step") == MAX_STEPS,
                 30, message="final heartbeat")
        print(f"killed at step {killed_at}, resumed from {summary['resumed_from']}")
    finally:
        stop(first)
        stop(second)
    for i in (1, 0):
        annotate_pod(kube, namespace, f"e2e-worker-{i}", fake_pods.exit_annotations(0))
    assert wait_phase(kube, namespace, "e2e", "Succeeded")["status"]["restarts"] == 1

    # Exact resume through the operator (issue #31): `rljob train` of the same manifest, uninterrupted
    # (two processes, as replicas × procsPerWorker; checkpoints in a folder), logs the same values, to
    # the last bit, at every step: those the first gang trained before the resumed checkpoint, and
    # every step the second gang trained.
    local = write_manifest(tmp_path / "job.yaml", job_manifest("e2e", spec=spec))
    reference = run_rljob("train", str(local), "--output", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    want = logged_curve(tmp_path / "reference" / "metrics.jsonl")
    after = logged_curve(second[0][2] / "output" / "metrics.jsonl")
    assert sorted(after) == list(range(resumed + 1, MAX_STEPS + 1))
    before = {k: v for k, v in logged_curve(first[0][2] / "output" / "metrics.jsonl").items() if k <= resumed}
    assert sorted(before) == list(range(1, resumed + 1))
    assert_same_curve(after, want) + assert_same_curve(before, want)
