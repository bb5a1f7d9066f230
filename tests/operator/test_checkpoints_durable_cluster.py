"""Durable checkpoints on a real control plane (issue #31, point 1).

A job whose runtime has no ``spec.checkpoint.storage`` says, once, that a gang restart loses its checkpoints
(a Warning Event, the CheckpointsDurable condition, the Checkpoints column); a job on a ``pvc://``
runtime has its workers mount the claim and the trainer config names the mounted folder. kwok runs no containers,
so resuming from the claim is proven by the trainer test
(``tests/trainer/test_run_training.py::test_checkpoints_in_a_folder_outside_the_output_outlive_it_and_resume``).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
import yaml

from tests.support.operator_process import (
    create_job,
    events_for,
    get_job,
    job_manifest,
    job_pods,
    on_namespaced_runtime,
    wait_for_events,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def _condition(job: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in job["status"]["conditions"] if c["type"] == "CheckpointsDurable")


def _claim_pv(kube: Any, namespace: str, claim: str) -> str:
    """A PersistentVolume pre-bound to ``namespace/claim`` (the PV controller binds them), and the claim."""
    pv = f"rljob-test-{namespace}"[:63]
    kube.request("POST", "/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": f"/tmp/{pv}"}, "claimRef": {"namespace": namespace, "name": claim}},
    })
    kube.request("POST", kube.core_path(namespace, "persistentvolumeclaims"), {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    return pv


def test_a_job_without_storage_is_warned_once_and_shows_it(kube, namespace, operator, control_plane) -> None:
    operator()
    create_job(kube, namespace, job_manifest("ephemeral", replicas=1))
    job = wait_phase(kube, namespace, "ephemeral", "Running", timeout=60)
    condition = _condition(job)
    assert (condition["status"], condition["reason"]) == ("False", "Ephemeral")
    assert "/workspace/output/checkpoints" in condition["message"] and "pvc://<claim>/<prefix>" in condition["message"]
    warned = [e for e in wait_for_events(kube, namespace, "ephemeral", "EphemeralCheckpoints")
              if e["reason"] == "EphemeralCheckpoints"]
    assert [(e["type"], e.get("count", 1)) for e in warned] == [("Warning", 1)]
    assert warned[0]["message"] == condition["message"]

    time.sleep(7)  # two resyncs (3 s in tests): reconciles that must not warn again
    again = [e for e in events_for(kube, namespace, "ephemeral") if e["reason"] == "EphemeralCheckpoints"]
    assert [e.get("count", 1) for e in again] == [1]
    assert _condition(get_job(kube, namespace, "ephemeral"))["lastTransitionTime"] == condition["lastTransitionTime"]

    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig)]
    table = subprocess.run([*kubectl, "get", "rltj", "ephemeral", "-n", namespace], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert "CHECKPOINTS" in table[0].split() and "Ephemeral" in table[1].split(), table
    described = subprocess.run([*kubectl, "describe", "rltj", "ephemeral", "-n", namespace], capture_output=True,
                               text=True, check=True).stdout
    assert "CheckpointsDurable" in described and "EphemeralCheckpoints" in described


def test_a_pvc_job_mounts_the_claim_in_every_worker(kube, namespace, operator) -> None:
    pv = _claim_pv(kube, namespace, "ckpt")
    try:
        operator()
        spec = on_namespaced_runtime(kube, namespace, "claim", {"checkpoint": {"storage": "pvc://ckpt/runs"}})
        create_job(kube, namespace, job_manifest("durable", replicas=2, spec=spec))
        job = wait_phase(kube, namespace, "durable", "Running", timeout=90)
        assert (_condition(job)["status"], _condition(job)["reason"]) == ("True", "Durable")
        pods = job_pods(kube, namespace, "durable")
        assert len(pods) == 2
        for pod in pods:
            volume = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
            assert volume["persistentVolumeClaim"]["claimName"] == "ckpt"
            mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
            assert mount["mountPath"] == "/var/lib/rljob/checkpoints/ckpt" and not mount.get("readOnly")
        config = kube.request("GET", kube.core_path(namespace, "configmaps", "durable-config"))["data"]["trainer.yaml"]
        assert yaml.safe_load(config)["checkpoint"]["storage"] == \
            f"/var/lib/rljob/checkpoints/ckpt/runs/{namespace}/durable"  # the job's own folder on the claim
        assert "EphemeralCheckpoints" not in {e["reason"] for e in events_for(kube, namespace, "durable")}
    finally:
        kube.request("DELETE", f"/api/v1/persistentvolumes/{pv}")
