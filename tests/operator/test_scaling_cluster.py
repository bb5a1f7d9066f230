"""Elastic jobs on a real control plane: KWOK GPU nodes come and go, the job grows, shrinks, waits, resumes."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
import yaml

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    QUICK_EXIT,
    create_job,
    events_for,
    get_job,
    job_manifest,
    job_pods,
    on_namespaced_runtime,
)

pytestmark = pytest.mark.cluster

#: Global batch 12 at every size the tests visit: batchSize 1 × accumulation (6, 4, 3) × workers (2, 3, 4).
BATCH = {"batchSize": 1, "gradientAccumulationSteps": 6, "numGenerations": 2}
FAST = {"RLJOB_OPERATOR_FORCE_DELETE_AFTER_SECONDS": "2"}


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _pool_nodes(kube: Any, fake_gpu_nodes: Any, pool: str, count: int) -> list[str]:
    """GPU nodes for this test's job only: labelled and tainted with the pool, so that no other
    test's pods take their GPUs while the job's capacity is being judged."""
    names = fake_gpu_nodes.add(count, gpus=1, labels={"rljob.dev/test-pool": pool})
    for name in names:
        node = kube.request("GET", f"/api/v1/nodes/{name}")
        taints = [*(node["spec"].get("taints") or []), {"key": "rljob.dev/test-pool", "value": pool,
                                                         "effect": "NoSchedule"}]
        kube.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints}},
                     content_type="application/merge-patch+json")
    # A new node carries node.kubernetes.io/not-ready (NoSchedule) until the node lifecycle controller
    # sees it Ready (and the patch above may have put it back): until then neither the scheduler nor
    # the operator's capacity counts it, and the operator now reacts within that second.
    for name in names:
        wait_for(lambda name=name: not [t for t in kube.request("GET", f"/api/v1/nodes/{name}")["spec"].get("taints") or []
                                        if t["key"].startswith("node.kubernetes.io/")], 30,
                 interval=0.1, message=f"{name} schedulable")
    return names


def _spec(kube: Any, namespace: str, pool: str, **autoscaling: Any) -> dict[str, Any]:
    """An elastic job on the test's pool of nodes (an RLTrainingRuntime of its namespace places it there)."""
    return {
        **on_namespaced_runtime(kube, namespace, "pool", {"podTemplate": {"spec": {
            "nodeSelector": {"rljob.dev/test-pool": pool},
            "tolerations": [{"key": "rljob.dev/test-pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
        }}}),
        "workers": {"minReplicas": 2, "maxReplicas": 4},
        "training": BATCH,
        "autoscaling": autoscaling,
        "runPolicy": {"checkIntervalSeconds": 1, "backoffBaseSeconds": 0},
    }


def _running_at(kube: Any, namespace: str, name: str, size: int, timeout: float = 90) -> dict[str, Any]:
    """The job once a gang of ``size`` workers, all of one generation, runs Ready."""

    def reached() -> dict[str, Any] | None:
        job = get_job(kube, namespace, name)
        status = job.get("status") or {}
        pods = [p for p in job_pods(kube, namespace, name) if not p["metadata"].get("deletionTimestamp")]
        gens = {p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in pods}
        if status.get("phase") == "Running" and (status.get("scaling") or {}).get("replicas") == size \
                and len(pods) == size and gens == {str(status.get("gangGeneration"))}:
            return job
        return None

    try:
        return wait_for(reached, timeout, interval=0.2, message=f"{name} running with {size} workers")
    except TimeoutError as e:
        status = {k: v for k, v in (get_job(kube, namespace, name).get("status") or {}).items() if k != "conditions"}
        raise AssertionError(f"{e}\nstatus: {yaml.safe_dump(status)}") from None


def _global_batch(kube: Any, namespace: str, name: str) -> tuple[int, int]:
    """(global batch, world size) in the job's ConfigMap as the workers read it."""
    cm = kube.request("GET", kube.core_path(namespace, "configmaps", f"{name}-config"))
    cfg = yaml.safe_load(next(iter(v for k, v in cm["data"].items() if k.endswith(".yaml"))))
    t = cfg["training"]
    return t["batchSize"] * t["gradientAccumulationSteps"] * cfg["worldSize"], cfg["worldSize"]


def _resized(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in events_for(kube, namespace, name) if e["reason"] == "Resized"]


def test_capacity_grows_with_nodes_shrinks_when_they_go_waits_below_min_and_resumes(
        kube, namespace, operator, fake_gpu_nodes) -> None:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    first = _pool_nodes(kube, fake_gpu_nodes, pool, 2)
    operator(env=FAST)
    create_job(kube, namespace, job_manifest("elastic", 2, _spec(kube, namespace, pool, policy="Capacity", cooldownSeconds=6,
                                                                  schedulingTimeoutSeconds=5)))
    job = _running_at(kube, namespace, "elastic", 2)
    batches = [_global_batch(kube, namespace, "elastic")]

    # One more GPU: grow to 3. Another at once: the cooldown holds the second grow back.
    third = _pool_nodes(kube, fake_gpu_nodes, pool, 1)
    job = _running_at(kube, namespace, "elastic", 3)
    grown_at = _time(job["status"]["scaling"]["lastScaleTime"])
    assert job["status"]["scaling"]["lastScaleReason"] == "CapacityAvailable"
    batches.append(_global_batch(kube, namespace, "elastic"))
    fourth = _pool_nodes(kube, fake_gpu_nodes, pool, 1)
    job = _running_at(kube, namespace, "elastic", 4)
    assert (_time(job["status"]["scaling"]["lastScaleTime"]) - grown_at).total_seconds() >= 6 - 1  # 1 s resolution
    batches.append(_global_batch(kube, namespace, "elastic"))
    _pool_nodes(kube, fake_gpu_nodes, pool, 1)  # beyond maxReplicas: stays at 4

    # Two nodes go: their workers are lost at once, the next gang starts at what fits (the spare and two).
    for name in first:
        fake_gpu_nodes.remove(name, wait=False)
    job = _running_at(kube, namespace, "elastic", 3, timeout=120)
    assert job["status"]["scaling"]["lastScaleReason"] == "NodesLost"
    assert job["status"]["restarts"] == 0 and job["status"]["disruptions"] >= 1
    batches.append(_global_batch(kube, namespace, "elastic"))

    # Below minReplicas: Pending with a reason, no pods; back above: runs again.
    for name in (*third, *fourth):
        fake_gpu_nodes.remove(name, wait=False)

    def waiting() -> dict[str, Any] | None:
        job = get_job(kube, namespace, "elastic")
        status = job.get("status") or {}
        live = [p for p in job_pods(kube, namespace, "elastic") if not p["metadata"].get("deletionTimestamp")]
        return job if status.get("reason") == "InsufficientCapacity" and not live else None

    job = wait_for(waiting, 120, interval=0.2, message="elastic waiting for capacity")
    assert job["status"]["phase"] == "Pending" and "minReplicas is 2" in job["status"]["message"]
    _pool_nodes(kube, fake_gpu_nodes, pool, 1)
    job = _running_at(kube, namespace, "elastic", 2)
    batches.append(_global_batch(kube, namespace, "elastic"))

    assert [b for b, _ in batches] == [12] * len(batches), batches  # the global batch never changed
    assert [w for _, w in batches] == [2, 3, 4, 3, 2]
    reasons = [e["message"].split(":")[0] for e in _resized(kube, namespace, "elastic")]
    assert len(reasons) >= 4, reasons  # an event for every resize
    assert all("global batch 12 kept" in e["message"] for e in _resized(kube, namespace, "elastic"))


def test_kubectl_scale_is_clamped_to_the_bounds_and_resizes_the_gang(kube, namespace, operator) -> None:
    operator()
    spec = {**QUICK_EXIT, "workers": {"minReplicas": 1, "maxReplicas": 3}, "training": BATCH}
    create_job(kube, namespace, job_manifest("manual", 2, spec))
    _running_at(kube, namespace, "manual", 2)
    scale = kube.job_path(namespace, "manual", "scale")
    kube.request("PATCH", scale, {"spec": {"replicas": 7}}, content_type="application/merge-patch+json")
    job = _running_at(kube, namespace, "manual", 3)
    assert job["spec"]["workers"]["replicas"] == 7 and job["status"]["scaling"]["specReplicas"] == 7
    assert job["status"]["scaling"]["lastScaleReason"] == "ScaleRequested"
    assert "clamped to [1, 3]" in job["status"]["scaling"]["lastScaleMessage"]
    current = kube.request("GET", scale)
    assert current["spec"]["replicas"] == 7 and current["status"]["replicas"] == 3
    assert current["status"]["selector"] == "rljob.dev/job=manual"

    kube.request("PATCH", scale, {"spec": {"replicas": 1}}, content_type="application/merge-patch+json")
    job = _running_at(kube, namespace, "manual", 1)
    assert _global_batch(kube, namespace, "manual") == (12, 1)
    assert job["status"]["restarts"] == 0
    messages = [e["message"] for e in _resized(kube, namespace, "manual")]
    assert any("2 → 3" in m for m in messages) and any("3 → 1" in m for m in messages)
