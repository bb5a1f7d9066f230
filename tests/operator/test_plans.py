"""The reconcile core as pure decisions: the one status builder, refused creates mapped to Plans,
and the reconciler applying Plans in its documented order (over a recording fake Kube)."""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_contract.job import FINISHED_PHASES, LastFailure, Phase, RLTrainingJobStatus
from rljob_operator.cluster.kube import ChildConflict
from rljob_operator.cluster.reconciler import Reconciler
from rljob_operator.decisions import plan as plan_module
from rljob_operator.decisions import situation as situation_module
from rljob_operator.decisions.children import JobNetwork, spec_hash
from rljob_operator.decisions.conditions import make_conditions
from rljob_operator.decisions.lifecycle import STEPS, plan_invalid, plan_reconcile
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.plan import (
    INVALID_SPEC_FIELDS,
    REJECTED_POD_FIELDS,
    STUCK_FIELDS,
    Event,
    Plan,
    StatusDraft,
    job_status,
    status_patch,
)
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.decisions.refusals import CONFLICT_REQUEUE_SECONDS, Refusal, plan_for_refusal
from rljob_operator.names import LABEL_GANG_GENERATION
from rljob_operator.times import rfc3339

from tests.support.jobs import ENDPOINT, NOW, UID, make_job, observe, pod_json
from tests.support.operator_process import job_manifest

EARLIER = rfc3339(NOW - timedelta(hours=1))
FULL_FIELDS = ["phase", "reason", "message", "observedGeneration", "conditions", "workers", "gangGeneration",
               "selector", "startTime", "completionTime", "restarts", "disruptions", "lastFailure",
               "nextRestartTime", "gangStartTime", "oomRecovery", "scaling"]


def _raw(status: dict[str, Any] | None = None, generation: int = 3) -> dict[str, Any]:
    raw = job_manifest("train", 2, namespace="team-a")
    raw["metadata"].update({"uid": UID, "generation": generation, "resourceVersion": "7"})
    if status is not None:
        raw["status"] = status
    return raw


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


# ------------------------------------------------------------------ status builder


def test_the_status_renders_every_field_and_counts_only_the_current_gang() -> None:
    job = make_job(replicas=2)
    pods = observe(job, pod_json(job, 0, generation=1), pod_json(job, 1, "Failed", False, generation=1, exit_code=1),
                   pod_json(job, 0, generation=0), pod_json(job, 1, generation=0, deleting=True))
    d = StatusDraft("Restarting", "HeartbeatTimeout", "no heartbeat", generation=1, desired=2, restarts=1)
    status = status_patch(job_status(d, job_name="train", observed_generation=4, previous_conditions=[], now=NOW,
                                     pods=pods))
    assert list(status) == FULL_FIELDS
    # Active counts every owned pod neither finished nor being deleted; the rest only the gang of generation 1.
    assert status["workers"] == {"desired": 2, "active": 2, "ready": 1, "succeeded": 0, "failed": 1,
                                 "summary": "1/2", "current": 1}
    assert (status["gangGeneration"], status["selector"], status["restarts"]) == (1, "rljob.dev/job=train", 1)
    conditions = _conditions(status)
    assert conditions["Stalled"]["status"] == "True"  # a stall restart is Stalled, a failure restart is not
    assert {c["observedGeneration"] for c in conditions.values()} == {4}
    d.reason = "WorkerFailed"
    assert _conditions(status_patch(job_status(d, job_name="train", observed_generation=4, previous_conditions=[],
                                               now=NOW)))["Stalled"]["status"] == "False"


def test_the_status_keeps_transition_times_and_writes_only_the_fields_asked_in_their_order() -> None:
    previous = [{"type": "Failed", "status": "True", "lastTransitionTime": EARLIER},
                {"type": "Ready", "status": "True", "lastTransitionTime": EARLIER}]
    d = StatusDraft("Failed", "InvalidPodSpec", "bad", completion_time=rfc3339(NOW))
    status = status_patch(job_status(d, job_name="train", observed_generation=2, previous_conditions=previous,
                                     now=NOW), REJECTED_POD_FIELDS)
    assert list(status) == list(REJECTED_POD_FIELDS)
    conditions = _conditions(status)
    assert conditions["Failed"]["lastTransitionTime"] == EARLIER  # unchanged status: time kept
    assert conditions["Ready"]["lastTransitionTime"] == rfc3339(NOW)  # flipped to False
    assert (conditions["Stalled"]["status"], conditions["Reconciling"]["status"]) == ("True", "False")
    stuck = status_patch(job_status(StatusDraft("Pending", "QuotaExceeded", "q"), job_name="train",
                                    observed_generation=2, previous_conditions=[], now=NOW), STUCK_FIELDS)
    assert stuck == {"reason": "QuotaExceeded", "message": "q"}


def test_plan_invalid_writes_the_invalid_spec_fields_through_the_builder() -> None:
    plan = plan_invalid(_raw({"completionTime": EARLIER, "gangGeneration": 2}), ["spec.x: bad"], NOW)
    assert list(plan.status) == list(INVALID_SPEC_FIELDS)
    assert (plan.status["phase"], plan.status["reason"], plan.status["observedGeneration"]) == ("Failed",
                                                                                              "InvalidSpec", 3)
    assert plan.status["completionTime"] == EARLIER  # the first failure's time is kept


def test_a_new_failure_record_writes_what_was_decided_and_a_carried_one_is_written_whole() -> None:
    """status_patch writes the fields a decision set (a null clears one): a record built without
    replacedPods leaves it alone; a record carried from the stored status goes back whole, defaults
    and nulls included."""
    new = StatusDraft("Restarting", "WorkerFailed", "m",
                      last_failure=LastFailure(worker="train-worker-1", reason="WorkerFailed", exit_code=None))
    body = status_patch(job_status(new, job_name="train", observed_generation=1, previous_conditions=[], now=NOW))
    assert body["lastFailure"] == {"worker": "train-worker-1", "reason": "WorkerFailed", "exitCode": None}
    assert body["startTime"] is None and "progress" not in body  # progress is the status API's
    stored = RLTrainingJobStatus.model_validate({"lastFailure": {"reason": "OOMKilled"}, "restarts": 2})
    carried = StatusDraft("Running", "Running", "m").carry(stored)
    body = status_patch(job_status(carried, job_name="train", observed_generation=1, previous_conditions=[], now=NOW))
    assert body["lastFailure"] == {"worker": None, "reason": "OOMKilled", "exitCode": None, "message": "", "time": None,
                                   "disruption": False, "replacedPods": []}
    assert body["restarts"] == 2 and stored.last_failure is not None and stored.last_failure.model_fields_set == {
        "reason"}  # the stored record itself is not changed


def test_status_phase_is_a_plain_str_however_it_is_given() -> None:
    for given in (Phase.failed, "Failed"):
        status = RLTrainingJobStatus.model_validate({"phase": given})
        assert type(status.phase) is str and status.phase in FINISHED_PHASES
    assert RLTrainingJobStatus().phase is None
    with pytest.raises(ValueError, match="phase"):
        RLTrainingJobStatus.model_validate({"phase": "Exploded"})


# ---------------------------------------------------------------------- steps


def test_a_finished_job_is_decided_by_the_first_step_without_hashing_its_spec(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    assert [s.__name__ for s in STEPS][:7] == ["finished", "runtime_not_found", "runtime_not_allowed",
                                              "policy_violation", "suspended", "deadline_passed", "succeeded"]
    assert STEPS[-1].__name__ == "progress"

    def no_hash(job: Any) -> str:
        raise AssertionError("spec_hash computed for a finished job")

    monkeypatch.setattr(situation_module, "spec_hash", no_hash)
    job = make_job(status={"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, "Succeeded", False, exit_code=0)), NOW)
    assert plan.status["phase"] == "Succeeded" and not plan.delete_pods and plan.configmap is None


def test_pod_creations_carry_the_configmap_and_service_built_from_the_status_written() -> None:
    job = make_job(status={"phase": "Restarting", "reason": "CudaOutOfMemory", "gangGeneration": 1,
                           "nextRestartTime": EARLIER, "oomRecovery": {"batchSize": 2, "gradientAccumulationSteps": 2}})
    plan = plan_reconcile(job, [], NOW, ENDPOINT)
    assert len(plan.create_pods) == 2 and plan.service is not None and plan.service["kind"] == "Service"
    assert plan.configmap is not None and "batchSize: 2" in next(iter(plan.configmap["data"].values()))
    assert plan_reconcile(job, observe(job, *(pod_json(job, i, generation=1) for i in range(2))), NOW).configmap is None


def test_a_plan_renders_its_configmap_only_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[str] = []
    real = plan_module.desired_configmap

    def counted(job: Any, endpoint: Any, runtime: Any) -> dict[str, Any]:
        rendered.append("cm")
        return real(job, endpoint, runtime)

    monkeypatch.setattr(plan_module, "desired_configmap", counted)
    plan = plan_reconcile(make_job(), [], NOW, ENDPOINT)  # the reconciler may discard it (a lagging watch)
    assert plan.children is not None and rendered == []
    assert plan.configmap is plan.configmap and rendered == ["cm"]  # rendered once


# ------------------------------------------------------------------- refusals


INTERRUPTED = Plan(status={"phase": "Pending", "reason": "CreatingWorkers"}, events=[Event("Normal", "X", "x")],
                   requeue_after=2.0, gang_restart="SpecChanged")


def test_a_taken_name_or_an_exhausted_quota_leaves_the_job_stuck_and_the_rest_of_the_plan_to_follow() -> None:
    quota = json.dumps({"kind": "Status", "message": "pods \"train-worker-0\" is forbidden: exceeded quota: gpus"})
    for refusal, reason, message in [
        (Refusal(None, conflict="Service team-a/train exists and belongs to Service/x"), "ChildConflict",
         "Service team-a/train exists and belongs to Service/x"),
        (Refusal(403, quota, "Forbidden"), "QuotaExceeded", "pods \"train-worker-0\" is forbidden: exceeded quota: gpus"),
    ]:
        plan = plan_for_refusal(_raw(), INTERRUPTED, refusal, NOW)
        assert plan is not None
        conditions = plan.status.pop("conditions", None)
        assert plan.status == {"reason": reason, "message": message}  # the phase written before stays
        if reason == "QuotaExceeded":  # a wait, visible in the conditions: reconciling, neither stalled nor failed
            assert conditions is not None
            by_type = {c["type"]: (c["status"], c["reason"]) for c in conditions}
            assert by_type["Reconciling"] == ("True", "QuotaExceeded")
            assert by_type["Stalled"][0] == by_type["Failed"][0] == by_type["Ready"][0] == "False"
        assert plan.events == [Event("Warning", reason, message), Event("Normal", "X", "x")]
        assert (plan.requeue_after, plan.gang_restart) == (CONFLICT_REQUEUE_SECONDS, "SpecChanged")
        assert not plan.create_pods and plan.configmap is None and not plan.delete_pods


def test_a_rejected_pod_fails_the_job_and_drops_the_rest_of_the_plan() -> None:
    raw = _raw({"conditions": [{"type": "Failed", "status": "False", "lastTransitionTime": EARLIER}]})
    body = json.dumps({"message": "Pod \"train-worker-0\" is invalid: spec.volumes[4].name: Duplicate value"})
    plan = plan_for_refusal(raw, INTERRUPTED, Refusal(422, body, "Unprocessable Entity"), NOW)
    assert plan is not None
    status = plan.status
    assert list(status) == list(REJECTED_POD_FIELDS)
    assert (status["phase"], status["reason"], status["completionTime"]) == ("Failed", "InvalidPodSpec", rfc3339(NOW))
    assert status["message"].endswith("Duplicate value")
    assert _conditions(status)["Failed"] == {"type": "Failed", "status": "True", "reason": "InvalidPodSpec",
                                             "message": status["message"], "lastTransitionTime": rfc3339(NOW),
                                             "observedGeneration": 3}
    assert plan.events == [Event("Warning", "InvalidPodSpec", status["message"])]
    assert plan.requeue_after is None and plan.gang_restart is None
    # A body that is not a Status object: the reason phrase says it.
    plain = plan_for_refusal(raw, INTERRUPTED, Refusal(422, "<html>", "Unprocessable Entity"), NOW)
    assert plain is not None and plain.status["message"] == "Unprocessable Entity"


def test_a_terminating_namespace_means_nothing_more_and_other_refusals_are_not_decisions() -> None:
    body = json.dumps({"message": "pods \"x\" is forbidden: unable to create new content in namespace team-a "
                                  "because it is being terminated"})
    nothing = plan_for_refusal(_raw(), INTERRUPTED, Refusal(403, body, "Forbidden"), NOW)
    assert nothing == Plan(status={})
    rbac = json.dumps({"message": 'pods is forbidden: User "system:serviceaccount:rljob-system:rljob-operator" '
                                  'cannot create resource "pods" in API group "" in the namespace "team-a"'})
    assert plan_for_refusal(_raw(), INTERRUPTED, Refusal(403, rbac, "Forbidden"), NOW) is None
    assert plan_for_refusal(_raw(), INTERRUPTED, Refusal(500, "", "Internal Server Error"), NOW) is None


# -------------------------------------------------- the reconciler applies Plans


class RecordingKube:
    """Records the reconciler's API calls in order; ``refuse`` makes one kind of create fail."""

    def __init__(self, raw: dict[str, Any], refuse: tuple[str, Exception] | None = None) -> None:
        self.raw, self.refuse = raw, refuse
        self.calls: list[tuple[Any, ...]] = []
        self.statuses: list[dict[str, Any]] = []
        self.lists = 0

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.raw))

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.lists += 1
        return []

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.calls.append(("status", status.get("phase"), status.get("reason")))
        self.statuses.append(status)

    def create_or_adopt(self, obj: dict[str, Any], uid: str, compare_data: bool = False,
                        compare_spec: bool = False, look_first: bool = False,
                        compare_fields: tuple[str, ...] = ()) -> dict[str, Any]:
        self.calls.append(("look" if look_first else "create", obj["kind"]))
        if self.refuse is not None and self.refuse[0] == obj["kind"]:
            raise self.refuse[1]
        return obj

    def get_child(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("get", obj["kind"]))
        return None

    def create_pod(self, pod: dict[str, Any]) -> bool:
        self.calls.append(("create", "Pod"))
        if self.refuse is not None and self.refuse[0] == "Pod":
            raise self.refuse[1]
        return True

    def post_event(self, raw: dict[str, Any], type_: str, reason: str, message: str, now: str,
                   **kw: Any) -> dict[str, Any]:
        self.calls.append(("event", reason))
        return {"metadata": {"name": f"event-{len(self.calls)}"}}

    def patch_event(self, namespace: str, name: str, count: int, message: str, now: str) -> dict[str, Any]:
        self.calls.append(("event", f"count {count}"))
        return {}


def _reconciler(kube: RecordingKube, network: JobNetwork | None = None,
                pod_cache: Callable[[str, str], list[dict[str, Any]] | None] | None = None) -> Reconciler:
    # Any image: these tests are about the write order, not the platform's pod profile.
    return Reconciler(kube, clock=lambda: NOW, profile=PodProfile(allowed_images=("*",)),  # type: ignore[arg-type]
                      network=network, pod_cache=pod_cache)


def _reconcile(kube: RecordingKube, network: JobNetwork | None = None,
               pod_cache: Callable[[str, str], list[dict[str, Any]] | None] | None = None) -> float | None:
    reconciler = _reconciler(kube, network, pod_cache)
    try:
        return reconciler.reconcile("team-a", "train")
    finally:
        reconciler.close()


def _refused(status: int, body: str) -> ApiException:
    error = ApiException(status=status, reason="Refused")
    error.body = body
    return error


WORKERS = ("train-worker-0", "train-worker-1")


def test_the_reconciler_writes_status_then_children_then_pods_then_events_and_lists_no_pod_in_the_status() -> None:
    kube = RecordingKube(_raw())
    reconciler = _reconciler(kube)
    try:
        assert reconciler.reconcile("team-a", "train") is None
        assert kube.calls[0] == ("status", "Pending", "CreatingWorkers")
        assert sorted(kube.calls[1:3]) == [("create", "ConfigMap"), ("create", "Service")]
        assert kube.calls[3:] == [("create", "Pod"), ("create", "Pod"), ("event", "CreatingWorkers"),
                                  ("event", "EphemeralCheckpoints")]
        # The pods carry the job as their controller reference, their mark (decisions/observed.py): no status
        # write lists them.
        assert all(c[0] != "record" for c in kube.calls)
        assert all("createdPods" not in status for status in kube.statuses)
        kube.raw = _raw(kube.statuses[0])
        kube.statuses.clear()
        reconciler.reconcile("team-a", "train")
        assert all("createdPods" not in status for status in kube.statuses)
    finally:
        reconciler.close()


def test_a_refused_pod_create_is_decided_after_every_create_of_the_gang_is_answered() -> None:
    class OneRefused(RecordingKube):
        def create_pod(self, pod: dict[str, Any]) -> bool:
            self.sent.append(pod["metadata"]["name"])
            if pod["metadata"]["name"].endswith("-1"):
                raise _refused(422, '{"message": "invalid"}')
            return super().create_pod(pod)

    kube = OneRefused(_raw())
    kube.sent: list[str] = []  # type: ignore[attr-defined]
    _reconcile(kube)
    # The refusal still decides the rest, after both creates were answered; each pod was sent once.
    assert kube.statuses[-1]["reason"] == "InvalidPodSpec"
    assert sorted(kube.sent) == list(WORKERS)


def test_children_are_checked_once_per_gang_generation_and_looked_up_first_after_the_first() -> None:
    kube = RecordingKube(_raw())
    reconciler = _reconciler(kube, JobNetwork())
    try:
        reconciler.reconcile("team-a", "train")
        children = {("create", "ConfigMap"), ("create", "Service"), ("create", "NetworkPolicy")}
        assert set(kube.calls[1:4]) == children
        # The same generation again (its pods are created over several reconciles while old
        # ones terminate): the children were made for it, only pods are created.
        kube.calls.clear()
        reconciler.reconcile("team-a", "train")
        assert [c for c in kube.calls if c[1] != "Pod" and c[0] not in ("event", "status", "record")] == []
        # A new generation: each child is looked up (it most likely exists), not re-posted blindly.
        kube.raw = _raw({"gangGeneration": 1, "phase": "Restarting", "restarts": 1})
        kube.calls.clear()
        reconciler.reconcile("team-a", "train")
        assert {c for c in kube.calls if c[1] in ("ConfigMap", "Service", "NetworkPolicy")} == \
            {("look", "ConfigMap"), ("look", "Service"), ("look", "NetworkPolicy")}
        # A new job under the same name (another uid) starts over.
        kube.raw = _raw()
        kube.raw["metadata"]["uid"] = "another-uid"
        kube.calls.clear()
        reconciler.reconcile("team-a", "train")
        assert {c for c in kube.calls if c[1] in ("ConfigMap", "Service", "NetworkPolicy")} == children
    finally:
        reconciler.close()


def test_pods_from_the_watch_are_listed_again_only_before_creating_one_this_reconciler_created_and_has_not_seen(
) -> None:
    def no_pods(namespace: str, name: str) -> list[dict[str, Any]]:
        return []  # the watch shows no pod

    # No reconcile got as far as the pods of a job without status (status is written first).
    kube = RecordingKube(_raw())
    _reconcile(kube, pod_cache=no_pods)
    assert kube.lists == 0 and kube.calls.count(("create", "Pod")) == 2

    # One did, but not this reconciler (another replica, before a restart): the watch shows every pod
    # that exists, and a name still taken would refuse the create, so the pods are created without a LIST.
    kube = RecordingKube(_raw({"phase": "Pending", "gangGeneration": 0}))
    second = _reconciler(kube, pod_cache=no_pods)
    try:
        second.reconcile("team-a", "train")
        assert kube.lists == 0 and kube.calls.count(("create", "Pod")) == 2
        # This reconciler created them a moment ago and the watch does not show them yet: the API is asked.
        second.reconcile("team-a", "train")
        assert kube.lists == 1
    finally:
        second.close()


def test_the_network_policy_exists_before_any_pod_and_a_taken_name_stops_the_pods() -> None:
    kube = RecordingKube(_raw())
    assert _reconcile(kube, JobNetwork()) is None
    assert sorted(kube.calls[1:4]) == [("create", "ConfigMap"), ("create", "NetworkPolicy"), ("create", "Service")]
    assert kube.calls[4:] == [("create", "Pod"), ("create", "Pod"), ("event", "CreatingWorkers"),
                              ("event", "EphemeralCheckpoints")]

    taken = "NetworkPolicy team-a/train-workers exists and lacks the label app.kubernetes.io/managed-by=rljob-operator"
    kube = RecordingKube(_raw(), ("NetworkPolicy", ChildConflict(taken)))
    assert _reconcile(kube, JobNetwork()) == CONFLICT_REQUEUE_SECONDS
    assert ("create", "Pod") not in kube.calls and ("status", None, "ChildConflict") in kube.calls


def test_the_reconciler_applies_the_refusal_plan_in_place_of_the_rest() -> None:
    # Stuck again: the stored status already says ChildConflict, but this reconcile wrote CreatingWorkers first.
    taken = "Service team-a/train exists and belongs to Service/x"
    raw = _raw({"reason": "ChildConflict", "message": taken})
    kube = RecordingKube(raw, ("Service", ChildConflict(taken)))
    assert _reconcile(kube) == CONFLICT_REQUEUE_SECONDS
    assert kube.calls[0] == ("status", "Pending", "CreatingWorkers") and ("create", "Pod") not in kube.calls
    assert kube.calls[-4:] == [("status", None, "ChildConflict"), ("event", "ChildConflict"),
                               ("event", "CreatingWorkers"), ("event", "EphemeralCheckpoints")]

    kube = RecordingKube(_raw(), ("Pod", _refused(422, '{"message": "invalid"}')))
    assert _reconcile(kube) is None
    assert kube.calls[-2:] == [("status", "Failed", "InvalidPodSpec"), ("event", "InvalidPodSpec")]

    kube = RecordingKube(_raw(), ("Pod", _refused(500, "")))
    with pytest.raises(ApiException):
        _reconcile(kube)
    assert kube.calls[-1] == ("create", "Pod")  # nothing written after an error that is not a decision


# ------------------------------------------------------------- adoption and network


def test_only_a_child_with_the_operators_marker_for_this_job_is_adoptable() -> None:
    from rljob_operator.cluster.kube import adoptable

    labels = {"rljob.dev/job": "train", "app.kubernetes.io/managed-by": "rljob-operator"}
    ours = {"metadata": {"labels": labels, "annotations": {"rljob.dev/created-for-uid": UID}}}
    assert adoptable(ours, UID) == ""
    assert "was not created by the operator for this job" in adoptable({"metadata": {"labels": labels}}, UID)
    assert "'another-uid'" in adoptable({"metadata": {"labels": labels, "annotations": {
        "rljob.dev/created-for-uid": "another-uid"}}}, UID)
    assert "lacks the label app.kubernetes.io/managed-by" in adoptable(
        {"metadata": {"labels": {"rljob.dev/job": "train"}, "annotations": {"rljob.dev/created-for-uid": UID}}}, UID)


def test_every_child_carries_the_marker_and_the_policy_admits_only_the_job_and_prometheus() -> None:
    from rljob_operator.decisions.children import desired_configmap, desired_network_policy, desired_service

    job = make_job(replicas=2)
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    policy = desired_network_policy(job, JobNetwork((peer,)))
    for child in (desired_configmap(job), desired_service(job), policy):
        assert child["metadata"]["annotations"]["rljob.dev/created-for-uid"] == UID
    assert policy["metadata"]["name"] == f"{job.metadata.name}-workers"
    own = {"matchLabels": {"rljob.dev/job": job.metadata.name}}
    assert policy["spec"] == {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [
        {"from": [{"podSelector": own}]}, {"from": [peer], "ports": [{"protocol": "TCP", "port": 9400}]}]}
    # No scraper configured: the job's own pods only.
    assert desired_network_policy(job, JobNetwork())["spec"]["ingress"] == [{"from": [{"podSelector": own}]}]
    # A plan without network settings makes no policy.
    assert plan_reconcile(job, [], NOW).networkpolicy is None
    assert plan_reconcile(job, [], NOW, network=JobNetwork((peer,))).networkpolicy == policy


def test_a_merge_patch_replacing_a_spec_exactly() -> None:
    from rljob_operator.cluster.kube import _replacing
    from rljob_operator.cluster.reconciler import _merge_patch

    current = {"podSelector": {"matchLabels": {"a": "1", "b": "2"}}, "ingress": [{}], "egress": [{}]}
    desired = {"podSelector": {"matchLabels": {"a": "1"}}, "ingress": [{"from": []}], "policyTypes": ["Ingress"]}
    assert _merge_patch(current, _replacing(current, desired)) == desired
    assert _replacing(desired, desired) == {}


def test_new_job_creates_every_worker_and_records_its_start() -> None:
    job = make_job(replicas=3)
    plan = plan_reconcile(job, [], NOW, ENDPOINT)
    assert [p["metadata"]["name"] for p in plan.create_pods] == [f"train-worker-{i}" for i in range(3)]
    assert plan.configmap is not None and plan.service is not None and not plan.delete_pods
    s = plan.status
    assert (s["phase"], s["reason"], s["startTime"], s["gangGeneration"]) == ("Pending", "CreatingWorkers",
                                                                            rfc3339(NOW), 0)
    assert s["workers"] == {"desired": 3, "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "summary": "0/3",
                            "current": 0}
    assert s["selector"] == "rljob.dev/job=train" and s["observedGeneration"] == 1
    assert [e.reason for e in plan.events] == ["CreatingWorkers", "EphemeralCheckpoints"]  # no spec.checkpoint.storage


def test_a_partly_created_gang_is_completed_and_never_duplicated() -> None:
    job = make_job(replicas=3, status={"phase": "Pending", "startTime": rfc3339(NOW), "gangGeneration": 0})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, "Pending", False, node=None)), NOW)
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-1", "train-worker-2"]
    full = observe(job, *(pod_json(job, i) for i in range(3)))
    assert plan_reconcile(job, full, NOW).create_pods == []


def test_phases_follow_the_pods() -> None:
    job = make_job(status={"phase": "Pending", "startTime": rfc3339(NOW)})
    pending = plan_reconcile(job, observe(job, pod_json(job, 0, "Pending", False, node=None),
                                          pod_json(job, 1, "Pending", False, node=None,
                                                   unschedulable="0/4 nodes: Insufficient nvidia.com/gpu")), NOW)
    assert pending.status["phase"] == "Pending" and pending.status["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in pending.status["message"]
    starting = plan_reconcile(job, observe(job, pod_json(job, 0, "Running", False), pod_json(job, 1, "Pending", False)),
                              NOW)
    assert starting.status["phase"] == "Starting"
    running = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1)), NOW)
    assert running.status["phase"] == "Running" and running.status["workers"]["summary"] == "2/2"
    assert {c["type"]: c["status"] for c in running.status["conditions"]} == {
        "Ready": "True", "Reconciling": "False", "Stalled": "False", "Succeeded": "False", "Failed": "False",
        "Suspended": "False", "CheckpointsDurable": "False"}
    # The stored status has no CheckpointsDurable yet (a job from before it): warned once, with the phase change.
    assert [(e.type, e.reason) for e in running.events] == [("Normal", "Running"), ("Warning", "EphemeralCheckpoints")]


def test_a_running_job_that_loses_readiness_stays_running_but_not_ready() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, ready=False), pod_json(job, 1)), NOW)
    assert plan.status["phase"] == "Running" and plan.status["reason"] == "WorkersNotReady"
    assert next(c for c in plan.status["conditions"] if c["type"] == "Ready")["status"] == "False"
    # No phase change, no Event; only the once-per-job warning a job from before CheckpointsDurable gets.
    assert [e.reason for e in plan.events] == ["EphemeralCheckpoints"]


def test_worker_zero_exiting_0_means_succeeded_and_the_rest_of_the_gang_is_deleted() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW)})
    early = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1, "Succeeded", False, exit_code=0)), NOW)
    assert early.status["phase"] == "Running"
    done = plan_reconcile(job, observe(job, pod_json(job, 0, "Succeeded", False, exit_code=0), pod_json(job, 1)), NOW)
    assert done.status["phase"] == "Succeeded" and done.status["completionTime"] == rfc3339(NOW)
    # Worker 1 outlived worker 0 (its code sleeps, say): it would keep its GPUs. Deleted, and looked after.
    assert done.delete_pods == ["train-worker-1"] and done.create_pods == []
    assert done.requeue_after is not None
    assert next(c for c in done.status["conditions"] if c["type"] == "Succeeded")["status"] == "True"
    # The next reconcile (the finished step) deletes whatever still runs, orphans with the job's label too.
    succeeded = make_job(status={"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW)})
    orphan = pod_json(succeeded, 2)
    orphan["metadata"]["ownerReferences"] = []
    later = plan_reconcile(succeeded, observe(succeeded, pod_json(succeeded, 0, "Succeeded", False, exit_code=0),
                                              pod_json(succeeded, 1), orphan), NOW)
    assert later.status["phase"] == "Succeeded" and sorted(later.delete_pods) == ["train-worker-1", "train-worker-2"]
    finished = plan_reconcile(succeeded, observe(succeeded, pod_json(succeeded, 0, "Succeeded", False, exit_code=0)),
                              NOW)
    assert finished.delete_pods == [] and finished.requeue_after is None


def test_a_permanent_exit_fails_the_job_with_the_termination_message() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(
        job, pod_json(job, 0),
        pod_json(job, 1, "Failed", False, exit_code=78, message="spec.training.rewards[0]: cannot import x\nmore"),
    ), NOW)
    s = plan.status
    assert (s["phase"], s["reason"]) == ("Failed", "PermanentError")
    assert s["message"] == "train-worker-1 exited with code 78: spec.training.rewards[0]: cannot import x"
    assert plan.delete_pods == ["train-worker-0"]  # the rest of the gang would hang: free the GPUs
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "PermanentError")]
    conditions = {c["type"]: c["status"] for c in s["conditions"]}
    assert conditions["Failed"] == conditions["Stalled"] == "True" and conditions["Ready"] == "False"


def test_a_worker_disappearing_under_restart_policy_never_fails_the_job() -> None:
    job = make_job(spec={"runPolicy": {"restartPolicy": "Never"}}, status={"phase": "Running", "startTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0)), NOW)
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "WorkerLost"
    assert "train-worker-1" in plan.status["message"] and plan.create_pods == []


def test_a_worker_on_a_deleted_node_restarts_the_gang_as_a_disruption_and_is_force_deleted() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW), "gangGeneration": 0})
    pods = [pod_json(job, 0, node="node-a"), pod_json(job, 1, node="node-b")]
    # Unknown (no Node watch): both pods look healthy, nothing happens.
    unknown = plan_reconcile(job, observe(job, *pods), NOW)
    assert unknown.status.get("phase", "Running") == "Running" and not unknown.delete_pods
    observed = [ObservedPod.from_pod(p, UID, "train", node_gone=lambda node: node == "node-b") for p in pods]
    assert [p.node_lost for p in observed] == [False, True]
    plan = plan_reconcile(job, observed, NOW)
    s = plan.status
    assert (s["phase"], s["reason"], s["gangGeneration"], s["disruptions"], s["restarts"]) == (
        "Restarting", "WorkerLost", 1, 1, 0)
    assert s["lastFailure"]["worker"] == "train-worker-1" and s["lastFailure"]["disruption"] is True
    # No kubelet will confirm worker 1's end: it is force-deleted (and only that); worker 0 goes gracefully.
    assert (plan.force_delete_pods, plan.delete_pods) == (["train-worker-1"], ["train-worker-0"])


def test_a_pod_of_a_deleted_namesake_job_blocks_its_name() -> None:
    job = make_job()
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, uid="old-job-uid", deleting=True)), NOW)
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-1"]
    assert plan.delete_pods == []  # not ours to delete
    assert plan.requeue_after is not None


def test_suspend_deletes_pods_and_resume_starts_a_new_gang() -> None:
    running = {"phase": "Running", "startTime": rfc3339(NOW - timedelta(hours=1)), "gangGeneration": 2}
    job = make_job(spec={"runPolicy": {"suspend": True}}, status=running)
    pods = observe(job, pod_json(job, 0, generation=2), pod_json(job, 1, generation=2))
    plan = plan_reconcile(job, pods, NOW)
    assert plan.status["phase"] == "Suspended" and sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"]
    assert plan.status["startTime"] is None and plan.create_pods == []
    done = plan_reconcile(make_job(spec={"runPolicy": {"suspend": True}}, status=plan.status), [], NOW)
    assert done.status["phase"] == "Suspended" and done.requeue_after is None
    assert next(c for c in done.status["conditions"] if c["type"] == "Suspended")["status"] == "True"
    resumed = plan_reconcile(make_job(status=done.status), [], NOW + timedelta(minutes=5))
    assert resumed.status["gangGeneration"] == 3 and resumed.gang_restart == "Resumed"
    assert {p["metadata"]["labels"][LABEL_GANG_GENERATION] for p in resumed.create_pods} == {"3"}
    assert resumed.status["startTime"] == rfc3339(NOW + timedelta(minutes=5))  # the deadline clock restarts


def test_the_deadline_fails_the_job_and_is_requeued_before() -> None:
    start = NOW - timedelta(seconds=50)
    job = make_job(spec={"runPolicy": {"activeDeadlineSeconds": 60}},
                   status={"phase": "Running", "startTime": rfc3339(start)})
    pods = observe(job, pod_json(job, 0), pod_json(job, 1))
    before = plan_reconcile(job, pods, NOW)
    assert before.status["phase"] == "Running" and before.requeue_after == pytest.approx(10)
    after = plan_reconcile(job, pods, NOW + timedelta(seconds=11))
    assert (after.status["phase"], after.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert sorted(after.delete_pods) == ["train-worker-0", "train-worker-1"]


def test_ttl_deletes_a_finished_job_when_due() -> None:
    status = {"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW), "startTime": rfc3339(NOW)}
    job = make_job(spec={"runPolicy": {"ttlSecondsAfterFinished": 30}}, status=status)
    waiting = plan_reconcile(job, [], NOW + timedelta(seconds=10))
    assert not waiting.delete_job and waiting.requeue_after == pytest.approx(20)
    assert plan_reconcile(job, [], NOW + timedelta(seconds=30)).delete_job
    assert not plan_reconcile(make_job(status=status), [], NOW + timedelta(days=9)).delete_job


def test_ttl_deletes_a_finished_job_only_once_its_pods_are_gone() -> None:
    """Deleting the job would let the garbage collector take its Kueue Workload (its quota) while a pod runs."""
    status = {"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW), "startTime": rfc3339(NOW)}
    job = make_job(spec={"runPolicy": {"ttlSecondsAfterFinished": 30}}, status=status)
    terminating = observe(job, pod_json(job, 1, deleting=True))
    due = plan_reconcile(job, terminating, NOW + timedelta(seconds=30))
    assert not due.delete_job and due.requeue_after is not None
    exited = observe(job, pod_json(job, 1, "Succeeded", False, exit_code=0))
    assert plan_reconcile(job, exited, NOW + timedelta(seconds=30)).delete_job


def test_a_finished_job_creates_nothing() -> None:
    job = make_job(status={"phase": "Failed", "reason": "PermanentError", "completionTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1, "Failed", False, exit_code=78)), NOW)
    assert plan.create_pods == [] and plan.delete_pods == ["train-worker-0"] and plan.events == []
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PermanentError"


def test_a_spec_change_restarts_the_gang() -> None:
    old = make_job(replicas=3)
    pods = [pod_json(old, 0), pod_json(old, 1), pod_json(old, 2)]
    job = make_job(replicas=3, spec={"training": {"seed": 5}},
                   status={"phase": "Running", "startTime": rfc3339(NOW), "gangGeneration": 0}, generation=2)
    plan = plan_reconcile(job, observe(job, *pods), NOW)
    assert plan.status["gangGeneration"] == 1 and plan.gang_restart == "SpecChanged"
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1", "train-worker-2"]
    assert plan.create_pods == []  # the names are taken until the old pods are gone
    assert plan.status["phase"] == "Pending" and plan.status["observedGeneration"] == 2
    assert "SpecChanged" in [e.reason for e in plan.events]


def test_an_invalid_spec_fails_until_it_is_edited() -> None:
    raw = {"metadata": {"name": "x", "generation": 3}, "status": {}}
    plan = plan_invalid(raw, ["spec.training.trl: max_steps are set by rljob"], NOW)
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec"
    assert "spec.training.trl" in plan.status["message"] and plan.events[0].type == "Warning"
    again = plan_invalid({**raw, "status": plan.status}, ["spec.training.trl: max_steps are set by rljob"], NOW)
    assert again.events == []
    fixed = make_job(status={**plan.status, "observedGeneration": 3}, generation=4)
    assert len(plan_reconcile(fixed, [], NOW).create_pods) == 2


def test_a_running_job_edited_into_an_invalid_spec_stops_its_pods() -> None:
    """An edit the CRD lets through and the models refuse fails the job (InvalidSpec): a finished job keeps no
    pod running, whichever way it ended; a stuck one is force-deleted in its time."""
    job = make_job()
    raw = {"metadata": {"name": "train", "generation": 3, "uid": UID}, "status": {"phase": "Running"}}
    pods = observe(job, pod_json(job, 0), pod_json(job, 1, "Succeeded", False, exit_code=0))
    plan = plan_invalid(raw, ["spec.training.trl: bad"], NOW, pods)
    assert plan.status["phase"] == "Failed" and plan.delete_pods == ["train-worker-0"]
    assert plan.requeue_after is not None
    stuck = observe(job, pod_json(job, 0, deleting=True))
    later = plan_invalid({**raw, "status": plan.status}, ["spec.training.trl: bad"], NOW + timedelta(seconds=60),
                         stuck, force_delete_after=60)
    assert later.force_delete_pods == ["train-worker-0"] and later.delete_pods == []
    assert plan_invalid({**raw, "status": plan.status}, ["spec.training.trl: bad"], NOW).requeue_after is None


def test_conditions_keep_their_transition_time_until_they_flip() -> None:
    first = make_conditions("Running", "Running", "m", ready=True, reconciling=False, generation=1, previous=[],
                            now=NOW)
    later = NOW + timedelta(minutes=1)
    second = make_conditions("Failed", "X", "m", ready=False, reconciling=False, generation=2,
                             previous=[c.model_dump(by_alias=True) for c in first], now=later)
    times = {c.type: c.last_transition_time for c in second}
    assert times["Ready"] == times["Failed"] == times["Stalled"] == rfc3339(later)
    assert times["Succeeded"] == times["Suspended"] == rfc3339(NOW)
    assert {c.observed_generation for c in second} == {2}


def test_observed_pod_reads_the_container_termination() -> None:
    job = make_job()
    pod = pod_json(job, 1, "Failed", False, exit_code=200, message="CUDA out of memory")
    observed = ObservedPod.from_pod(pod, UID, "train")
    assert (observed.index, observed.generation, observed.exit_code) == (1, 0, 200)
    assert observed.owned and observed.finished and not observed.active
    assert observed.spec_hash == spec_hash(job)
    assert not ObservedPod.from_pod(copy.deepcopy(pod), "other", "train").owned


def test_an_operator_upgrade_alone_does_not_restart_running_gangs() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW), "gangGeneration": 0})
    pods = [pod_json(job, 0), pod_json(job, 1)]
    for pod in pods:  # built by an older operator whose spec rendering differed
        pod["metadata"]["annotations"]["rljob.dev/spec-hash"] = "older-rendering"
    plan = plan_reconcile(job, observe(job, *pods), NOW)
    assert plan.status["phase"] == "Running" and plan.delete_pods == [] and plan.gang_restart is None


def test_starting_says_why_a_container_does_not_start() -> None:
    job = make_job(status={"phase": "Starting", "startTime": rfc3339(NOW)})
    stuck = pod_json(job, 1, "Pending", False)
    stuck["status"]["containerStatuses"] = [{"name": "trainer", "state": {"waiting": {
        "reason": "ErrImagePull", "message": "pull access denied for registry.invalid/rljob"}}}]
    plan = plan_reconcile(job, observe(job, pod_json(job, 0), stuck), NOW)
    assert plan.status["phase"] == "Starting"
    assert plan.status["message"].endswith("train-worker-1: ErrImagePull: pull access denied for registry.invalid/rljob")


def test_orphaned_pods_of_a_namesake_are_cleared_away() -> None:
    job = make_job()
    orphan = pod_json(job, 0)
    orphan["metadata"]["ownerReferences"] = []
    plan = plan_reconcile(job, observe(job, orphan), NOW)
    assert plan.delete_pods == ["train-worker-0"]
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-1"]
    assert plan.status["reason"] == "CreatingWorkers"


def test_a_replacement_trusts_the_watch_only_when_a_get_of_each_replaced_worker_agrees_with_it() -> None:
    job = make_job(3)
    cached = [pod_json(job, 0), pod_json(job, 1, "Failed", False, exit_code=1)]  # worker 2: gone, as the watch says
    live = {p["metadata"]["name"]: json.loads(json.dumps(p)) for p in cached}
    kube = RecordingKube(_raw())
    gets: list[str] = []

    def get_pod(namespace: str, name: str) -> dict[str, Any] | None:
        gets.append(name)
        return live.get(name)

    kube.get_pod = get_pod  # type: ignore[attr-defined]
    reconciler = _reconciler(kube)
    try:
        seen = reconciler._replacement_seen
        assert seen("team-a", cached, ("train-worker-1", "train-worker-2")) and gets == ["train-worker-1", "train-worker-2"]
        live["train-worker-1"]["status"]["phase"] = "Running"  # the watch lags behind this pod's change
        assert not seen("team-a", cached, ("train-worker-1",))
        live["train-worker-2"] = pod_json(job, 2)  # created meanwhile: the watch has not shown it yet
        assert not seen("team-a", cached, ("train-worker-2",))
        del live["train-worker-1"]  # gone, though the watch still shows it
        assert not seen("team-a", cached, ("train-worker-1",))
        assert not seen("team-a", cached, ())  # nothing named: nothing to trust the watch with
        assert kube.lists == 0
    finally:
        reconciler.close()


def test_independent_requests_go_together_and_a_single_one_from_the_reconciling_thread() -> None:
    """``Reconciler._together``: a gang's creates or deletions are sent at once on the request threads, and every
    one is answered before the first failure is raised; a single one (a worker replaced in place) is sent from
    the reconciling thread, with no hand-over on the failure's path."""
    reconciler = _reconciler(RecordingKube(_raw()))
    threads: list[str] = []
    finished: list[int] = []
    started = threading.Barrier(3, timeout=5)

    def request(i: int, fail: bool = False, meet: bool = True) -> None:
        threads.append(threading.current_thread().name)
        if meet:
            started.wait()  # all three in flight at once
        if fail:
            raise RuntimeError(f"refused {i}")
        time.sleep(0.05)
        finished.append(i)

    try:
        reconciler._together([functools.partial(request, 0, meet=False)])
        assert threads == [threading.current_thread().name] and finished == [0]
        threads.clear()
        finished.clear()
        with pytest.raises(RuntimeError, match="refused 1"):
            reconciler._together([functools.partial(request, 0), functools.partial(request, 1, True),
                                  functools.partial(request, 2)])
        assert sorted(finished) == [0, 2]  # answered before the refusal was raised
        assert len(threads) == 3 and all(t.startswith("rljob-create") for t in threads)
    finally:
        reconciler.close()
