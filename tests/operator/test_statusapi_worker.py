"""Whose pods may speak for a job, without a cluster: the branch the control plane cannot show.

A pod whose controller ownerReference names the job but with another uid (a job deleted and made
again under its name, or a tenant's forgery) is deleted by the garbage collector within moments, so
``tests/operator/test_statusapi_cluster.py`` cannot hold one still long enough to send a heartbeat. Here the
API server's two answers (the pod, the job) are given as it would give them, and ``_check_worker``
must refuse the token with 403 naming the pod and the job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from rljob_operator.cluster.kube import Kube
from rljob_operator.server.statusapi import POD_NAME_EXTRA, POD_UID_EXTRA, Denied, Identity, StatusAPI

JOB_UID = "11111111-1111-1111-1111-111111111111"
OLD_UID = "22222222-2222-2222-2222-222222222222"
POD_UID = "33333333-3333-3333-3333-333333333333"


def _pod(owner_uid: str, controller: bool = True) -> dict[str, Any]:
    owner = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "name": "st", "uid": owner_uid,
             "controller": controller}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "ml", "name": "st-worker-0", "uid": POD_UID, "ownerReferences": [owner]}}


JOB = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob",
       "metadata": {"namespace": "ml", "name": "st", "uid": JOB_UID}}


class Answers(StatusAPI):
    """The status API with the API server's answers given: ``_call`` returns what GET would."""

    def __init__(self, pod: dict[str, Any]) -> None:
        super().__init__(Kube(k8s.ApiClient(k8s.Configuration())))
        self.answers = {"pods": pod, "rltrainingjobs": JOB}
        self.asked: list[str] = []

    def _call(self, verb: str, resource: str, call: Callable[..., Any], *args: Any) -> Any:
        self.asked.append(f"{verb} {resource}")
        return self.answers[resource]


def _identity() -> Identity:
    return Identity(username="system:serviceaccount:ml:default", uid="u", groups=[],
                    extra={POD_NAME_EXTRA: ["st-worker-0"], POD_UID_EXTRA: [POD_UID]})


def test_a_pod_controlled_by_the_jobs_namesake_of_another_uid_is_refused() -> None:
    api = Answers(_pod(OLD_UID))
    try:
        with pytest.raises(Denied) as refused:
            api._check_worker(_identity(), "ml", "st")
        assert refused.value.status == 403
        assert "pod ml/st-worker-0 is not a worker of ml/st" in refused.value.message
        assert "another job of that name" in refused.value.message
        assert api.asked == ["GET pods", "GET rltrainingjobs"]  # it got as far as comparing the uids
    finally:
        api.close()


def test_the_same_pod_controlled_by_the_jobs_current_uid_is_a_worker() -> None:
    api = Answers(_pod(JOB_UID))
    try:
        api._check_worker(_identity(), "ml", "st")  # no Denied: the control that makes the test above mean it
    finally:
        api.close()


def test_an_owner_reference_that_is_not_the_controller_makes_no_worker() -> None:
    api = Answers(_pod(JOB_UID, controller=False))
    try:
        with pytest.raises(Denied, match="is not a worker of ml/st") as refused:
            api._check_worker(_identity(), "ml", "st")
        assert refused.value.status == 403 and api.asked == ["GET pods"]
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
