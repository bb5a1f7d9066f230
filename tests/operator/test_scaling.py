"""Elastic sizes as pure decisions: clamping, resizes, the global batch, policy Capacity."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from rljob_contract.job import RLTrainingJob, parse_job
from rljob_contract.spec import accumulation_for
from rljob_operator.decisions.children import desired_configmap, desired_worker_pod
from rljob_operator.decisions.lifecycle import Plan, plan_reconcile
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.scaling import Capacity
from rljob_operator.names import CONFIG_KEY
from rljob_operator.times import rfc3339

from tests.support.jobs import NOW, UID, env_of, observe, pod_json
from tests.support.operator_process import job_manifest, on_runtime

ELASTIC = {"workers": {"minReplicas": 1, "maxReplicas": 4}}
CAPACITY = {"workers": {"minReplicas": 2, "maxReplicas": 4},
            "autoscaling": {"policy": "Capacity", "cooldownSeconds": 60, "schedulingTimeoutSeconds": 30}}


def make(replicas: int, spec: dict[str, Any], status: dict[str, Any] | None = None, generation: int = 1
         ) -> RLTrainingJob:
    doc = job_manifest("train", replicas, spec, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": generation})
    if status is not None:
        doc["status"] = status
    return parse_job(doc)


def after(job: RLTrainingJob, plan: Plan, replicas: int | None = None) -> RLTrainingJob:
    """The job as the next reconcile reads it: the plan's status written, the spec perhaps scaled."""
    doc = job.model_dump(by_alias=True, mode="json", exclude_none=True)
    # A merge patch: null deletes a field.
    merged = {**(doc.get("status") or {}), **plan.status}
    doc["status"] = {k: v for k, v in merged.items() if v is not None}
    if replicas is not None:
        doc["spec"]["workers"]["replicas"] = replicas
        doc["metadata"]["generation"] += 1
    return parse_job(doc)


def running(job: RLTrainingJob, n: int, generation: int = 0) -> list[dict[str, Any]]:
    return [pod_json(job, i, generation=generation) for i in range(n)]


def config_of(job: RLTrainingJob) -> dict[str, Any]:
    return yaml.safe_load(desired_configmap(job)["data"][CONFIG_KEY])


def node(name: str, gpus: int, ready: bool = True, labels: dict[str, str] | None = None,
         taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32", "memory": "256Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def cluster(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Capacity:
    return Capacity.from_objects(nodes, pods)


# ------------------------------------------------------------------------ batch


@pytest.mark.parametrize(("batch", "world", "target", "groups", "want"), [
    (4, 2, 8, 4, 1), (4, 1, 8, 4, 2), (4, 4, 32, 4, 2),  # exact
    (4, 3, 8, 4, 1),  # 8/12 is not whole: 1 (12) is nearer than 2 (24)
    (4, 3, 32, 8, 2),  # 32/12 = 2.67, but 36 holds no whole groups of 8: 24 and 48 are valid, 24 is nearer
    (5, 2, 32, 8, 4),  # multiples of 4 only (10 × a must hold groups of 8)
])
def test_accumulation_keeps_the_global_batch_or_the_nearest_valid(batch: int, world: int, target: int, groups: int,
                                                                   want: int) -> None:
    got = accumulation_for(batch, world, target, groups)
    assert got == want and (batch * world * got) % groups == 0


def test_an_elastic_job_may_start_at_a_size_whose_batch_needs_another_accumulation() -> None:
    job = make(3, {"workers": {"minReplicas": 1, "maxReplicas": 4}, "training": {"numGenerations": 8}})
    cfg = job.trainer_config("out")
    assert cfg.world_size == 3 and (cfg.training.batch_size * 3 * cfg.training.gradient_accumulation_steps) % 8 == 0


# ------------------------------------------------------------------ kubectl scale


def test_replicas_are_clamped_to_the_bounds() -> None:
    job = make(9, ELASTIC)
    plan = plan_reconcile(job, [], NOW)
    assert len(plan.create_pods) == 4 and plan.status["scaling"]["replicas"] == 4
    assert plan.status["workers"]["desired"] == 4
    assert env_of(plan.create_pods[0])["RLJOB_NNODES"] == "4"


def test_kubectl_scale_resizes_a_running_gang_and_keeps_the_global_batch() -> None:
    job = make(2, ELASTIC)
    job = after(job, plan_reconcile(job, [], NOW))
    plan = plan_reconcile(job, observe(job, *running(job, 2)), NOW + timedelta(seconds=5))
    job = after(job, plan)
    assert job.status.phase == "Running"
    before = config_of(job)

    scaled = after(job, plan, replicas=1)  # kubectl scale rltj/train --replicas=1
    plan = plan_reconcile(scaled, observe(scaled, *running(job, 2)), NOW + timedelta(seconds=10))
    assert plan.status["phase"] == "Restarting" and plan.status["reason"] == "Resizing"
    assert plan.status["gangGeneration"] == 1 and plan.gang_restart == "Resized"
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"] and plan.create_pods == []
    assert plan.status["restarts"] == 0 and plan.status["disruptions"] == 0  # a resize counts against nothing
    scaling = plan.status["scaling"]
    assert (scaling["replicas"], scaling["specReplicas"], scaling["lastScaleReason"]) == (1, 1, "ScaleRequested")
    assert scaling["lastScaleTime"] == rfc3339(NOW + timedelta(seconds=10))
    resized = [e for e in plan.events if e.reason == "Resized"]
    assert resized and "2 → 1" in resized[0].message and "global batch 8 kept" in resized[0].message

    job = after(scaled, plan)
    plan = plan_reconcile(job, [], NOW + timedelta(seconds=12))  # the old pods are gone
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-0"]
    assert env_of(plan.create_pods[0])["RLJOB_NNODES"] == "1"
    after_cfg = config_of(after(job, plan))
    assert after_cfg["worldSize"] == 1 and before["worldSize"] == 2
    assert after_cfg["training"]["gradientAccumulationSteps"] == 2 * before["training"]["gradientAccumulationSteps"]
    global_batch = [c["training"]["batchSize"] * c["training"]["gradientAccumulationSteps"] * c["worldSize"]
                    for c in (before, after_cfg)]
    assert global_batch == [8, 8]


def test_a_scale_beyond_the_bounds_that_changes_nothing_only_says_so() -> None:
    job = make(4, ELASTIC)
    job = after(job, plan_reconcile(job, [], NOW))
    job = after(job, plan_reconcile(job, observe(job, *running(job, 4)), NOW))
    scaled = after(job, plan_reconcile(job, observe(job, *running(job, 4)), NOW), replicas=7)
    plan = plan_reconcile(scaled, observe(scaled, *running(job, 4)), NOW)
    assert plan.delete_pods == [] and plan.status["scaling"]["replicas"] == 4
    assert plan.status["scaling"]["specReplicas"] == 7
    clamped = [e for e in plan.events if e.reason == "ScaleClamped"]
    assert clamped and "clamped to [1, 4]" in clamped[0].message


def test_an_inexact_global_batch_is_announced() -> None:
    job = make(2, ELASTIC)
    job = after(job, plan_reconcile(job, [], NOW))
    job = after(job, plan_reconcile(job, observe(job, *running(job, 2)), NOW))
    scaled = after(job, plan_reconcile(job, observe(job, *running(job, 2)), NOW), replicas=3)
    plan = plan_reconcile(scaled, observe(scaled, *running(job, 2)), NOW)
    message = next(e.message for e in plan.events if e.reason == "Resized")
    assert "global batch 8 cannot be kept exactly at 3 worker(s): using 12" in message
    assert plan.status["scaling"]["globalBatchSize"] == 12


# ---------------------------------------------------------------- policy Capacity


def _running_capacity_job(nodes: list[dict[str, Any]], start: int = 2) -> tuple[RLTrainingJob, list[dict[str, Any]]]:
    job = make(start, CAPACITY)
    cap = cluster(nodes, [])
    job = after(job, plan_reconcile(job, [], NOW, capacity=cap))
    pods = running(job, start)
    for i, p in enumerate(pods):
        p["spec"]["nodeName"] = nodes[i % len(nodes)]["metadata"]["name"]
    job = after(job, plan_reconcile(job, observe(job, *pods), NOW, capacity=cluster(nodes, pods)))
    assert job.status.phase == "Running"
    return job, pods


def test_capacity_grows_into_free_gpus_after_the_cooldown_only() -> None:
    nodes = [node("a", 1), node("b", 1)]
    job, pods = _running_capacity_job(nodes)
    bigger = nodes + [node("c", 1), node("d", 1), node("e", 1)]
    early = plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=59), capacity=cluster(bigger, pods))
    assert early.delete_pods == [] and early.status["scaling"]["replicas"] == 2  # inside the cooldown
    assert early.requeue_after is not None
    plan = plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=61), capacity=cluster(bigger, pods))
    assert plan.status["scaling"]["replicas"] == 4  # 3 free GPUs, but maxReplicas is 4
    assert plan.status["scaling"]["lastScaleReason"] == "CapacityAvailable"
    assert plan.status["reason"] == "Resizing" and sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"]


def test_capacity_only_counts_nodes_the_job_may_use() -> None:
    nodes = [node("a", 1), node("b", 1)]
    job, pods = _running_capacity_job(nodes)
    other = [node("tainted", 8, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
             node("notready", 8, ready=False), node("c", 1)]
    busy = {"metadata": {"name": "x", "namespace": "other"}, "status": {"phase": "Running"},
            "spec": {"nodeName": "c", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}
    plan = plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=61),
                          capacity=cluster(nodes + other, pods + [busy]))
    assert plan.delete_pods == [] and plan.status["scaling"]["replicas"] == 2
    tolerant = on_runtime(job, {"podTemplate": {"spec": {"tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}]}}})
    worker = desired_worker_pod(job, 0, 0, runtime=tolerant)["spec"]
    assert cluster(nodes + other, [busy]).slots(worker) == 10  # a, b and the tainted node's 8


def test_capacity_shrinks_unschedulable_workers_after_the_timeout() -> None:
    nodes = [node("a", 1), node("b", 1), node("c", 1), node("d", 1)]
    job = make(4, CAPACITY)
    job = after(job, plan_reconcile(job, [], NOW, capacity=cluster(nodes, [])))
    assert job.status.scaling.replicas == 4
    pods = [pod_json(job, i) for i in range(3)] + [pod_json(job, 3, "Pending", False, node=None,
                                                            unschedulable="0/4 nodes: Insufficient nvidia.com/gpu")]
    for p, n in zip(pods, "abc", strict=False):
        p["spec"]["nodeName"] = n
    # Another team's pod took node d's GPU before worker 3 was scheduled.
    thief = {"metadata": {"name": "x", "namespace": "other"}, "status": {"phase": "Running"},
             "spec": {"nodeName": "d", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}
    cap = cluster(nodes, pods[:3] + [thief])
    plan = plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=20), capacity=cap)
    assert plan.delete_pods == [] and plan.status["reason"] == "Unschedulable"
    plan = plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=31), capacity=cap)
    assert plan.status["scaling"]["replicas"] == 3 and plan.status["scaling"]["lastScaleReason"] == "Unschedulable"
    assert len(plan.delete_pods) == 4


def test_nodes_lost_shrink_the_next_gang_and_below_min_it_waits() -> None:
    nodes = [node("a", 1), node("b", 1), node("c", 1)]
    job, pods = _running_capacity_job(nodes, start=3)
    left = nodes[:2]  # node c is gone: its worker is lost at once (no wait for the pod GC)
    plan = plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=5), capacity=cluster(left, pods[:2]))
    assert plan.status["phase"] == "Restarting" and plan.status["reason"] == "WorkerLost"
    assert plan.status["disruptions"] == 1 and plan.status["restarts"] == 0
    job = after(job, plan)
    plan = plan_reconcile(job, [], NOW + timedelta(seconds=6), capacity=cluster(left, []))
    assert plan.status["scaling"]["replicas"] == 2 and plan.status["scaling"]["lastScaleReason"] == "NodesLost"
    job = after(job, plan)
    plan = plan_reconcile(job, [], NOW + timedelta(seconds=7), capacity=cluster(left, []))
    assert len(plan.create_pods) == 2 and env_of(plan.create_pods[0])["RLJOB_NNODES"] == "2"

    # Only one node left: below minReplicas (2) the job waits, Pending, with no pods.
    waiting = plan_reconcile(job, [], NOW + timedelta(seconds=8), capacity=cluster(left[:1], []))
    assert waiting.create_pods == [] and waiting.status["phase"] == "Pending"
    assert waiting.status["reason"] == "InsufficientCapacity" and "minReplicas is 2" in waiting.status["message"]
    assert waiting.requeue_after == job.spec.run_policy.check_interval_seconds
    # Back above: the gang starts again.
    back = plan_reconcile(after(job, waiting), [], NOW + timedelta(seconds=9), capacity=cluster(left, []))
    assert len(back.create_pods) == 2


def test_a_snapshot_taken_before_the_node_watch_saw_a_node_go_does_not_count_it() -> None:
    from rljob_operator.cluster.reconciler import Reconciler

    nodes = [node("a", 1), node("b", 1), node("c", 1)]
    job, pods = _running_capacity_job(nodes, start=3)

    class Lister:  # what the API server answered a moment before node c was deleted
        def list_nodes(self) -> list[dict[str, Any]]:
            return nodes

        def list_bound_pods(self) -> list[dict[str, Any]]:
            return pods

    gone: set[str] = set()
    reconciler = Reconciler(Lister(), node_gone=lambda name: name in gone)  # type: ignore[arg-type]
    try:
        assert [n.name for n in reconciler.capacity().nodes] == ["a", "b", "c"]  # type: ignore[union-attr]
        gone.add("c")  # the Node watch saw it deleted; the snapshot above is still fresh (1 s)
        snapshot = reconciler.capacity()
        assert snapshot is not None and [n.name for n in snapshot.nodes] == ["a", "b"]
        assert [p.node for p in snapshot.pods] == ["a", "b"] and not snapshot.node_ok("c")
        # So the gang restarted for the worker lost there starts at what the other nodes hold: NodesLost.
        observed = [ObservedPod.from_pod(p, UID, "train", node_gone=lambda name: name in gone) for p in pods]
        job = after(job, plan_reconcile(job, observed, NOW + timedelta(seconds=5), capacity=snapshot))
        plan = plan_reconcile(job, [], NOW + timedelta(seconds=6), capacity=reconciler.capacity())
        assert (plan.status["scaling"]["replicas"], plan.status["scaling"]["lastScaleReason"]) == (2, "NodesLost")
    finally:
        reconciler.close()


def test_a_new_gang_counts_its_own_terminating_pods_as_free_whatever_the_watch_shows() -> None:
    nodes = [node(n, 1) for n in "abcd"]
    job = make(4, CAPACITY)
    job = after(job, plan_reconcile(job, [], NOW, capacity=cluster(nodes, [])))
    # The old gang (3 workers) is still terminating on a, b, c in the cluster's view, while the
    # reconciler's watch has already dropped it: those GPUs are the job's own, so 4 still fit.
    old = [pod_json(job, i, deleting=True, node=n) for i, n in enumerate("abc")]
    plan = plan_reconcile(job, [], NOW + timedelta(seconds=1), capacity=cluster(nodes, old))
    assert plan.status["scaling"]["replicas"] == 4 and len(plan.create_pods) == 4
