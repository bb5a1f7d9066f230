"""The operator on a real control plane: a job becomes a gang of GPU pods, and lives its life.

kwok plays the kubelet on fake 8-GPU nodes; pod outcomes come from the annotations in
``tests.cluster.fake_pods``. The operator runs as ``rljob operator`` in a child process.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request
from typing import Any

import pytest

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    TEST_IMAGE,
    annotate_pod,
    apply_runtime,
    create_job,
    get_job,
    job_manifest,
    job_pods,
    patch_spec,
    runtime_manifest,
    token_for,
    wait_for_events,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def _gone(kube: Any, path: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        kube.request("GET", path)
    except ApiException as e:
        return e.status == 404
    return False


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def _post_heartbeat(url: str, token: str, body: dict[str, Any], ca: str) -> int:
    context = ssl.create_default_context(cadata=ca)
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return int(response.status)


def test_two_gpu_workers_run_on_fake_gpu_nodes(kube, namespace, operator, control_plane) -> None:
    op = operator()
    create_job(kube, namespace, job_manifest("gang", replicas=2))
    job = wait_phase(kube, namespace, "gang", "Running", timeout=60)

    pods = sorted(job_pods(kube, namespace, "gang"), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["gang-worker-0", "gang-worker-1"]
    for index, pod in enumerate(pods):
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"].startswith("gpu-node-")
        container = pod["spec"]["containers"][0]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        env = _env(pod)
        assert env["RLJOB_NODE_RANK"] == str(index) and env["RLJOB_NNODES"] == "2"
        assert env["RLJOB_RDZV_ENDPOINT"] == f"gang-worker-0.gang.{namespace}.svc:29500"
        assert env["RLJOB_STATUS_URL"].startswith(op.status_url)
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    svc = kube.request("GET", kube.core_path(namespace, "services", "gang"))
    assert svc["spec"]["clusterIP"] == "None"
    cm = kube.request("GET", kube.core_path(namespace, "configmaps", "gang-config"))
    assert "trainer.yaml" in cm["data"] and "BEGIN CERTIFICATE" in cm["data"]["status-ca.crt"]

    status = job["status"]
    assert status["workers"]["summary"] == "2/2" and status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert not job["metadata"].get("finalizers")  # deleting a job never waits for the operator
    # One Event per phase transition (posted after the status that shows the phase).
    wait_for_events(kube, namespace, "gang", "CreatingWorkers", "Running")
    metrics = op.metrics_text()
    assert 'rljob_operator_jobs{phase="Running"} 1.0' in metrics
    assert "rljob_operator_reconcile_duration_seconds_count" in metrics
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/healthz", timeout=5) as health:
        assert health.status == 200

    # A heartbeat from worker 0 (a pod-bound token, as the kubelet projects it) fills Step and Reward.
    token = token_for(kube, namespace, "default", "rljob-status", pod=pods[0])
    url = _env(pods[0])["RLJOB_STATUS_URL"]
    assert _post_heartbeat(url, token, {"step": 7, "reward": 0.625, "loss": 0.1}, cm["data"]["status-ca.crt"]) == 202
    wait_for(lambda: (get_job(kube, namespace, "gang")["status"].get("progress") or {}).get("step") == 7, 20,
             message="progress.step")
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig)]
    out = subprocess.run([*kubectl, "get", "rltj", "-n", namespace], capture_output=True, text=True, check=True)
    header, row = out.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "WORKERS", "STEP", "REWARD", "EVAL", "CHECKPOINTS", "AGE"]
    # Cells by the header's column offsets (kubectl leaves a missing number's cell blank).
    starts = [header.index(name) for name in header.split()]
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    # No spec.training.evaluation: no Eval; no spec.checkpoint.storage: Ephemeral.
    assert cells[:7] == ["gang", "Running", "2/2", "7", "0.625", "", "Ephemeral"]


def test_worker_zero_completing_means_succeeded(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("done", replicas=2))
    wait_phase(kube, namespace, "done", "Running")
    for i in (1, 0):
        annotate_pod(kube, namespace, f"done-worker-{i}", fake_pods.exit_annotations(0))
    job = wait_phase(kube, namespace, "done", "Succeeded", reason="Completed")
    assert job["status"]["completionTime"]
    assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Succeeded"] == "True"
    wait_for_events(kube, namespace, "done", "Completed")


def test_a_permanent_exit_fails_the_job_with_its_message(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("bad", replicas=2))
    wait_phase(kube, namespace, "bad", "Running")
    message = "spec.training.rewards[0].name: cannot import mypkg.rewards:score"
    annotate_pod(kube, namespace, "bad-worker-1", fake_pods.exit_annotations(78, message=message))
    job = wait_phase(kube, namespace, "bad", "Failed", reason="PermanentError")
    assert job["status"]["message"] == f"bad-worker-1 exited with code 78: {message}"
    # The rest of the gang is stopped (it would hang in its next collective); the failed pod stays for its logs.
    wait_for(lambda: [p["metadata"]["name"] for p in job_pods(kube, namespace, "bad")] == ["bad-worker-1"], 30,
             message="worker 0 deleted")
    events = wait_for_events(kube, namespace, "bad", "PermanentError")
    warning = [e for e in events if e["reason"] == "PermanentError"]
    assert warning[0]["type"] == "Warning" and message in warning[0]["message"]


def test_suspend_deletes_the_pods_and_resume_recreates_them(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("pause", replicas=2))
    wait_phase(kube, namespace, "pause", "Running")
    patch_spec(kube, namespace, "pause", {"runPolicy": {"suspend": True}})
    job = wait_phase(kube, namespace, "pause", "Suspended")
    wait_for(lambda: not job_pods(kube, namespace, "pause"), 30, message="pods deleted")
    job = wait_phase(kube, namespace, "pause", "Suspended")
    assert "startTime" not in job["status"]
    assert not _gone(kube, kube.core_path(namespace, "services", "pause"))
    assert not _gone(kube, kube.core_path(namespace, "configmaps", "pause-config"))

    patch_spec(kube, namespace, "pause", {"runPolicy": {"suspend": False}})
    job = wait_phase(kube, namespace, "pause", "Running")
    assert job["status"]["gangGeneration"] == 1
    pods = job_pods(kube, namespace, "pause")
    assert len(pods) == 2 and {p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in pods} == {"1"}
    assert {_env(p)["RLJOB_RUN_ID"].rsplit("-", 1)[1] for p in pods} == {"g1"}


def test_the_deadline_fails_a_running_job(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("slow", replicas=2, spec={"runPolicy": {"activeDeadlineSeconds": 3}}))
    wait_phase(kube, namespace, "slow", "Running")
    job = wait_phase(kube, namespace, "slow", "Failed", timeout=30, reason="DeadlineExceeded")
    assert "activeDeadlineSeconds (3s)" in job["status"]["message"]
    wait_for(lambda: not job_pods(kube, namespace, "slow"), 30, message="pods deleted")


def test_ttl_deletes_a_finished_job_and_its_children(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("short", replicas=1, spec={
        "runPolicy": {"ttlSecondsAfterFinished": 2}, "training": {"batchSize": 8}}))
    wait_phase(kube, namespace, "short", "Running")
    annotate_pod(kube, namespace, "short-worker-0", fake_pods.exit_annotations(0))
    wait_phase(kube, namespace, "short", "Succeeded")
    wait_for(lambda: _gone(kube, kube.job_path(namespace, "short")), 30, message="job deleted by its TTL")
    wait_for(lambda: _gone(kube, kube.core_path(namespace, "configmaps", "short-config")), 60,
             message="ConfigMap garbage-collected")


def test_deleting_the_job_removes_every_child(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("gc", replicas=2))
    wait_phase(kube, namespace, "gc", "Running")
    kube.request("DELETE", kube.job_path(namespace, "gc"))
    wait_for(lambda: _gone(kube, kube.job_path(namespace, "gc")), 20, message="job deleted (no finalizer)")
    wait_for(
        lambda: not job_pods(kube, namespace, "gc")
        and _gone(kube, kube.core_path(namespace, "services", "gc"))
        and _gone(kube, kube.core_path(namespace, "configmaps", "gc-config")),
        60, message="children garbage-collected",
    )


def test_scaling_through_the_scale_subresource_restarts_the_gang(kube, namespace, operator, control_plane) -> None:
    operator()
    create_job(kube, namespace, job_manifest("elastic", replicas=2))
    wait_phase(kube, namespace, "elastic", "Running")
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig)]
    subprocess.run([*kubectl, "scale", "rltj/elastic", "-n", namespace, "--replicas=4"], check=True,
                   capture_output=True)

    def regrown() -> bool:
        job = get_job(kube, namespace, "elastic")
        pods = job_pods(kube, namespace, "elastic")
        return (job["status"].get("phase") == "Running" and job["status"]["gangGeneration"] == 1
                and len(pods) == 4 and all(_env(p)["RLJOB_NNODES"] == "4" for p in pods))

    wait_for(regrown, 60, message="4-worker gang running")
    scale = kube.request("GET", kube.job_path(namespace, "elastic", "scale"))
    assert scale["spec"]["replicas"] == 4 and scale["status"]["selector"] == "rljob.dev/job=elastic"


def test_a_gang_that_does_not_fit_stays_pending_with_the_schedulers_reason(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("huge", replicas=2, spec={"workers": {"gpusPerWorker": 16}}))
    job = wait_phase(kube, namespace, "huge", "Pending", reason="Unschedulable", timeout=60)
    assert "nvidia.com/gpu" in job["status"]["message"]


def test_a_spec_only_the_trainer_models_reject_fails_until_fixed(kube, namespace, operator) -> None:
    operator()
    # A union-typed TRL field (deepspeed: a mapping or a path) cannot be typed in the CRD; the models check it.
    create_job(kube, namespace, job_manifest("trl", replicas=1, spec={
        "training": {"batchSize": 8, "trl": {"deepspeed": 5}}}))
    job = wait_phase(kube, namespace, "trl", "Failed", reason="InvalidSpec")
    assert "spec.training.trl" in job["status"]["message"] and not job_pods(kube, namespace, "trl")
    kube.request("PATCH", kube.job_path(namespace, "trl"), {"spec": {"training": {"trl": None}}},
                 content_type="application/merge-patch+json")
    wait_phase(kube, namespace, "trl", "Running")


def test_a_pod_the_api_server_refuses_fails_the_job_with_its_reason(kube, namespace, operator) -> None:
    operator()
    apply_runtime(kube, runtime_manifest("bad-volume", {"podTemplate": {"spec": {"volumes": [
        {"name": "Not_A_DNS_Label", "emptyDir": {}}]}}}, kind="RLTrainingRuntime", namespace=namespace))
    create_job(kube, namespace, job_manifest("vol", replicas=2, spec={
        "runtimeRef": {"kind": "RLTrainingRuntime", "name": "bad-volume"}}))
    job = wait_phase(kube, namespace, "vol", "Failed", reason="InvalidPodSpec")
    assert "spec.volumes" in job["status"]["message"]
    wait_for(lambda: not job_pods(kube, namespace, "vol"), 30, message="no pods left")


def test_a_job_waits_for_the_runtime_it_names_and_runs_on_it_once_applied(kube, namespace, operator) -> None:
    """GitOps may apply a job before its runtime: the job waits, Pending RuntimeNotFound saying what to create,
    and runs as soon as the runtime exists, with the runtime's image and pod shape."""
    operator()
    create_job(kube, namespace, job_manifest("later", replicas=2, spec={
        "runtimeRef": {"kind": "RLTrainingRuntime", "name": "team"}}))
    job = wait_phase(kube, namespace, "later", "Pending", reason="RuntimeNotFound")
    assert job["status"]["message"] == ("spec.runtimeRef: RLTrainingRuntime 'team' does not exist in namespace "
                                        f"{namespace}: create it, or name another")
    wait_for_events(kube, namespace, "later", "RuntimeNotFound")
    assert job_pods(kube, namespace, "later") == []
    apply_runtime(kube, runtime_manifest("team", {
        "imagePullPolicy": "IfNotPresent", "podTemplate": {"metadata": {"labels": {"team": "a"}}},
        "limits": {"cpuPerWorker": {"default": "250m"}, "terminationGracePeriodSeconds": {"default": 30}},
        "checkpoint": {"storage": "s3://ckpt/rljob"}}, kind="RLTrainingRuntime", namespace=namespace))
    wait_phase(kube, namespace, "later", "Running", timeout=60)
    for pod in job_pods(kube, namespace, "later"):
        container = pod["spec"]["containers"][0]
        assert (container["image"], container["imagePullPolicy"]) == (TEST_IMAGE, "IfNotPresent")
        assert container["resources"]["requests"]["cpu"] == "250m" and pod["metadata"]["labels"]["team"] == "a"
        assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    config = kube.request("GET", kube.core_path(namespace, "configmaps", "later-config"))["data"]["trainer.yaml"]
    assert f"storage: s3://ckpt/rljob/{namespace}/later" in config  # the job's own path on the runtime's storage


def test_a_job_refused_by_its_runtimes_bounds_names_the_field_and_the_bound(kube, namespace, operator) -> None:
    operator()
    apply_runtime(kube, runtime_manifest("small", {"limits": {"gpusPerWorker": {"max": 1}}},
                                         kind="RLTrainingRuntime", namespace=namespace))
    create_job(kube, namespace, job_manifest("big", replicas=1, spec={
        "runtimeRef": {"kind": "RLTrainingRuntime", "name": "small"}, "workers": {"gpusPerWorker": 2}}))
    job = wait_phase(kube, namespace, "big", "Failed", reason="PolicyViolation")
    assert job["status"]["message"] == (f"spec.workers.gpusPerWorker: 2 GPUs per worker (runtime RLTrainingRuntime/"
                                        f"{namespace}/small allows at most 1)")
    assert job_pods(kube, namespace, "big") == []
