"""rljob next to Kubeflow's training operator: bursts of RLTrainingJobs and PyTorchJobs of one shape, alternating.

The peer is Kubeflow's training operator (``github.com/kubeflow/training-operator``
``cmd/training-operator.v1``, the version in ``tools/training-operator/go.mod``), built from its Go
module by ``tools/build-binaries.sh --peers`` (about 6 min on 2 cores, once; not part of the default
set) and run as a process against the same control plane as ``bench/operator_scale.py`` (etcd,
kube-apiserver, kube-scheduler, kube-controller-manager, 100 KWOK nodes × 48 GPUs), with its own CRD
(``kubeflow.org_pytorchjobs.yaml`` of the same module version) and its own ClusterRole
(``manifests/base/rbac/role.yaml``) bound to a ServiceAccount ``kubeflow/training-operator`` whose
token it uses, so its requests pass RBAC and API Priority and Fairness as ours do.

Its webhook is disabled: it blocks starting its controllers until its certificate rotator has
certificates, which needs a Secret ``kubeflow/training-operator-webhook-cert`` and a
ValidatingWebhookConfiguration ``validator.training-operator.kubeflow.org``; the benchmark creates
that configuration with an empty ``webhooks`` list, so the API server never calls it (the webhook
only validates specs, which are valid here). Leader election stays off (its default, and out of a
cluster it has no namespace to elect in); ``--namespace`` limits it to the burst's namespace, as
``--namespace`` does for rljob. Each side runs with its defaults: the peer with 1 controller thread
(``--controller-threads``; ``--peer-threads`` changes it) and controller-runtime's client limit of
20 requests/s (burst 30); rljob with its default reconcile workers (16) and no client-side limit.

The shape: 4 pods × ``nvidia.com/gpu: 1``. RLTrainingJob: 4 workers. PyTorchJob: Master × 1 +
Worker × 3 (the non-elastic shape its docs use; its workers get an init container that waits for the
master's DNS name, which KWOK completes at once), ``restartPolicy: ExitCode`` on both replica types.
A failure is a pod whose containers exit 137 (KWOK's ``rljob.dev/fake-exit-code``): retryable for
both (ExitCode retries 128 and above), on any pod of the job (the peer's master, rljob's worker 0
included). The peer replaces the one failed pod; so does rljob, for fixed-size (``rljob``) and elastic
(``rljob-elastic``) jobs alike: both sides' jobs keep checkpoints on object storage, so the survivors stay
and dial the replacement's rendezvous (issue #48). ``restartPolicy: OnFailure`` restarts the container
in place, which KWOK does not model, so it is not measured.

For each burst size (default 10, 100, 1000) and repetition, both sides run, in alternating order,
each in a fresh namespace with a fresh controller process, and after each burst ``min(N, --failures)``
injected failures. Per side: time until every job is Running (its status) with its 4 pods Ready,
apply → 4 pods created p50/p99, failure → replacement created and Ready p50/p99, the controller's
API requests per job by verb (audit log, its user only), its CPU seconds per job and its peak RSS.
The summary holds the medians over repetitions and the ratios peer ÷ rljob (> 1: rljob better).

    python -m bench.peer_scale [--jobs 10 100 1000] [--repeat 2] [--failures 100]
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench import operator_scale as scale
from bench.common import REPO, write_result
from tests.cluster.controlplane import ClusterConfig, ControlPlane
from tests.cluster.nodes import GPU_RESOURCE, GpuNodeShape
from tests.cluster.waiting import wait_for

PEER_NAMESPACE = "kubeflow"  # where its certificate rotator keeps its Secret (MY_POD_NAMESPACE)
PEER_SA = "training-operator"
PEER_USER = f"system:serviceaccount:{PEER_NAMESPACE}:{PEER_SA}"
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
WEBHOOK_SECRET = "training-operator-webhook-cert"
LABEL_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"
LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"
FAILURE_EXIT_CODE = "137"  # killed: retryable for both sides
# Where the training operator reads its webhook's certificates (pkg/cert/cert.go: fixed, not a flag);
# in a cluster, its Deployment mounts the Secret there.
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


# ------------------------------------------------------------------------- the peer's build


def peer_binary() -> Path:
    """The training operator's binary, built on demand into the binary cache."""
    done = subprocess.run(["bash", str(REPO / "tools" / "build-binaries.sh"), "--peers"], cwd=REPO,
                          stdout=subprocess.PIPE, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def peer_module_dir() -> Path:
    """The training operator's Go module source (its CRDs and RBAC), as the build left it in the module cache."""
    gomod = (REPO / "tools" / "training-operator" / "go.mod").read_text()
    match = re.search(r"github\.com/kubeflow/training-operator (v\S+)", gomod)
    if not match:
        raise SystemExit("tools/training-operator/go.mod: no version of github.com/kubeflow/training-operator")
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    path = Path(cache) / f"github.com/kubeflow/training-operator@{match.group(1)}"
    if not (path / "manifests").is_dir():
        raise SystemExit(f"{path}: not in the Go module cache; run tools/build-binaries.sh --peers")
    return path


# ------------------------------------------------------------------------- the peer's setup


def install_peer(plane: ControlPlane, kube: Any, module: Path) -> Path:
    """The PyTorchJob CRD, the peer's ClusterRole and ServiceAccount, its webhook disabled; its kubeconfig."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    crd = yaml.safe_load((module / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml").read_text())
    kube.request("POST", crds, crd)
    wait_for(lambda: any(c["type"] == "Established" and c["status"] == "True" for c in
                               (kube.request("GET", f"{crds}/{crd['metadata']['name']}").get("status") or {})
                               .get("conditions") or []), 60, message="PyTorchJob CRD Established")
    role = yaml.safe_load((module / "manifests/base/rbac/role.yaml").read_text())
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "bench-training-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": PEER_SA, "namespace": PEER_NAMESPACE}],
    })
    scale.create_namespace(kube, PEER_NAMESPACE)
    # What its certificate rotator needs before it lets the controllers start: the Secret it fills, and
    # the webhook configuration it injects the CA into; with no webhooks the API server never calls it.
    kube.request("POST", kube.core_path(PEER_NAMESPACE, "secrets"), {"metadata": {"name": WEBHOOK_SECRET}})
    kube.request("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                 {"metadata": {"name": WEBHOOK_CONFIG}, "webhooks": []})
    time.sleep(1)  # discovery catches up
    return plane.service_account_kubeconfig(PEER_NAMESPACE, PEER_SA, expiration_s=24 * 3600)


def pytorchjob_manifest(name: str) -> dict[str, Any]:
    """4 pods × 1 GPU: Master × 1 + Worker × 3, restartPolicy ExitCode, the GPU taint tolerated."""
    def replicas(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "ExitCode", "template": {"spec": {
            "containers": [{"name": "pytorch", "image": "registry.invalid/pytorch-trainer:bench",
                            "resources": {"limits": {GPU_RESOURCE: 1}}}],
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        }}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(scale.WORKERS - 1)}}}


# ---------------------------------------------------------------------------- the peer side


class PeerRecorder(scale.Recorder):
    """The Recorder for PyTorchJobs: index 0 is the master, 1-3 the workers; a pod that replaces
    one of the same job and index is generation 1 (the peer replaces pods one by one)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, int], int] = {}

    def identify(self, meta: dict[str, Any]) -> tuple[str, int, int] | None:
        labels = meta.get("labels") or {}
        if LABEL_JOB_NAME not in labels or LABEL_REPLICA_INDEX not in labels:
            return None
        master = labels.get(LABEL_REPLICA_TYPE, "").lower() == "master"
        key = (labels[LABEL_JOB_NAME], int(labels[LABEL_REPLICA_INDEX]) + (0 if master else 1))
        gen = self.seen.get(key, 0)
        self.seen[key] = gen + 1
        return key[0], gen, key[1]

    def job_state(self, job: dict[str, Any]) -> tuple[str, int]:
        """Running while its Running condition is True, else its last True condition (Created, Restarting...)."""
        true = [c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        return ("Running" if "Running" in true else (true[-1] if true else "")), 0


class TrainingOperatorProcess:
    """The training operator as a child process watching one namespace, as its ServiceAccount."""

    def __init__(self, kube: Any, binary: Path, kubeconfig: Path, namespace: str, log: Path, threads: int) -> None:
        self.kube = kube
        self.metrics_port = scale.helpers.free_port()
        self.log = log
        self.args = [str(binary), "--enable-scheme=pytorchjob", f"--namespace={namespace}",
                     f"--kubeconfig={kubeconfig}", f"--controller-threads={threads}",
                     f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
                     f"--health-probe-bind-address=127.0.0.1:{scale.helpers.free_port()}",
                     f"--webhook-server-port={scale.helpers.free_port()}"]
        self.env = {**os.environ, "MY_POD_NAMESPACE": PEER_NAMESPACE}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> TrainingOperatorProcess:
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(self.args, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                         preexec_fn=scale._die_with_parent)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the training operator exited:\n{self.log_tail()}")

    def mount_certs(self) -> bool:
        """Do what the kubelet does for its Deployment: put the Secret its rotator filled into CERT_DIR.
        Its controllers start only once the certificates are there (cert-controller's ensureCertsMounted)."""
        data = self.kube.request("GET", self.kube.core_path(PEER_NAMESPACE, "secrets", WEBHOOK_SECRET)).get("data") or {}
        if not {"ca.crt", "tls.crt", "tls.key"} <= data.keys():  # the rotator writes the Secret more than once
            return False
        CERT_DIR.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            (CERT_DIR / key).write_bytes(base64.b64decode(value))
        return True

    def wait_leader(self, timeout: float) -> None:
        """Until its PyTorchJob controller's workers run (after its certificates and its caches)."""
        mounted = False

        def started() -> bool:
            nonlocal mounted
            self.check_alive()
            mounted = mounted or self.mount_certs()
            return re.search(r"Starting workers.*pytorchjob-controller", self.log.read_text(errors="replace")) is not None

        wait_for(started, timeout, interval=0.2, message="training operator's PyTorchJob controller started")

    def reconciles(self) -> dict[str, float]:
        """controller-runtime's reconcile counters of the PyTorchJob controller (ok, error, seconds)."""
        out: dict[str, float] = {}
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if 'controller="pytorchjob-controller"' not in line:
                continue
            for prefix, key in (("controller_runtime_reconcile_total", None),
                                ("controller_runtime_reconcile_time_seconds_sum", "seconds")):
                if line.startswith(prefix + "{"):
                    result = re.search(r'result="(\w+)"', line)
                    name = key or {"success": "ok", "error": "error"}.get(result.group(1) if result else "", "other")
                    out[name] = out.get(name, 0.0) + float(line.split()[-1])
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class KubeflowSide:
    """Kubeflow's training operator and its PyTorchJobs, with the members ``scale.RLJobSide`` has."""

    name = "kubeflow"
    user = PEER_USER
    failure_exit_code = FAILURE_EXIT_CODE
    replacement_pods = 1  # the failed pod, recreated under its name
    victim_indexes = range(scale.WORKERS)  # 0 is the master

    def __init__(self, kube: Any, binary: Path, kubeconfig: Path, threads: int) -> None:
        self.kube, self.binary, self.kubeconfig, self.threads = kube, binary, kubeconfig, threads

    def recorder(self) -> scale.Recorder:
        return PeerRecorder()

    def jobs_path(self, namespace: str) -> str:
        return f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs"

    def manifest(self, name: str) -> dict[str, Any]:
        return pytorchjob_manifest(name)

    def victim_pod(self, job: str, index: int) -> str:
        return f"{job}-master-0" if index == 0 else f"{job}-worker-{index - 1}"

    def controller(self, namespace: str, log: Path) -> TrainingOperatorProcess:
        return TrainingOperatorProcess(self.kube, self.binary, self.kubeconfig, namespace, log, self.threads)


class ReplacementRecorder(scale.Recorder):
    """rljob's Recorder where a pod that replaces one of the same job and worker index in place (same gang
    generation) counts as generation 1, as the peer's do."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, int], int] = {}

    def identify(self, meta: dict[str, Any]) -> tuple[str, int, int] | None:
        identity = super().identify(meta)
        if identity is None:
            return None
        job, _, index = identity
        gen = self.seen.get((job, index), 0)
        self.seen[(job, index)] = gen + 1
        return job, gen, index


class RLJobPeerSide(scale.RLJobSide):
    """rljob's fixed-size jobs with the peer's failure (exit 137), so both sides meet the same fault, and
    checkpoints on object storage (durable): a failed worker, worker 0 included, is replaced alone (issue
    #48), as the peer replaces its pods. Any worker may fail, as any of the peer's pods may."""

    failure_exit_code = FAILURE_EXIT_CODE
    replacement_pods = 1

    def recorder(self) -> scale.Recorder:
        return ReplacementRecorder()

    def manifest(self, name: str) -> dict[str, Any]:
        doc = super().manifest(name)
        doc["spec"]["runtimeRef"] = {"name": scale.BENCH_S3_RUNTIME}  # checkpoints on object storage
        return doc


class RLJobElasticSide(RLJobPeerSide):
    """rljob's elastic jobs (``minReplicas: 2``, ``maxReplicas: 4``, checkpoints on object storage): a failed
    worker is replaced alone (issue #31; worker 0 too since issue #48)."""

    def __init__(self, kubeconfig: Path) -> None:
        super().__init__(kubeconfig, name="rljob-elastic")

    def manifest(self, name: str) -> dict[str, Any]:
        doc = super().manifest(name)
        doc["spec"]["workers"].update({"minReplicas": 2, "maxReplicas": scale.WORKERS})
        return doc


# ----------------------------------------------------------------------------------- runs


def run_pair(plane: scale.BenchControlPlane, kube: Any, sides: list[Any], audits: dict[str, scale.AuditLog],
             meter: scale.Meter, n: int, rep: int, args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    """Both sides at one burst size, one after the other (the first alternates), each with failures after."""
    order = sides if (rep + args.jobs.index(n)) % 2 == 0 else sides[::-1]  # alternating which side goes first
    burst_args = argparse.Namespace(**{**vars(args), "failures": min(args.failures, n)})
    runs = []
    for side in order:
        namespace = f"{side.name}-{n}-r{rep}"
        run = scale.run_burst(plane, kube, side, audits[side.name], meter, n, burst_args, logs,
                              with_failures=True, namespace=namespace)
        run["repetition"] = rep
        runs.append(run)
        scale.delete_namespace(kube, namespace, timeout=max(60, n))
    return runs


def _figures(run: dict[str, Any]) -> dict[str, float | None]:
    """The compared figures of one run: lower is better for each; "API <verb>" ones are the breakdown."""
    n = run["jobs"]
    up = [x for x in (run["all_running_s"], run["all_pods_ready_s"]) if x is not None]
    created = run["latency_s"]["pods_created"]
    failures = run.get("failures", {}).get("latency_s", {})
    burst = run["api_requests"]["burst"]
    out: dict[str, float | None] = {
        "all Running, s": max(up) if len(up) == 2 else None,
        "apply → 4 pods created p50, s": created["p50"], "apply → 4 pods created p99, s": created["p99"],
        "failure → replacement created p50, s": failures.get("replacement_created", {}).get("p50"),
        "failure → replacement created p99, s": failures.get("replacement_created", {}).get("p99"),
        "failure → replacement Ready p50, s": failures.get("replacement_ready", {}).get("p50"),
        "failure → replacement Ready p99, s": failures.get("replacement_ready", {}).get("p99"),
        "API requests per job, burst": burst["total"] / n,
        "controller CPU per job, burst, ms": 1000 * run["cpu_s"]["burst"].get("operator", float("nan")) / n,
        "controller peak RSS, MiB": run["operator_memory"]["peak_rss_mib"],
    }
    if "failures" in run:
        out["API requests per failure"] = run["api_requests"]["failures"]["total"] / run["failures"]["failures"]
        out["controller CPU per failure, ms"] = 1000 * run["cpu_s"]["failures"].get("operator", float("nan")) / \
            run["failures"]["failures"]
    for verb, count in burst["by_verb"].items():
        out[f"API {verb} per job, burst"] = count / n
    return out


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(float(statistics.median(present)), 3) if present else None


def summary_rows(runs: list[dict[str, Any]], load: float) -> list[dict[str, Any]]:
    """Per burst size and figure: the medians over repetitions of each side and the ratio peer ÷ rljob;
    ``load`` (the load average before the run) marks how busy the machine was."""
    rows: list[dict[str, Any]] = []
    ours_sides = [s for s in dict.fromkeys(r["side"] for r in runs) if s != "kubeflow"]
    for n in sorted({r["jobs"] for r in runs}):
        peer_figures = [_figures(r) for r in runs if r["jobs"] == n and r["side"] == "kubeflow"]
        for side in ours_sides:
            figures = [_figures(r) for r in runs if r["jobs"] == n and r["side"] == side]
            keys = list(dict.fromkeys(k for f in figures + peer_figures for k in f))
            for key in keys:
                ours = _median([f.get(key, 0.0) for f in figures])
                peer = _median([f.get(key, 0.0) for f in peer_figures])
                ratio = round(peer / ours, 2) if ours and peer is not None else None
                row: dict[str, Any] = {
                    "metric": f"N={n} ({len(figures)} rep., load {load:.1f} on {os.cpu_count()} cores): {key} — "
                              f"{side} / Kubeflow (ratio Kubeflow ÷ {side})",
                    "value": f"{ours} / {peer} ({ratio if ratio is not None else '—'}×)", "unit": ""}
                if not key.startswith("API ") or key.startswith("API requests"):  # the verbs are the breakdown
                    row.update(target="ratio ≥ 1", met=None if ratio is None else ratio >= 1.0)
                rows.append(row)
    return rows


def _result_name(value: str) -> str:
    """--result names a file in bench/results/: ASCII letters, digits and _ only, never a path."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", value):
        raise argparse.ArgumentTypeError(f"--result {value!r}: use letters, digits and _ (a name, not a path)")
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000], help="burst sizes, run in order")
    p.add_argument("--repeat", type=int, default=2, help="repetitions of each burst size (both sides each time)")
    p.add_argument("--failures", type=int, default=100, help="worker failures injected after each burst (≤ N)")
    p.add_argument("--failure-interval", type=float, default=0.1, help="seconds between injected failures")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle window after each burst")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each wait for Running")
    p.add_argument("--peer-threads", type=int, default=1, help="the training operator's --controller-threads")
    p.add_argument("--scheduler-qps", type=int, default=200, help="kube-scheduler --kube-api-qps (0: its default)")
    p.add_argument("--node-grace", type=int, default=40, help="node monitor grace period; heartbeats every 1/5")
    p.add_argument("--kwok-parallelism", type=int, default=4,
                   help="pod stages KWOK plays at once (its default 4; operator_scale's A/Bs use 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sides", nargs="+", default=["rljob", "kubeflow"], choices=["rljob", "rljob-elastic", "kubeflow"],
                   help="what runs at each burst, alternating: rljob (fixed-size jobs), rljob-elastic (elastic jobs, "
                        "2-4 workers), kubeflow; each replaces a failed pod alone")
    p.add_argument("--result", default="peer_scale", type=_result_name,
                   help="write bench/results/RESULT.json (a long burst kept beside the default run's file)")
    a = p.parse_args()
    a.jobs = sorted(a.jobs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    binary, module = peer_binary(), peer_module_dir()
    config = ClusterConfig(gpu_nodes=scale.NODES, node_shape=GpuNodeShape(gpus=scale.GPUS_PER_NODE),
                           node_monitor_grace_s=a.node_grace, start_timeout_s=300,
                           kwok_pod_parallelism=a.kwok_parallelism)
    plane = scale.BenchControlPlane(config, a.scheduler_qps, audit_users=[scale.OPERATOR_USER, PEER_USER])
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rljob-bench-peer-") as tmp:
        try:
            print(f"starting the control plane with {scale.NODES} KWOK nodes × {scale.GPUS_PER_NODE} GPUs", flush=True)
            plane.start(build_binaries=False)
            api_client = plane.api_client()
            kube = scale.Kube(api_client)
            scale.install_crd(kube)
            ours = scale.operator_kubeconfig(plane, kube)
            peer = KubeflowSide(kube, binary, install_peer(plane, kube, module), a.peer_threads)
            made = {"rljob": lambda: RLJobPeerSide(ours), "rljob-elastic": lambda: RLJobElasticSide(ours),
                    "kubeflow": lambda: peer}
            sides: list[Any] = [made[s]() for s in dict.fromkeys(a.sides)]
            audits = {s.name: scale.AuditLog(plane.audit_log, s.user) for s in sides}
            meter = scale.Meter(plane)
            for n in a.jobs:
                for rep in range(a.repeat):
                    runs.extend(run_pair(plane, kube, sides, audits, meter, n, rep, a, Path(tmp)))
            api_client.close()
        finally:
            plane.stop()
    rows = summary_rows(runs, load_before[0])
    path = write_result(a.result, {
        "config": {"nodes": scale.NODES, "gpus_per_node": scale.GPUS_PER_NODE, "pods_per_job": scale.WORKERS,
                   "bursts": a.jobs, "repetitions": a.repeat, "failures": a.failures,
                   "failure_exit_code": FAILURE_EXIT_CODE, "failure_interval_s": a.failure_interval,
                   "idle_seconds": a.idle_seconds,
                   "scheduler_qps": a.scheduler_qps or "default (50)", "node_monitor_grace_s": a.node_grace,
                   "kwok_pod_parallelism": a.kwok_parallelism,
                   "rljob": f"defaults ({scale.OperatorSettings.workers} reconcile workers, leader election); a service "
                            f"account bound to cluster-admin, {scale.credentials()}",
                   "kubeflow": f"training-operator {module.name.split('@')[1]}, --controller-threads="
                               f"{a.peer_threads}, client 20 req/s burst 30 (controller-runtime's default), no "
                               "leader election, webhook disabled; a service account bound to its ClusterRole",
                   "source": scale.source_state(),
                   "load_average_before": [round(x, 2) for x in load_before],
                   "load_average_after": [round(x, 2) for x in os.getloadavg()],
                   "wall_s": round(time.time() - started, 1)},
        "runs": runs,
        "summary": rows,
    })
    scale.print_table(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
