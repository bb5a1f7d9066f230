"""``rljob operator`` started with nothing but ``--kubeconfig`` against the test control plane, as against
``make dev-cluster`` (its defaults and the elector without a cluster: ``tests/operator/test_local.py``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.operator_process import (
    FAST_ENV,
    REPO,
    WITHOUT_POLICIES_ENV,
    create_job,
    free_port,
    job_manifest,
    job_pods,
    wait_phase,
)


def _operator_env(**extra: str) -> dict[str, str]:
    """The test's environment with short intervals and free ports, nothing that picks a namespace or
    leader election (those are what the test is about)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("POD_NAMESPACE", "RLJOB_OPERATOR_LEADER_ELECT", "RLJOB_OPERATOR_NAMESPACES",
                        "RLJOB_OPERATOR_OPERATOR_NAMESPACE", "RLJOB_OPERATOR_LEASE_NAMESPACE")}
    env.update(FAST_ENV)
    env.update(WITHOUT_POLICIES_ENV)
    env.update({"RLJOB_OPERATOR_STATUS_PORT": str(free_port()), "RLJOB_OPERATOR_METRICS_PORT": str(free_port())})
    env.update(extra)
    return env


def _no_rljob_system(kube: Any) -> None:
    try:
        kube.request("GET", "/api/v1/namespaces/rljob-system")
    except ApiException as e:
        assert e.status == 404
        return
    pytest.fail("namespace rljob-system exists on the test control plane: this test needs a cluster without it")


def _no_jobs_being_deleted(kube: Any) -> None:
    """Wait until no RLTrainingJob is left in a Terminating namespace, and delete any left in a
    namespace that no longer exists.

    An operator started without ``--namespace`` watches every namespace. The tests before this one
    force-delete their pods and then their namespace without waiting, and a job whose pods vanished
    under it is reconciled as a lost gang, with warnings when its events can no longer be posted.
    That is a real cluster being torn down, not the steady state this test checks. A job whose
    namespace is gone was orphaned by the namespace controller (``ControlPlane.restart_apiserver``
    says how, and guards against it); nothing else would ever delete it.
    """
    from tests.cluster.waiting import wait_for

    def settled() -> bool:
        namespaces = {n["metadata"]["name"]: (n.get("status") or {}).get("phase")
                      for n in kube.request("GET", "/api/v1/namespaces")["items"]}
        jobs = kube.request("GET", "/apis/rljob.dev/v1alpha1/rltrainingjobs")["items"]
        for job in jobs:
            namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
            if namespace not in namespaces:
                print(f"deleting RLTrainingJob {namespace}/{name}, orphaned: its namespace does not exist")
                with contextlib.suppress(ApiException):
                    kube.request("DELETE", f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rltrainingjobs/{name}")
        return not any(namespaces.get(j["metadata"]["namespace"], "Terminating") == "Terminating" for j in jobs)

    wait_for(settled, 120, interval=0.5, message="earlier tests' jobs deleted with their namespaces")


@pytest.mark.cluster
def test_operator_with_only_a_kubeconfig_reconciles_without_repeating_warnings(
    admin_kubeconfig: Path, kube: Any, namespace: str, crd_installed: Any, experiment_crd: Any, tmp_path: Path
) -> None:
    _no_rljob_system(kube)
    _no_jobs_being_deleted(kube)
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rljob", "operator", "--kubeconfig", str(admin_kubeconfig)],
                                stdout=out, stderr=subprocess.STDOUT, env=_operator_env(), cwd=REPO)
    try:
        create_job(kube, namespace, job_manifest("local"))
        from tests.cluster.waiting import wait_for

        wait_for(lambda: len(job_pods(kube, namespace, "local")) == 2 or proc.poll() is not None, 60,
                 message="the gang's pods created")
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        wait_phase(kube, namespace, "local", "Running")
        time.sleep(4 * float(FAST_ENV["RLJOB_OPERATOR_RETRY_SECONDS"]) + 2)  # what repeats would have repeated
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "leader election off" in text
    # Without admission policies (none on the test control plane), said once and loudly, and nothing else is.
    unchecked = [line for line in text.splitlines() if " ERROR " in line and "WITHOUT admission policies" in line]
    assert len(unchecked) == 1, text[-3000:]
    noisy = [line for line in text.splitlines() if (" WARNING " in line or " ERROR " in line) and line not in unchecked]
    assert not noisy, "\n".join(noisy[:10])


@pytest.mark.cluster
def test_leader_election_asked_for_in_a_missing_namespace_stops_at_once(
    admin_kubeconfig: Path, kube: Any, crd_installed: Any
) -> None:
    _no_rljob_system(kube)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "rljob", "operator", "--kubeconfig", str(admin_kubeconfig),
                             "--leader-elect"], capture_output=True, text=True, timeout=60,
                            env=_operator_env(), cwd=REPO)
    assert result.returncode == 2, result.stderr[-3000:]
    assert time.monotonic() - started < 30
    assert "namespace 'rljob-system' for Lease 'rljob-operator' does not exist" in result.stderr
    assert "--operator-namespace" in result.stderr
