"""The real node (tests/cluster/realnode.py): real pods in real containers beside the kwok nodes.

Runs only when selected (``pytest -m realnode``, ``make e2e``): it needs root, the Debian packages
of ``tools/real-node-deps.sh`` and ``tools/build-binaries.sh --real-node``, and it changes the
host's network while it runs. One control plane for the module; the last test stops it and checks
that nothing is left on the host. It must run before any test of the session's control plane (one real
node at a time): pytest runs the files in name order, and every other file of the session's real node
sorts after this one (``test_real_node_<c…>`` first; ``tests/delivery/test_layout.py`` checks it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import ClusterConfig, ControlPlane, realnode, wait_for
from tests.cluster.binaries import REPO_ROOT
from tests.cluster.nodes import node_is_ready
from tests.cluster.processes import is_running, reap_stale

pytestmark = pytest.mark.realnode

#: The kubelet's and containerd's host folders when run with their defaults: this node must not make them.
DEFAULT_HOST_PATHS = ("/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/opt/containerd",
                      "/var/log/pods", "/var/log/containers", "/usr/libexec/kubernetes", "/etc/kubernetes",
                      "/var/lib/cni/networks/rljob", "/sys/fs/cgroup/memory/k8s.io")
POD_TIMEOUT_S = 120


def host_snapshot() -> dict[str, Any]:
    """What a real node could leave on the host, as comparable sets."""
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {
        "paths": {p for p in DEFAULT_HOST_PATHS if Path(p).exists()},
        "links": {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()},
        "chains": set(re.findall(r"^:((?:KUBE|CNI)-[\w-]+)", rules, re.MULTILINE)),
        "rules": {line for line in rules.splitlines() if "rljob" in line},
        "sysctls": {name: Path("/proc/sys", name).read_text() for name in realnode.SYSCTLS
                    if Path("/proc/sys", name).exists()},
        "mounts": set(Path("/proc/self/mountinfo").read_text().splitlines()),
    }


@pytest.fixture(scope="module")
def host_before() -> dict[str, Any]:
    return host_snapshot()


@pytest.fixture(scope="module")
def plane(host_before: dict[str, Any]) -> Iterator[ControlPlane]:
    started = time.monotonic()
    cluster = ControlPlane(config=ClusterConfig(gpu_nodes=1, real_node=True))
    cluster.start(build_binaries=False)
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in cluster.real_node_start_seconds.items())
    print(f"control plane with a real node up in {time.monotonic() - started:.1f}s ({steps}); images "
          f"imported {cluster.real_node_images['imported']}, kept {cluster.real_node_images['kept']}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def core(plane: ControlPlane):
    from kubernetes import client

    api = plane.api_client()
    yield client.CoreV1Api(api)
    api.close()


@pytest.fixture(scope="module")
def namespace(core) -> str:
    name = f"real-node-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
             60, message=f"service account {name}/default")
    return name


def restricted_pod(name: str, script: str, *, memory: str = "64Mi", **spec: Any) -> dict[str, Any]:
    """A pod as the operator's profile has it: non-root, read-only root, no capabilities, seccomp
    RuntimeDefault, emptyDirs for what it writes, a memory limit; ``script`` runs in python3."""
    security = {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"name": "main", "image": realnode.base_image(), "imagePullPolicy": "Never",
                 "command": ["python3", "-u", "-c", script], "securityContext": security,
                 "resources": {"limits": {"memory": memory, "cpu": "500m"}},
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "tmp", "mountPath": "/tmp"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {realnode.REAL_NODE_LABEL: "true"},
                     "securityContext": {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [container], "terminationGracePeriodSeconds": 5,
                     "volumes": [{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
                     **spec}}


def finished(core, namespace: str, name: str):
    """The pod's container state once it terminated (waits)."""
    def terminated():
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses or []
        return statuses and statuses[0].state.terminated and (pod, statuses[0].state.terminated)

    return wait_for(terminated, POD_TIMEOUT_S, interval=0.5, message=f"pod {namespace}/{name} terminated")


def test_real_node_is_ready_with_the_real_kubelet(plane: ControlPlane, core) -> None:
    node = core.read_node(realnode.NODE_NAME)
    assert node_is_ready(node)
    assert node.status.node_info.kubelet_version == plane.server_version() == "v1.37.2"
    assert node.status.node_info.container_runtime_version.startswith("containerd://1.6")
    assert plane.real_node is not None
    # kube-apiserver dials this address for logs and exec: the bridge's, on this host.
    assert {"type": "InternalIP", "address": plane.real_node.gateway} in [a.to_dict() for a in node.status.addresses]
    assert not node.spec.taints  # the one node for pods that need no GPU
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    assert node_is_ready(core.read_node("gpu-node-0"))  # kwok still plays its own nodes


def test_restricted_pod_runs_writes_its_emptydir_and_logs_through_the_api(core, namespace: str) -> None:
    script = """
import os, pathlib
pathlib.Path("/work/out.txt").write_text("x" * 4096)
try:
    open("/etc/blocked", "w")
    root = "writable"
except OSError as error:
    root = f"read-only ({error.strerror})"
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
print(f"uid={os.getuid()} gid={os.getgid()} wrote={pathlib.Path('/work/out.txt').stat().st_size} root={root} caps={caps}")
"""
    core.create_namespaced_pod(namespace, restricted_pod("restricted", script))
    pod, terminated = finished(core, namespace, "restricted")
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert pod.spec.node_name == realnode.NODE_NAME
    assert re.match(r"10\.244\.\d+\.\d+$", pod.status.pod_ip)
    logs = core.read_namespaced_pod_log("restricted", namespace)  # kube-apiserver -> the kubelet
    assert logs.strip() == "uid=1000 gid=1000 wrote=4096 root=read-only (Read-only file system) caps=0000000000000000"


def test_memory_hog_is_oom_killed_by_the_kernel(core, namespace: str) -> None:
    script = "blocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))\n"
    core.create_namespaced_pod(namespace, restricted_pod("hog", script, memory="48Mi"))
    _, terminated = finished(core, namespace, "hog")
    assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 137)


SERVER = """
import socket
server = socket.create_server(("0.0.0.0", 29500))
while True:
    connection, peer = server.accept()
    connection.sendall(f"hello {peer[0]} from {socket.gethostname()}".encode())
    connection.close()
"""

CLIENT = """
import socket, sys, time
def ask(name):
    deadline = time.monotonic() + 60
    while True:
        try:
            address = socket.getaddrinfo(name, 29500, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
            with socket.create_connection((address, 29500), timeout=5) as connection:
                return address, connection.recv(200).decode()
        except OSError as error:
            if time.monotonic() > deadline:
                sys.exit(f"{name}: {error}")
            time.sleep(0.5)
for name in sys.argv[1:]:
    address, answer = ask(name)
    print(f"{name} {address} {answer}")
"""


def test_pod_reaches_a_peer_by_its_rendezvous_name_and_through_a_cluster_ip(core, namespace: str) -> None:
    """The trainer's rendezvous: ``<hostname>.<headless service>.<namespace>.svc`` (CoreDNS), and a
    ClusterIP Service in front of the same pod (kube-proxy)."""
    headless = {"clusterIP": "None", "publishNotReadyAddresses": True}  # as the operator's Service
    for name, extra in (("rdzv", headless), ("front", {})):
        spec = {"selector": {"app": "worker-0"}, "ports": [{"port": 29500, "targetPort": 29500}], **extra}
        core.create_namespaced_service(namespace, {"metadata": {"name": name}, "spec": spec})
    core.create_namespaced_pod(namespace, restricted_pod("worker-0", SERVER, hostname="worker-0", subdomain="rdzv"))
    rendezvous = f"worker-0.rdzv.{namespace}.svc"
    client = restricted_pod("worker-1", CLIENT)
    client["spec"]["containers"][0]["command"] += [rendezvous, f"front.{namespace}.svc"]
    core.create_namespaced_pod(namespace, client)
    _, terminated = finished(core, namespace, "worker-1")
    logs = core.read_namespaced_pod_log("worker-1", namespace)
    assert terminated.exit_code == 0, logs
    server, client_pod = (core.read_namespaced_pod(n, namespace) for n in ("worker-0", "worker-1"))
    front_ip = core.read_namespaced_service("front", namespace).spec.cluster_ip
    by_name = {line.split()[0]: line.split()[1:] for line in logs.splitlines()}
    assert by_name[rendezvous] == [server.status.pod_ip, "hello", client_pod.status.pod_ip, "from", "worker-0"]
    assert by_name[f"front.{namespace}.svc"][0] == front_ip  # kube-proxy's DNAT to the same pod
    assert by_name[f"front.{namespace}.svc"][-1] == "worker-0"


API_CLIENT = """
import json, ssl, urllib.error, urllib.request
secrets = "/var/run/secrets/kubernetes.io/serviceaccount"
context = ssl.create_default_context(cafile=f"{secrets}/ca.crt")
token = open(f"{secrets}/token").read()
namespace = open(f"{secrets}/namespace").read()
def get(path):
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"https://kubernetes.default.svc{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
status, version = get("/version")
print(status, version["gitVersion"])
status, refusal = get(f"/api/v1/namespaces/{namespace}/secrets")
print(status, refusal["message"])
"""


def test_pod_reaches_the_api_server_as_its_service_account(core, namespace: str) -> None:
    """In-cluster clients (the operator, later) reach kube-apiserver at kubernetes.default.svc with
    their service account's token, checking its certificate against the projected CA."""
    core.create_namespaced_pod(namespace, restricted_pod("in-cluster", API_CLIENT))
    _, terminated = finished(core, namespace, "in-cluster")
    logs = core.read_namespaced_pod_log("in-cluster", namespace)
    assert terminated.exit_code == 0, logs
    assert logs.splitlines() == [
        "200 v1.37.2",
        f'403 secrets is forbidden: User "system:serviceaccount:{namespace}:default" cannot list resource '
        f'"secrets" in API group "" in the namespace "{namespace}"',
    ]


def assert_nothing_left(workdir: Path, bridge: str, before: dict[str, Any]) -> None:
    """No trace of the node in ``workdir`` on the host, compared with the ``before`` snapshot."""
    after = host_snapshot()
    assert not workdir.exists()
    assert not Path(f"/sys/class/net/{bridge}").exists()
    assert not [line for line in after["mounts"] - before["mounts"] if str(workdir) in line]
    assert after["chains"] - before["chains"] == set()
    assert after["rules"] - before["rules"] == set()
    assert after["sysctls"] == before["sysctls"]
    assert after["paths"] - before["paths"] == set()
    assert [link for link in after["links"] - before["links"] if link.startswith(("rljob", "veth"))] == []
    leftovers = subprocess.run(["pgrep", "-af", str(workdir)], capture_output=True, text=True).stdout
    assert leftovers == ""


def test_stop_leaves_nothing_behind(plane: ControlPlane, host_before: dict[str, Any]) -> None:
    workdir = plane.workdir
    state = plane.real_node
    assert state is not None
    started = time.monotonic()
    plane.stop()
    print(f"stopped in {time.monotonic() - started:.1f}s")
    assert_nothing_left(workdir, state.bridge, host_before)


KILLED_OWNER = """
import json, time
from kubernetes import client
from tests.cluster import ClusterConfig, ControlPlane, realnode, wait_for
plane = ControlPlane(config=ClusterConfig(gpu_nodes=0, real_node=True)).start(build_binaries=False)
core = client.CoreV1Api(plane.api_client())
wait_for(lambda: core.list_namespaced_service_account("default").items, 60)
core.create_namespaced_pod("default", {"metadata": {"name": "sleeper"}, "spec": {"containers": [
    {"name": "main", "image": realnode.base_image(), "imagePullPolicy": "Never", "command": ["sleep", "600"]}]}})
wait_for(lambda: core.read_namespaced_pod("sleeper", "default").status.phase == "Running", 120)
print(json.dumps({"workdir": str(plane.workdir), "bridge": plane.real_node.bridge,
                  "pids": [[p.pid, p.exe] for p in plane.processes]}), flush=True)
time.sleep(600)
"""


def test_a_killed_owner_s_node_is_torn_down_by_the_next_start(host_before: dict[str, Any]) -> None:
    """SIGKILLed, the owner runs no cleanup: the kernel kills the components (PDEATHSIG) but the
    containers and their shims live on, with their mounts and the bridge, until the next start's
    reaper tears the node down from the run record."""
    owner = subprocess.Popen([sys.executable, "-c", KILLED_OWNER], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        started = json.loads(owner.stdout.readline() if owner.stdout else "{}")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    wait_for(lambda: not any(is_running(pid, exe) for pid, exe in started["pids"]), 30,
             message="the components to die with their owner")
    survivors = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True).stdout.split()
    assert survivors, "the pod's container outlived its node agents"

    assert started["workdir"] in reap_stale()
    assert not [pid for pid in survivors if Path(f"/proc/{pid}").exists()]
    assert_nothing_left(Path(started["workdir"]), started["bridge"], host_before)
