"""End to end: a job resized from 2 workers to 1 mid-training (``kubectl scale``) with the real trainer.

The pods the operator builds run here as local processes (as in ``test_fault_training_cluster.py``). When the
operator deletes the 2-worker gang, the test stops its processes with SIGTERM, as the kubelet
would: the workers agree on the step, save a checkpoint and exit. The 1-worker gang the operator
then creates resumes from that checkpoint, with gradientAccumulationSteps doubled so the global
batch stays, and trains to maxSteps.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.waiting import wait_for
from tests.support.operator_process import create_job, get_job, job_manifest, job_pods, on_namespaced_runtime
from tests.support.pod_harness import PodProcess, logs, start_gang, stop

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.e2e]

MAX_STEPS = 30


def _config(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    cm = kube.request("GET", kube.core_path(namespace, "configmaps", f"{name}-config"))
    return yaml.safe_load(cm["data"]["trainer.yaml"])  # type: ignore[no-any-return]


def test_a_job_resized_from_two_workers_to_one_resumes_from_its_checkpoint_and_finishes(
        kube, namespace, operator, tmp_path: Path) -> None:
    operator()
    spec = {
        "training": {"maxSteps": MAX_STEPS},
        "checkpoint": {"everySteps": 100, "keepLast": 2},
        "workers": {"minReplicas": 1, "maxReplicas": 2},
        **on_namespaced_runtime(kube, namespace, "folder", {"checkpoint": {"storage": str(tmp_path / "checkpoints")}}),
    }
    checkpoints = tmp_path / "checkpoints" / namespace / "resize"  # the job's own folder on the runtime's storage
    create_job(kube, namespace, job_manifest("resize", replicas=2, spec=spec))
    wait_for(lambda: len(job_pods(kube, namespace, "resize")) == 2
             and (get_job(kube, namespace, "resize").get("status") or {}).get("phase") == "Running",
             60, message="2 workers running")
    before = _config(kube, namespace, "resize")
    first = start_gang(kube, namespace, "resize", 0, tmp_path)
    second: list[PodProcess] = []
    try:
        def training() -> dict[str, Any] | None:
            assert all(p.poll() is None for p, _, _ in first), logs(first)
            progress = get_job(kube, namespace, "resize")["status"].get("progress") or {}
            return progress if (progress.get("step") or 0) >= 4 else None

        at_scale = wait_for(training, 300, interval=0.2, message="training under way")["step"]
        assert at_scale < MAX_STEPS - 5, "training nearly finished before the resize: raise MAX_STEPS"
        kube.request("PATCH", kube.job_path(namespace, "resize", "scale"), {"spec": {"replicas": 1}},
                     content_type="application/merge-patch+json")
        wait_for(lambda: not any(p["metadata"]["labels"]["rljob.dev/gang-generation"] == "0"
                                 for p in job_pods(kube, namespace, "resize")), 60, message="old gang deleted")
        stop(first, signal.SIGTERM)  # what the kubelet does to a deleted pod's container
        codes = [p.returncode for p, _, _ in first]
        assert codes == [143, 143], logs(first)  # stopped, not finished
        saved = sorted(int(c.name.rsplit("-", 1)[1]) for c in checkpoints.glob("checkpoint-*"))
        assert saved and saved[-1] >= at_scale, (saved, at_scale)  # saved on SIGTERM (everySteps is 100)

        wait_for(lambda: [p["metadata"]["labels"]["rljob.dev/gang-generation"]
                          for p in job_pods(kube, namespace, "resize")] == ["1"], 60, message="1-worker gang")
        after = _config(kube, namespace, "resize")
        assert (before["worldSize"], after["worldSize"]) == (2, 1)
        assert after["training"]["gradientAccumulationSteps"] == 2 * before["training"]["gradientAccumulationSteps"]
        second = start_gang(kube, namespace, "resize", 1, tmp_path, size=1)
        codes = [p.wait(timeout=600) for p, _, _ in second]
        assert codes == [0], logs(second)
        summary = json.loads((second[0][2] / "output" / "summary.json").read_text())
        assert summary["resumed_from"] == f"checkpoint-{saved[-1]}" and summary["steps"] == MAX_STEPS
        print(f"resized at step {at_scale}, saved checkpoint-{saved[-1]} on SIGTERM, finished at {MAX_STEPS}")
    finally:
        stop(first)
        stop(second)
    status = get_job(kube, namespace, "resize")["status"]
    assert status["restarts"] == 0 and status["scaling"]["replicas"] == 1
    assert status["scaling"]["globalBatchSize"] == before["training"]["batchSize"] * 2
