"""The operator image under the chart's pod, against the test control plane: it reconciles a job
(the images themselves and the trainer's pod: ``tests/delivery/test_images.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cluster.waiting import wait_for
from tests.support import containers


@pytest.fixture
def chart_operator_pod(control_plane: Any, api_client: Any, tmp_path: Path) -> Any:
    """``helm install`` of the chart into a restricted namespace; yields (kube, namespace, an operator pod
    as the API server admitted it: the chart's template plus the ServiceAccount's token volume)."""
    from rljob_operator.cluster.kube import Kube

    from tests.delivery.test_install_cluster import chart_installed

    kube = Kube(api_client)
    suffix = tmp_path.name[-6:].lower().replace("_", "")
    namespace, jobs = f"rljob-img-{suffix}", f"rljob-imgjobs-{suffix}"
    # As a user who pushed the image to their registry configures it: the chart's runtimes and allowlist.
    with chart_installed(control_plane, kube, tmp_path / "helm", "rljob-img", namespace, jobs,
                         "--set", "replicaCount=1", "--set", "podProfile.allowedImages={registry.invalid/rljob-trainer:*}",
                         "--set", "runtimes.image.repository=registry.invalid/rljob-trainer,runtimes.image.tag=test"):
        selector = "app.kubernetes.io/instance=rljob-img,app.kubernetes.io/component=operator"
        pod = wait_for(lambda: (kube.list_pods(namespace, selector) or [None])[0], 60, message="the operator pod")
        yield kube, namespace, jobs, pod


def _api_access_files(kube: Any, control_plane: Any, pod: dict[str, Any]) -> containers.VolumeFiles:
    """What a kubelet puts in the pod's projected ``kube-api-access-*`` volume: its token, CA, namespace."""
    from tests.support.operator_process import token_for

    volume = next(v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
    namespace = pod["metadata"]["namespace"]
    token = token_for(kube, namespace, pod["spec"]["serviceAccountName"], pod=pod)
    return containers.VolumeFiles({volume["name"]: {
        "token": token, "ca.crt": control_plane.ca_cert.read_text(), "namespace": namespace}})


@pytest.mark.images
@pytest.mark.cluster
def test_operator_image_runs_under_the_charts_pod_and_reconciles_a_job(
        built_images: dict[str, str], chart_operator_pod: Any, control_plane: Any, tmp_path: Path) -> None:
    from tests.support.operator_process import (
        create_job,
        free_port,
        job_manifest,
        wait_phase,
    )

    kube, namespace, jobs, pod = chart_operator_pod
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    metrics_port, status_port = free_port(), free_port()
    api = control_plane.server.removeprefix("https://")
    name = f"rljob-test-operator-{tmp_path.name[-12:]}".lower().replace("_", "")
    argv = containers.run_argv(
        pod, tmp_path, image=built_images["operator"], container_name=name, network=["--network", "host"],
        files=_api_access_files(kube, control_plane, pod),
        # What this node differs in: the API server's address (a kubelet sets the Service's), and free
        # ports on the shared host network.
        node_env={"KUBERNETES_SERVICE_HOST": api.rsplit(":", 1)[0], "KUBERNETES_SERVICE_PORT": api.rsplit(":", 1)[1],
                  "RLJOB_OPERATOR_METRICS_PORT": str(metrics_port), "RLJOB_OPERATOR_STATUS_PORT": str(status_port),
                  "RLJOB_OPERATOR_STATUS_URL": f"https://127.0.0.1:{status_port}"})
    containers.remove(name)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def serving(path: str) -> requests.Response | None:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                return requests.get(f"http://127.0.0.1:{metrics_port}{path}", timeout=2)
            except requests.ConnectionError:
                return None

        health = wait_for(lambda: serving("/healthz"), 120, message="the operator container's /healthz")
        assert health.status_code == 200
        wait_for(lambda: "rljob_operator_leader 1.0" in serving("/metrics").text, 60, message="leading")
        # With its chart RBAC (the ServiceAccount's token), it reconciles a job into a Running gang, on the
        # chart's default runtime (which runs trainers as rljob-trainer).
        create_job(kube, jobs, job_manifest("img-gang", replicas=2))
        job = wait_phase(kube, jobs, "img-gang", "Running", timeout=90)
        assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Ready"] == "True"
        assert len(kube.list_pods(jobs, "rljob.dev/job=img-gang")) == 2
        metrics = serving("/metrics").text
        assert not [m for m in metrics.splitlines()
                    if m.startswith("rljob_operator_api_errors_total") and 'code="403"' in m]
        assert containers.changed_paths(name, argv) == []
    finally:
        containers.remove(name)
        proc.wait(timeout=60)
