"""Kueue as pure decisions: a labelled job waits for its Workload's admission, runs with the
assigned flavor, stops gracefully when evicted and gives the quota back (integrations/kueue/decide.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rljob_contract.job import RLTrainingJob, parse_job
from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.lifecycle import Plan, plan_reconcile
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.integrations.gate import Gated
from rljob_operator.integrations.kueue.decide import (
    KUEUE,
    Flavor,
    Priority,
    QueueView,
    QueueWrites,
    desired_workload,
    workload_name,
)
from rljob_operator.times import rfc3339

from tests.operator.test_operator_unit import NOW, UID, observe, pod_json
from tests.support.operator import job_manifest, on_runtime

PROFILE = PodProfile(allowed_images=("registry.invalid/*",))
FLAVOR = Flavor("a100", {"pool": "a100"}, [{"key": "pool", "operator": "Equal", "value": "a100",
                                            "effect": "NoSchedule"}])


def make(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None, *,
         labels: dict[str, str] | None = None, generation: int = 1) -> RLTrainingJob:
    doc = job_manifest("train", 2, {"workers": {"gpusPerWorker": 2}, **(spec or {})}, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": generation,
                            "labels": {"kueue.x-k8s.io/queue-name": "team-a", **(labels or {})}})
    if status is not None:
        doc["status"] = status
    return parse_job(doc)


def worker_of(job: RLTrainingJob, runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """A worker pod of ``job`` on the tests' runtime (``runtime`` merged into its spec), as the reconciler builds it
    for the gates."""
    return desired_worker_pod(job, 0, 0, runtime=on_runtime(job, runtime))


def workload(job: RLTrainingJob, *conditions: tuple[str, str, str], admitted_to: str | None = None,
             active: bool = True, runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's Workload as Kueue leaves it: ``conditions`` (type, status, reason), an admission."""
    wl = desired_workload(job, job.replicas, None, worker_of(job, runtime))
    wl["metadata"].update({"resourceVersion": "7", "generation": 1})
    wl["spec"]["active"] = active
    status: dict[str, Any] = {"conditions": [
        {"type": t, "status": s, "reason": r, "message": f"{r} says Kueue", "lastTransitionTime": rfc3339(NOW)}
        for t, s, r in conditions]}
    if admitted_to:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "workers", "flavors": {"nvidia.com/gpu": admitted_to}, "count": job.replicas}]}
    wl["status"] = status
    return wl


ADMITTED = (("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"))


def reconcile(job: RLTrainingJob, view: QueueView, *pods: dict[str, Any], runtime: dict[str, Any] | None = None) -> Plan:
    """One reconcile of ``job`` on the tests' runtime (``runtime`` merged into its spec), as the reconciler runs it."""
    view = dataclasses.replace(view, worker=worker_of(job, runtime))
    return plan_reconcile(job, observe(job, *pods), NOW, profile=PROFILE, gates=(Gated(KUEUE, view),),
                          runtime=on_runtime(job, runtime))


def writes(plan: Plan) -> QueueWrites:
    """The plan's Workload writes (a KeyError if the Kueue gate wrote nothing)."""
    found = plan.gate_writes["kueue"]
    assert isinstance(found, QueueWrites)
    return found


def test_a_new_labelled_job_is_queued_with_a_workload_of_its_whole_gang_and_no_pod() -> None:
    job = make()
    plan = reconcile(job, QueueView())
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "Queued"
    assert not plan.create_pods and plan.status["gangStartTime"] is None
    assert writes(plan).create is not None
    spec = writes(plan).create["spec"]
    assert spec["queueName"] == "team-a"
    [podset] = spec["podSets"]
    assert podset["name"] == "workers" and podset["count"] == 2  # the gang as one unit
    [container] = podset["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert writes(plan).create["metadata"]["ownerReferences"][0]["uid"] == UID


def test_waiting_shows_kueues_reason_and_message() -> None:
    job = make()
    wl = workload(job, ("QuotaReserved", "False", "Pending"))
    plan = reconcile(job, QueueView(workloads=[wl]))
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "Pending"
    assert "Pending says Kueue" in plan.status["message"] and wl["metadata"]["name"] in plan.status["message"]
    assert writes(plan).create is None and not writes(plan).status


def test_priority_class_sets_the_workloads_priority_as_jobframework_does() -> None:
    job = make(labels={"kueue.x-k8s.io/priority-class": "high"})
    plan = reconcile(job, QueueView(priority=Priority("high", 1000)))
    assert writes(plan).create is not None
    spec = writes(plan).create["spec"]
    assert spec["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}
    assert spec["priority"] == 1000
    missing = reconcile(job, QueueView(priority_problem="metadata.labels[kueue.x-k8s.io/priority-class]: gone"))
    assert missing.status["reason"] == "PriorityClassNotFound"
    assert writes(missing).create is None


def test_an_admitted_gang_is_created_with_the_flavors_labels_and_tolerations() -> None:
    job = make(status={"phase": "Queued", "gangGeneration": 0})
    wl = workload(job, *ADMITTED, admitted_to="a100")
    plan = reconcile(job, QueueView(workloads=[wl], flavors={"a100": FLAVOR}))
    assert len(plan.create_pods) == 2
    for pod in plan.create_pods:
        assert pod["spec"]["nodeSelector"]["pool"] == "a100"
        assert FLAVOR.tolerations[0] in pod["spec"]["tolerations"]
        assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]  # Kueue's pod integration ignores it
    assert plan.status["phase"] == "Pending"


def test_a_flavor_the_pod_profile_refuses_fails_the_job_naming_it() -> None:
    job = make(status={"phase": "Queued", "gangGeneration": 0})
    wl = workload(job, *ADMITTED, admitted_to="any")
    bad = Flavor("any", {}, [{"operator": "Exists"}])
    plan = reconcile(job, QueueView(workloads=[wl], flavors={"any": bad}))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PolicyViolation"
    assert "ResourceFlavor any: spec.tolerations[0]" in plan.status["message"]
    assert not plan.create_pods
    assert wl["metadata"]["name"] in writes(plan).status  # quota given back


def test_a_flavor_label_contradicting_the_runtimes_node_selector_fails_the_job_naming_both() -> None:
    job = make(status={"phase": "Queued", "gangGeneration": 0})
    h100 = {"podTemplate": {"spec": {"nodeSelector": {"pool": "h100"}}}}
    wl = workload(job, *ADMITTED, admitted_to="a100", runtime=h100)
    plan = reconcile(job, QueueView(workloads=[wl], flavors={"a100": FLAVOR}), runtime=h100)
    assert plan.status["phase"] == "Failed" and not plan.create_pods
    assert "spec.podTemplate.spec.nodeSelector[pool]" in plan.status["message"]
    assert "ResourceFlavor a100" in plan.status["message"]


def test_the_workload_counts_the_pod_built_on_the_runtime() -> None:
    """The Workload's podSet is the worker as built on its runtime: its GPU resource and cpu/memory defaults."""
    amd = {"gpuResource": "amd.com/gpu", "limits": {"cpuPerWorker": {"default": "4"}}}
    job = make()
    plan = reconcile(job, QueueView(), runtime=amd)
    [container] = writes(plan).create["spec"]["podSets"][0]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "4", "amd.com/gpu": "2"}


def test_eviction_stops_the_gang_as_a_new_generation_without_counting_a_restart() -> None:
    job = make(status={"phase": "Running", "gangGeneration": 0, "restarts": 1, "gangStartTime": rfc3339(NOW)})
    wl = workload(job, *ADMITTED, ("Evicted", "True", "Preempted"), admitted_to="a100")
    pods = [pod_json(job, i) for i in range(2)]
    plan = reconcile(job, QueueView(workloads=[wl], flavors={"a100": FLAVOR}), *pods)
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "Preempted"
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"]
    assert plan.status["gangGeneration"] == 1 and plan.status["restarts"] == 1
    assert plan.status["gangStartTime"] is None and not plan.create_pods
    assert not writes(plan).status  # pods remain: the quota is still theirs
    assert any(e.reason == "Evicted" for e in plan.events)


def test_once_the_evicted_gang_is_gone_the_quota_reservation_is_cleared_as_jobframework_does() -> None:
    job = make(status={"phase": "Queued", "gangGeneration": 1})
    wl = workload(job, *ADMITTED, ("Evicted", "True", "Preempted"), admitted_to="a100")
    plan = reconcile(job, QueueView(workloads=[wl]))
    assert "kueue" in plan.gate_writes
    version, status = writes(plan).status[wl["metadata"]["name"]]
    assert version == "7" and status["admission"] is None
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["QuotaReserved"]["status"] == "False" and conds["QuotaReserved"]["reason"] == "Pending"
    assert conds["Admitted"]["status"] == "False"
    assert conds["Evicted"]["status"] == "True"  # kept
    assert conds["Requeued"]["status"] == "True" and conds["Requeued"]["reason"] == "Preempted"
    # Still Terminating: nothing cleared yet.
    pending = reconcile(job, QueueView(workloads=[wl]), pod_json(job, 0, generation=0, deleting=True))
    assert not writes(pending).status


def test_finishing_marks_the_workload_finished_and_suspending_deletes_it() -> None:
    job = make(status={"phase": "Running", "gangGeneration": 0})
    wl = workload(job, *ADMITTED, admitted_to="a100")
    done = reconcile(job, QueueView(workloads=[wl], flavors={"a100": FLAVOR}),
                     pod_json(job, 0, phase="Succeeded", exit_code=0), pod_json(job, 1))
    assert done.status["phase"] == "Succeeded"
    _, status = writes(done).status[wl["metadata"]["name"]]
    assert [c for c in status["conditions"] if c["type"] == "Finished"][0]["reason"] == "Succeeded"
    suspended = make({"runPolicy": {"suspend": True}}, {"phase": "Running", "gangGeneration": 0})
    plan = reconcile(suspended, QueueView(workloads=[workload(suspended, *ADMITTED, admitted_to="a100")]))
    assert plan.status["phase"] == "Suspended"
    assert writes(plan).delete == [workload_name(suspended, 2, worker_of(suspended))]


def test_a_new_size_is_a_new_workload_and_the_old_one_goes() -> None:
    old = make()
    wl = workload(old, *ADMITTED, admitted_to="a100")
    job = parse_job({**old.model_dump(by_alias=True, mode="json", exclude_none=True),
                     "spec": {**old.model_dump(by_alias=True, mode="json", exclude_none=True)["spec"],
                              "workers": {"replicas": 3, "procsPerWorker": 1, "gpusPerWorker": 2}}})
    plan = reconcile(job, QueueView(workloads=[wl], flavors={"a100": FLAVOR}))
    assert plan.status["phase"] == "Queued"
    assert writes(plan).delete == [wl["metadata"]["name"]]
    assert writes(plan).create is not None and writes(plan).create["spec"]["podSets"][0]["count"] == 3


def test_capacity_autoscaling_with_a_queue_is_refused_naming_the_field() -> None:
    job = make({"workers": {"gpusPerWorker": 2, "minReplicas": 1, "maxReplicas": 4}, "autoscaling": {"policy": "Capacity"}})
    plan = reconcile(job, QueueView())
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PolicyViolation"
    assert "spec.autoscaling.policy" in plan.status["message"] and "kueue.x-k8s.io/queue-name" in plan.status["message"]
    assert writes(plan).create is None


def test_a_refused_workload_keeps_its_reason_while_it_is_tried_again() -> None:
    job = make(status={"phase": "Queued", "reason": "WorkloadRejected", "message": "spec.queueName: Invalid value"})
    plan = reconcile(job, QueueView())
    assert plan.status["reason"] == "WorkloadRejected" and "spec.queueName" in plan.status["message"]
    assert writes(plan).create is not None  # tried again...
    assert plan.requeue_after == 30.0  # ...every 30 s, not in a loop


def test_without_kueue_installed_the_job_waits_saying_so() -> None:
    plan = reconcile(make(), QueueView(available=False))
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "KueueUnavailable"
    assert "install Kueue" in plan.status["message"] and not plan.create_pods
    assert writes(plan).create is None


def test_an_unlabelled_job_plans_exactly_as_without_kueue() -> None:
    doc = job_manifest("train", 2, {"workers": {"gpusPerWorker": 2}}, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": 1})
    job = parse_job(doc)
    plain = plan_reconcile(job, [], NOW, profile=PROFILE, runtime=on_runtime(job))
    assert "kueue" not in plain.gate_writes and len(plain.create_pods) == 2
