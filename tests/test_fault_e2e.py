"""End to end: the real trainer, run as local processes from the pods the operator builds, survives
a worker killed mid-training — the operator restarts the gang, which resumes from the newest
checkpoint (losing at most one checkpoint interval) and trains to maxSteps.

As in ``test_operator_contract``, each pod's command and environment run here as a process; the
fake pod mirrors what the kubelet would report (exit 137 for the SIGKILLed node), and a pod the
operator deletes has its process stopped. The checkpoint location is a folder both gangs share,
as a volume or bucket would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.operator_helpers import (
    annotate_pod,
    create_job,
    free_port,
    get_job,
    job_manifest,
    job_pods,
    wait_gang,
    wait_phase,
)
from tests.test_operator_contract import _local_process

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

MAX_STEPS = 10
EVERY = 3


def _start_gang(kube: Any, namespace: str, name: str, generation: int, root: Path, size: int = 2
                ) -> list[tuple[Any, Any, Path]]:
    """Run gang ``generation``'s pods (``size`` of them) as local processes."""
    pods = sorted(job_pods(kube, namespace, name), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in pods] == [str(generation)] * size
    cm = kube.request("GET", kube.core_path(namespace, "configmaps", f"{name}-config"))
    config_dir = root / f"g{generation}" / "etc-rljob"
    config_dir.mkdir(parents=True)
    for key, value in cm["data"].items():
        (config_dir / key).write_text(value)
    rdzv = f"127.0.0.1:{free_port()}"
    procs = []
    for pod in pods:
        work = root / f"g{generation}" / pod["metadata"]["name"]
        work.mkdir()
        command, env = _local_process(kube, namespace, pod, work, rdzv, config_dir)
        assert env["RLJOB_RUN_ID"].endswith(f"-g{generation}")
        log = open(work / "log.txt", "wb")  # noqa: SIM115 - closed by _stop
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log, work))
    return procs


def _stop(procs: list[tuple[Any, Any, Path]], sig: int = signal.SIGKILL) -> None:
    """Signal every node's process group at once (as the kubelets do for a gang's deleted pods), then
    wait for each (SIGKILL after 20 s)."""
    for p, _, _ in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    for p, log, _ in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
        log.close()


def _logs(procs: list[tuple[Any, Any, Path]]) -> str:
    return "\n".join(f"--- {w}\n" + (w / "log.txt").read_text(errors="replace")[-3000:] for _, _, w in procs)


def test_sigkilled_worker_gang_restarts_and_resumes_from_checkpoint(kube, namespace, operator, tmp_path) -> None:
    operator()
    storage = tmp_path / "checkpoints"
    spec = {
        "training": {"maxSteps": MAX_STEPS},
        "checkpoint": {"everySteps": EVERY, "keepLast": 2, "storage": str(storage)},
        "runPolicy": {"backoffBaseSeconds": 0},
        "workers": {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 1}}},
    }
    create_job(kube, namespace, job_manifest("e2e", spec=spec))
    wait_gang(kube, namespace, "e2e", 0)
    first = _start_gang(kube, namespace, "e2e", 0, tmp_path)
    second: list[tuple[Any, Any, Path]] = []
    try:
        def checkpointed() -> dict[str, Any] | None:
            assert all(p.poll() is None for p, _, _ in first), _logs(first)
            progress = get_job(kube, namespace, "e2e")["status"].get("progress") or {}
            return progress if progress.get("checkpoint") and (progress.get("step") or 0) > EVERY else None

        progress = wait_for(checkpointed, 300, interval=0.2, message="a checkpoint and a step past it")
        killed_at = progress["step"]
        assert killed_at < MAX_STEPS, "training finished before the fault: raise MAX_STEPS"
        _stop(first[1:])  # SIGKILL worker 1's node: torchrun and its workers
        annotate_pod(kube, namespace, "e2e-worker-1", fake_pods.exit_annotations(137))  # what the kubelet reports
        wait_for(lambda: not any(p["metadata"]["labels"]["rljob.dev/gang-generation"] == "0"
                                 for p in job_pods(kube, namespace, "e2e")), 60, message="old gang deleted")
        _stop(first[:1], signal.SIGTERM)  # the kubelet stops worker 0 when its pod is deleted
        job = wait_gang(kube, namespace, "e2e", 1)
        assert job["status"]["restarts"] == 1 and job["status"]["lastFailure"]["worker"] == "e2e-worker-1"

        second = _start_gang(kube, namespace, "e2e", 1, tmp_path)
        codes = [p.wait(timeout=600) for p, _, _ in second]
        assert codes == [0, 0], _logs(second)
        summary = json.loads((second[0][2] / "output" / "summary.json").read_text())
        resumed = int(summary["resumed_from"].rsplit("-", 1)[-1])
        assert killed_at - EVERY <= resumed <= killed_at + EVERY, (killed_at, summary["resumed_from"])
        assert summary["steps"] == MAX_STEPS
        wait_for(lambda: (get_job(kube, namespace, "e2e")["status"].get("progress") or {}).get("step") == MAX_STEPS,
                 30, message="final heartbeat")
        print(f"killed at step {killed_at}, resumed from {summary['resumed_from']}")
    finally:
        _stop(first)
        _stop(second)
    for i in (1, 0):
        annotate_pod(kube, namespace, f"e2e-worker-{i}", fake_pods.exit_annotations(0))
    assert wait_phase(kube, namespace, "e2e", "Succeeded")["status"]["restarts"] == 1
