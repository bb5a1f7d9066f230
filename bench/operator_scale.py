"""The operator at scale on the real control plane: bursts of RLTrainingJobs × 4 workers on KWOK nodes.

The test harness's control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
KWOK; ``tests/cluster``) runs 100 fake GPU nodes with 48 ``nvidia.com/gpu`` each: 4,800 GPUs, so the
largest burst (1,000 jobs × 4 workers × 1 GPU = 4,000 pods) fits with room to spare and nothing
waits on capacity. A real node has 8 GPUs (4,000 GPUs would be 500 nodes), but 500 heartbeating
KWOK nodes cost this 2-core machine more than the operator does; pods per node (≤ 48 of 110) and
GPUs per pod are what the scheduler and the operator see either way.

For each burst size N (default 10, 100, 1000), in a fresh namespace and with a fresh operator
process (``python -m rljob operator``, production defaults, leader election on, acting
as a service account so that its requests go through RBAC and API Priority and Fairness as in a
cluster), the benchmark creates N jobs at once (8 client threads) and records, client-side from
watch streams on jobs and pods:

* time until every job reports phase Running;
* per job, latency from the create request to all 4 worker pods created, scheduled, Ready, and to
  phase Running (p50/p99);
* the operator's API requests by verb and resource, from the API server's audit log (a policy that
  logs only the operator's user at Metadata level), during the burst and in an idle window after;
* the operator's CPU seconds and peak RSS (``VmHWM``), and CPU seconds of each control-plane
  component, of this process and of the whole machine (another workload shares it).

After the largest burst, F workers (default 100, one per job, 10 per second) are made to exit with
code 1 (KWOK's ``rljob.dev/fake-exit-code`` annotation); the latency is from the pod turning
Failed to all 4 pods of the replacement gang (a new ``rljob.dev/gang-generation``) existing, and
to the job Running again. The jobs set ``runPolicy.backoffBaseSeconds: 0``, so the figure is the
operator's reaction, not the configured backoff. KWOK makes a scheduled pod Running and Ready at
once, so the jobs need no pod annotations.

Changes to the harness's components, all in this file: the API server gets the audit policy, and
kube-scheduler gets ``--kube-api-qps=200 --kube-api-burst=400`` (its default of 50 requests/s
would bind at most 50 pods/s and measure the scheduler; ``--scheduler-qps 0`` keeps the default),
the same limits the harness gives kube-controller-manager. Nodes heartbeat every 8-18 s
(``--node-grace 40``), closer to kubelets' 10 s lease renewals than the tests' 3-7 s. KWOK plays
at most 4 pod stages at once by default (its own default; ``--kwok-parallelism N`` raises it): one
process stands in for the kubelets of all 100 nodes, which on a real cluster work in parallel.

``--against REV`` compares two operators instead: this checkout's and commit REV's (from a git
worktree), each running the largest burst and its failures ``--repeat`` times, alternating which
goes first, on one control plane; the summary gives each figure's median per side and the ratio.

    python -m bench.operator_scale [--jobs 10 100 1000] [--failures 100] [--idle-seconds 30]
    python -m bench.operator_scale --jobs 1000 --against REV [--repeat 2] [--kwok-parallelism 32]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import json
import os
import random
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.common import REPO, write_result

for _folder in ("contract", "operator", "trainer"):  # as the Makefile's PYTHONPATH, for a bare `python -m bench...`
    if str(REPO / _folder) not in sys.path:
        sys.path.insert(0, str(REPO / _folder))

from rljob_operator.cluster.kube import Kube  # noqa: E402
from rljob_operator.crd import CRD_NAME, RUNTIME_NAMES, crd_manifest, runtime_crd_manifest  # noqa: E402
from rljob_operator.names import LABEL_GANG_GENERATION, LABEL_JOB, LABEL_WORKER_INDEX  # noqa: E402
from rljob_operator.settings import OperatorSettings  # noqa: E402

from tests.cluster import fake_pods  # noqa: E402
from tests.cluster.controlplane import ClusterConfig, ControlPlane  # noqa: E402
from tests.cluster.nodes import GpuNodeShape  # noqa: E402
from tests.cluster.waiting import wait_for  # noqa: E402
from tests.support import operator_process as helpers  # noqa: E402

WORKERS = 4
NODES = 100
GPUS_PER_NODE = 48
OPERATOR_NAMESPACE = "rljob-bench-system"
OPERATOR_SA = "rljob-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"

TARGET_ALL_RUNNING_S = 120.0  # 1,000 jobs × 4 workers, on the 2-core machine
TARGET_POD_CREATE_P99_S = 2.0
TARGET_REPLACEMENT_P99_S = 3.0
TARGET_RSS_MIB = 300.0
TARGET_RSS_MIB_10000 = 1024.0  # issue #48 point 4: 10,000 jobs × 4 workers within 1 GiB
SETTLE_S = 5.0  # after the last job turns Running, before the idle window starts



def audit_policy(users: list[str]) -> str:
    """An audit policy that logs only ``users``' requests, at Metadata level."""
    return f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: {json.dumps(users)}
- level: None
"""


AUDIT_POLICY = audit_policy([OPERATOR_USER])


# ------------------------------------------------------------------------- small helpers


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: list[float]) -> dict[str, Any]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {"n": len(values), "p50": r(percentile(values, 50)), "p90": r(percentile(values, 90)),
            "p99": r(percentile(values, 99)), "max": r(max(values) if values else None)}


#: KWOK's pods run no trainer, so no heartbeat ever comes: the default startupTimeoutSeconds (30 min) would restart
#: every gang of a long run at once (a 10,000-job run did, 30 min after its first create), which is not idle.
STARTUP_TIMEOUT_S = 86400


def job_manifest(name: str) -> dict[str, Any]:
    """The tests' tiny valid job at 4 workers × 1 process × 1 GPU; no backoff before a gang restart, and a
    startup deadline no run reaches (``STARTUP_TIMEOUT_S``)."""
    return helpers.job_manifest(name, WORKERS, {"runtimeRef": {"name": BENCH_RUNTIME}, "runPolicy": {
        "backoffBaseSeconds": 0, "startupTimeoutSeconds": STARTUP_TIMEOUT_S}})


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in KiB."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


# --------------------------------------------------------------------- the control plane


class BenchControlPlane(ControlPlane):
    """The harness's control plane with an audit log of the operator's requests and a faster scheduler."""

    def __init__(self, config: ClusterConfig, scheduler_qps: int, audit_users: list[str] | None = None) -> None:
        super().__init__(config=config)
        self.scheduler_qps = scheduler_qps
        self.audit_users = audit_users or [OPERATOR_USER]

    @property
    def audit_log(self) -> Path:
        return self.layout.path("audit.log")

    def _launch(self, name: str, argv: list[str]) -> None:
        if name == "kube-apiserver":
            policy = self.layout.path("audit-policy.yaml")
            policy.write_text(audit_policy(self.audit_users))
            argv = [*argv, f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                    "--audit-log-format=json", "--audit-log-maxsize=0"]
        if name == "kube-scheduler" and self.scheduler_qps:
            argv = [*argv, f"--kube-api-qps={self.scheduler_qps}", f"--kube-api-burst={2 * self.scheduler_qps}"]
        super()._launch(name, argv)


def bench_plane(args: argparse.Namespace) -> BenchControlPlane:
    """The benchmarks' control plane: NODES KWOK nodes × GPUS_PER_NODE GPUs (or the arguments' ``nodes``,
    ``gpus_per_node`` and ``pods_per_node``, where given), with the arguments' ``node_grace``,
    ``kwok_parallelism`` and ``scheduler_qps``."""
    nodes, gpus, pods = plane_shape(args)
    config = ClusterConfig(gpu_nodes=nodes, node_shape=GpuNodeShape(gpus=gpus, pods=pods, cpu=str(max(96, pods * 2)),
                                                                     memory=f"{max(1, pods // 100)}Ti"),
                           node_monitor_grace_s=args.node_grace, start_timeout_s=300,
                           kwok_pod_parallelism=args.kwok_parallelism)
    return BenchControlPlane(config, args.scheduler_qps)


def plane_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """(KWOK nodes, GPUs per node, pods per node): the arguments' where given, else NODES × GPUS_PER_NODE × 110."""
    return (getattr(args, "nodes", None) or NODES, getattr(args, "gpus_per_node", None) or GPUS_PER_NODE,
            getattr(args, "pods_per_node", None) or 110)


#: The ClusterRLTrainingRuntime the benchmark's jobs run on: the fake trainer image (KWOK never pulls it);
#: ``BENCH_S3_RUNTIME`` also puts checkpoints on object storage (elastic jobs replace workers in place).
BENCH_RUNTIME = "bench"
BENCH_S3_RUNTIME = "bench-s3"


def install_crd(kube: Kube) -> None:
    """The job CRD, the runtimes' CRDs, and the benchmark's runtimes."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    manifests = [crd_manifest(), *map(runtime_crd_manifest, RUNTIME_NAMES)]
    for manifest in manifests:
        kube.request("POST", path, manifest)

    def established(name: str) -> bool:
        conditions = (kube.request("GET", f"{path}/{name}").get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    for name in (CRD_NAME, *(m["metadata"]["name"] for m in manifests[1:])):
        wait_for(lambda name=name: established(name), 60, message=f"CRD {name} Established")
    time.sleep(1)  # discovery catches up
    for name, spec in ((BENCH_RUNTIME, {}), (BENCH_S3_RUNTIME, {"checkpoint": {"storage": "s3://bench-checkpoints"}})):
        kube.request("POST", "/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes", {
            "apiVersion": "rljob.dev/v1alpha1", "kind": "ClusterRLTrainingRuntime", "metadata": {
                "name": name, "annotations": {"rljob.dev/is-default-runtime": str(name == BENCH_RUNTIME).lower()}},
            "spec": {"image": "registry.invalid/rljob-trainer:bench", **spec}})


def create_namespace(kube: Kube, name: str) -> None:
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for(lambda: kube.request("GET", kube.core_path(name, "serviceaccounts"),
                                  query={"fieldSelector": "metadata.name=default"})["items"],
             60, message=f"service account {name}/default")


def operator_kubeconfig(plane: ControlPlane, kube: Kube) -> Path:
    """A token kubeconfig for the operator's service account, bound to cluster-admin."""
    create_namespace(kube, OPERATOR_NAMESPACE)
    path = plane.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SA, expiration_s=24 * 3600)
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "rljob-bench-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}],
    })
    return path


# ------------------------------------------------------------------------------ watches


class Watch(threading.Thread):
    """List then watch one collection over a raw HTTPS stream; ``handle(t, type, obj)`` per event,
    with ``t`` the arrival time here (time.time())."""

    def __init__(self, plane: ControlPlane, path: str, handle: Any) -> None:
        super().__init__(daemon=True, name=f"watch {path}")
        url = urlparse(plane.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=str(plane.ca_cert))
        self.context.load_cert_chain(str(plane.layout.cert("admin")), str(plane.layout.key("admin")))
        self.path, self.handle = path, handle
        self.stopping = threading.Event()
        self.listed = threading.Event()
        self.error: BaseException | None = None
        self._conn: http.client.HTTPSConnection | None = None

    def _get(self, query: dict[str, str]) -> http.client.HTTPResponse:
        self._conn = http.client.HTTPSConnection(self.host, self.port, context=self.context)
        self._conn.request("GET", f"{self.path}?{urlencode(query)}", headers={"Accept": "application/json"})
        response = self._conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"GET {self.path}: {response.status} {response.read()[:300]!r}")
        return response

    def run(self) -> None:
        try:
            for attempt in range(60):  # a new CRD's storage answers 429 for a moment
                try:
                    listing = json.loads(self._get({}).read())
                    break
                except RuntimeError as error:
                    if " 429 " not in str(error) or attempt == 59:
                        raise
                    time.sleep(0.5)
            version = listing["metadata"]["resourceVersion"]
            for item in listing.get("items") or []:
                self.handle(time.time(), "ADDED", item)
            self.listed.set()
            while not self.stopping.is_set():
                response = self._get({"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true",
                                      "timeoutSeconds": "600"})
                while line := response.readline():
                    arrived = time.time()
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch {self.path}: {event['object']}")
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.handle(arrived, event["type"], event["object"])
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            if not self.stopping.is_set():
                self.error = error
        finally:
            self.listed.set()

    def stop(self) -> None:
        self.stopping.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)


def pod_ready(pod: dict[str, Any]) -> bool:
    """Does the pod's JSON say its Ready condition is True?"""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


class Recorder:
    """When each job and worker pod reached each state, as seen by the watches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> job, gen, index, created/scheduled/ready/failed/deleted
        self.phase: dict[str, str] = {}  # job -> current phase
        self.running_at: dict[tuple[str, int], float] = {}  # (job, gang generation) -> first seen Running
        self.gangs: dict[tuple[str, int], list[str]] = {}  # (job, gang generation) -> pod uids
        self.events = Counter[str]()

    def identify(self, meta: dict[str, Any]) -> tuple[str, int, int] | None:
        """A worker pod's (job, gang generation, worker index); None for other pods. Called under the lock."""
        labels = meta.get("labels") or {}
        if LABEL_JOB not in labels:
            return None
        return (labels[LABEL_JOB], int(labels.get(LABEL_GANG_GENERATION, -1)),
                int(labels.get(LABEL_WORKER_INDEX, -1)))

    def job_state(self, job: dict[str, Any]) -> tuple[str, int]:
        """A job's phase and gang generation, from its status."""
        status = job.get("status") or {}
        return status.get("phase") or "", int(status.get("gangGeneration") or 0)

    def on_pod(self, t: float, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        status = pod.get("status") or {}
        with self.lock:
            rec = self.pods.get(meta["uid"])
            if rec is None:
                identity = self.identify(meta)
                if identity is None:
                    return
                job, gen, index = identity
                rec = self.pods[meta["uid"]] = {"job": job, "gen": gen, "index": index, "created": t}
                self.gangs.setdefault((rec["job"], rec["gen"]), []).append(meta["uid"])
            self.events["pod " + kind] += 1
            if (pod.get("spec") or {}).get("nodeName"):
                rec.setdefault("scheduled", t)
            if pod_ready(pod):
                rec.setdefault("ready", t)
            if status.get("phase") == "Failed":
                rec.setdefault("failed", t)
            if kind == "DELETED":
                rec.setdefault("deleted", t)

    def on_job(self, t: float, kind: str, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        with self.lock:
            self.events["job " + kind] += 1
            if kind == "DELETED":
                self.phase.pop(name, None)
                return
            phase, gen = self.job_state(job)
            self.phase[name] = phase
            if phase == "Running":
                self.running_at.setdefault((name, gen), t)

    def count_phase(self, phase: str) -> int:
        with self.lock:
            return sum(1 for p in self.phase.values() if p == phase)

    def gang(self, job: str, gen: int) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(self.pods[uid]) for uid in self.gangs.get((job, gen), [])]


# ---------------------------------------------------------------------------- measuring


class Meter:
    """CPU seconds of the operator, each control-plane component, this process and the machine."""

    def __init__(self, plane: ControlPlane) -> None:
        self.components = {p.name: psutil.Process(p.pid) for p in plane.processes}
        self.operator: psutil.Process | None = None

    def snapshot(self) -> dict[str, float]:
        def cpu(process: psutil.Process) -> float:
            try:
                times = process.cpu_times()
            except psutil.Error:
                return float("nan")
            return float(times.user + times.system)

        machine = psutil.cpu_times()
        out = {"wall": time.time(), "machine_busy": machine.user + machine.system + machine.nice
               + getattr(machine, "irq", 0) + getattr(machine, "softirq", 0) + getattr(machine, "steal", 0),
               "bench_client": cpu(psutil.Process())}
        out.update({name: cpu(p) for name, p in self.components.items()})
        if self.operator is not None:
            out["operator"] = cpu(self.operator)
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before[k], 2) for k in after if k in before}


class AuditLog:
    """The operator's requests, one per audit ID, from the API server's JSON audit log."""

    def __init__(self, path: Path, user: str = OPERATOR_USER) -> None:
        self.path, self.user = path, user
        self.offset = 0
        self.requests: dict[str, dict[str, Any]] = {}

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("user", {}).get("username") != self.user or event["auditID"] in self.requests:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", "?").split("?")[0])
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            done = event.get("stage") == "ResponseComplete" and event["verb"] != "watch"
            self.requests[event["auditID"]] = {
                "t": received,
                # Server side, from authentication to the response (API Priority and Fairness queueing included).
                "latency": datetime.fromisoformat(event["stageTimestamp"]).timestamp() - received if done else None,
                "name": ref.get("name"), "namespace": ref.get("namespace"),
                "verb": event["verb"], "resource": resource,
                "code": (event.get("responseStatus") or {}).get("code"),
                "client": "kopf" if "kopf" in (event.get("userAgent") or "") else "reconciler",
            }

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Requests received in [start, end): total, by verb, by verb and resource, by client."""
        self.read()
        chosen = [r for r in self.requests.values() if start <= r["t"] < end]
        latency: dict[str, list[float]] = {}
        for r in chosen:
            if r["latency"] is not None:
                latency.setdefault(r["verb"], []).append(r["latency"])
        return {
            "server_latency_s": {verb: distribution(v) for verb, v in sorted(latency.items())},
            "total": len(chosen),
            "by_verb": dict(Counter(r["verb"] for r in chosen).most_common()),
            "by_verb_resource": dict(Counter(f"{r['verb']} {r['resource']}" for r in chosen).most_common()),
            "by_client": dict(Counter(r["client"] for r in chosen).most_common()),
            "errors": dict(Counter(f"{r['verb']} {r['resource']} {r['code']}" for r in chosen
                                   if r["code"] and r["code"] >= 400).most_common()),
        }


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def in_cluster_available() -> bool:
    """Can this machine run the operator as in its pod (``in_cluster``): root, with ``unshare`` and ``mount``?"""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


def credentials() -> str:
    """How the benchmarks' operator authenticates, for the results' config."""
    return "its in-cluster credentials" if in_cluster_available() else "in a kubeconfig"


def in_cluster(args: list[str], env: dict[str, str], folder: Path) -> tuple[list[str], dict[str, str]]:
    """``args`` (``rljob operator --kubeconfig K ...``) run as in the operator's pod: without the kubeconfig, with
    the in-cluster credentials the kubelet gives a pod (``KUBERNETES_SERVICE_HOST``/``PORT``, and the token and
    CA files at ``SERVICE_ACCOUNT_DIR``) taken from K.

    A deployed operator has no kubeconfig, and the client's kubeconfig loader alone (its auth providers'
    libraries) is about 17 MiB of its memory: measured with one, the peak RSS row would count memory no
    replica holds. The files go to a tmpfs in a mount namespace of the operator's own (``unshare``): this
    machine's ``/var/run/secrets`` is not touched. ``exec`` keeps the process the one measured (its pid).
    """
    import base64

    import yaml

    at = args.index("--kubeconfig")
    kubeconfig = Path(args[at + 1])
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    server = urlparse(cluster["server"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(user["token"])
    (folder / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    (folder / "namespace").write_text(config["contexts"][0]["context"].get("namespace", "default"))
    command = " ".join(shlex.quote(a) for a in args[:at] + args[at + 2:])
    script = (f"mkdir -p /run/secrets && mount -t tmpfs -o size=1m tmpfs /run/secrets && "
              f"mkdir -p {SERVICE_ACCOUNT_DIR} && cp {shlex.quote(str(folder))}/* {SERVICE_ACCOUNT_DIR}/ && "
              f"exec {command}")
    return (["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            {**env, "KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port or 443)})


class OperatorProcess(helpers.OperatorProcess):
    """The tests' ``rljob operator`` process, but with production settings (not the tests' fast
    resyncs and leases), as the operator's service account, dying with this process."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, source: Path = REPO) -> None:
        """``source``: the checkout whose operator runs (``--against``: another commit's worktree)."""
        super().__init__(kubeconfig, namespace, log, identity=f"bench-{namespace}")
        self.args += ["--operator-namespace", OPERATOR_NAMESPACE]
        self.source = source
        path = os.pathsep.join([str(source / "contract"), str(source / "operator"), str(source / "trainer"), str(source)]
                               + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        # Production settings but for the pod profile's images: the tests' fake trainer image (KWOK
        # never pulls it), as in the tests, so the jobs are built rather than refused (PolicyViolation).
        # And without the admission policies (the control plane has none; the policies cost the operator one
        # check every 30 s, nothing per job).
        images = helpers.FAST_ENV["RLJOB_OPERATOR_ALLOWED_IMAGES"]
        self.env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "RLJOB_OPERATOR_ALLOWED_IMAGES": images,
                    **helpers.WITHOUT_POLICIES_ENV}

    def start(self) -> OperatorProcess:
        args, env = self.args, self.env
        if in_cluster_available():
            args, env = in_cluster(self.args, self.env, self.log.with_suffix(".sa"))
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.source, preexec_fn=_die_with_parent)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"the operator exited:\n{self.log_tail()}")

    def counters(self) -> dict[str, float]:
        """Resyncs, reconciles (ok + error) and the queue depth: the idle window's samples. Only those series
        are asked for (``name[]``): a whole scrape of 10,000 jobs is 80,000 per-job phase series and about
        half a second of the operator's CPU, which read every 10 s was most of the idle operator's CPU."""
        got = self.reconciles(("rljob_operator_resyncs_total", "rljob_operator_reconciles_total",
                               "rljob_operator_queue_depth"))
        return {"resyncs": got.get("resyncs", 0.0), "reconciles": got.get("ok", 0.0) + got.get("error", 0.0),
                "queue": got.get("queue", 0.0)}

    def reconciles(self, names: tuple[str, ...] = ()) -> dict[str, float]:
        """The operator's own counters: reconciles (ok, error), the seconds they took in all, the
        event-driven reconciles' wait in the queue, urgent and not (cumulative buckets: diff two snapshots),
        resyncs and the queue's depth; ``names``: only those series are read."""
        out: dict[str, float] = {}
        # An operator busy with 10,000 jobs answers /metrics in seconds: a 2 s bound ended such a run before
        # it measured anything.
        for family in text_string_to_metric_families(self.metrics_text(timeout=60, names=names)):
            for sample in family.samples:
                if sample.name == "rljob_operator_reconciles_total" and sample.labels.get("result") in ("ok", "error"):
                    out[sample.labels["result"]] = sample.value
                elif sample.name == "rljob_operator_resyncs_total":
                    out["resyncs"] = sample.value
                elif sample.name == "rljob_operator_queue_depth":
                    out["queue"] = sample.value
                elif sample.name == "rljob_operator_reconcile_duration_seconds_sum":
                    out["seconds"] = sample.value
                elif (sample.name.startswith("rljob_operator_queue_wait_seconds_")
                      and sample.labels.get("queued_by") in ("urgent", "event")):
                    le = sample.labels.get("le")
                    kind = sample.name.rsplit("_", 1)[-1]
                    out[f"{sample.labels['queued_by']}_queue_wait_{kind}" + (f"_le_{le}" if le else "")] = sample.value
        return out


# -------------------------------------------------------------------------------- sides


class RLJobSide:
    """What the phases need to know about the controller under test: here, rljob's operator.

    ``bench/peer_scale.py`` has another side (Kubeflow's training operator) with the same members."""

    name = "rljob"
    user = OPERATOR_USER
    failure_exit_code = "1"  # retryable for rljob (contract.py); the peer bench uses 137 for both sides
    replacement_pods = WORKERS  # a failed worker restarts its whole gang (a new rendezvous)

    def __init__(self, kubeconfig: Path, source: Path = REPO, name: str = "rljob") -> None:
        self.kubeconfig = kubeconfig
        self.source = source
        self.name = name

    def recorder(self) -> Recorder:
        return Recorder()

    def jobs_path(self, namespace: str) -> str:
        return Kube.job_path(namespace)

    def manifest(self, name: str) -> dict[str, Any]:
        return job_manifest(name)

    def victim_pod(self, job: str, index: int) -> str:
        """The name of worker ``index`` (0-3) of ``job``'s first gang."""
        return f"{job}-worker-{index}"

    def controller(self, namespace: str, log: Path) -> OperatorProcess:
        return OperatorProcess(self.kubeconfig, namespace, log, self.source)


# ------------------------------------------------------------------------------- phases


def wait_until(predicate: Any, timeout: float, checks: list[Any], what: str) -> bool:
    """Poll ``predicate`` (4/s) until true or ``timeout``; ``checks`` raise if something died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for check in checks:
            check()
        if predicate():
            return True
        time.sleep(0.25)
    print(f"  timed out after {timeout:.0f}s waiting for {what}", flush=True)
    return False


def create_burst(kube: Kube, namespace: str, names: list[str], side: Any = None,
                 rate: float = 0.0) -> dict[str, float]:
    """Create the jobs from 8 threads; each job's time is when its create request was sent. ``rate`` > 0: the
    i-th create is sent no sooner than i / rate seconds after the first (KubeRay's anchor: 100 per second)."""
    sent: dict[str, float] = {}
    side = side or RLJobSide(Path())
    start = time.monotonic()
    order = {name: i for i, name in enumerate(names)}

    def create(name: str) -> None:
        doc = side.manifest(name)
        if rate > 0:
            time.sleep(max(0.0, start + order[name] / rate - time.monotonic()))
        sent[name] = time.time()
        kube.request("POST", side.jobs_path(namespace), doc)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, names))
    return sent


def gang_latencies(recorder: Recorder, jobs: dict[str, float], gen: int) -> dict[str, list[float]]:
    """Per job, seconds from ``jobs[name]`` to its gang ``gen`` created, scheduled, Ready, and Running."""
    out: dict[str, list[float]] = {k: [] for k in ("pods_created", "pods_scheduled", "pods_ready", "running",
                                                   "scheduled_after_created", "ready_after_scheduled",
                                                   "running_after_ready")}
    for name, start in jobs.items():
        pods = recorder.gang(name, gen)
        stamps = {}
        for stage in ("created", "scheduled", "ready"):
            times = [p[stage] for p in pods if stage in p]
            stamps[stage] = max(times) if len(times) == WORKERS else None
        stamps["running"] = recorder.running_at.get((name, gen))
        for stage, key in (("created", "pods_created"), ("scheduled", "pods_scheduled"), ("ready", "pods_ready"),
                           ("running", "running")):
            if stamps[stage] is not None:
                out[key].append(stamps[stage] - start)
        for a, b, key in (("created", "scheduled", "scheduled_after_created"),
                          ("scheduled", "ready", "ready_after_scheduled"), ("ready", "running", "running_after_ready")):
            if stamps[a] is not None and stamps[b] is not None:
                out[key].append(stamps[b] - stamps[a])
    return out


#: Threads that send the injected failures (each a PATCH that a loaded API server answers in a fraction of a second).
INJECT_THREADS = 16


def inject_on_schedule(send: Any, targets: list[Any], interval: float) -> dict[int, float]:
    """Call ``send(target)`` for each target at its time on a fixed schedule (start + i × ``interval``), from
    threads of its own, so that slow answers do not slow the rate (one after another, a PATCH taking 0.3 s on
    the loaded machine made a nominal 10 failures a second 2.5-3); returns each target's index → when sent
    (``time.time()``). Raises the first error once all were sent."""
    sent: dict[int, float] = {}
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=INJECT_THREADS, thread_name_prefix="inject") as pool:
        futures = []
        for i, target in enumerate(targets):
            wait = start + i * interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sent[i] = time.time()
            futures.append(pool.submit(send, target))
        for future in futures:
            future.result()
    return sent


def achieved_rate(window: list[float], failures: int) -> float | None:
    """Failures per second actually sent over the injection window (None for a single failure)."""
    span = window[1] - window[0]
    return (failures - 1) / span if failures > 1 and span > 0 else None


def fail_pod(kube: Kube, namespace: str, pod: str, exit_code: str = "1", uid: str | None = None) -> None:
    """Make ``pod``'s containers exit with ``exit_code`` (KWOK's fake exit-code annotation). With ``uid``, only
    that pod: a replacement already made under the name (a late patch) is left alone (409)."""
    metadata: dict[str, Any] = {"annotations": {fake_pods.EXIT_CODE: exit_code}}
    if uid is not None:
        metadata["uid"] = uid  # a precondition: the API server refuses a patch of another pod under the name
    kube.request("PATCH", kube.core_path(namespace, "pods", pod), {"metadata": metadata},
                 content_type="application/merge-patch+json")


def inject_failures(kube: Kube, namespace: str, recorder: Recorder, names: list[str], count: int,
                    interval: float, timeout: float, checks: list[Any], seed: int,
                    side: Any = None) -> dict[str, Any]:
    """Make one worker of ``count`` distinct jobs exit (``side.failure_exit_code``); time the replacements:
    the side's ``replacement_pods`` new pods of generation 1 (rljob: the gang; the peer: the one pod)."""
    side = side or RLJobSide(Path())
    rng = random.Random(seed)
    victims = rng.sample(names, min(count, len(names)))
    indexes = [rng.choice(getattr(side, "victim_indexes", range(WORKERS))) for _ in victims]

    def fail(target: tuple[str, int]) -> None:
        fail_pod(kube, namespace, side.victim_pod(*target), side.failure_exit_code)

    sent = inject_on_schedule(fail, list(zip(victims, indexes, strict=True)), interval)
    injected = {name: (sent[i], indexes[i]) for i, name in enumerate(victims)}
    injected_done = max(sent.values())

    def stamp(name: str, stage: str) -> float | None:
        """When the last of the replacement pods reached ``stage``; None until all have."""
        pods = recorder.gang(name, 1)
        times = [p[stage] for p in pods if stage in p]
        return max(times) if len(times) == side.replacement_pods else None

    def replaced() -> bool:
        if side.replacement_pods != WORKERS:  # the peer's job status has no generation: its new pod Ready
            return all(stamp(name, "ready") is not None for name in victims)
        with recorder.lock:
            return all((name, 1) in recorder.running_at for name in victims)

    all_back = wait_until(replaced, timeout, checks, "every replacement Running")
    latencies: dict[str, list[float]] = {"failed_after_injected": [], "replacement_created": [],
                                         "replacement_ready": [], "replacement_running": [],
                                         "replacement_created_after_injected": []}
    for name, (t_injected, index) in injected.items():
        failed = [p["failed"] for p in recorder.gang(name, 0) if p["index"] == index and "failed" in p]
        created, ready = stamp(name, "created"), stamp(name, "ready")
        running = recorder.running_at.get((name, 1))
        if failed:
            latencies["failed_after_injected"].append(failed[0] - t_injected)
            for key, t in (("replacement_created", created), ("replacement_ready", ready),
                           ("replacement_running", running)):
                if t is not None:
                    latencies[key].append(t - failed[0])
        if created is not None:
            latencies["replacement_created_after_injected"].append(created - t_injected)
    window = [min(t for t, _ in injected.values()), injected_done]
    return {"failures": len(victims), "interval_s": interval, "all_replaced_running": all_back,
            "injection_window": window, "achieved_per_s": achieved_rate(window, len(victims)),
            "latency_s": {k: distribution(v) for k, v in latencies.items()}, "raw_s": latencies}


def delete_namespace(kube: Kube, namespace: str, timeout: float) -> None:
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}")

    def gone() -> bool:
        try:
            kube.request("GET", f"/api/v1/namespaces/{namespace}")
        except Exception as error:  # noqa: BLE001
            return getattr(error, "status", None) == 404
        return False

    with contextlib.suppress(TimeoutError):
        wait_for(gone, timeout, interval=0.5, message=f"namespace {namespace} deleted")


def all_ready_at(recorder: Recorder, names: list[str]) -> float | None:
    """When the last pod of the jobs' first gangs turned Ready; None while one is not."""
    last = 0.0
    for name in names:
        ready = [p["ready"] for p in recorder.gang(name, 0) if "ready" in p]
        if len(ready) < WORKERS:
            return None
        last = max(last, *ready)
    return last


IDLE_SAMPLE_S = 10.0  # the idle window's sampling period: a read of three series of /metrics each


def idle_timeline(operator: Any, meter: Meter, end: float, check: Callable[[], None]) -> list[dict[str, float]]:
    """Samples until ``end``, every ``IDLE_SAMPLE_S``: the time, the operator's CPU seconds, and its counters
    of resyncs and reconciles and its queue depth (``/metrics``), from which ``idle_phases`` finds resyncs."""
    samples: list[dict[str, float]] = []
    counters = getattr(operator, "counters", None)  # the peer's controller has none: its samples are CPU only
    while True:
        samples.append({"t": time.time(), "cpu": meter.snapshot().get("operator", float("nan")),
                        **(counters() if counters else {"resyncs": 0.0, "reconciles": 0.0, "queue": 0.0})})
        if samples[-1]["t"] >= end:
            return samples
        check()
        time.sleep(max(0.0, min(IDLE_SAMPLE_S, end - time.time())))


def idle_phases(samples: list[dict[str, float]], audit: AuditLog, jobs: int) -> dict[str, Any]:
    """The idle window split into resyncs, busy intervals and the steady state.

    A resync starts in the sample interval where ``rljob_operator_resyncs_total`` grew, and ends at the first
    sample by which ``jobs`` reconciles more were done and the queue was empty. Its cost is what the operator
    spent from the sample before it to that end (CPU seconds, API requests), less the steady state's rate
    over the same time. The operator writes Events on threads of their own, so a large burst's Events are
    still being created after every job is Running: an interval outside the resyncs with an Event create or a
    reconcile is busy (that backlog, or jobs with something to do), not the steady state's. The steady state is
    the rate over the intervals left."""
    intervals = []
    for a, b in zip(samples, samples[1:], strict=False):
        window = audit.window(a["t"], b["t"])
        intervals.append({"t": a["t"], "seconds": b["t"] - a["t"], "cpu": b["cpu"] - a["cpu"],
                          "requests": window["total"],
                          "event_creates": window["by_verb_resource"].get("create events", 0)})
    resyncs: list[tuple[int, int]] = []
    i = 1
    while i < len(samples):
        if samples[i]["resyncs"] > samples[i - 1]["resyncs"]:
            start = i - 1
            end = next((j for j in range(i, len(samples)) if samples[j]["reconciles"] - samples[start]["reconciles"]
                        >= jobs and samples[j]["queue"] == 0), None)
            if end is None:
                break  # the window ended mid-resync: not measured
            resyncs.append((start, end))
            i = end
        i += 1
    inside = {k for a, b in resyncs for k in range(a, b)}
    busy = [k for k in range(len(intervals)) if k not in inside and (
        intervals[k]["event_creates"] or samples[k + 1]["reconciles"] > samples[k]["reconciles"])]
    steady = [intervals[k] for k in range(len(intervals)) if k not in inside and k not in busy]
    steady_s = sum(x["seconds"] for x in steady)
    cpu_rate = sum(x["cpu"] for x in steady) / steady_s if steady_s else float("nan")
    request_rate = sum(x["requests"] for x in steady) / steady_s if steady_s else float("nan")
    measured = []
    for a, b in resyncs:
        s0, s1 = samples[a], samples[b]
        wall = s1["t"] - s0["t"]
        window = audit.window(s0["t"], s1["t"])
        measured.append({
            "window_s": round(wall, 1), "reconciles": int(s1["reconciles"] - s0["reconciles"]),
            "operator_cpu_s": round(s1["cpu"] - s0["cpu"], 2),
            "operator_cpu_s_over_steady": round(s1["cpu"] - s0["cpu"] - cpu_rate * wall, 2),
            "api_requests": window["total"], "api_requests_over_steady": round(window["total"] - request_rate * wall),
            "by_verb_resource": window["by_verb_resource"],
        })
    return {
        "sample_s": IDLE_SAMPLE_S, "window_s": round(samples[-1]["t"] - samples[0]["t"], 1),
        "steady": {"seconds": round(steady_s, 1), "operator_cpu_cores": round(cpu_rate, 4),
                   "api_requests_per_s": round(request_rate, 2)},
        "busy": {"intervals": len(busy), "event_creates": sum(intervals[k]["event_creates"] for k in busy),
                 "reconciles": int(sum(samples[k + 1]["reconciles"] - samples[k]["reconciles"] for k in busy)),
                 "until_s": round(intervals[busy[-1]]["t"] + intervals[busy[-1]]["seconds"]
                                  - samples[0]["t"], 1) if busy else 0.0},
        "resyncs": measured,
        "samples": [{k: round(v, 3) for k, v in x.items()} for x in samples],
        "intervals": [{k: round(v, 3) for k, v in x.items()} for x in intervals],
    }


def run_burst(plane: BenchControlPlane, kube: Kube, side: Any, audit: AuditLog, meter: Meter, n: int,
              args: argparse.Namespace, logs: Path, with_failures: bool, namespace: str | None = None,
              sent_out: dict[str, float] | None = None) -> dict[str, Any]:
    """One burst of ``n`` jobs of ``side`` (RLJobSide or the peer's) with a fresh controller in a fresh namespace;
    ``sent_out`` (if given) receives when each job's create was sent."""
    namespace = namespace or f"rljob-scale-{n}"
    create_namespace(kube, namespace)
    recorder = side.recorder()
    watches = [Watch(plane, f"/api/v1/namespaces/{namespace}/pods", recorder.on_pod),
               Watch(plane, side.jobs_path(namespace), recorder.on_job)]
    operator = side.controller(namespace, logs / f"{side.name}-{namespace}.log")
    result: dict[str, Any] = {"side": side.name, "jobs": n, "namespace": namespace, "timeout_s": args.timeout}

    def check() -> None:
        operator.check_alive()
        for w in watches:
            if w.error is not None:
                raise RuntimeError(f"{w.name}: {w.error}")

    try:
        for w in watches:
            w.start()
            w.listed.wait(30)
        t_operator = time.time()
        operator.start()
        meter.operator = psutil.Process(operator.pid)
        operator.wait_leader(timeout=90)
        time.sleep(2)  # the controller's watches are up
        snap_ready = meter.snapshot()
        memory = {"after_start_kib": _proc_status(operator.pid)}
        reconciles = {"start": operator.reconciles()}

        names = [f"job-{i:04d}" for i in range(n)]
        print(f"N={n}: creating {n} jobs × {WORKERS} workers", flush=True)
        t_burst = time.time()
        sent = create_burst(kube, namespace, names, side, getattr(args, "create_rate", 0.0))  # peer_scale has none
        if sent_out is not None:
            sent_out.update(sent)
        t_created = time.time()
        # Running as the job's status says, and its 4 pods Ready: the peer's PyTorchJob turns Running
        # when its master runs, rljob's job when all its workers do.
        done = wait_until(lambda: recorder.count_phase("Running") == n and all_ready_at(recorder, names) is not None,
                          args.timeout, [check], f"{n} jobs Running")
        t_all_running = max(recorder.running_at.get((name, 0), 0.0) for name in names) if done else time.time()
        t_all_ready = all_ready_at(recorder, names) if done else None
        snap_running = meter.snapshot()
        memory["all_running_kib"] = _proc_status(operator.pid)
        reconciles["all_running"] = operator.reconciles()
        running = recorder.count_phase("Running")
        latencies = gang_latencies(recorder, sent, 0)
        elapsed = t_all_running - t_burst
        print(f"  {running}/{n} Running after {elapsed:.1f}s; apply→pods created p99 "
              f"{percentile(latencies['pods_created'], 99) or float('nan'):.2f}s", flush=True)
        result.update({
            "all_running": done, "running": running,
            "create_requests_s": round(t_created - t_burst, 2),
            "all_running_s": round(elapsed, 2) if done else None,
            "all_pods_ready_s": round(t_all_ready - t_burst, 2) if t_all_ready is not None else None,
            "latency_s": {k: distribution(v) for k, v in latencies.items()},
            "raw_latency_s": {k: [round(x, 3) for x in latencies[k]] for k in ("pods_created", "running")},
        })

        # Idle: every job Running, nothing happening but the operator's own resync and checks. The
        # burst's requests end a few seconds after the last job turned Running (Events, queued reconciles).
        t_idle = max(time.time(), t_all_running + SETTLE_S)
        time.sleep(max(0.0, t_idle - time.time()))
        timeline = idle_timeline(operator, meter, t_idle + args.idle_seconds, check)
        check()
        snap_idle = meter.snapshot()
        t_idle_end = time.time()
        memory["after_idle_kib"] = _proc_status(operator.pid)
        reconciles["after_idle"] = operator.reconciles()

        windows = {"startup": (t_operator, t_burst), "burst": (t_burst, t_idle),
                   "idle": (t_idle, t_idle_end)}
        cpu = {"burst": Meter.delta(snap_ready, snap_running), "idle": Meter.delta(snap_running, snap_idle)}
        if with_failures and args.failures and done:
            print(f"  injecting {min(args.failures, n)} worker failures", flush=True)
            failures = inject_failures(kube, namespace, recorder, names, args.failures, args.failure_interval,
                                       args.timeout, [check], args.seed, side)
            windows["failures"] = (failures["injection_window"][0], time.time())
            cpu["failures"] = Meter.delta(snap_idle, meter.snapshot())
            memory["after_failures_kib"] = _proc_status(operator.pid)
            reconciles["after_failures"] = operator.reconciles()
            result["failures"] = failures
            lat = failures["latency_s"]["replacement_created"]
            print(f"  failure → replacement gang created p50 {lat['p50']}s p99 {lat['p99']}s", flush=True)
        final = _proc_status(operator.pid)
        memory["peak_rss_mib"] = round(final.get("VmHWM", 0) / 1024, 1)
        result["operator_memory"] = memory
        result["operator_reconciles"] = reconciles
        result["cpu_s"] = cpu
        result["operator_cpu_s_total"] = round(meter.snapshot()["operator"] - snap_ready.get("operator", 0.0), 2)
        result["watch_events"] = dict(recorder.events)
        time.sleep(0.5)
        result["api_requests"] = {k: audit.window(a, b) for k, (a, b) in windows.items()}
        result["idle"] = idle_phases(timeline, audit, n)
        result["windows_s"] = {k: round(b - a, 2) for k, (a, b) in windows.items()}
    finally:
        operator.stop()
        meter.operator = None
        for w in watches:
            w.stop()
    result["operator_log_tail"] = operator.log_tail(5)
    return result


def run_against(plane: BenchControlPlane, kube: Kube, kubeconfig: Path, audit: AuditLog, meter: Meter,
                args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    """The largest burst and its failures, ``args.repeat`` times with each operator: this checkout's
    and commit ``args.against``'s, alternating which goes first (base, head, head, base, ...), on one
    control plane."""
    n = max(args.jobs)
    worktree = logs / "against"
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.against], cwd=REPO, check=True,
                   capture_output=True)
    try:
        head = RLJobSide(kubeconfig)
        base = RLJobSide(kubeconfig, worktree, name=f"rljob@{args.against}")
        runs: list[dict[str, Any]] = []
        for rep in range(args.repeat):
            for side in (base, head) if rep % 2 == 0 else (head, base):
                tag = "base" if side is base else "head"
                runs.append(run_burst(plane, kube, side, audit, meter, n, args, logs, with_failures=True,
                                      namespace=f"rljob-scale-{n}-{tag}-{rep}"))
                delete_namespace(kube, runs[-1]["namespace"], timeout=max(60, n / 4))
        return runs
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False,
                       capture_output=True)


def against_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure, each side's median over its runs and the ratio this checkout / the other commit."""
    head = [r for r in runs if r["side"] == "rljob"]
    base = [r for r in runs if r["side"] != "rljob"]

    def median(values: list[float | None]) -> float | None:
        got = sorted(v for v in values if v is not None)
        return percentile(got, 50) if got else None

    figures: list[tuple[str, Any]] = [
        ("failure → replacement gang created p50", lambda r: r["failures"]["latency_s"]["replacement_created"]["p50"]),
        ("failure → replacement gang created p99", lambda r: r["failures"]["latency_s"]["replacement_created"]["p99"]),
        ("failure → job Running again p99", lambda r: r["failures"]["latency_s"]["replacement_running"]["p99"]),
        ("operator API requests per failure",
         lambda r: r["api_requests"]["failures"]["total"] / r["failures"]["failures"]),
        ("operator CPU per failure, s", lambda r: r["cpu_s"]["failures"]["operator"] / r["failures"]["failures"]),
        ("machine CPU per failure, s", lambda r: r["cpu_s"]["failures"]["machine_busy"] / r["failures"]["failures"]),
        ("all Running after, s", lambda r: r["all_running_s"]),
        ("apply → pods created p99, s", lambda r: r["latency_s"]["pods_created"]["p99"]),
        ("operator API requests per job, burst", lambda r: r["api_requests"]["burst"]["total"] / r["jobs"]),
        ("operator CPU per job, burst, ms", lambda r: 1000 * r["cpu_s"]["burst"]["operator"] / r["jobs"]),
        ("operator peak RSS, MiB", lambda r: r["operator_memory"]["peak_rss_mib"]),
    ]
    def each(side: list[dict[str, Any]], pick: Any) -> list[float | None]:
        out: list[float | None] = []
        for r in side:
            try:
                out.append(round(float(pick(r)), 3))
            except (KeyError, TypeError):  # a run that timed out has no such figure
                out.append(None)
        return out

    rows = []
    for label, pick in figures:
        h, b = each(head, pick), each(base, pick)
        mh, mb = median(h), median(b)
        rows.append({"metric": f"{runs[0]['jobs']} jobs: {label} (median: this / {base[0]['side']})",
                     "value": f"{mh if mh is None else round(mh, 3)} / {mb if mb is None else round(mb, 3)}",
                     "unit": f"ratio {mh / mb:.2f}" if mh is not None and mb else "",
                     "this": h, "other": b})
    return rows


# -------------------------------------------------------------------------------- report


def _pair(dist: dict[str, Any]) -> str:
    return f"{dist['p50']} / {dist['p99']}"


def summary_rows(runs: list[dict[str, Any]], idle_seconds: float) -> list[dict[str, Any]]:
    """The README rows: per burst size, time to Running, latencies and the operator's cost; then the
    largest run's memory and failure recovery. Targets are the issue's (1,000-job burst, 2-core machine)."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        n = run["jobs"]
        all_running = run["all_running_s"]
        row: dict[str, Any] = {"metric": f"{n} jobs × {WORKERS} workers: all Running after", "unit": "s",
                               "value": all_running if all_running is not None else f"> {_timed_out(run)}"}
        if n == 1000:
            row.update(target=f"≤ {TARGET_ALL_RUNNING_S:g}",
                       met=all_running is not None and all_running <= TARGET_ALL_RUNNING_S)
        rows.append(row)
        created = run["latency_s"]["pods_created"]
        rows.append({"metric": f"{n} jobs: apply → {WORKERS} pods created, p50 / p99", "value": _pair(created),
                     "unit": "s", "target": f"p99 ≤ {TARGET_POD_CREATE_P99_S:g}",
                     "met": created["p99"] is not None and created["p99"] <= TARGET_POD_CREATE_P99_S})
        rows.append({"metric": f"{n} jobs: apply → job Running, p50 / p99", "value": _pair(run["latency_s"]["running"]),
                     "unit": "s"})
        burst = run["api_requests"]["burst"]["total"]
        cpu_ms = 1000 * run["cpu_s"]["burst"].get("operator", float("nan")) / n
        rows.append({"metric": f"{n} jobs: operator API requests / CPU per job, burst",
                     "value": f"{burst / n:.1f} / {cpu_ms:.0f} ms", "unit": ""})
        rows.append({"metric": f"{n} jobs Running, idle: operator API requests/s",
                     "value": round(run["api_requests"]["idle"]["total"] / idle_seconds, 1), "unit": "req/s"})
        idle = run.get("idle")
        if idle:
            steady = idle["steady"]
            rows.append({"metric": f"{n} jobs Running, idle (no resync, nothing queued): operator API requests/s / CPU",
                         "value": f"{steady['api_requests_per_s']} / {100 * steady['operator_cpu_cores']:.1f} % of a core",
                         "unit": ""})
            for k, r in enumerate(idle["resyncs"], 1):
                rows.append({"metric": f"{n} jobs: resync {k} (each job reconciled again): wall / CPU / requests",
                             "value": f"{r['window_s']} s / {r['operator_cpu_s_over_steady']} s / "
                                      f"{r['api_requests_over_steady']}", "unit": ""})
    largest = runs[-1]
    rss = largest["operator_memory"]["peak_rss_mib"]
    target_rss = TARGET_RSS_MIB_10000 if largest["jobs"] >= 10000 else TARGET_RSS_MIB
    rows.append({"metric": f"operator peak RSS ({largest['jobs']} jobs)", "value": rss, "unit": "MiB",
                 "target": f"≤ {target_rss:g}", "met": rss <= target_rss})
    if "failures" in largest:
        f = largest["failures"]
        lat = f["latency_s"]
        p99 = lat["replacement_created"]["p99"]
        achieved = f.get("achieved_per_s")
        rate = (f"{1 / f['interval_s']:g}/s" if f["interval_s"] else "at once") + (
            f", sent at {achieved:.1f}/s" if achieved is not None else "")
        what = f"{f['failures']} worker failures, {rate} ({largest['jobs']} jobs)"
        rows.append({"metric": f"{what}: failure → replacement gang created, p50 / p99",
                     "value": _pair(lat["replacement_created"]), "unit": "s",
                     "target": f"p99 ≤ {TARGET_REPLACEMENT_P99_S:g}",
                     "met": p99 is not None and p99 <= TARGET_REPLACEMENT_P99_S})
        rows.append({"metric": f"{what}: failure → job Running again, p50 / p99",
                     "value": _pair(lat["replacement_running"]), "unit": "s"})
    return rows


def _timed_out(run: dict[str, Any]) -> str:
    return f"{run['timeout_s']:g} ({run['running']}/{run['jobs']} Running)"


def print_table(rows: list[dict[str, Any]]) -> None:
    width = max(len(r["metric"]) for r in rows)
    for r in rows:
        met = {True: "met", False: "MISSED"}.get(r.get("met"), "")  # type: ignore[arg-type]
        value = f"{r['value']} {r.get('unit', '')}".strip()
        print(f"{r['metric']:<{width}}  {value:>22}  {r.get('target', ''):>10} {met}")


def source_state() -> str:
    """The commit measured, and whether operator/ had uncommitted changes (it is worked on concurrently)."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "operator", "crds")
    return f"{head}{' + uncommitted changes in operator/' if dirty else ''}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000], help="burst sizes, run in order")
    p.add_argument("--failures", type=int, default=100, help="worker failures injected after the largest burst")
    p.add_argument("--failure-interval", type=float, default=0.1, help="seconds between injected failures")
    p.add_argument("--idle-seconds", type=float, default=30.0, help="idle window after each burst")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each wait for Running")
    p.add_argument("--scheduler-qps", type=int, default=200, help="kube-scheduler --kube-api-qps (0: its default)")
    p.add_argument("--node-grace", type=int, default=40, help="node monitor grace period; heartbeats every 1/5")
    p.add_argument("--kwok-parallelism", type=int, default=4,
                   help="pod stages kwok plays at once (4: kwok's default; it plays the kubelet of every node)")
    p.add_argument("--nodes", type=int, default=NODES, help="KWOK nodes (10,000 jobs × 4 workers: 200)")
    p.add_argument("--gpus-per-node", type=int, default=GPUS_PER_NODE, help="nvidia.com/gpu per KWOK node")
    p.add_argument("--pods-per-node", type=int, default=110, help="pods per KWOK node (the kubelet's default: 110)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--create-rate", type=float, default=0.0,
                   help="jobs created per second (0: as fast as 8 threads send them; KubeRay's anchor: 100)")
    p.add_argument("--result", default="operator_scale",
                   help="results/NAME.json to write (another name keeps the figures the READMEs cite)")
    p.add_argument("--against", metavar="REV", default=None,
                   help="instead of the bursts: the largest burst and its failures, alternately with this "
                        "checkout's operator and commit REV's (a git worktree), --repeat times each")
    p.add_argument("--repeat", type=int, default=2, help="runs per side with --against")
    p.add_argument("--keep", type=Path, default=None,
                   help="copy the operator logs and the API server's audit log into this folder")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    sizes = sorted(a.jobs)
    plane = bench_plane(a)
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rljob-bench-scale-") as tmp:
        started = time.time()
        try:
            print(f"starting the control plane with {a.nodes} KWOK nodes × {a.gpus_per_node} GPUs", flush=True)
            plane.start(build_binaries=False)
            print(f"  up in {time.time() - started:.0f}s", flush=True)
            api_client = plane.api_client()
            kube = Kube(api_client)
            install_crd(kube)
            kubeconfig = operator_kubeconfig(plane, kube)
            audit = AuditLog(plane.audit_log)
            meter = Meter(plane)
            if a.against:
                runs = run_against(plane, kube, kubeconfig, audit, meter, a, Path(tmp))
            else:
                for i, n in enumerate(sizes):
                    last = i == len(sizes) - 1
                    runs.append(run_burst(plane, kube, RLJobSide(kubeconfig), audit, meter, n, a, Path(tmp),
                                          with_failures=last))
                    if not last:
                        delete_namespace(kube, runs[-1]["namespace"], timeout=max(60, n))
            api_client.close()
        finally:
            if a.keep is not None:  # before the plane's stop removes its folder
                a.keep.mkdir(parents=True, exist_ok=True)
                for kept in [*Path(tmp).glob("*.log"), plane.audit_log]:
                    if kept.exists():
                        shutil.copy2(kept, a.keep / kept.name)
            plane.stop()
    rows = against_rows(runs) if a.against else summary_rows(runs, a.idle_seconds)
    path = write_result(a.result, {
        "config": {"nodes": a.nodes, "gpus_per_node": a.gpus_per_node, "pods_per_node": a.pods_per_node,
                   "workers_per_job": WORKERS, "gpus_per_worker": 1, "bursts": sizes[-1:] if a.against else sizes, "failures": a.failures,
                   "against": a.against, "repeat": a.repeat if a.against else None,
                   "failure_interval_s": a.failure_interval, "idle_seconds": a.idle_seconds,
                   "scheduler_qps": a.scheduler_qps or "default (50)", "node_monitor_grace_s": a.node_grace,
                   "kwok_pod_parallelism": a.kwok_parallelism, "create_rate_per_s": a.create_rate or "unlimited",
                   "operator": f"defaults ({OperatorSettings.workers} reconcile workers, "
                               f"{OperatorSettings.resync_seconds:g} s resync, leader election) unless "
                               f"operator_env says otherwise; a service account bound to cluster-admin, {credentials()}",
                   "operator_env": {k: v for k, v in os.environ.items() if k.startswith("RLJOB_OPERATOR_")},
                   "source": source_state(),
                   "load_average_before": [round(x, 2) for x in load_before],
                   "load_average_after": [round(x, 2) for x in os.getloadavg()],
                   "wall_s": round(time.time() - started, 1)},
        "runs": runs,
        "summary": rows,
    })
    print_table(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
