"""The generated CRD on a real API server: it rejects what the models reject, naming the field."""

from __future__ import annotations

import subprocess

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_operator.api import RLTrainingJobSpec, parse_job

from tests.operator_helpers import INVALID_MANIFESTS, create_job, get_job, invalid_manifest, job_manifest

pytestmark = pytest.mark.cluster


def test_the_api_server_rejects_invalid_manifests_naming_the_field(kube, crd_installed, namespace) -> None:
    assert len(INVALID_MANIFESTS) >= 15
    problems = []
    for case, patch, field in INVALID_MANIFESTS:
        try:
            create_job(kube, namespace, invalid_manifest(case, patch))
        except ApiException as e:
            message = e.body or ""
            if e.status not in (400, 422) or field not in message:
                problems.append(f"{case}: HTTP {e.status}, expected {field!r} in: {message[:300]}")
        else:
            problems.append(f"{case}: accepted")
    assert not problems, "\n".join(problems)


def test_server_side_defaults_are_the_models_defaults(kube, crd_installed, namespace) -> None:
    local = job_manifest("defaults")
    create_job(kube, namespace, local)
    stored = get_job(kube, namespace, "defaults")
    assert stored["spec"]["runPolicy"] == {
        "suspend": False, "restartPolicy": "OnFailure", "backoffLimit": 3, "backoffBaseSeconds": 10,
        "backoffMaxSeconds": 600, "oomRecovery": True, "oomMinBatchSize": 1, "stallTimeoutSeconds": 600,
        "startupTimeoutSeconds": 1800, "checkIntervalSeconds": 30,
    }
    assert stored["spec"]["training"]["algorithm"] == "grpo" and stored["spec"]["workers"]["gpuResource"]
    assert RLTrainingJobSpec.model_validate(stored["spec"]) == parse_job(local).spec
    minimal = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "minimal"}}
    create_job(kube, namespace, minimal)
    assert RLTrainingJobSpec.model_validate(get_job(kube, namespace, "minimal")["spec"]) == RLTrainingJobSpec()


def test_kubectl_explain_shows_the_models_descriptions(crd_installed, control_plane) -> None:
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig)]
    out = subprocess.run([*kubectl, "explain", "rltj.spec.workers"], capture_output=True, text=True, check=True)
    assert "gpusPerWorker" in out.stdout and "GPUs requested (and limited) per worker pod" in out.stdout
    out = subprocess.run([*kubectl, "explain", "rltj.spec.training.numGenerations"], capture_output=True, text=True,
                         check=True)
    assert "Completions sampled per prompt" in out.stdout
