"""Pods an ordinary tenant makes to pass for a job's workers, on the real API server (issue #43 point 3, the gang's
side): the API server refuses the tenant a pod controlled by the job (the admission policy ``rljob-worker-pods``,
issue #48), the job's phase and gang are the operator's pods' alone, a stranger claiming the job (the job's UID
under another API group, or no controller and a worker's name) is deleted, one that does not is left alone, and the
rendezvous names only the worker 0 the operator created (``test_strangers.py`` for the decisions)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_contract.job import parse_job
from rljob_operator.cluster.kube import FIELD_MANAGER
from rljob_operator.decisions.children import desired_worker_pod

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    WORKER_PODS_POLICY,
    create_job,
    job_claim,
    job_manifest,
    job_pods,
    wait_for_events,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def _tenant_pod(tenant: Any, kube: Any, namespace: str, job: dict[str, Any], name: str, index: int,
                meta: dict[str, Any], manager: str = "notebook") -> dict[str, Any]:
    """What the tenant can make from what it may read: the worker's public shape (labels, spec, hostname), its
    own annotations and ownerReferences, created with the field manager it chooses."""
    pod = desired_worker_pod(parse_job(copy.deepcopy(job)), index, 0)
    pod["metadata"] = {**pod["metadata"], "name": name, **meta,
                       "annotations": {**pod["metadata"]["annotations"], **meta.get("annotations", {})}}
    return tenant.request("POST", kube.core_path(namespace, "pods"), pod,  # type: ignore[no-any-return]
                          query={"fieldManager": manager})


def _claim(job: dict[str, Any], api_version: str | None = None) -> list[dict[str, Any]]:
    """A controller ownerReference naming the job (its UID is public), under ``api_version`` (default the job's)."""
    return [job_claim(job["metadata"]["name"], job["metadata"]["uid"], api_version or job["apiVersion"])]


def _refused_claim(tenant: Any, kube: Any, namespace: str, job: dict[str, Any], name: str, index: int) -> None:
    """The tenant's pod controlled by the job: the API server refuses it, naming the policy and the field."""
    with pytest.raises(ApiException) as refused:
        _tenant_pod(tenant, kube, namespace, job, name, index, {"ownerReferences": _claim(job)})
    assert refused.value.status == 403
    assert WORKER_PODS_POLICY in refused.value.body and "metadata.ownerReferences" in refused.value.body


def _operators(kube: Any, namespace: str, job: str) -> dict[str, str]:
    """The job's pods the job controls (name → UID): the operator's, as only it may give a pod that reference."""
    out = {}
    for pod in job_pods(kube, namespace, job):
        refs = pod["metadata"].get("ownerReferences") or []
        if any(r.get("controller") and r.get("kind") == "RLTrainingJob" and r.get("apiVersion", "").startswith(
                "rljob.dev/") and r.get("name") == job for r in refs):
            out[pod["metadata"]["name"]] = pod["metadata"]["uid"]
    return out


def _gone(kube: Any, namespace: str, pod: dict[str, Any]) -> bool:
    uids = {p["metadata"]["uid"] for p in kube.list_pods(namespace, f"rljob.dev/job={pod['metadata']['labels']['rljob.dev/job']}")}
    return pod["metadata"]["uid"] not in uids


def _rendezvous(kube: Any, namespace: str, job: str) -> list[dict[str, Any]]:
    """Every EndpointSlice serving the job's Service: what CoreDNS answers worker 0's name from."""
    found = kube.request("GET", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                         query={"labelSelector": f"kubernetes.io/service-name={job}"})
    return list(found.get("items") or [])


def _worker0_only(kube: Any, namespace: str, job: str) -> dict[str, Any] | None:
    """The Service's slices once they name worker 0 (the operator's: controlled by the job), and only it."""
    recorded = _operators(kube, namespace, job)
    slices = _rendezvous(kube, namespace, job)
    endpoints = [e for s in slices for e in s.get("endpoints") or []]
    if len(endpoints) != 1 or endpoints[0]["targetRef"]["uid"] != recorded.get(f"{job}-worker-0"):
        return None
    return {"slices": slices, "endpoint": endpoints[0]}


def test_a_tenants_worker_0_made_before_the_operator_does_not_finish_the_job_and_is_replaced(
        kube, namespace, operator, tenant_kube) -> None:
    """The tenant makes ``early-worker-0`` before the operator has looked: controlled by the job, the API server
    refuses it; with every label, no controller and the operator's field manager, it is made, and exits 0. Once the
    operator runs, the job does not succeed; the stranger is deleted with a ForeignPod Event, and the real worker 0
    is created and given the rendezvous name."""
    job = create_job(kube, namespace, job_manifest("early", replicas=2))
    _refused_claim(tenant_kube, kube, namespace, job, "early-worker-0", 0)
    fake = _tenant_pod(tenant_kube, kube, namespace, job, "early-worker-0", 0,
                       {"ownerReferences": [], "annotations": {"rljob.dev/fake-exit-code": "0"}}, manager=FIELD_MANAGER)
    assert [m["manager"] for m in fake["metadata"]["managedFields"]] == [FIELD_MANAGER]  # the client's choice
    wait_for(lambda: next((p["status"].get("phase") == "Succeeded" for p in job_pods(kube, namespace, "early")), False),
             60, message="the tenant's worker 0 exited 0")

    operator()
    running = wait_phase(kube, namespace, "early", "Running", timeout=90)
    assert _gone(kube, namespace, fake)
    [event] = [e for e in wait_for_events(kube, namespace, "early", "ForeignPod") if e["reason"] == "ForeignPod"]
    assert event["type"] == "Warning" and event["message"].startswith(f"pod early-worker-0 (its creator named itself "
                                                                       f"'{FIELD_MANAGER}') claims this job")
    status = running["status"]
    assert "completionTime" not in status and status["workers"]["succeeded"] == 0
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "early")}
    assert pods.keys() == {"early-worker-0", "early-worker-1"} and pods["early-worker-0"] != fake["metadata"]["uid"]
    found = wait_for(lambda: _worker0_only(kube, namespace, "early"), 30, message="the rendezvous names worker 0")
    assert found["endpoint"]["hostname"] == "early-worker-0" and _operators(kube, namespace, "early") == pods
    assert "createdPods" not in status  # the status lists no pod
    assert "Completed" not in {e["reason"] for e in wait_for_events(kube, namespace, "early", "ForeignPod")}


def test_pods_a_tenant_adds_to_a_running_gang_change_nothing_and_only_those_claiming_it_are_deleted(
        kube, namespace, operator, tenant_kube) -> None:
    """During a run the tenant adds a lookalike of worker 0 (every label, worker 0's hostname, controlled by its own
    ConfigMap, exiting 0) and a pod claiming the job under another name (worker 1's labels, exiting 1): the job's
    kind, name and UID as its controller under another API group, since the API server refuses the job's own
    (``rljob-worker-pods``). The job stays
    Running with its two workers, nothing restarts, the claiming pod is deleted, the lookalike (not the operator's to
    delete) is left alone, and no rendezvous answer ever names it."""
    operator()
    create_job(kube, namespace, job_manifest("mid", replicas=2))
    job = wait_phase(kube, namespace, "mid", "Running", timeout=90)
    wait_for(lambda: _worker0_only(kube, namespace, "mid"), 30, message="the rendezvous names worker 0")
    owner = tenant_kube.request("POST", kube.core_path(namespace, "configmaps"), {"metadata": {"name": "notebooks"}})
    lookalike = _tenant_pod(tenant_kube, kube, namespace, job, "mid-notebook", 0, {
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "notebooks",
                             "uid": owner["metadata"]["uid"], "controller": True}],
        "annotations": {"rljob.dev/fake-exit-code": "0", "rljob.dev/fake-exit-after": "5s"}})
    assert lookalike["spec"]["hostname"] == "mid-worker-0" and lookalike["spec"]["subdomain"] == "mid"
    _refused_claim(tenant_kube, kube, namespace, job, "mid-helper", 1)
    claiming = _tenant_pod(tenant_kube, kube, namespace, job, "mid-helper", 1, {
        "ownerReferences": _claim(job, "tenant.example/v1"), "annotations": {"rljob.dev/fake-exit-code": "1"}})

    wait_for(lambda: _gone(kube, namespace, claiming), 60, message="the claiming stranger deleted")
    wait_for(lambda: next((p["status"].get("phase") == "Succeeded" for p in job_pods(kube, namespace, "mid")
                           if p["metadata"]["name"] == "mid-notebook"), False), 60, message="the lookalike exited 0")
    events = wait_for_events(kube, namespace, "mid", "ForeignPod")
    assert [e["message"].split()[1] for e in events if e["reason"] == "ForeignPod"] == ["mid-helper"]
    status = wait_phase(kube, namespace, "mid", "Running")["status"]
    assert (status["restarts"], status["workers"]["active"], status["workers"]["ready"]) == (0, 2, 2)
    assert status["gangGeneration"] == job["status"]["gangGeneration"] and "completionTime" not in status
    assert {p["metadata"]["name"] for p in job_pods(kube, namespace, "mid")} == {"mid-worker-0", "mid-worker-1",
                                                                                  "mid-notebook"}
    found = _worker0_only(kube, namespace, "mid")
    assert found is not None and len(found["slices"]) == 1, found  # the operator's slice, and no selector's
    assert lookalike["metadata"]["uid"] not in str(found)
