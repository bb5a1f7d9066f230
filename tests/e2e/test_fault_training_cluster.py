"""End to end: the real trainer, run as local processes from the pods the operator builds, survives
a worker of a fixed-size job killed mid-training, and logs exactly the curve an uninterrupted run of
the same manifest logs (issue #48, point 1). Either worker, worker 0 too: the operator replaces that pod
alone, the survivor's agent restarts its ranks (worker 0's loss takes the rendezvous store its agent
hosts: the survivor's launcher dials it again, where the replacement hosts a new one), and both resume
from the newest checkpoint in the S3 test server (losing at most one checkpoint interval).

As in ``test_operator_contract``, each pod's command and environment (its Secret's keys included) run
here as a process; the fake pod mirrors what the kubelet would report (exit 137 for the SIGKILLed
node), and a pod the operator deletes has its process stopped.
"""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    annotate_pod,
    create_job,
    events_for,
    free_port,
    get_job,
    job_manifest,
    job_pods,
    on_namespaced_runtime,
    wait_gang,
    wait_phase,
)
from tests.support.pod_harness import PodProcess, logs, start_pod, stop
from tests.support.s3_server import MotoServer, bucket_fixture, s3_server_fixture  # noqa: F401 - fixtures register by import
from tests.support.trainer import assert_same_curve, deep_update, logged_curve, run_rljob, write_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.e2e]

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


SPEC = {
    "training": {"maxSteps": MAX_STEPS},
    "checkpoint": {"everySteps": EVERY, "keepLast": 2},
    "runPolicy": {"backoffBaseSeconds": 0},
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    """What `rljob train` of the same manifest logs, uninterrupted (two processes, as replicas ×
    procsPerWorker; checkpoints in a folder): every value of every step."""
    out = tmp_path_factory.mktemp("reference")
    local = write_manifest(out / "job.yaml", job_manifest("e2e", spec=SPEC))
    reference = run_rljob("train", str(local), "--output", str(out / "run"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    return logged_curve(out / "run" / "metrics.jsonl")


def _start_job(kube: Any, namespace: str, s3_server: MotoServer, bucket: str) -> None:
    kube.request("POST", kube.core_path(namespace, "secrets"), {"metadata": {"name": "s3-keys"}, "data": {
        k: base64.b64encode(v.encode()).decode() for k, v in KEYS.items()}})
    create_job(kube, namespace, job_manifest("e2e", spec=deep_update(SPEC, on_namespaced_runtime(
        kube, namespace, "s3", {"checkpoint": {"storage": f"s3://{bucket}", "endpointUrl": s3_server.endpoint,
                                               "credentialsSecret": "s3-keys"}}))))


def _checkpointed(kube: Any, namespace: str, gang: list[PodProcess]) -> int:
    """Wait for a checkpoint and a step past it; the step the gang is at."""
    def checkpointed() -> dict[str, Any] | None:
        assert all(p.poll() is None for p, _, _ in gang), logs(gang)
        progress = get_job(kube, namespace, "e2e")["status"].get("progress") or {}
        return progress if progress.get("checkpoint") and (progress.get("step") or 0) > EVERY else None

    step: int = wait_for(checkpointed, 300, interval=0.2, message="a checkpoint and a step past it")["step"]
    assert step < MAX_STEPS, "training finished before the fault: raise MAX_STEPS"
    return step


def _sealed(s3_server: MotoServer, bucket: str, namespace: str) -> tuple[int, set[str]]:
    """(the newest checkpoint sealed in the bucket, the files in it)."""
    own = f"{namespace}/e2e"  # the job's own path under the runtime's storage
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=f"{own}/").get("Contents", [])
    sealed = {int(o["Key"][len(own) + 1:].split("/")[0].split("-")[1]) for o in listed
              if o["Key"].endswith("/rljob-manifest.json")}
    assert sealed, "the first gang sealed no checkpoint in the bucket"
    newest = {o["Key"].rsplit("/", 1)[1] for o in listed if o["Key"].startswith(f"{own}/checkpoint-{max(sealed)}/")}
    return max(sealed), newest


def _resumed(summary: dict[str, Any], killed_at: int) -> int:
    resumed = int(summary["resumed_from"].rsplit("-", 1)[-1])
    assert killed_at - EVERY <= resumed <= killed_at + EVERY, (killed_at, summary["resumed_from"])
    assert summary["steps"] == MAX_STEPS
    return resumed


def _finish(kube: Any, namespace: str) -> dict[str, Any]:
    wait_for(lambda: (get_job(kube, namespace, "e2e")["status"].get("progress") or {}).get("step") == MAX_STEPS,
             30, message="final heartbeat")
    for i in (1, 0):
        annotate_pod(kube, namespace, f"e2e-worker-{i}", fake_pods.exit_annotations(0))
    return wait_phase(kube, namespace, "e2e", "Succeeded")["status"]


def _uids(kube: Any, namespace: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "e2e")
            if not p["metadata"].get("deletionTimestamp")}


@pytest.mark.parametrize("lost", [0, 1], ids=["worker-0", "worker-1"])
def test_a_sigkilled_worker_of_a_fixed_size_job_is_replaced_alone_and_the_gang_logs_the_uninterrupted_curve(
        kube: Any, namespace: str, operator: Any, tmp_path: Path, s3_server: MotoServer, bucket: str,
        uninterrupted: dict[int, dict[str, float]], lost: int) -> None:
    survivor, name = 1 - lost, f"e2e-worker-{lost}"
    operator()
    _start_job(kube, namespace, s3_server, bucket)
    wait_gang(kube, namespace, "e2e", 0)
    before = _uids(kube, namespace)
    rdzv = f"127.0.0.1:{free_port()}"  # one rendezvous endpoint for the gang and the replacement: same generation
    pods = sorted(job_pods(kube, namespace, "e2e"), key=lambda p: p["metadata"]["name"])
    first = [start_pod(kube, namespace, p, tmp_path, rdzv) for p in pods]
    replacement: list[PodProcess] = []
    try:
        killed_at = _checkpointed(kube, namespace, first)
        # The keys reached the trainer as files (its checkpoints are in the bucket), and no process of the
        # gang has them in its environment: only the path of the credentials file the launcher wrote.
        environs = _environments([p for p, _, _ in first])
        assert not [env for env in environs if KEYS["AWS_SECRET_ACCESS_KEY"].encode() in env]
        assert any(b"AWS_SHARED_CREDENTIALS_FILE=" in env for env in environs)
        # SIGKILL the node: its torchrun agent (worker 0's hosts the rendezvous store) and its ranks.
        stop(first[lost:lost + 1])
        annotate_pod(kube, namespace, name, fake_pods.exit_annotations(137))  # what the kubelet reports

        def replaced() -> dict[str, str] | None:
            now = _uids(kube, namespace)
            return now if len(now) == 2 and now[name] != before[name] else None

        after = wait_for(replaced, 60, message=f"{name} created again")
        other = f"e2e-worker-{survivor}"
        assert after[other] == before[other] and first[survivor][0].poll() is None  # never touched
        status = get_job(kube, namespace, "e2e")["status"]
        assert status["restarts"] == 1 and status["gangGeneration"] == 0
        assert status["lastFailure"]["replacedPods"] == [before[name]] and status["lastFailure"]["worker"] == name
        warnings = [e for e in events_for(kube, namespace, "e2e") if e["reason"] == "WorkerFailed"]
        assert warnings and f"replacing {name} in place" in warnings[0]["message"]
        newest, files = _sealed(s3_server, bucket, namespace)
        # Each rank's RNG states are in it, though each rank saved them in its own pod's folder.
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= files, files
        new = next(p for p in job_pods(kube, namespace, "e2e") if p["metadata"]["name"] == name)
        replacement = [start_pod(kube, namespace, new, tmp_path, rdzv)]
        gang = [first[survivor], replacement[0]]
        assert [p.wait(timeout=600) for p, _, _ in gang] == [0, 0], logs(gang)
        kept = (first[survivor][2] / "log.txt").read_text(errors="replace")
        assert "lost a peer worker" in kept, logs(gang)
        if lost == 0:  # the survivor's launcher dialled the store again, where the new worker 0 hosts one
            assert "lost the rendezvous store" in kept, logs(gang)
        summaries = [json.loads(f.read_text()) for _, _, w in gang for f in [w / "output" / "summary.json"]
                     if f.exists()]
        assert len(summaries) == 1, "one rank 0 writes the summary"
        resumed = _resumed(summaries[0], killed_at)
        assert resumed == newest  # the newest the bucket held
        print(f"killed {name} at step {killed_at}, resumed from checkpoint-{resumed}")
    finally:
        stop(first)
        stop(replacement)
    done = _finish(kube, namespace)
    assert done["restarts"] == 1 and done["gangGeneration"] == 0

    # Exact resume in place: every step logged before the resumed checkpoint, and every step after it
    # (whichever pod's rank 0 logged it), the same values as the uninterrupted run, to the last bit.
    curve: dict[int, dict[str, float]] = {}
    for _, _, w in [*first, *replacement]:  # the survivor's file holds both runs: the resumed steps win
        if (w / "output" / "metrics.jsonl").exists():
            logged = logged_curve(w / "output" / "metrics.jsonl")
            curve.update({s: v for s, v in logged.items() if s not in curve or s > resumed})
    assert sorted(curve) == list(range(1, MAX_STEPS + 1))
    assert assert_same_curve(curve, uninterrupted) > 0
