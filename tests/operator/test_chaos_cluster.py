"""Interrupted reconciles converge, and only one operator replica acts.

``RLJOB_FAULT_CRASH_AFTER_WRITES=N`` makes the operator exit abruptly (status 137, like
SIGKILL) right after its N-th write to the API server, so the trials below stop it between
every pair of consecutive writes of a reconcile: after the status patch, after the
ConfigMap, the Service, each pod, the Event. A few more trials SIGKILL it at random times.
After each interruption a fresh operator must reach exactly the desired state, and at no
point may a job have more pods than workers.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    create_job,
    get_job,
    job_manifest,
    job_pods,
    patch_spec,
)

pytestmark = pytest.mark.cluster

FAULT_ENV = "RLJOB_FAULT_CRASH_AFTER_WRITES"
SEED = 20261129
REPLICAS = 4
#: CPU-only workers: trials must not run the shared fake GPU nodes out of GPUs.
CPU_ONLY = {"workers": {"gpusPerWorker": 0}}


def _check_pod_count(kube: Any, namespace: str, name: str, most: int) -> list[dict[str, Any]]:
    pods = job_pods(kube, namespace, name)
    names = [p["metadata"]["name"] for p in pods]
    assert len(pods) <= most, f"{name}: {len(pods)} pods for {most} workers: {names}"
    assert len(set(names)) == len(names)
    return pods


def _converged(kube: Any, namespace: str, name: str, replicas: int, generation: int) -> bool:
    job = get_job(kube, namespace, name)
    status = job.get("status") or {}
    pods = _check_pod_count(kube, namespace, name, max(replicas, REPLICAS))
    uid = job["metadata"]["uid"]
    ok_pods = sorted(
        p["metadata"]["name"] for p in pods
        if p["metadata"]["labels"].get("rljob.dev/gang-generation") == str(generation)
        and not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["ownerReferences"][0]["uid"] == uid
    )
    try:
        children = [kube.request("GET", kube.core_path(namespace, kind, child))
                    for kind, child in (("services", name), ("configmaps", f"{name}-config"))]
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return (
        ok_pods == [f"{name}-worker-{i}" for i in range(replicas)]
        and len(pods) == replicas
        and status.get("phase") == "Running"
        and status.get("workers", {}).get("summary") == f"{replicas}/{replicas}"
        and status.get("observedGeneration") == job["metadata"]["generation"]
        and all(c["metadata"]["ownerReferences"][0]["uid"] == uid for c in children)
    )


def _describe(kube: Any, namespace: str, name: str) -> str:
    job = get_job(kube, namespace, name)
    pods = [(p["metadata"]["name"], p["metadata"]["labels"].get("rljob.dev/gang-generation"),
             (p.get("status") or {}).get("phase"), bool(p["metadata"].get("deletionTimestamp")))
            for p in job_pods(kube, namespace, name)]
    status = {k: v for k, v in (job.get("status") or {}).items() if k != "conditions"}
    return f"generation {job['metadata']['generation']}, status {status}\npods {pods}"


def test_operator_interrupted_at_every_point_of_a_reconcile_converges(kube, namespace, operator) -> None:
    interrupted = 0
    started = time.monotonic()
    # Every write once: creating a 4-worker gang takes 7 writes before its first Event (status,
    # ConfigMap, Service, 4 pods), then its Events; scaling a running gang 4 → 3 takes the status,
    # 4 deletions, then (once the old pods are gone) the first of 3 creations.
    trials: list[tuple[str, int]] = [("create", n) for n in range(1, 10)]
    trials += [("scale", n) for n in range(1, 7)]
    healer = operator(identity="chaos")
    for trial, (kind, crash_after) in enumerate(trials):
        name = f"chaos-{trial}"
        create_job(kube, namespace, job_manifest(name, replicas=REPLICAS, spec=CPU_ONLY))
        replicas, generation = REPLICAS, 0
        if kind == "scale":  # the healer of the last trial starts the gang; then it stops and we scale
            wait_for(lambda name=name: _converged(kube, namespace, name, REPLICAS, 0), 60,
                     message=f"{name} running before the scale")
            healer.stop()
            patch_spec(kube, namespace, name, {"workers": {"replicas": 3}})
            replicas, generation = 3, 1
        else:  # the job was created while no operator ran... unless the healer raced us to it
            healer.stop()
            if job_pods(kube, namespace, name):
                kube.request("DELETE", kube.job_path(namespace, name))
                wait_for(lambda name=name: not job_pods(kube, namespace, name), 120, message="clean slate")  # GC + kwok; slow under load
                name = f"{name}b"
                create_job(kube, namespace, job_manifest(name, replicas=REPLICAS, spec=CPU_ONLY))
        crashing = operator(wait=False, identity="chaos", env={FAULT_ENV: str(crash_after)})
        code = crashing.wait_exit(60)
        assert code == 137, f"trial {trial} ({kind}, crash after {crash_after}): exit {code}\n{crashing.log_tail()}"
        interrupted += 1
        _check_pod_count(kube, namespace, name, REPLICAS)

        healer = operator(identity="chaos")  # the same identity: the Lease is taken over at once
        try:
            wait_for(lambda n=name, r=replicas, g=generation: _converged(kube, namespace, n, r, g), 60,
                     message=f"trial {trial} ({kind}, crash after write {crash_after}) converging")
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{_describe(kube, namespace, name)}\ncrashed operator:\n"
                                 f"{crashing.log_tail(15)}\nhealer:\n{healer.log_tail(30)}") from None
        kube.request("DELETE", kube.job_path(namespace, name))
    assert interrupted == len(trials) == 15
    print(f"{interrupted} interrupted reconciles converged in {time.monotonic() - started:.0f}s")


def test_operator_sigkilled_at_random_times_converges(kube, namespace, operator) -> None:
    rng = random.Random(SEED + 1)
    for trial in range(5):
        name = f"kill-{trial}"
        op = operator(identity="killed")
        create_job(kube, namespace, job_manifest(name, replicas=REPLICAS, spec=CPU_ONLY))
        time.sleep(rng.uniform(0.0, 0.6))
        op.kill()
        _check_pod_count(kube, namespace, name, REPLICAS)
        healer = operator(identity="killed")
        wait_for(lambda n=name: _converged(kube, namespace, n, REPLICAS, 0), 60, message=f"{name} converging")
        healer.stop()
        kube.request("DELETE", kube.job_path(namespace, name))


def test_only_the_lease_holder_reconciles_and_a_standby_takes_over(kube, namespace, operator) -> None:
    first = operator(identity="replica-a")
    second = operator(wait=False, identity="replica-b")
    wait_for(lambda: "rljob_operator_leader" in _metrics(second), 30, message="standby serving metrics")
    create_job(kube, namespace, job_manifest("ha", replicas=2))
    wait_for(lambda: _converged(kube, namespace, "ha", 2, 0), 60, message="ha running")
    assert first.is_leader() and not second.is_leader()
    assert 'rljob_operator_reconciles_total{result="ok"}' not in _metrics(second)

    first.kill()  # no clean release: the standby waits for the Lease to expire (4 s here)
    second.wait_leader(timeout=30)
    patch_spec(kube, namespace, "ha", {"runPolicy": {"suspend": True}})
    wait_for(lambda: get_job(kube, namespace, "ha")["status"].get("phase") == "Suspended"
             and not job_pods(kube, namespace, "ha"), 30, message="the new leader acting")

    third = operator(wait=False, identity="replica-c")
    wait_for(lambda: "rljob_operator_leader" in _metrics(third), 30, message="third replica up")
    second.stop()  # a clean stop releases the Lease: the standby takes over at once
    third.wait_leader(timeout=10)
    lease = kube.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/rljob-operator")
    assert lease["spec"]["holderIdentity"] == "replica-c" and lease["spec"]["leaseTransitions"] >= 2


def _metrics(op: Any) -> str:
    try:
        return str(op.metrics_text())
    except OSError:
        return ""
