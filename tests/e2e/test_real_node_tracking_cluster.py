"""A tracked job on the real node: the trainer image's MLflow client, pointed at the platform's tracking server by
its runtime, and the run record that outlives the RLTrainingJob.

The MLflow server (``mlflow server``, SQLite behind it) listens on the pods' bridge gateway, as the S3 test server
does (``test_real_node_jobs_cluster.py``). The runtime "cpu" gives the trainer container ``MLFLOW_TRACKING_URI`` and
the token from a Secret (``valueFrom.secretKeyRef``): the job itself only names its experiment. Run by ``make e2e``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.waiting import wait_for
from tests.e2e.conftest import image_values
from tests.e2e.test_real_node_jobs_cluster import (
    RUNTIMES_RELEASE,
    S3_KEYS,
    chart_profile_env,
    chart_runtimes_yaml,
    real_job,
    s3_secret,
)
from tests.support.mlflow_server import MlflowServer
from tests.support.operator_process import create_job, job_pods, wait_phase
from tests.support.s3_server import MotoServer
from tests.support.trainer import REPO

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]
STEPS = 20


@pytest.fixture
def tracking_server(real_node: Any, tmp_path: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path / "mlflow", host=real_node.real_node.gateway).start()
    yield server
    server.stop()


@pytest.fixture
def tracked_runtimes(real_node: Any, namespace: str, bucket: tuple[MotoServer, str],
                     tracking_server: MlflowServer, trainer_image: str) -> Iterator[str]:
    """The chart's runtimes with the e2e values, checkpoints in the test's bucket, and the runtime "cpu" pointing
    its trainers at the tracking server: MLFLOW_TRACKING_URI, and MLFLOW_TRACKING_TOKEN from the Secret
    ``mlflow-token`` of the job's namespace. Yields the namespace's checkpoint prefix in the bucket."""
    server, bucket_name = bucket
    storage = {"storage": f"s3://{bucket_name}/rljob", "endpointUrl": server.endpoint, "credentialsSecret": "s3-keys"}
    env = [{"name": "MLFLOW_TRACKING_URI", "value": tracking_server.uri},
           {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mlflow-token", "key": "token"}}}]
    manifest = chart_runtimes_yaml(namespace, "--set-json", f"runtimes.checkpoint={json.dumps(storage)}",
                                   "--set-json", "runtimes.cpu.spec.podTemplate.spec.containers="
                                   + json.dumps([{"name": "trainer", "env": env}]), *image_values(trainer_image))
    kubectl = [str(real_node.bin / "kubectl"), "--kubeconfig", str(real_node.admin_kubeconfig)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True, capture_output=True)
    try:
        yield f"rljob/{namespace}"
    finally:
        subprocess.run([*kubectl, "delete", "clusterrltrainingruntimes", "-l",
                        f"app.kubernetes.io/instance={RUNTIMES_RELEASE}", "--ignore-not-found"],
                       check=False, capture_output=True)


def test_a_job_on_the_real_node_is_tracked_through_its_runtime_and_rljob_history_lists_it_once_deleted(
        real_node: Any, kube: Any, namespace: str, operator: Any, bucket: tuple[MotoServer, str],
        tracking_server: MlflowServer, tracked_runtimes: str, trainer_image: str) -> None:
    server, bucket_name = bucket
    operator(status_host=real_node.real_node.gateway, env=chart_profile_env(trainer_image))
    s3_secret(kube, namespace)
    kube.request("POST", kube.core_path(namespace, "secrets"), {
        "metadata": {"name": "mlflow-token"}, "data": {"token": base64.b64encode(b"not-checked-here").decode()}})
    create_job(kube, namespace, real_job("tracked", {
        "training": {"maxSteps": STEPS, "tracking": {"mlflow": {"experiment": "e2e"}}},
        "checkpoint": {"everySteps": 10, "keepLast": 2}}))
    pods = wait_for(lambda: job_pods(kube, namespace, "tracked") or None, 300, message="the tracked job's pods")
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert "value" not in env["MLFLOW_TRACKING_TOKEN"]  # from the Secret, never a literal in the pod
    job = wait_phase(kube, namespace, "tracked", "Succeeded", timeout=900)
    assert job["status"]["progress"]["step"] == STEPS

    (run,) = tracking_server.runs("e2e")
    assert run.info.status == "FINISHED"
    assert run.data.params["spec.training.maxSteps"] == str(STEPS)
    assert run.data.tags["rljob.namespace"] == namespace and run.data.tags["rljob.job"] == "tracked"
    assert run.data.tags["rljob.image"] == trainer_image  # by digest, from the session's registry
    assert run.data.tags["rljob.best_checkpoint"].startswith(f"s3://{bucket_name}/{tracked_runtimes}/tracked/")
    steps = [m.step for m in tracking_server.client().get_metric_history(run.info.run_id, "reward")]
    assert steps == list(range(1, STEPS + 1))
    assert {"summary.json", "reward_curve.png"} <= {a.path for a in tracking_server.client().list_artifacts(run.info.run_id)}

    kube.request("DELETE", kube.job_path(namespace, "tracked"))
    wait_for(lambda: not any(j["metadata"]["name"] == "tracked"
                             for j in kube.request("GET", kube.job_path(namespace))["items"]), 120,
             message="the job deleted")
    listed = subprocess.run([sys.executable, "-m", "rljob", "history", f"s3://{bucket_name}/rljob",
                             "--endpoint-url", server.endpoint, "--json"], capture_output=True, text=True,
                            timeout=120, cwd=REPO, env={**os.environ, **S3_KEYS, "AWS_REGION": "us-east-1"})
    assert listed.returncode == 0, listed.stderr
    (record,) = json.loads(listed.stdout)["runs"]
    assert (record["job"], record["namespace"], record["phase"], record["steps"]) == ("tracked", namespace,
                                                                                      "Succeeded", STEPS)
    assert record["tracking"]["mlflow_run_id"] == run.info.run_id
    assert record["best_checkpoint"]["location"] == run.data.tags["rljob.best_checkpoint"]
