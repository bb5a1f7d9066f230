"""The worker pod built from a representative runtime and job carries exactly the runtime's shape (issue #42).

Two checks of one pod: every value the runtime's ``podTemplate`` sets is in the built pod where the template
put it, except the few the operator owns (named here, each with why); and the whole pod, with the Kueue
Workload's podSet template made from it, equals a reviewed golden file
(``tests/operator/snapshots/built-pod.yaml``; ``RLJOB_UPDATE_SNAPSHOTS=1`` rewrites it after a deliberate change).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from rljob_contract.runtime import resolve
from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.policy import PodProfile, violations
from rljob_operator.integrations.kueue.decide import desired_workload

from tests.support.jobs import ENDPOINT, make_job
from tests.support.operator_process import REPO, test_runtime

GOLDEN = Path(__file__).parent / "snapshots" / "built-pod.yaml"
#: A platform team's GPU runtime: everything a runtime may shape that the restricted profile allows.
RUNTIME: dict[str, Any] = {
    "imagePullPolicy": "IfNotPresent",
    "imagePullSecrets": [{"name": "regcred"}],
    "gpuResource": "nvidia.com/gpu",
    "podTemplate": {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"cost-center": "1234"}},
        "spec": {
            "serviceAccountName": "rljob-trainer",
            "priorityClassName": "training",
            "runtimeClassName": "nvidia",
            "nodeSelector": {"pool": "a100"},
            "tolerations": [{"key": "pool", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "ScheduleAnyway",
                                           "labelSelector": {"matchLabels": {"team": "ml"}}}],
            "terminationGracePeriodSeconds": 300,
            "resources": {"limits": {"cpu": "64", "memory": "512Gi"}},
            "resourceClaims": [{"name": "nics", "resourceClaimTemplateName": "rdma-nic"}],
            "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}],
            "containers": [{
                "name": "trainer",
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
                        {"name": "NCCL_DEBUG", "value": "WARN"}],
                "envFrom": [{"configMapRef": {"name": "nccl-tuning"}}],
                "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}],
                "resources": {"claims": [{"name": "nics"}], "limits": {"ephemeral-storage": "200Gi"}},
            }],
        },
    },
    "limits": {"gpusPerWorker": {"max": 8}, "cpuPerWorker": {"default": "16", "max": "64"},
               "memoryPerWorker": {"default": "128Gi", "max": "512Gi"}, "replicas": {"max": 16},
               "terminationGracePeriodSeconds": {"max": 600}},
    "checkpoint": {"storage": "s3://ml-checkpoints/rljob", "endpointUrl": "http://minio.storage:9000",
                   "credentialsSecret": "s3-keys"},
    "queue": {"name": "team-ml"},
}
#: A researcher's job on it: sizes within the bounds, plain env, a reward module from a ConfigMap.
JOB: dict[str, Any] = {
    "workers": {"procsPerWorker": 4, "gpusPerWorker": 4, "env": [{"name": "WANDB_MODE", "value": "offline"}],
                "resources": {"requests": {"memory": "256Gi"}}},
    "training": {"rewards": [{"name": "team.scoring:exact",
                              "source": {"configMap": {"name": "team-rewards", "key": "scoring.py"}}}]},
    "checkpoint": {"subPath": "lr-3e-4"},
}
#: Template values the built pod does not carry as written, and why: the operator owns them.
OPERATOR_OWNED = {
    "spec.terminationGracePeriodSeconds": "the template's is a default; the job's own, within the bound, wins",
}


def _not_carried(pod: Any, template: Any, path: str = "") -> list[str]:
    """The paths of what ``template`` sets that ``pod`` lacks: maps key by key, a named list item in the pod's item
    of that name, another list item anywhere in the pod's list (the operator may add its own: the GPU toleration)."""
    if isinstance(template, dict):
        if not isinstance(pod, dict):
            return [path]
        return [p for k, v in template.items() if (path + "." + k).lstrip(".") not in OPERATOR_OWNED
                for p in _not_carried(pod.get(k), v, (path + "." + k).lstrip("."))]
    if isinstance(template, list):
        if not isinstance(pod, list):
            return [path]
        out = []
        for i, item in enumerate(template):
            named = isinstance(item, dict) and "name" in item
            theirs = [p for p in pod if isinstance(p, dict) and p.get("name") == item["name"]] if named else \
                [p for p in pod if not _not_carried(p, item)]
            out += _not_carried(theirs[0], item, f"{path}[{i}]") if theirs else [f"{path}[{i}]"]
        return out
    return [] if pod == template else [path]


def built() -> tuple[dict[str, Any], dict[str, Any]]:
    """Worker 1 of gang 3 of the job on the runtime, and the podSet template of its Workload."""
    job = make_job(3, spec=JOB)
    runtime = resolve(job, test_runtime(RUNTIME, name="gpu"))
    assert violations(job, PodProfile(allowed_images=("registry.invalid/*",),
                                      allowed_service_accounts=("rljob-trainer",)), runtime) == []
    pod = desired_worker_pod(job, 1, 3, ENDPOINT, runtime)
    template = desired_workload(job, 3, None, desired_worker_pod(job, 0, 0, runtime=runtime),
                                queue=runtime.queue)["spec"]["podSets"][0]["template"]
    return pod, template


def test_every_value_the_runtimes_template_sets_reaches_the_pod_but_what_the_operator_owns() -> None:
    pod, _ = built()
    assert _not_carried(pod, RUNTIME["podTemplate"]) == []
    assert pod["spec"]["terminationGracePeriodSeconds"] == 300  # the job sets none: the template's default
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"ephemeral-storage": "200Gi", "nvidia.com/gpu": "4"}
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "16", "memory": "256Gi",
                                                                     "nvidia.com/gpu": "4"}


def test_the_built_pod_and_its_workload_equal_the_reviewed_golden_file() -> None:
    pod, template = built()
    text = ("# The worker pod (and its Kueue podSet template) built from tests/operator/test_built_pod.py's runtime and\n"
            "# job. Reviewed: regenerate with RLJOB_UPDATE_SNAPSHOTS=1 only after a deliberate change.\n"
            + yaml.safe_dump({"pod": pod, "workloadPodSetTemplate": template}, sort_keys=True, width=100))
    if os.environ.get("RLJOB_UPDATE_SNAPSHOTS") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"{GOLDEN} is missing: review the built pod and run with RLJOB_UPDATE_SNAPSHOTS=1"
    assert text == GOLDEN.read_text(), f"the built pod changed: compare with {GOLDEN.relative_to(REPO)}"
