"""Contract: the pods the operator builds really train, and their heartbeats reach the job's status.

The operator builds a 2-worker gang on fake nodes; this test takes each pod's command and
environment exactly as built and runs them here as two processes (two torchrun nodes on
CPU, the built-in tiny model), changing only what a pod gets from its node: files (the
ConfigMap, the projected token) become local files, the rendezvous endpoint maps to
loopback, ports become free ones. Both nodes must train to completion and rank 0's
heartbeats must show up in the job's ``status.progress``.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.operator_helpers import (
    annotate_pod,
    create_job,
    free_port,
    get_job,
    job_manifest,
    job_pods,
    token_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

MAX_STEPS = 3
#: Every RLJOB_* variable the operator sets, and how a local process gets it.
MAPPED = {"RLJOB_RDZV_ENDPOINT", "RLJOB_OUTPUT_DIR", "RLJOB_METRICS_PORT", "RLJOB_TOKEN_FILE",
          "RLJOB_STATUS_CA_FILE", "RLJOB_POD_NAME", "RLJOB_CREDENTIALS_DIR"}
AS_BUILT = {"RLJOB_NNODES", "RLJOB_NODE_RANK", "RLJOB_NPROC_PER_NODE", "RLJOB_RUN_ID", "RLJOB_STATUS_URL",
            "RLJOB_SHUTDOWN_TIMEOUT"}
#: Set as built on some jobs only (elastic ones).
OPTIONAL = {"RLJOB_IN_PLACE_RESTARTS"}


def _secret_volumes(kube: Any, namespace: str, pod: dict[str, Any], root: Path) -> Path:
    """The pod's Secret volumes mounted under the storage-credentials folder, written below ``root`` as a
    kubelet writes them (one file per key); returns ``root`` (the folder the pod sees as CREDENTIALS_DIR)."""
    from rljob_trainer import contract

    container = pod["spec"]["containers"][0]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert mount["mountPath"].startswith(contract.CREDENTIALS_DIR + "/") and mount["readOnly"] is True
        folder = root / mount["mountPath"].removeprefix(contract.CREDENTIALS_DIR + "/")
        folder.mkdir(parents=True)
        data = kube.request("GET", kube.core_path(namespace, "secrets", secret["secretName"])).get("data") or {}
        for key, value in data.items():
            (folder / key).write_bytes(base64.b64decode(value))
            (folder / key).chmod(secret["defaultMode"])
    return root


def _local_process(kube: Any, namespace: str, pod: dict[str, Any], work: Path, rdzv: str,
                   config_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The pod's command and environment, with node-provided files and ports mapped to this machine."""
    container = pod["spec"]["containers"][0]
    name = pod["metadata"]["name"]
    token_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "rljob-status-token")
    audience = token_volume["projected"]["sources"][0]["serviceAccountToken"]["audience"]
    token = work / "token"
    token.write_text(token_for(kube, namespace, pod["spec"].get("serviceAccountName", "default"), audience, pod=pod))
    mapped = {
        "RLJOB_RDZV_ENDPOINT": rdzv,
        "RLJOB_OUTPUT_DIR": str(work / "output"),
        "RLJOB_METRICS_PORT": str(free_port()),
        "RLJOB_TOKEN_FILE": str(token),
        "RLJOB_STATUS_CA_FILE": str(config_dir / "status-ca.crt"),
        "RLJOB_POD_NAME": name,
        "RLJOB_CREDENTIALS_DIR": str(_secret_volumes(kube, namespace, pod, work / "credentials")),
    }
    # Storage credentials reach the pod only through its Secret volumes, never this process's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    built: dict[str, str] = {}
    for entry in container["env"]:
        key = entry["name"]
        if key.startswith("RLJOB_"):
            assert key in MAPPED | AS_BUILT | OPTIONAL, f"the contract test does not know {key}"
        if key in MAPPED:
            built[key] = mapped[key]
        else:
            assert "value" in entry, f"{key} comes from the node: map it"
            built[key] = entry["value"]
    assert set(built) >= MAPPED | AS_BUILT, "the pod lacks part of the trainer's contract"
    assert not container.get("envFrom"), "the contract test does not know envFrom"
    env.update(built)
    env.update({"CUDA_VISIBLE_DEVICES": "", "RLJOB_PROGRESS": "0", "TOKENIZERS_PARALLELISM": "false",
                "RLJOB_TERMINATION_LOG": str(work / "termination-log")})
    command = [sys.executable if part == "python" else part for part in container["command"]]
    command = [str(config_dir / Path(part).name) if part.startswith("/etc/rljob/") else part for part in command]
    return command, env


def test_pods_as_built_train_and_report_progress(kube, namespace, operator, tmp_path: Path) -> None:
    op = operator()
    create_job(kube, namespace, job_manifest("contract", replicas=2, spec={"training": {"maxSteps": MAX_STEPS}}))
    wait_phase(kube, namespace, "contract", "Running")
    pods = sorted(job_pods(kube, namespace, "contract"), key=lambda p: p["metadata"]["name"])
    cm = kube.request("GET", kube.core_path(namespace, "configmaps", "contract-config"))
    config_dir = tmp_path / "etc-rljob"
    config_dir.mkdir()
    for key, value in cm["data"].items():  # what the pods mount at /etc/rljob
        (config_dir / key).write_text(value)

    rdzv = f"127.0.0.1:{free_port()}"
    procs = []
    for pod in pods:
        work = tmp_path / pod["metadata"]["name"]
        work.mkdir()
        command, env = _local_process(kube, namespace, pod, work, rdzv, config_dir)
        assert env["RLJOB_STATUS_URL"].startswith(op.status_url)
        log = open(work / "log.txt", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log, work))
    try:
        codes = [p.wait(timeout=600) for p, _, _ in procs]
    finally:
        for p, log, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=60)
            log.close()
    logs = "\n".join(f"--- {w.name}\n" + (w / "log.txt").read_text(errors="replace")[-3000:] for _, _, w in procs)
    assert codes == [0, 0], logs

    def final_progress() -> dict[str, Any] | None:
        progress = get_job(kube, namespace, "contract")["status"].get("progress") or {}
        return progress if progress.get("step") == MAX_STEPS else None

    progress = wait_for(final_progress, 30, message="final heartbeat in status.progress")
    assert isinstance(progress["reward"], float) and progress["lastHeartbeat"]

    # The fake pods finish as the real processes did: the job succeeds and keeps its progress.
    for pod in pods:
        annotate_pod(kube, namespace, pod["metadata"]["name"], fake_pods.exit_annotations(0))
    job = wait_phase(kube, namespace, "contract", "Succeeded")
    assert job["status"]["progress"]["step"] == MAX_STEPS
