"""The pod-contract harness: the pods the operator builds, run here as local processes.

Each pod's command and environment (its Secret's keys included) run as a process on this machine,
changing only what a pod gets from its node: files (the ConfigMap mounted at /etc/rljob, the
projected status token, Secret volumes) become local files, the rendezvous endpoint maps to
loopback, ports become free ones. ``test_operator_contract`` checks that contract; the end-to-end
tests (faults, resizing, evaluation in the status) run their gangs with it.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.operator_process import free_port, job_pods, token_for

#: Every RLJOB_* variable the operator sets, and how a local process gets it.
MAPPED = {"RLJOB_RDZV_ENDPOINT", "RLJOB_OUTPUT_DIR", "RLJOB_METRICS_PORT", "RLJOB_TOKEN_FILE",
          "RLJOB_STATUS_CA_FILE", "RLJOB_POD_NAME", "RLJOB_CREDENTIALS_DIR"}
AS_BUILT = {"RLJOB_NNODES", "RLJOB_NODE_RANK", "RLJOB_NPROC_PER_NODE", "RLJOB_RUN_ID", "RLJOB_STATUS_URL",
            "RLJOB_SHUTDOWN_TIMEOUT"}
#: Set as built on some jobs only (those that may restart: ``contract.RESTARTABLE_ENV``).
OPTIONAL = {"RLJOB_IN_PLACE_RESTARTS"}

#: A pod run here: its process (its node's torchrun agent and ranks), its open log file, its folder.
PodProcess = tuple[subprocess.Popen[bytes], Any, Path]


def _secret_volumes(kube: Any, namespace: str, pod: dict[str, Any], root: Path) -> Path:
    """The pod's Secret volumes mounted under the storage-credentials folder, written below ``root`` as a
    kubelet writes them (one file per key); returns ``root`` (the folder the pod sees as CREDENTIALS_DIR)."""
    from rljob_contract import pod as contract

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


def local_process(kube: Any, namespace: str, pod: dict[str, Any], work: Path, rdzv: str,
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


def mount_config(kube: Any, namespace: str, job: str, config_dir: Path) -> Path:
    """The job's ConfigMap written to ``config_dir`` as the pods mount it at /etc/rljob (once)."""
    if not config_dir.exists():
        cm = kube.request("GET", kube.core_path(namespace, "configmaps", f"{job}-config"))
        config_dir.mkdir(parents=True)
        for key, value in cm["data"].items():
            (config_dir / key).write_text(value)
    return config_dir


def start_pod(kube: Any, namespace: str, pod: dict[str, Any], root: Path, rdzv: str) -> PodProcess:
    """Run one pod as a local process in a folder of its own under ``root`` (its config in root/etc-rljob)."""
    config_dir = mount_config(kube, namespace, pod["metadata"]["labels"]["rljob.dev/job"], root / "etc-rljob")
    work = root / f"{pod['metadata']['name']}-{pod['metadata']['uid'][:8]}"
    work.mkdir()
    command, env = local_process(kube, namespace, pod, work, rdzv, config_dir)
    log = open(work / "log.txt", "wb")  # noqa: SIM115 - closed by stop
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log, work


def start_gang(kube: Any, namespace: str, name: str, generation: int, root: Path, size: int = 2
               ) -> list[PodProcess]:
    """Run gang ``generation``'s pods (``size`` of them, by name) as local processes under root/g<generation>."""
    pods = sorted(job_pods(kube, namespace, name), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in pods] == [str(generation)] * size
    for pod in pods:
        run_id = next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "RLJOB_RUN_ID")
        assert run_id.endswith(f"-g{generation}"), run_id
    rdzv = f"127.0.0.1:{free_port()}"
    return [start_pod(kube, namespace, pod, root / f"g{generation}", rdzv) for pod in pods]


def stop(procs: list[PodProcess], sig: int = signal.SIGKILL) -> None:
    """Signal every node's process group at once (as the kubelets do for a gang's deleted pods), then
    wait for each (SIGKILL after 20 s)."""
    for p, _, _ in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    for p, log, _ in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
        log.close()


def logs(procs: list[PodProcess]) -> str:
    return "\n".join(f"--- {w}\n" + (w / "log.txt").read_text(errors="replace")[-3000:] for _, _, w in procs)
