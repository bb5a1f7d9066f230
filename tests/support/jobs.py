"""A job and its pods as the operator's pure decisions see them, for the operator's unit tests.

* ``make_job(replicas, spec, status, generation)``: a parsed RLTrainingJob ``train`` in ``team-a`` (uid ``UID``).
* ``pod_json(job, index, phase, ...)``: a worker pod as the API server shows it (built by the operator's own
  builder), ``observe(job, *pods)`` the pods as the reconciler sees pods it created, ``env_of(pod)`` its env.
* ``NOW``: the decisions' clock; ``ENDPOINT``: the status API the pods are told.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rljob_contract.job import RLTrainingJob, parse_job
from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.names import StatusEndpoint
from rljob_operator.times import rfc3339

from tests.support.operator_process import job_manifest

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "0123456789abcdef-uid"
ENDPOINT = StatusEndpoint("https://rljob-operator.rljob-system.svc:8443", "-----BEGIN CERTIFICATE-----\nx\n")


def make_job(replicas: int = 2, spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
             generation: int = 1) -> RLTrainingJob:
    doc = job_manifest("train", replicas, spec, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": generation})
    if status is not None:
        doc["status"] = status
    return parse_job(doc)


def pod_json(job: RLTrainingJob, index: int, phase: str = "Running", ready: bool = True, generation: int = 0,
             exit_code: int | None = None, message: str | None = None, node: str | None = "gpu-node-0",
             deleting: bool = False, uid: str = UID, unschedulable: str | None = None) -> dict[str, Any]:
    pod = desired_worker_pod(job, index, generation, ENDPOINT)
    pod["metadata"]["ownerReferences"][0]["uid"] = uid
    pod["metadata"]["uid"] = f"pod-{index}-{generation}"
    if deleting:
        pod["metadata"]["deletionTimestamp"] = rfc3339(NOW)
    if node:
        pod["spec"]["nodeName"] = node
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if unschedulable:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                      "finishedAt": rfc3339(NOW)}
        if message:
            terminated["message"] = message
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    pod["status"] = status
    return pod


def observe(job: RLTrainingJob, *pods: dict[str, Any]) -> list[ObservedPod]:
    """``pods`` as the operator sees them for the job ``train`` with uid ``UID`` (a test may show two generations'
    pods under one name, which a cluster never holds at once)."""
    return [ObservedPod.from_pod(p, UID, "train") for p in pods]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}
