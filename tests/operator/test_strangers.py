"""Only pods the operator created are a job's gang (issue #43 point 3, the reconciler's side): a pod with the job's
labels, name or ownerReference that the operator did not create is a stranger: never counted, never deciding a
phase, deleted when it claims the job, ignored when it does not (``decisions/observed.py``, ``createdpods.py``)."""

from __future__ import annotations

import copy
from typing import Any

from rljob_contract.job import RLTrainingJob
from rljob_operator.cluster.kube import FIELD_MANAGER
from rljob_operator.decisions.createdpods import created, known, seed
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.observed import ObservedPod, slim_pod
from rljob_operator.decisions.plan import Event, Plan

from tests.operator.test_plans import RecordingKube, _raw, _reconciler
from tests.support.jobs import NOW, UID, make_job, pod_json

RUNNING = {"phase": "Running", "startTime": "2030-01-01T11:00:00Z", "gangGeneration": 0,
           "gangStartTime": "2030-01-01T11:59:00Z"}


def tenants(pod: dict[str, Any], name: str | None = None, manager: str = "kubectl-create") -> dict[str, Any]:
    """``pod`` as a tenant would make it: every label and the ownerReference copied, its own UID, ``name``."""
    pod = copy.deepcopy(pod)
    if name is not None:
        pod["metadata"]["name"] = name
    pod["metadata"]["uid"] = f"tenant-{pod['metadata']['name']}"
    pod["metadata"]["managedFields"] = [  # as the API server records a create, and kwok's status writes
        {"manager": "kwok", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}},
        {"manager": manager, "operation": "Update", "apiVersion": "v1", "fieldsV1": {"f:metadata": {}, "f:spec": {}}}]
    return pod


def decide(job: RLTrainingJob, ours: list[dict[str, Any]], others: list[dict[str, Any]]) -> Plan:
    """The plan for ``job`` seeing the pods it created (``ours``, recorded) and ``others`` (not)."""
    record = created(ours)
    return plan_reconcile(job, [ObservedPod.from_pod(p, UID, record) for p in ours + others], NOW)


def foreign(plan: Plan) -> list[Event]:
    return [e for e in plan.events if e.reason == "ForeignPod"]


def test_a_stranger_named_worker_0_that_exits_0_does_not_end_the_job_and_is_deleted() -> None:
    job = make_job(replicas=2, status={**RUNNING, "phase": "Pending", "createdPods": {}})
    worker1 = pod_json(job, 1)
    fake0 = tenants(pod_json(job, 0, "Succeeded", False, exit_code=0))
    plan = decide(job, [worker1], [fake0])
    assert plan.status["phase"] == "Pending" and plan.status["reason"] == "WaitingForOldPods"
    assert plan.delete_pods == ["train-worker-0"] and plan.create_pods == []  # the name is freed first
    assert plan.status["workers"]["succeeded"] == 0 and plan.status["workers"]["active"] == 1
    [event] = foreign(plan)
    assert event.type == "Warning" and "train-worker-0" in event.message and "'kubectl-create'" in event.message
    # Once it is gone the operator creates the real worker 0.
    plan = decide(job, [worker1], [])
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-0"]


def test_a_labelled_stranger_under_another_name_counts_for_nothing_decides_nothing_and_is_deleted() -> None:
    job = make_job(replicas=2, status=RUNNING)
    gang = [pod_json(job, 0), pod_json(job, 1)]
    for phase, code in (("Succeeded", 0), ("Failed", 1), ("Running", None)):
        stranger = tenants(pod_json(job, 0, phase, phase == "Running", exit_code=code), name="train-notebook")
        plan = decide(job, gang, [stranger])
        assert (plan.status["phase"], plan.status["reason"]) == ("Running", "Running"), phase
        assert plan.status["workers"]["active"] == 2 and plan.status["workers"]["ready"] == 2
        assert plan.status.get("restarts", 0) == 0 and plan.gang_restart is None
        assert plan.delete_pods == ["train-notebook"]
        assert [e.message.split()[1] for e in foreign(plan)] == ["train-notebook"]
    # Already being deleted: nothing more is said or sent.
    stranger["metadata"]["deletionTimestamp"] = "2030-01-01T11:59:00Z"
    plan = decide(job, gang, [stranger])
    assert plan.delete_pods == [] and foreign(plan) == []


def test_a_finished_or_failing_job_deletes_strangers_too() -> None:
    done = make_job(replicas=1, status={**RUNNING, "phase": "Succeeded", "reason": "Completed",
                                        "completionTime": "2030-01-01T11:30:00Z"})
    stranger = tenants(pod_json(done, 0), name="train-worker-7")
    plan = decide(done, [], [stranger])
    assert plan.delete_pods == ["train-worker-7"] and len(foreign(plan)) == 1
    job = make_job(replicas=1, status=RUNNING)
    plan = decide(job, [pod_json(job, 0, "Failed", False, exit_code=1)], [stranger])
    assert plan.status["phase"] == "Restarting" and "train-worker-7" in plan.delete_pods
    assert len(foreign(plan)) == 1


def test_a_pod_that_does_not_claim_the_job_is_ignored_never_deleted() -> None:
    """Controlled by another object (a tenant's own, with the job's labels copied), or an orphan under a name
    that is no worker's: not counted, and not the operator's to delete."""
    job = make_job(replicas=1, status=RUNNING)
    gang = [pod_json(job, 0)]
    other_controller = tenants(pod_json(job, 0, "Succeeded", False, exit_code=0), name="train-lookalike")
    other_controller["metadata"]["ownerReferences"][0].update(kind="ConfigMap", uid="tenants-configmap")
    orphan = tenants(pod_json(job, 0, "Failed", False, exit_code=1), name="train-scratch")
    del orphan["metadata"]["ownerReferences"]
    plan = decide(job, gang, [other_controller, orphan])
    assert (plan.status["phase"], plan.delete_pods, foreign(plan)) == ("Running", [], [])
    # An orphan under a worker's name (a namesake deleted with --cascade=orphan, or a copy) blocks the gang's
    # names: deleted, as before, and said to be foreign.
    orphan["metadata"]["name"] = "train-worker-3"
    plan = decide(job, gang, [orphan])
    assert plan.delete_pods == ["train-worker-3"] and len(foreign(plan)) == 1


def test_a_pod_named_for_the_operators_field_manager_but_not_recorded_is_still_a_stranger() -> None:
    """``managedFields`` name the field manager the creating *client* chose (``?fieldManager=``, ``kubectl
    --field-manager``): a tenant may name the operator's. So a pod the record does not name is a stranger
    whatever they say, even one the operator did create just before it crashed (that window costs one pod
    created twice: it is deleted and created again, recorded)."""
    job = make_job(replicas=1, status={**RUNNING, "phase": "Pending", "createdPods": {}})
    claimed = tenants(pod_json(job, 0), manager=FIELD_MANAGER)
    plan = decide(job, [], [claimed])
    assert plan.delete_pods == ["train-worker-0"]
    assert f"its creator named itself {FIELD_MANAGER!r}" in foreign(plan)[0].message
    # Recorded under its name with its UID, it is the job's.
    plan = decide(job, [claimed], [])
    assert plan.delete_pods == [] and plan.status["workers"]["active"] == 1


def test_the_pods_this_reconciler_created_are_the_jobs_before_any_status_records_them() -> None:
    """Between a create and the status write that records it, the reconciler's memory of the create's answer
    makes the pod the job's: it is counted, and not taken for a stranger."""
    kube = RecordingKube(_raw())
    reconciler = _reconciler(kube)
    try:
        reconciler.reconcile("team-a", "train")  # creates the gang
        made = _as_created()
        kube.list_pods = lambda namespace, selector: made  # type: ignore[method-assign]
        kube.raw = _raw({**kube.statuses[0], "createdPods": {}})  # the first write, before any record
        kube.calls.clear()
        kube.statuses.clear()
        reconciler.reconcile("team-a", "train")
        assert not [c for c in kube.calls if c[0] == "delete"]
        assert kube.statuses[0]["createdPods"] == created(made)
        assert kube.statuses[0]["workers"]["active"] == 2
        # Another reconciler (the operator restarted before the record was written) knows nothing of them.
        fresh = _reconciler(kube)
        deleted: list[str] = []
        kube.delete_pod = lambda namespace, name, uid=None, force=False: deleted.append(name)  # type: ignore[attr-defined]
        try:
            fresh.reconcile("team-a", "train")
        finally:
            fresh.close()
        assert sorted(deleted) == ["train-worker-0", "train-worker-1"]
    finally:
        reconciler.close()


def _as_created() -> list[dict[str, Any]]:
    """The gang the reconciler created, as the API server shows it (the UIDs ``RecordingKube`` answered with)."""
    job = make_job(replicas=2)
    pods = [pod_json(job, i) for i in range(2)]
    for pod in pods:
        pod["metadata"]["uid"] = f"uid-of-{pod['metadata']['name']}"
        pod["metadata"]["namespace"] = "team-a"
    return pods


def test_a_job_an_earlier_operator_ran_keeps_the_pods_its_uid_controls_and_no_other() -> None:
    job = make_job(replicas=2)
    ours, other = pod_json(job, 0), tenants(pod_json(job, 1))
    other["metadata"]["ownerReferences"][0]["uid"] = "another-uid"
    status = {"phase": "Running"}  # written by a version that kept no record
    record = known(status, seed(status, [ours, other], UID))
    assert record == {"train-worker-0": ours["metadata"]["uid"]}
    assert not known({}, seed({}, [ours], UID))  # no status yet: nothing made before the operator looked


def test_the_watch_cache_keeps_who_a_pod_says_created_it_and_its_address() -> None:
    job = make_job()
    pod = tenants(pod_json(job, 0), manager="notebook")
    pod["metadata"]["managedFields"].append({"manager": "annotator", "operation": "Update", "fieldsV1": {"f:metadata": {}}})
    pod["status"]["podIP"] = "10.0.0.7"
    slim = slim_pod(pod)
    assert [m["manager"] for m in slim["metadata"]["managedFields"]] == ["notebook"]
    seen = ObservedPod.from_pod(slim, UID, {})
    assert seen == ObservedPod.from_pod(pod, UID, {})
    assert (seen.creator, seen.pod_ip, seen.stranger, seen.owned) == ("notebook", "10.0.0.7", True, False)


def addressed(pod: dict[str, Any], ip: str) -> dict[str, Any]:
    pod["status"]["podIP"] = ip
    return pod


def test_the_rendezvous_names_the_worker_0_the_operator_created_never_a_stranger() -> None:
    job = make_job(replicas=2, status=RUNNING)
    gang = [addressed(pod_json(job, 0), "10.0.0.10"), addressed(pod_json(job, 1), "10.0.0.11")]
    lookalike = addressed(tenants(pod_json(job, 0), name="train-notebook"), "10.0.0.66")
    lookalike["spec"]["hostname"] = "train-worker-0"  # what a selector-based Service would have answered for
    plan = decide(job, gang, [lookalike])
    assert plan.rendezvous is not None
    assert [e["addresses"] for e in plan.rendezvous["endpoints"]] == [["10.0.0.10"]]
    # No worker 0 of the operator's (only a stranger under its name): no endpoint, whatever the stranger's address.
    pending = make_job(replicas=2, status={**RUNNING, "phase": "Pending"})
    plan = decide(pending, [gang[1]], [addressed(tenants(pod_json(pending, 0)), "10.0.0.66")])
    assert plan.rendezvous is not None and plan.rendezvous["endpoints"] == []
    # Worker 0 being deleted, or the job finished: no endpoint either.
    gang[0]["metadata"]["deletionTimestamp"] = "2030-01-01T11:59:00Z"
    starting = make_job(replicas=2, status={**RUNNING, "phase": "Starting"})
    assert decide(starting, gang, []).rendezvous["endpoints"] == []  # type: ignore[index]
    done = make_job(replicas=2, status={**RUNNING, "phase": "Succeeded", "reason": "Completed",
                                        "completionTime": "2030-01-01T11:30:00Z"})
    assert decide(done, [addressed(pod_json(done, 0), "10.0.0.10")], []).rendezvous["endpoints"] == []  # type: ignore[index]


def test_the_reconciler_writes_the_rendezvous_slice_when_worker_0_s_address_changes_and_only_then() -> None:
    job = make_job(replicas=2)
    gang = [addressed(pod_json(job, i), f"10.0.0.{i + 10}") for i in range(2)]
    for pod in gang:
        pod["metadata"]["namespace"] = "team-a"
    status = {"phase": "Starting", "gangGeneration": 0, "startTime": "2030-01-01T11:00:00Z",
              "gangStartTime": "2030-01-01T11:59:00Z", "createdPods": created(gang)}
    kube = RecordingKube(_raw(status))
    written: list[list[dict[str, Any]]] = []
    kube.list_pods = lambda namespace, selector: gang  # type: ignore[method-assign]
    looked: list[bool] = []

    def create_or_adopt(obj: dict[str, Any], uid: str, look_first: bool = False, **kw: Any) -> dict[str, Any]:
        written.append(obj["endpoints"])
        looked.append(look_first)
        return obj

    kube.create_or_adopt = create_or_adopt  # type: ignore[method-assign]
    reconciler = _reconciler(kube)
    try:
        reconciler.reconcile("team-a", "train")  # (looked at once: none there, so created)
        reconciler.reconcile("team-a", "train")  # nothing changed: nothing sent
        assert [[e["addresses"] for e in endpoints] for endpoints in written] == [[["10.0.0.10"]]]
        assert looked == [False] and [c for c in kube.calls if c[0] == "get"] == [("get", "EndpointSlice")]
        gang[0]["metadata"]["deletionTimestamp"] = "2030-01-01T11:59:30Z"  # worker 0 goes: its address too
        reconciler.reconcile("team-a", "train")
        assert written[-1] == [] and looked[-1] is True
    finally:
        reconciler.close()
