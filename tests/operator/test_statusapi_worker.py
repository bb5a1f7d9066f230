"""Whose pods may speak for a job, without a cluster: the pod's controller reference and the reads it costs.

The status API accepts a heartbeat only from a pod the operator created for the job: the pod of the token's name
and uid has the job (``rljob.dev``, kind, name and uid) as its controller reference, which the admission policy
``rljob-worker-pods`` admits only from whoever may patch the job's status (``decisions.observed.job_reference``).
``tests/operator/test_statusapi_cluster.py`` sends real tokens of real pods (a tenant's among them); here the API
server's answers (the job, the pod) are given as it would give them, to count the reads: each pod is read once
per ``CACHE_SECONDS``, the job too, however many heartbeats they send.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from rljob_operator.cluster.kube import Kube
from rljob_operator.server import statusapi
from rljob_operator.server.statusapi import POD_NAME_EXTRA, POD_UID_EXTRA, Denied, Identity, StatusAPI

JOB_UID = "11111111-1111-1111-1111-111111111111"
POD_UID = "33333333-3333-3333-3333-333333333333"
OTHER_UID = "44444444-4444-4444-4444-444444444444"

JOB = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob",
       "metadata": {"namespace": "ml", "name": "st", "uid": JOB_UID}, "status": {"phase": "Running"}}
REFERENCE = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "name": "st", "uid": JOB_UID,
             "controller": True, "blockOwnerDeletion": True}


def pod(name: str = "st-worker-0", uid: str = POD_UID, ref: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod as the API server answers it, controlled by the job; ``ref`` changes members of its controller
    reference (``{"kind": None}``: no ownerReference at all)."""
    ref = ref or {}
    refs = [] if "kind" in ref and ref["kind"] is None else [{**REFERENCE, **ref}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "namespace": "ml", "name": name, "uid": uid, "labels": {"rljob.dev/job": "st"}, "ownerReferences": refs}}


class Answers(StatusAPI):
    """The status API with the API server's answers given: ``_call`` returns the job, or the pod, as GET would."""

    def __init__(self, job: dict[str, Any], *pods: dict[str, Any]) -> None:
        super().__init__(Kube(k8s.ApiClient(k8s.Configuration())))
        self.job = job
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.asked: list[str] = []

    def _call(self, verb: str, resource: str, call: Callable[..., Any], *args: Any) -> Any:
        self.asked.append(f"{verb} {resource}")
        if resource == "pods":
            if args[0] not in self.pods:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(self.pods[args[0]])
        if args[-1] != self.job["metadata"]["name"]:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.job)


def _identity(pod: str = "st-worker-0", uid: str = POD_UID, namespace: str = "ml") -> Identity:
    return Identity(username=f"system:serviceaccount:{namespace}:default", uid="u", groups=[],
                    extra={POD_NAME_EXTRA: [pod], POD_UID_EXTRA: [uid]})


def test_a_pod_the_job_controls_speaks_for_it_and_costs_one_read_of_each() -> None:
    api = Answers(JOB, pod())
    try:
        api._check_worker(_identity(), "ml", "st")
        api._check_worker(_identity(), "ml", "st")
        assert sorted(api.asked) == ["GET pods", "GET rltrainingjobs"]  # then cached
    finally:
        api.close()


@pytest.mark.parametrize(("name", "answered"), [
    ("st-worker-0", pod(uid=OTHER_UID)),  # the name, but another pod under it now
    ("st-notebook", pod("st-notebook", ref={"kind": "ConfigMap"})),  # the labels, another controller
    ("st-notebook", pod("st-notebook", ref={"kind": None})),  # the labels, no ownerReference
    ("st-worker-0", pod(ref={"uid": "a-deleted-namesakes-uid"})),  # a pod of a namesake job deleted before
    ("st-worker-0", pod(ref={"name": "another-job"})),  # a reference naming another job, with this one's uid
    ("st-worker-0", pod(ref={"apiVersion": "tenant.example/v1"})),  # the job's kind, name and uid, another group
    ("st-worker-0", pod(ref={"controller": False})),  # the job as an owner, not as the controller
    ("st-worker-1", None),  # no such pod
])
def test_a_pod_the_job_does_not_control_is_refused_and_read_once_per_period(
        name: str, answered: dict[str, Any] | None) -> None:
    pods = [answered] if answered is not None else []
    api = Answers(JOB, *pods)
    try:
        for _ in range(5):
            with pytest.raises(Denied) as refused:
                api._check_worker(_identity(name), "ml", "st")
            assert refused.value.status == 403
            assert refused.value.message == (f"pod ml/{name} is not a worker of ml/st: only pods the operator created "
                                             "for the job may speak for it")
        assert sorted(api.asked) == ["GET pods", "GET rltrainingjobs"]
    finally:
        api.close()


def test_a_job_made_again_under_its_name_is_read_again_for_its_new_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job was deleted and made again: the cached job has the old uid, the new gang's pods name the new one."""
    api = Answers(JOB, pod())
    monkeypatch.setattr(statusapi, "RECORD_RECHECK_SECONDS", 0.0)
    try:
        api._check_worker(_identity(), "ml", "st")
        api.job = copy.deepcopy(JOB)
        api.job["metadata"]["uid"] = "new-job-uid"
        api.pods["st-worker-0"] = pod(uid=OTHER_UID, ref={"uid": "new-job-uid"})
        api._check_worker(_identity(uid=OTHER_UID), "ml", "st")
        assert sorted(api.asked) == ["GET pods"] * 2 + ["GET rltrainingjobs"] * 2
        with pytest.raises(Denied):  # the old job's pod no longer speaks (its cached answer names the old uid)
            api._check_worker(_identity(), "ml", "st")
    finally:
        api.close()


def test_a_token_without_its_pods_uid_or_of_another_namespace_or_of_a_job_that_is_gone_is_refused() -> None:
    api = Answers(JOB, pod())
    try:
        for identity, namespace in ((_identity(uid=""), "ml"), (_identity(namespace="other"), "ml")):
            with pytest.raises(Denied) as refused:
                api._check_worker(identity, namespace, "st")
            assert refused.value.status == 403
        assert api.asked == []  # refused before any read
        with pytest.raises(Denied) as refused:
            api._check_worker(_identity(), "ml", "gone")
        assert refused.value.status == 404
    finally:
        api.close()


def test_a_heartbeat_becomes_progress_under_the_status_models_names_finite_values_only() -> None:
    from datetime import UTC, datetime

    from rljob_contract.job import Progress
    from rljob_contract.pod import HeartbeatBody
    from rljob_operator.server.statusapi import REPORTED_FIELDS, heartbeat_progress

    # Every field the heartbeat and status.progress share is carried, with no table to keep in step.
    assert REPORTED_FIELDS == ("reward", "loss", "checkpoint", "best_checkpoint", "best_metric")
    body = HeartbeatBody(step=7, reward=float("nan"), loss=0.5, best_checkpoint="s3://b/checkpoint-6", best_metric=2,
                         evaluation={"metric": "eval/acc", "step": 6, "values": {"eval/acc": 0.75, "eval/len": None},
                                     "best_value": float("inf")})
    progress = heartbeat_progress(body, datetime(2030, 1, 1, tzinfo=UTC))
    assert progress == {"step": 7, "lastHeartbeat": "2030-01-01T00:00:00Z", "loss": 0.5,
                        "bestCheckpoint": "s3://b/checkpoint-6", "bestMetric": 2.0,
                        "evaluation": {"metric": "eval/acc", "step": 6, "value": 0.75, "values": {"eval/acc": 0.75},
                                       "bestStep": None, "bestValue": None}}
    # What is written reads back as the API's model.
    assert Progress.model_validate(progress).best_checkpoint == "s3://b/checkpoint-6"
