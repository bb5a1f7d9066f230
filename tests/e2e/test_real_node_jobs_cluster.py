"""Jobs on the real node: the trainer image in real pods, through ``kubectl apply`` and the operator.

The control plane has one real node (containerd, kubelet, kube-proxy, CoreDNS; ``tests/cluster/
realnode.py``) beside its KWOK GPU nodes. The jobs run on the chart's runtime "cpu", marked as the
default by the e2e values (``real-node-values.yaml``: the real node) with the trainer image of ``make images``
pushed to the session's registry and named by digest (the node pulls it), so
``examples/quickstart.yaml`` is applied as it ships. The operator runs here as a process (as for a
developer's ``rljob operator``); the pods reach its status API and the S3 test server on their bridge's
gateway address, over TLS for the heartbeats. What is asserted is what a user sees: the job's phase, the
reward in its status, the pods' UIDs, the checkpoints in the bucket, the kubelet's own reasons.

Run by ``make e2e`` (``pytest -m realnode``), never by ``make test``: it needs root, the Debian
packages of ``tools/real-node-deps.sh`` and the real-node binaries.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.waiting import wait_for
from tests.delivery.test_chart import CHART, KUBE_VERSION, REPO, helm
from tests.e2e.conftest import image_values
from tests.support.operator_process import create_job, get_job, job_pods, wait_for_events, wait_phase
from tests.support.s3_server import MotoServer
from tests.support.trainer import deep_update

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

#: The chart's values for the real node: "cpu" the default runtime, the local trainer image, the real node.
E2E_VALUES = Path(__file__).with_name("real-node-values.yaml")
QUICKSTART = REPO / "examples" / "quickstart.yaml"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
#: The release name the runtimes are rendered under (their label app.kubernetes.io/instance).
RUNTIMES_RELEASE = "rljob-e2e"


def chart_runtimes_yaml(namespace: str, *values: str) -> str:
    """The chart's runtimes with the e2e values (and ``values``), and the trainers' ServiceAccount they name,
    made in ``namespace``: what ``helm install -f tests/e2e/real-node-values.yaml`` creates of them."""
    return helm("template", RUNTIMES_RELEASE, str(CHART), "--namespace", "rljob-system", "--kube-version",
                KUBE_VERSION, "-f", str(E2E_VALUES), "--set", f"trainerServiceAccount.namespaces={{{namespace}}}",
                *values, "--show-only", "templates/runtimes.yaml",
                "--show-only", "templates/trainer-serviceaccount.yaml").stdout


@pytest.fixture
def chart_runtimes(real_node: Any, namespace: str, bucket: tuple[MotoServer, str], trainer_image: str) -> Iterator[str]:
    """The chart's runtimes as the e2e values make them ("cpu" the default), checkpoints in the test's bucket
    (each job's under ``<bucket>/rljob/<namespace>/<job>``, with the Secret ``s3-keys`` of its namespace);
    removed after the test, so the chart's own install (the last test) makes them anew. Yields the prefix
    of the namespace's checkpoints in the bucket."""
    server, bucket_name = bucket
    storage = {"storage": f"s3://{bucket_name}/rljob", "endpointUrl": server.endpoint, "credentialsSecret": "s3-keys"}
    manifest = chart_runtimes_yaml(namespace, "--set-json", f"runtimes.checkpoint={json.dumps(storage)}",
                                   *image_values(trainer_image))
    kubectl = [str(real_node.bin / "kubectl"), "--kubeconfig", str(real_node.admin_kubeconfig)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True, capture_output=True)
    try:
        yield f"rljob/{namespace}"
    finally:
        subprocess.run([*kubectl, "delete", "clusterrltrainingruntimes", "-l",
                        f"app.kubernetes.io/instance={RUNTIMES_RELEASE}", "--ignore-not-found"],
                       check=False, capture_output=True)


@pytest.fixture
def real_operator(real_node: Any, operator: Any, chart_runtimes: str, trainer_image: str) -> Any:
    """The operator, its status API on the gateway address (its certificate names it), its pod profile as
    the chart sets it with the e2e values: the trainer image allowed (a platform team allows its own
    registry's) and the trainers' ServiceAccount the chart's runtimes name."""
    return operator(status_host=real_node.real_node.gateway, env=chart_profile_env(trainer_image))


def chart_profile_env(trainer_image: str) -> dict[str, str]:
    """The pod profile's settings in the operator Deployment the chart renders with the e2e values."""
    rendered = helm("template", RUNTIMES_RELEASE, str(CHART), "--namespace", "rljob-system", "--kube-version",
                    KUBE_VERSION, "-f", str(E2E_VALUES),
                    *image_values(trainer_image),
                    "--show-only", "templates/deployment.yaml").stdout
    container = yaml.safe_load(rendered)["spec"]["template"]["spec"]["containers"][0]
    wanted = ("RLJOB_OPERATOR_ALLOWED_IMAGES", "RLJOB_OPERATOR_ALLOWED_SERVICE_ACCOUNTS")
    env = {e["name"]: e["value"] for e in container["env"] if e["name"] in wanted}
    assert set(env) == set(wanted), f"the chart's Deployment sets {sorted(env)} of {wanted}"
    return env


def real_job(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The quickstart's training as two one-process workers (a rendezvous between pods) of 3 GiB each, on
    the default runtime: the e2e's "cpu", which places them on the real node and checkpoints in the bucket."""
    doc = {
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": name},
        "spec": {
            "workers": {"replicas": 2, "procsPerWorker": 1, "resources": {"limits": {"memory": "3Gi"}}},
            "training": {
                "model": "builtin:tiny",
                "dataset": {"name": "builtin:repeat-char", "size": 2048},
                "rewards": [{"name": "repeat_char", "kwargs": {"length": 6}}],
                "batchSize": 16, "numGenerations": 8, "maxCompletionLength": 6,
                "learningRate": 0.003, "maxSteps": 120, "seed": 0,
                "trl": {"lr_scheduler_type": "constant", "temperature": 1.0},
            },
            "checkpoint": {"everySteps": 20, "keepLast": 2},
        },
    }
    return deep_update(doc, {"spec": spec}) if spec else doc


def s3_secret(kube: Any, namespace: str) -> None:
    kube.request("POST", kube.core_path(namespace, "secrets"), {
        "metadata": {"name": "s3-keys"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in S3_KEYS.items()}})


def start_job(kube: Any, namespace: str, name: str, spec: dict[str, Any]) -> None:
    """A job checkpointing to the S3 test server (its runtime's storage), created and Running."""
    s3_secret(kube, namespace)
    create_job(kube, namespace, real_job(name, spec))
    wait_phase(kube, namespace, name, "Running", timeout=300)


def pod_log(kube: Any, namespace: str, name: str, previous: bool = False) -> str:
    """The container's log through the API server (which asks the kubelet: ``kubectl logs``)."""
    from kubernetes import client

    return str(client.CoreV1Api(kube.api_client).read_namespaced_pod_log(name, namespace, previous=previous))


def progress(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    return (get_job(kube, namespace, name).get("status") or {}).get("progress") or {}


def checkpoints_in(server: MotoServer, bucket_name: str, prefix: str) -> set[int]:
    """Steps of the sealed checkpoints under ``prefix`` (a manifest is written last)."""
    listed = server.client().list_objects_v2(Bucket=bucket_name, Prefix=f"{prefix}/")
    return {int(o["Key"].split("checkpoint-")[1].split("/")[0]) for o in listed.get("Contents", [])
            if o["Key"].endswith("/rljob-manifest.json")}


def test_the_unchanged_quickstart_trains_on_the_default_cpu_runtime_and_succeeds_with_the_reward_learned(
        real_node: Any, kube: Any, namespace: str, real_operator: Any, bucket: Any, chart_runtimes: str,
        trainer_image: str) -> None:
    """examples/quickstart.yaml as it ships (no runtimeRef, two processes on one worker), applied as a user
    does: the runtime marked as the default, "cpu", gives it its image, node, ServiceAccount and storage."""
    server, bucket_name = bucket
    s3_secret(kube, namespace)
    subprocess.run([str(real_node.bin / "kubectl"), "--kubeconfig", str(real_node.admin_kubeconfig),
                    "apply", "-n", namespace, "-f", str(QUICKSTART)], check=True, capture_output=True)
    # The pods are looked at once scheduled, not once the job is Running: with warm images the quickstart
    # can finish between two polls of the phase (its readiness probe is proven by the longer resume job).
    pods = wait_for(lambda: (found := job_pods(kube, namespace, "quickstart"))
                    and all(p["spec"].get("nodeName") for p in found) and found, 300, message="the pods scheduled")
    assert {p["spec"]["nodeName"] for p in pods} == {"rljob-real-node"}
    # The runtime "cpu" made them: its image, ServiceAccount and node, and no GPU asked for.
    assert {p["spec"]["serviceAccountName"] for p in pods} == {"rljob-trainer"}
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {trainer_image}
    assert not any("nvidia.com/gpu" in (p["spec"]["containers"][0].get("resources") or {}).get("limits", {})
                   for p in pods)
    job = wait_phase(kube, namespace, "quickstart", "Succeeded", timeout=900)
    # Heartbeats reached the status API over TLS while training ran (rank 0, on worker 0).
    assert job["status"]["progress"]["step"] == 120
    assert job["status"]["progress"]["reward"] >= 0.9, job["status"]["progress"]
    # The runtime's storage, the job's own path under it; the quickstart's everySteps 40, keepLast 2.
    assert checkpoints_in(server, bucket_name, f"{chart_runtimes}/quickstart") == {80, 120}


def test_a_deleted_worker_is_replaced_alone_and_both_resume_from_the_checkpoint_its_sigterm_made(
        real_node: Any, kube: Any, namespace: str, real_operator: Any, bucket: Any, chart_runtimes: str) -> None:
    """Two torchrun nodes train only once they met: worker 1 finds worker 0 by its DNS name through the
    headless Service (RLJOB_RDZV_ENDPOINT). Deleting worker 1's pod sends it SIGTERM: both workers' ranks
    agree to save a checkpoint; worker 1 ends, worker 0's ranks exit "lost a peer" (75) and its agent
    restarts them in place, so only worker 1's pod is new and the deletion counts once (issue #48)."""
    server, bucket_name = bucket
    start_job(kube, namespace, "resume", {"training": {"maxSteps": 400}, "checkpoint": {"everySteps": 10}})
    prefix = f"{chart_runtimes}/resume"
    saved = wait_for(lambda: checkpoints_in(server, bucket_name, prefix) or None, 600, message="a first checkpoint")
    # The probes are real: worker 0 turns Ready only once the trainer answers /readyz.
    wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                         for c in (next(p for p in job_pods(kube, namespace, "resume")
                                        if p["metadata"]["name"] == "resume-worker-0")["status"].get("conditions")
                                   or [])),
             300, message="worker 0 Ready through its readiness probe")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "resume")}
    kube.request("DELETE", kube.core_path(namespace, "pods", "resume-worker-1"))

    def replaced() -> dict[str, str] | None:
        job = get_job(kube, namespace, "resume")
        pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "resume")}
        fresh = len(pods) == 2 and pods.get("resume-worker-1") not in (None, before["resume-worker-1"])
        return pods if fresh and job["status"].get("phase") == "Running" else None

    after = wait_for(replaced, 600, message="worker 1 replaced")
    assert after["resume-worker-0"] == before["resume-worker-0"]  # worker 0 kept its pod: no gang restart
    log = wait_for(lambda: (text := pod_log(kube, namespace, "resume-worker-0")) and "resuming from" in text
                   and text, 300, message="worker 0's ranks resuming in place")
    resumed = int(re.search(r"resuming from \S*checkpoint-(\d+)", log).group(1))  # type: ignore[union-attr]
    # From the bucket, at least as new as any checkpoint sealed before the worker was deleted.
    assert resumed >= max(saved), (resumed, sorted(saved))
    wait_for(lambda: (progress(kube, namespace, "resume").get("step") or 0) > resumed, 300,
             message="training on after the resume")
    job = get_job(kube, namespace, "resume")
    assert job["status"]["restarts"] + job["status"]["disruptions"] == 1, job["status"]
    assert get_job(kube, namespace, "resume")["status"]["gangGeneration"] == 0


def test_suspend_stops_the_gang_with_sigterm_and_a_checkpoint_of_the_step_it_was_at(
        real_node: Any, kube: Any, namespace: str, real_operator: Any, bucket: Any, chart_runtimes: str) -> None:
    """everySteps is beyond maxSteps: any checkpoint in the bucket is the one SIGTERM made."""
    server, bucket_name = bucket
    start_job(kube, namespace, "pause", {"training": {"maxSteps": 400}, "checkpoint": {"everySteps": 1000}})
    prefix = f"{chart_runtimes}/pause"
    grace = job_pods(kube, namespace, "pause")[0]["spec"]["terminationGracePeriodSeconds"]
    at = wait_for(lambda: (step := progress(kube, namespace, "pause").get("step") or 0) >= 5 and step, 300,
                  message="training under way")
    assert checkpoints_in(server, bucket_name, prefix) == set()
    kube.request("PATCH", kube.job_path(namespace, "pause"), {"spec": {"runPolicy": {"suspend": True}}},
                 content_type="application/merge-patch+json")
    started = time.monotonic()
    wait_for(lambda: not job_pods(kube, namespace, "pause"), grace + 60, message="the gang gone")
    assert time.monotonic() - started < grace, "the pods outlived their grace period"
    wait_phase(kube, namespace, "pause", "Suspended", timeout=60)
    saved = checkpoints_in(server, bucket_name, prefix)
    assert len(saved) == 1 and at <= min(saved) < 400, (at, sorted(saved))


def test_a_worker_over_its_memory_limit_is_oom_killed_by_the_kernel_and_recovered_as_oom(
        real_node: Any, kube: Any, namespace: str, real_operator: Any) -> None:
    s3_secret(kube, namespace)
    create_job(kube, namespace, real_job("oom", {
        "workers": {"resources": {"limits": {"memory": "200Mi"}}}, "runPolicy": {"backoffLimit": 1}}))

    def oom_failure() -> dict[str, Any] | None:
        status = get_job(kube, namespace, "oom").get("status") or {}
        failure = status.get("lastFailure") or {}
        return status if failure.get("reason") == "OOMKilled" else None

    status = wait_for(oom_failure, 300, message="an OOMKilled worker")
    assert status["lastFailure"]["exitCode"] == 137
    assert status["oomRecovery"]["batchSize"] == 8  # halved, as the contract says
    wait_for_events(kube, namespace, "oom", "OOMRecovery")
