"""The operator's rules for runtimes on the real control plane (issue #42, operator half), each job created by an
ordinary tenant who may create RLTrainingJobs and nothing else, with no admission policy installed (the test
control plane has none: the operator runs ``without_admission_policies``, acknowledged):

* a ClusterRLTrainingRuntime's namespaceSelector, enforced by the operator itself (RuntimeNotAllowed);
* the built pod judged whole: a template's grace period of a year, ``gpuResource`` naming the control plane in
  a namespace admin's runtime, pod-level resources beyond the bound (Kueue's charge: test_kueue_cluster.py);
* a runtime edited under a running job applies from its next gang; one deleted keeps the job on its snapshot.

The same rules as pure decisions: ``tests/operator/test_runtime_rules.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    QUICK,
    annotate_pod,
    apply_runtime,
    create_job,
    deep_update,
    events_for,
    get_job,
    job_manifest,
    job_pods,
    runtime_manifest,
    wait_for_events,
    wait_gang,
    wait_phase,
)

pytestmark = pytest.mark.cluster

RUNTIMES = "/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _wait_condition(kube: Any, namespace: str, name: str, kind: str, reason: str) -> dict[str, Any]:
    """The job once its condition ``kind`` has ``reason``."""
    def reached() -> dict[str, Any] | None:
        job = get_job(kube, namespace, name)
        return job if _condition(job, kind).get("reason") == reason else None

    return wait_for(reached, 30, message=f"{name}: {kind} {reason}")  # type: ignore[no-any-return]


def _namespaced(kube: Any, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A namespace admin's RLTrainingRuntime ``name`` (the tests' image, a 1 s grace period, ``spec`` over it);
    the job spec patch that runs a job on it."""
    apply_runtime(kube, runtime_manifest(name, deep_update(QUICK, spec), kind="RLTrainingRuntime", namespace=namespace))
    return {"runtimeRef": {"kind": "RLTrainingRuntime", "name": name}}


@pytest.fixture
def team_runtime(kube: Any, namespace: str) -> Any:
    """``make(selector) -> name``: a ClusterRLTrainingRuntime for the namespaces ``selector`` picks; deleted after."""
    made: list[str] = []

    def make(selector: dict[str, Any]) -> str:
        name = f"team-{namespace}"[:63]
        apply_runtime(kube, runtime_manifest(name, deep_update(QUICK, {"namespaceSelector": selector})))
        made.append(name)
        return name

    yield make
    for name in made:
        kube.request("DELETE", f"{RUNTIMES}/{name}")


def test_a_runtime_outside_its_namespace_selector_is_refused_by_the_operator_itself(
        kube: Any, namespace: str, operator: Any, tenant: Any, team_runtime: Any) -> None:
    runtime = team_runtime({"matchLabels": {"rljob.dev/team": "vision"}})
    operator()
    create_job(tenant, namespace, job_manifest("outside", 1, {"runtimeRef": {"name": runtime}}))
    job = wait_phase(kube, namespace, "outside", "Failed", reason="RuntimeNotAllowed")
    assert job["status"]["message"] == (
        f"spec.runtimeRef: ClusterRLTrainingRuntime/{runtime} serves only the namespaces its spec.namespaceSelector "
        f"selects (rljob.dev/team=vision), and namespace {namespace} is not one of them: name another runtime, or "
        "ask the platform team to label the namespace")
    assert job_pods(kube, namespace, "outside") == []
    # The platform team labels the namespace: a job of it runs; relabelled, the running job is stopped.
    kube.request("PATCH", f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"rljob.dev/team": "vision"}}},
                 content_type="application/merge-patch+json")
    create_job(tenant, namespace, job_manifest("inside", 1, {"runtimeRef": {"name": runtime}}))
    wait_phase(kube, namespace, "inside", "Running")
    kube.request("PATCH", f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"rljob.dev/team": "nlp"}}},
                 content_type="application/merge-patch+json")
    wait_phase(kube, namespace, "inside", "Failed", timeout=30, reason="RuntimeNotAllowed")
    wait_for(lambda: not [p for p in job_pods(kube, namespace, "inside") if not p["metadata"].get("deletionTimestamp")],
             30, message="the stopped job's pods deleted")


def test_a_runtime_requiring_a_queue_runs_no_job_of_an_operator_without_kueue(
        kube: Any, namespace: str, operator: Any, tenant: Any, team_runtime: Any) -> None:
    """The runtime's ``queue.required`` holds even where the operator's Kueue integration is off: no job of it
    runs unqueued."""
    runtime = team_runtime({})
    kube.request("PATCH", f"{RUNTIMES}/{runtime}", {"spec": {"queue": {"name": "team-q", "required": True}}},
                 content_type="application/merge-patch+json")
    operator(env={"RLJOB_OPERATOR_KUEUE": "false"})
    create_job(tenant, namespace, job_manifest("unqueued", 1, {"runtimeRef": {"name": runtime}}))
    job = wait_phase(kube, namespace, "unqueued", "Failed", reason="RuntimeNotAllowed")
    assert "requires a Kueue LocalQueue (its spec.queue.required), and this operator does not run jobs through " \
        "Kueue" in job["status"]["message"]
    assert job_pods(kube, namespace, "unqueued") == []


def test_the_three_escapes_of_a_runtimes_pod_are_closed(kube: Any, namespace: str, operator: Any,
                                                        tenant: Any) -> None:
    """A year-long grace period in the template, gpuResource naming the control plane (a namespace admin's
    runtime), pod-level CPUs beyond the runtime's bound: each job fails PolicyViolation naming the field, and no
    pod of it is ever created."""
    operator()
    cases = {
        "grace": ({"podTemplate": {"spec": {"terminationGracePeriodSeconds": 31536000}},
                   "limits": {"terminationGracePeriodSeconds": {"max": 600}}},
                  "spec.podTemplate.spec.terminationGracePeriodSeconds: 31536000 seconds (at most 600"),
        "control-plane": ({"gpuResource": CONTROL_PLANE},
                          f"spec.gpuResource: tolerating the control-plane taint {CONTROL_PLANE} is not allowed"),
        "pod-level": ({"podTemplate": {"spec": {"resources": {"limits": {"cpu": "96"}}}},
                       "limits": {"cpuPerWorker": {"max": "32"}}},
                      "spec.podTemplate.spec.resources.limits.cpu: the worker pod's cpu requests come to 96 "
                      "(spec.limits.cpuPerWorker.max allows at most 32)"),
    }
    for case, (spec, _) in cases.items():
        create_job(tenant, namespace, job_manifest(case, 1, _namespaced(kube, namespace, case, spec)))
    for case, (_, refusal) in cases.items():
        status = wait_phase(kube, namespace, case, "Failed", reason="PolicyViolation")["status"]
        assert f"RLTrainingRuntime/{namespace}/{case}: {refusal}" in status["message"], status["message"]
        assert job_pods(kube, namespace, case) == []


def test_a_runtime_edited_under_a_running_job_applies_from_its_next_gang(kube: Any, namespace: str, operator: Any,
                                                                         tenant: Any) -> None:
    ref = _namespaced(kube, namespace, "team", {"podTemplate": {"metadata": {"labels": {"shape": "first"}}}})
    operator()
    create_job(tenant, namespace, job_manifest("edited", 2, {**ref, "runPolicy": {"backoffBaseSeconds": 0}}))
    job = wait_gang(kube, namespace, "edited", 0)
    first = job["status"]["runtime"]
    assert (first["kind"], first["name"], first["generation"]) == ("RLTrainingRuntime", "team", 1)
    config = kube.request("GET", kube.core_path(namespace, "configmaps", "edited-config"))["data"]
    assert json.loads(config["runtime.json"])["metadata"]["generation"] == 1
    gang = {p["metadata"]["uid"] for p in job_pods(kube, namespace, "edited")}

    _namespaced(kube, namespace, "team", {"podTemplate": {"metadata": {"labels": {"shape": "second"}}}})
    changed = _wait_condition(kube, namespace, "edited", "RuntimeUpToDate", "RuntimeChanged")
    assert "generation 2 applies from the next gang start" in _condition(changed, "RuntimeUpToDate")["message"]
    assert changed["status"]["runtime"] == first and changed["status"]["phase"] == "Running"
    assert {p["metadata"]["uid"] for p in job_pods(kube, namespace, "edited")} == gang  # the running gang untouched
    wait_for_events(kube, namespace, "edited", "RuntimeChanged")

    annotate_pod(kube, namespace, "edited-worker-1", {"rljob.dev/fake-exit-code": "1"})  # a retryable failure
    restarted = wait_gang(kube, namespace, "edited", 1, timeout=90)
    assert restarted["status"]["runtime"]["generation"] == 2
    assert {p["metadata"]["labels"]["shape"] for p in job_pods(kube, namespace, "edited")} == {"second"}
    assert _condition(restarted, "RuntimeUpToDate")["status"] == "True"


def test_a_runtime_deleted_under_a_running_job_keeps_it_on_its_snapshot(kube: Any, namespace: str, operator: Any,
                                                                        tenant: Any) -> None:
    ref = _namespaced(kube, namespace, "gone", {"podTemplate": {"metadata": {"labels": {"shape": "kept"}}}})
    operator()
    create_job(tenant, namespace, job_manifest("orphan", 2, {**ref, "runPolicy": {"backoffBaseSeconds": 0}}))
    wait_gang(kube, namespace, "orphan", 0)
    gang = {p["metadata"]["uid"] for p in job_pods(kube, namespace, "orphan")}
    kube.request("DELETE", f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rltrainingruntimes/gone")
    deleted = _wait_condition(kube, namespace, "orphan", "RuntimeUpToDate", "RuntimeDeleted")
    assert deleted["status"]["phase"] == "Running"  # neither broken nor changed
    assert {p["metadata"]["uid"] for p in job_pods(kube, namespace, "orphan")} == gang
    wait_for_events(kube, namespace, "orphan", "RuntimeDeleted")

    annotate_pod(kube, namespace, "orphan-worker-1", {"rljob.dev/fake-exit-code": "1"})
    restarted = wait_gang(kube, namespace, "orphan", 1, timeout=90)  # a new gang, from the snapshot
    assert {p["metadata"]["labels"]["shape"] for p in job_pods(kube, namespace, "orphan")} == {"kept"}
    cond = _condition(restarted, "RuntimeUpToDate")
    assert (cond["status"], cond["reason"]) == ("False", "RuntimeDeleted")
    wait_for(lambda: [e for e in events_for(kube, namespace, "orphan") if e["reason"] == "RuntimeDeleted" and
                      e["message"].startswith("gang generation 1 is built from the runtime's snapshot: ")], 30,
             message="the Event saying the new gang runs on the snapshot")
    # A job that never ran on it has no snapshot: it waits for the runtime.
    create_job(tenant, namespace, job_manifest("late", 1, ref))
    wait_phase(kube, namespace, "late", "Pending", reason="RuntimeNotFound")
