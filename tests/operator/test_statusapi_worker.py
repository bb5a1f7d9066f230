"""Whose pods may speak for a job, without a cluster: the record of created pods and the reads it costs.

The status API accepts a heartbeat only from a pod the operator created for the job: its name and uid in the
job's ``status.createdPods`` (``decisions.createdpods``). ``tests/operator/test_statusapi_cluster.py`` sends real
tokens of real pods (a tenant's among them); here the API server's answer (the job) is given as it would give it,
to count the reads: a pod missing from the record is looked up again in a fresh read, at most every
``RECORD_RECHECK_SECONDS`` per job, however many heartbeats it sends.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from rljob_operator.cluster.kube import Kube
from rljob_operator.server import statusapi
from rljob_operator.server.statusapi import POD_NAME_EXTRA, POD_UID_EXTRA, Denied, Identity, StatusAPI

JOB_UID = "11111111-1111-1111-1111-111111111111"
POD_UID = "33333333-3333-3333-3333-333333333333"
OTHER_UID = "44444444-4444-4444-4444-444444444444"

JOB = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob",
       "metadata": {"namespace": "ml", "name": "st", "uid": JOB_UID},
       "status": {"createdPods": {"st-worker-0": POD_UID}}}


class Answers(StatusAPI):
    """The status API with the API server's answer given: ``_call`` returns the job as GET would."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(Kube(k8s.ApiClient(k8s.Configuration())))
        self.job = job
        self.asked: list[str] = []

    def _call(self, verb: str, resource: str, call: Callable[..., Any], *args: Any) -> Any:
        self.asked.append(f"{verb} {resource}")
        return copy.deepcopy(self.job)


def _identity(pod: str = "st-worker-0", uid: str = POD_UID, namespace: str = "ml") -> Identity:
    return Identity(username=f"system:serviceaccount:{namespace}:default", uid="u", groups=[],
                    extra={POD_NAME_EXTRA: [pod], POD_UID_EXTRA: [uid]})


def test_a_pod_the_operator_recorded_for_the_job_speaks_for_it_and_costs_one_read() -> None:
    api = Answers(JOB)
    try:
        api._check_worker(_identity(), "ml", "st")
        api._check_worker(_identity(), "ml", "st")
        assert api.asked == ["GET rltrainingjobs"]  # cached: no pod is read at all
    finally:
        api.close()


@pytest.mark.parametrize(("pod", "uid"), [
    ("st-worker-0", OTHER_UID),  # the name, but another pod under it (made again by someone else)
    ("st-notebook", POD_UID),  # a pod of any other name, whatever its labels and ownerReferences
    ("st-worker-1", OTHER_UID),  # a worker name the operator has not created a pod under
])
def test_a_pod_missing_from_the_record_is_refused_after_one_fresh_read_per_period(
        pod: str, uid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Answers(JOB)
    try:
        for _ in range(5):
            with pytest.raises(Denied) as refused:
                api._check_worker(_identity(pod, uid), "ml", "st")
            assert refused.value.status == 403
            assert refused.value.message == (f"pod ml/{pod} is not a worker of ml/st: only pods the operator created "
                                             "for the job may speak for it")
        assert api.asked == ["GET rltrainingjobs"]  # a second read only once the first is RECORD_RECHECK_SECONDS old
        monkeypatch.setattr(statusapi, "RECORD_RECHECK_SECONDS", 0.0)
        with pytest.raises(Denied):
            api._check_worker(_identity(pod, uid), "ml", "st")
        assert api.asked == ["GET rltrainingjobs"] * 2
    finally:
        api.close()


def test_a_pod_created_after_the_read_is_found_in_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gang restarted: its new pods are recorded after the job was read; the first heartbeat reads it again."""
    api = Answers(JOB)
    monkeypatch.setattr(statusapi, "RECORD_RECHECK_SECONDS", 0.0)
    try:
        api._check_worker(_identity(), "ml", "st")
        api.job = copy.deepcopy(JOB)
        api.job["status"]["createdPods"]["st-worker-0"] = OTHER_UID
        api._check_worker(_identity(uid=OTHER_UID), "ml", "st")
        assert api.asked == ["GET rltrainingjobs"] * 2
        with pytest.raises(Denied):  # the pod it replaced under that name no longer speaks
            api._check_worker(_identity(), "ml", "st")
    finally:
        api.close()


def test_a_token_without_its_pods_uid_or_of_another_namespace_or_a_job_without_record_is_refused() -> None:
    api = Answers({**JOB, "status": {"phase": "Running"}})  # an earlier operator's job, not reconciled since
    try:
        for identity, namespace in ((_identity(uid=""), "ml"), (_identity(namespace="other"), "ml"),
                                    (_identity(), "ml")):
            with pytest.raises(Denied) as refused:
                api._check_worker(identity, namespace, "st")
            assert refused.value.status == 403
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
