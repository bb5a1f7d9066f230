"""Kueue as pure decisions: a labelled job waits for its Workload's admission, runs with the
assigned flavor, stops gracefully when evicted and gives the quota back (integrations/kueue/decide.py)."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest
from rljob_contract.job import RLTrainingJob, parse_job
from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.lifecycle import Plan, plan_reconcile
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.integrations.gate import Gated
from rljob_operator.integrations.kueue.client import KueueClient
from rljob_operator.integrations.kueue.decide import (
    KUEUE,
    QUEUE_REQUIRED,
    Flavor,
    Priority,
    QueueView,
    QueueWrites,
    desired_workload,
    queue_name,
    workload_name,
)
from rljob_operator.settings import OperatorSettings
from rljob_operator.times import rfc3339

from tests.support.jobs import NOW, UID, observe, pod_json
from tests.support.operator_process import job_manifest, on_runtime

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


def _finished_condition(plan: Plan, wl: dict[str, Any]) -> dict[str, Any]:
    _, status = writes(plan).status[wl["metadata"]["name"]]
    [finished] = [c for c in status["conditions"] if c["type"] == "Finished"]
    return finished


def test_worker_0_exiting_0_deletes_the_rest_and_the_workload_finishes_only_once_it_is_gone() -> None:
    """Issue #43 point 1: a reward module makes worker 0 exit 0 and worker 1 sleep. The job succeeds, worker 1
    is deleted, and its GPUs stay counted (the Workload not Finished) until it has terminated."""
    job = make(status={"phase": "Running", "gangGeneration": 0})
    wl = workload(job, *ADMITTED, admitted_to="a100")
    view = QueueView(workloads=[wl], flavors={"a100": FLAVOR})
    done = reconcile(job, view, pod_json(job, 0, phase="Succeeded", exit_code=0), pod_json(job, 1))
    assert done.status["phase"] == "Succeeded"
    assert done.delete_pods == ["train-worker-1"]
    assert writes(done) == QueueWrites()  # worker 1 still holds its GPUs
    assert done.requeue_after is not None  # looked at again without an event

    later = make(status={**done.status, "gangGeneration": 0})
    terminating = pod_json(later, 1, deleting=True)
    still = reconcile(later, view, pod_json(later, 0, phase="Succeeded", exit_code=0), terminating)
    assert still.status["phase"] == "Succeeded" and not still.delete_pods and writes(still) == QueueWrites()

    gone = reconcile(later, view, pod_json(later, 0, phase="Succeeded", exit_code=0))
    assert _finished_condition(gone, wl)["reason"] == "Succeeded"
    # A worker that exited (whatever its code) holds nothing: the quota goes with it still listed.
    exited = reconcile(later, view, pod_json(later, 0, phase="Succeeded", exit_code=0),
                       pod_json(later, 1, phase="Failed", exit_code=1))
    assert _finished_condition(exited, wl)["status"] == "True" and not exited.delete_pods


def test_a_failed_job_deletes_its_running_workers_and_finishes_its_workload_once_they_are_gone() -> None:
    job = make(status={"phase": "Running", "gangGeneration": 0})
    wl = workload(job, *ADMITTED, admitted_to="a100")
    view = QueueView(workloads=[wl], flavors={"a100": FLAVOR})
    failed = reconcile(job, view, pod_json(job, 0), pod_json(job, 1, phase="Failed", exit_code=78, message="bad"))
    assert failed.status["phase"] == "Failed" and failed.delete_pods == ["train-worker-0"]
    assert writes(failed) == QueueWrites()
    after = make(status={**failed.status, "gangGeneration": 0})
    assert writes(reconcile(after, view, pod_json(after, 0, deleting=True))) == QueueWrites()
    assert _finished_condition(reconcile(after, view), wl)["reason"] == "Failed"


def test_a_finished_jobs_worker_stuck_terminating_is_force_deleted_and_looked_at_until_then() -> None:
    """No event comes from a pod whose kubelet never answers: the finished job is looked at again when the
    pod falls due (its deletion deadline, which its grace period set, plus ``force_delete_after``)."""
    job = make(status={"phase": "Succeeded", "reason": "Completed", "gangGeneration": 0,
                       "completionTime": rfc3339(NOW)})
    wl = workload(job, *ADMITTED, admitted_to="a100")
    stuck = pod_json(job, 1, deleting=True)  # deletion deadline: NOW
    plan = plan_reconcile(job, observe(job, stuck), NOW, force_delete_after=30.0, profile=PROFILE,
                          gates=(Gated(KUEUE, QueueView(workloads=[wl])),))
    assert plan.requeue_after == 30.0 and not plan.force_delete_pods and writes(plan) == QueueWrites()
    due = plan_reconcile(job, observe(job, stuck), NOW + timedelta(seconds=30), force_delete_after=30.0,
                         profile=PROFILE, gates=(Gated(KUEUE, QueueView(workloads=[wl])),))
    assert due.force_delete_pods == ["train-worker-1"] and writes(due) == QueueWrites()
    assert due.requeue_after is not None and due.requeue_after > 0


def test_suspending_deletes_the_workload_once_the_pods_are_gone() -> None:
    suspended = make({"runPolicy": {"suspend": True}}, {"phase": "Running", "gangGeneration": 0})
    view = QueueView(workloads=[workload(suspended, *ADMITTED, admitted_to="a100")])
    stopping = reconcile(suspended, view, pod_json(suspended, 0), pod_json(suspended, 1))
    assert stopping.status["phase"] == "Suspended" and sorted(stopping.delete_pods) == ["train-worker-0",
                                                                                       "train-worker-1"]
    assert writes(stopping) == QueueWrites()
    plan = reconcile(suspended, view)
    assert writes(plan).delete == [workload_name(suspended, 2, worker_of(suspended))]


def test_a_finished_workload_never_admits_a_job_revived_by_a_spec_edit() -> None:
    """Kueue gave a finished Workload's quota back: a job revived after a refusable failure queues anew."""
    failed = make({"training": {"seed": 3}},
                  {"phase": "Failed", "reason": "PolicyViolation", "gangGeneration": 0, "observedGeneration": 1},
                  generation=2)
    wl = workload(failed, *ADMITTED, ("Finished", "True", "Failed"), admitted_to="a100")
    plan = reconcile(failed, QueueView(workloads=[wl], flavors={"a100": FLAVOR}))
    assert plan.status["phase"] == "Queued" and not plan.create_pods
    assert writes(plan).delete == [wl["metadata"]["name"]]  # goes first: the new one takes its name
    assert writes(plan).create is not None


def test_a_stale_workload_goes_once_the_old_gang_is_gone_not_while_the_new_one_runs() -> None:
    """After a resize the old size's Workload keeps its quota while the old gang terminates, and goes once it
    has, even if the new gang already runs."""
    old = make(status={"phase": "Running", "gangGeneration": 0})
    stale = workload(old, *ADMITTED, admitted_to="a100")
    job = make({"workers": {"replicas": 3, "procsPerWorker": 1, "gpusPerWorker": 2}},
               {"phase": "Running", "gangGeneration": 1})
    current = workload(job, *ADMITTED, admitted_to="a100")
    view = QueueView(workloads=[stale, current], flavors={"a100": FLAVOR})
    new_gang = [pod_json(job, i, generation=1) for i in range(3)]
    old_pod = pod_json(old, 0, generation=0, deleting=True)
    plan = reconcile(job, view, *new_gang, old_pod)
    assert plan.status["phase"] == "Running" and writes(plan).delete == []
    assert writes(reconcile(job, view, *new_gang)).delete == [stale["metadata"]["name"]]


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


# ------------------------------------------------------------- a queued job stays queued (#43 point 2)


def test_a_queued_job_remembers_its_queue_in_status() -> None:
    plan = reconcile(make(), QueueView())
    assert plan.status["queue"] == "team-a"
    moved = reconcile(make(labels={"kueue.x-k8s.io/queue-name": "team-b"}, status={"queue": "team-a"}), QueueView())
    assert moved.status["queue"] == "team-b"  # moving it (allowed while not admitted) moves the memory
    unlabelled = make(status={"queue": None})
    unlabelled.metadata.labels.clear()
    assert "queue" not in plan_reconcile(unlabelled, [], NOW, profile=PROFILE).status  # nothing to remember


def test_a_failed_job_revived_by_an_edit_that_also_removes_its_label_runs_only_through_its_workload() -> None:
    """The exploit: a job Failed on its spec (PolicyViolation) with a queue label; one patch removes the label
    and fixes the spec. The status remembers the queue: the revived job waits for a Workload in that queue."""
    bad = make({"training": {"trl": {"trust_remote_code": True}}})
    failed = reconcile(bad, QueueView())
    assert failed.status["reason"] == "PolicyViolation" and failed.status["queue"] == "team-a"

    revived = make({"training": {"seed": 3}}, {**failed.status, "observedGeneration": 1}, generation=2)
    revived.metadata.labels.clear()
    assert queue_name(revived) == "team-a"
    client = KueueClient(None, False)  # type: ignore[arg-type]
    client._served = (time.monotonic(), False)  # its answer to "is Kueue installed?", taken just now
    assert client.observe(revived, UID) is not None, "the Kueue gate no longer governs a job whose label went"
    plan = plan_reconcile(revived, [], NOW, profile=PROFILE, gates=(Gated(KUEUE, QueueView()),),
                          runtime=on_runtime(revived))
    assert plan.status["phase"] == "Queued" and not plan.create_pods
    assert writes(plan).create is not None and writes(plan).create["spec"]["queueName"] == "team-a"
    assert plan.status["queue"] == "team-a"


def test_where_a_queue_is_required_an_unlabelled_job_is_held_and_a_running_gang_stopped() -> None:
    doc = job_manifest("train", 2, {"workers": {"gpusPerWorker": 2}}, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": 1})
    doc["status"] = {"phase": "Running", "gangGeneration": 0}
    job = parse_job(doc)
    required = (Gated(KUEUE, QueueView(required=True)),)
    plan = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1)), NOW, profile=PROFILE,
                          gates=required, runtime=on_runtime(job))
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == QUEUE_REQUIRED
    assert "metadata.labels[kueue.x-k8s.io/queue-name]" in plan.status["message"]
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"] and not plan.create_pods
    assert writes(plan) == QueueWrites()  # no queue: nothing to write to Kueue
    fresh = parse_job({**doc, "status": {}})
    new = plan_reconcile(fresh, [], NOW, profile=PROFILE, gates=required, runtime=on_runtime(fresh))
    assert new.status["reason"] == QUEUE_REQUIRED and not new.create_pods
    # The client governs an unlabelled job only where the platform requires a queue.
    client = KueueClient(None, False, OperatorSettings(require_queue=True))  # type: ignore[arg-type]
    assert client.observe(job, UID) == Gated(KUEUE, QueueView(required=True))
    assert KueueClient(None, False, OperatorSettings()).observe(job, UID) is None  # type: ignore[arg-type]


def test_requiring_a_queue_without_kueue_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="RLJOB_OPERATOR_REQUIRE_QUEUE=true needs RLJOB_OPERATOR_KUEUE=true"):
        OperatorSettings.from_env({"RLJOB_OPERATOR_REQUIRE_QUEUE": "true", "RLJOB_OPERATOR_KUEUE": "false"})
