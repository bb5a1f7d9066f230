"""Multi-tenant safety on the real control plane, whose kube-apiserver runs PodSecurity admission and
ResourceQuota: PolicyViolation before any pod, PodRejected after one attempt, a quota refusal waits
(the pod profile's decisions: ``tests/operator/test_policy.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.cluster.waiting import wait_for
from tests.operator.test_policy import (
    ESCALATIONS,
    FOREIGN_IMAGE,
    JOB_ESCALATIONS,
    SECRET_REFERENCES,
    _template,
)
from tests.support.operator_process import (
    JOBS_ONLY,
    apply_runtime,
    create_job,
    events_for,
    get_job,
    job_manifest,
    job_pods,
    patch_spec,
    runtime_manifest,
    service_account_kube,
    wait_phase,
)


def _label_namespace(core_v1: Any, namespace: str, level: str) -> None:
    labels = {f"pod-security.kubernetes.io/{mode}": level for mode in ("enforce", "warn", "audit")}
    core_v1.patch_namespace(namespace, {"metadata": {"labels": labels}})


@pytest.fixture
def ordinary_user(control_plane: Any, kube: Any, namespace: str) -> Iterator[Any]:
    """A Kube acting as a ServiceAccount token whose only rights are on rltrainingjobs of ``namespace``."""
    user = service_account_kube(kube, namespace, "team-member",
                                control_plane.service_account_kubeconfig(namespace, "team-member"),
                                {"jobs-only": JOBS_ONLY})
    with pytest.raises(ApiException) as denied:  # the user could not build such pods themselves
        user.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
            "metadata": {"name": "direct"}, "spec": {"containers": [{"name": "c", "image": FOREIGN_IMAGE}]}})
    assert denied.value.status == 403
    yield user
    user.api_client.close()


def _pod_posts(op: Any) -> float:
    """Pod creations the operator sent (refused or not), from its own metrics."""
    total = 0.0
    for line in op.metrics_text().splitlines():
        if line.startswith("rljob_operator_api_requests_total{") and 'resource="pods"' in line and \
                'verb="POST"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.cluster
def test_each_escalation_fails_policy_violation_and_no_pod_ever_exists(kube, namespace, operator, core_v1,
                                                                      ordinary_user) -> None:
    """Whatever a runtime (a namespace's admins write RLTrainingRuntimes) or a job asks beyond the profile: the job
    fails PolicyViolation naming the field, and no pod is ever sent."""
    _label_namespace(core_v1, namespace, "restricted")
    user = ordinary_user
    op = operator(env={"RLJOB_OPERATOR_ALLOW_SECRET_REFERENCES": "false"})
    cases = ESCALATIONS + SECRET_REFERENCES
    for case, patch, _ in cases:
        apply_runtime(kube, runtime_manifest(f"p-{case}", patch, kind="RLTrainingRuntime", namespace=namespace))
        create_job(user, namespace, job_manifest(f"p-{case}"[:50], replicas=1, spec={
            "runtimeRef": {"kind": "RLTrainingRuntime", "name": f"p-{case}"}}))
    for case, patch, _ in JOB_ESCALATIONS:
        create_job(user, namespace, job_manifest(f"p-{case}"[:50], replicas=1, spec=patch))
    cases += JOB_ESCALATIONS
    for case, _, field in cases:
        job = wait_phase(kube, namespace, f"p-{case}"[:50], "Failed", reason="PolicyViolation", timeout=60)
        assert f"{field}: " in job["status"]["message"], (case, job["status"]["message"])
        # The Event follows the status write: wait for it rather than race it.
        name = f"p-{case}"[:50]
        wait_for(lambda name=name: any(e["reason"] == "PolicyViolation" for e in events_for(kube, namespace, name)),
                 10, message=f"a PolicyViolation Event on {name}")
    assert _pod_posts(op) == 0 and kube.list_pods(namespace, "") == []
    # A credential in trl is refused at kubectl apply already (CRD rule), naming the field.
    with pytest.raises(ApiException) as e:
        create_job(user, namespace, job_manifest("hub-token", spec={"training": {"trl": {"hub_token": "hf_x"}}}))
    assert e.value.status == 422 and "spec.training.trl.hub_token" in str(e.value.body)
    # An edit onto an allowed runtime re-checks the job: the same user's quickstart-shaped job runs.
    patch_spec(user, namespace, "p-host-network", {"runtimeRef": None})
    wait_phase(kube, namespace, "p-host-network", "Running", timeout=60)


@pytest.mark.cluster
def test_a_pod_admission_refuses_fails_the_job_with_podrejected_after_one_attempt(kube, namespace, operator,
                                                                                 core_v1) -> None:
    _label_namespace(core_v1, namespace, "restricted")
    # The platform allows privileged pods, the namespace does not: PodSecurity admission has the last word.
    op = operator(env={"RLJOB_OPERATOR_POD_PROFILE": "privileged"})
    apply_runtime(kube, runtime_manifest("hostnet", _template({"hostNetwork": True}), kind="RLTrainingRuntime",
                                         namespace=namespace))
    create_job(kube, namespace, job_manifest("hostnet", replicas=1, spec={
        "runtimeRef": {"kind": "RLTrainingRuntime", "name": "hostnet"}}))
    job = wait_phase(kube, namespace, "hostnet", "Failed", reason="PodRejected", timeout=60)
    assert "violates PodSecurity" in job["status"]["message"] and "hostNetwork" in job["status"]["message"]
    assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Failed"] == "True"
    time.sleep(8)  # more than two resyncs (3 s in tests): nothing is tried again
    assert _pod_posts(op) == 1 and job_pods(kube, namespace, "hostnet") == []
    assert [e["reason"] for e in events_for(kube, namespace, "hostnet")].count("PodRejected") == 1  # after 8 s
    assert get_job(kube, namespace, "hostnet")["status"]["reason"] == "PodRejected"


@pytest.mark.cluster
def test_the_quickstart_job_runs_in_a_namespace_enforcing_restricted(kube, namespace, operator, core_v1) -> None:
    _label_namespace(core_v1, namespace, "restricted")
    operator()
    create_job(kube, namespace, job_manifest("quick", replicas=2))
    wait_phase(kube, namespace, "quick", "Running", timeout=90)
    for pod in job_pods(kube, namespace, "quick"):
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False and not spec.get("hostNetwork")
        tokens = [v for v in spec["volumes"] if "projected" in v
                  for s in v["projected"]["sources"] if "serviceAccountToken" in s]
        # The only token is the status API's, bound to its audience (useless against the API server).
        assert [v["name"] for v in tokens] == ["rljob-status-token"]
        assert tokens[0]["projected"]["sources"][0]["serviceAccountToken"]["audience"] != ""


@pytest.mark.cluster
def test_a_quota_refusal_waits_with_a_visible_condition_and_does_not_fail(kube, namespace, operator,
                                                                        core_v1) -> None:
    core_v1.create_namespaced_resource_quota(namespace, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}})
    wait_for(lambda: (core_v1.read_namespaced_resource_quota("one-pod", namespace).status.hard or {}).get("pods"),
             30, message="quota observed")
    operator()
    create_job(kube, namespace, job_manifest("quota", replicas=2))

    def waiting_on_quota() -> dict[str, Any] | None:
        status = get_job(kube, namespace, "quota").get("status") or {}
        reconciling = {c["type"]: c for c in status.get("conditions") or []}.get("Reconciling") or {}
        return status if reconciling.get("reason") == "QuotaExceeded" and reconciling.get("status") == "True" else None

    status = wait_for(waiting_on_quota, 60, message="Reconciling condition says QuotaExceeded")
    assert "exceeded quota" in status["message"] and status["phase"] != "Failed"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Failed"] == conditions["Stalled"] == "False"
