"""Only pods the operator created are a job's gang (issue #43 point 3, the reconciler's side): a pod with the job's
labels, name or UID that the operator did not create is a stranger: never counted, never deciding a phase,
deleted when it claims the job, ignored when it does not (``decisions/observed.py``). The operator's mark is the
job as the pod's controller reference (API group ``rljob.dev``, kind, name and UID), which the admission policy
``rljob-worker-pods`` admits only from whoever may patch the job's status (issue #48: it replaced the per-worker
``status.createdPods``); that the API server refuses a tenant's such reference is
``tests/delivery/test_admission_policies_cluster.py``'s."""

from __future__ import annotations

import copy
from typing import Any

from rljob_contract.job import RLTrainingJob
from rljob_operator.cluster.kube import FIELD_MANAGER
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.observed import ObservedPod, slim_pod
from rljob_operator.decisions.plan import Event, Plan

from tests.operator.test_plans import RecordingKube, _raw, _reconciler
from tests.support.jobs import NOW, UID, make_job, pod_json

RUNNING = {"phase": "Running", "startTime": "2030-01-01T11:00:00Z", "gangGeneration": 0,
           "gangStartTime": "2030-01-01T11:59:00Z"}


def tenants(pod: dict[str, Any], name: str | None = None, manager: str = "kubectl-create") -> dict[str, Any]:
    """``pod`` as a tenant could make it: every label copied, its own UID, ``name``, and the controller reference
    as close as the API server admits from them: the job's kind, name and UID, under another API group (the
    admission policy refuses a reference to an RLTrainingJob of ``rljob.dev`` from them)."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["ownerReferences"][0]["apiVersion"] = "tenant.example/v1"
    if name is not None:
        pod["metadata"]["name"] = name
    pod["metadata"]["uid"] = f"tenant-{pod['metadata']['name']}"
    pod["metadata"]["managedFields"] = [  # as the API server records a create, and kwok's status writes
        {"manager": "kwok", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}},
        {"manager": manager, "operation": "Update", "apiVersion": "v1", "fieldsV1": {"f:metadata": {}, "f:spec": {}}}]
    return pod


def decide(job: RLTrainingJob, ours: list[dict[str, Any]], others: list[dict[str, Any]]) -> Plan:
    """The plan for ``job`` seeing the pods it created (``ours``) and ``others``."""
    return plan_reconcile(job, [ObservedPod.from_pod(p, UID, "train") for p in ours + others], NOW)


def foreign(plan: Plan) -> list[Event]:
    return [e for e in plan.events if e.reason == "ForeignPod"]


def test_a_stranger_named_worker_0_that_exits_0_does_not_end_the_job_and_is_deleted() -> None:
    job = make_job(replicas=2, status={**RUNNING, "phase": "Pending"})
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


def test_a_pod_named_for_the_operators_field_manager_without_the_jobs_reference_is_still_a_stranger() -> None:
    """``managedFields`` name the field manager the creating *client* chose (``?fieldManager=``, ``kubectl
    --field-manager``): a tenant may name the operator's. What makes a pod the job's is its controller reference
    to the job, which only the operator may write."""
    job = make_job(replicas=1, status={**RUNNING, "phase": "Pending"})
    claimed = tenants(pod_json(job, 0), manager=FIELD_MANAGER)
    plan = decide(job, [], [claimed])
    assert plan.delete_pods == ["train-worker-0"]
    assert f"its creator named itself {FIELD_MANAGER!r}" in foreign(plan)[0].message
    # With the job as its controller reference (rljob.dev), it is the job's.
    claimed["metadata"]["ownerReferences"][0]["apiVersion"] = "rljob.dev/v1alpha1"
    plan = decide(job, [claimed], [])
    assert plan.delete_pods == [] and plan.status["workers"]["active"] == 1


def test_only_a_reference_to_this_job_by_group_kind_name_and_uid_marks_a_pod_as_its() -> None:
    """Each part of the controller reference counts: the policy checks the right to patch the status of the job
    the reference *names*, so a reference naming another job (one whose status its writer may patch) with this
    job's UID is no mark of this job's, nor is one of another kind or group."""
    job = make_job(replicas=2, status=RUNNING)
    gang = [pod_json(job, 0), pod_json(job, 1)]
    for field, value in (("name", "other-job"), ("kind", "RLExperiment"), ("apiVersion", "rljob.dev.evil/v1"),
                         ("controller", False)):
        forged = copy.deepcopy(pod_json(job, 0, "Succeeded", False, exit_code=0))
        forged["metadata"].update(name="train-lookalike", uid="forged")
        forged["metadata"]["ownerReferences"][0][field] = value
        seen = ObservedPod.from_pod(forged, UID, "train")
        assert not seen.owned, field
        plan = decide(job, gang, [forged])
        assert plan.status["workers"]["succeeded"] == 0 and plan.status["phase"] == "Running", field
    seen = ObservedPod.from_pod(pod_json(job, 0), UID, "train")
    assert seen.owned and not seen.stranger
    assert not ObservedPod.from_pod(pod_json(job, 0), "another-uid", "train").owned  # a namesake's pod
    assert not ObservedPod.from_pod(pod_json(job, 0), UID, "").owned  # no job named: nothing is its


def test_the_pods_a_reconciler_created_are_the_jobs_with_no_record_and_after_a_restart() -> None:
    """The gang is the job's from the first reconcile that sees it: no status write records it (the status holds
    nothing per worker), and a reconciler that knows nothing of the creates (the operator restarted) keeps it."""
    kube = RecordingKube(_raw())
    reconciler = _reconciler(kube)
    try:
        reconciler.reconcile("team-a", "train")  # creates the gang
        assert [c for c in kube.calls if c[0] == "create"]
        made = _as_created()
        kube.list_pods = lambda namespace, selector: made  # type: ignore[method-assign]
        kube.raw = _raw(kube.statuses[-1])
        kube.calls.clear()
        kube.statuses.clear()
        reconciler.reconcile("team-a", "train")
        assert not [c for c in kube.calls if c[0] in ("delete", "create")]
        assert all("createdPods" not in status for status in kube.statuses)
        fresh = _reconciler(kube)
        deleted: list[str] = []
        kube.delete_pod = lambda namespace, name, uid=None, force=False: deleted.append(name)  # type: ignore[attr-defined]
        try:
            fresh.reconcile("team-a", "train")
        finally:
            fresh.close()
        assert deleted == []
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


def test_the_record_an_earlier_version_kept_is_removed_with_the_next_status_write_and_its_pods_stay() -> None:
    job_status = {"phase": "Running", "startTime": "2030-01-01T11:00:00Z", "gangGeneration": 0,
                  "gangStartTime": "2030-01-01T11:59:00Z", "createdPods": {"train-worker-0": "u0"}}
    kube = RecordingKube(_raw(job_status))
    made = _as_created()
    kube.list_pods = lambda namespace, selector: made  # type: ignore[method-assign]
    reconciler = _reconciler(kube)
    try:
        reconciler.reconcile("team-a", "train")
    finally:
        reconciler.close()
    assert kube.statuses and kube.statuses[0]["createdPods"] is None
    assert not [c for c in kube.calls if c[0] in ("delete", "create")]


def test_the_watch_cache_keeps_who_a_pod_says_created_it_and_its_address() -> None:
    job = make_job()
    pod = tenants(pod_json(job, 0), manager="notebook")
    pod["metadata"]["managedFields"].append({"manager": "annotator", "operation": "Update", "fieldsV1": {"f:metadata": {}}})
    pod["status"]["podIP"] = "10.0.0.7"
    slim = slim_pod(pod)
    assert [m["manager"] for m in slim["metadata"]["managedFields"]] == ["notebook"]
    seen = ObservedPod.from_pod(slim, UID, "train")
    assert seen == ObservedPod.from_pod(pod, UID, "train")
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
              "gangStartTime": "2030-01-01T11:59:00Z"}
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
