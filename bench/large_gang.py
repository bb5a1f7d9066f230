"""One large fixed-size job on the real control plane: N workers × 8 GPUs on KWOK nodes of 8 GPUs (issue #48, point 3).

For each gang size N (default 100, then 1,000), on one control plane with ``max(N) + 20`` KWOK nodes
of 8 ``nvidia.com/gpu`` each (one worker per node, as on 8-GPU machines; the spare nodes take the
replacements), a fresh operator (``bench/operator_scale.py``'s: production defaults, leader election,
a service account) runs one RLTrainingJob of N workers × 8 processes × 8 GPUs with checkpoints on
object storage (``s3://``: durable, so a failed worker other than worker 0 is replaced alone,
``docs/guides/elastic.md``) and ``backoffBaseSeconds: 0``. The benchmark records from watch streams:

* apply → all N pods created, all Ready, and the job Running;
* one worker (N/2) exiting 1 (KWOK's ``rljob.dev/fake-exit-code``): failure → its replacement
  created and Ready, and the job Running again; every other pod's UID unchanged;
* then 10 workers (not 0, not N/2) exiting 1 at once: the same, per replacement;
* for each failure phase, the operator's API requests (audit log, its user only) and CPU seconds
  per failure, from the injection until the job is Running again plus ``SETTLE_S``, with the
  idle rate measured just before (the operator's own resyncs) beside it;
* the job object's size (JSON bytes, its ``status`` alone, ``lastFailure.replacedPods`` entries,
  conditions) and the Events about the job, after each phase.

The summary puts both sizes side by side with the ratio N=1,000 ÷ N=100: requests and CPU per
failure should not grow with the gang (ratio ≈ 1), nor should the status (no per-worker list).

With ``--peer``, Kubeflow's training operator (``bench/peer_scale.py``'s process, RBAC and webhook set-up)
runs a PyTorchJob of the same shape at each size too (Master × 1 + Worker × (N - 1), 8 GPUs each,
``restartPolicy: ExitCode``, failures exit 137), alternating which side goes first; each run in its own
namespace, deleted before the next. The peer replaces the failed pod under its name; its job is back when
the replacement is Ready (its Running condition need not drop for one pod).

    python -m bench.large_gang [--sizes 100 1000] [--burst-failures 10] [--node-grace 120] [--peer]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench import operator_scale as scale
from bench import peer_scale
from bench.common import write_result
from tests.cluster.controlplane import ClusterConfig
from tests.cluster.nodes import GPU_RESOURCE, GpuNodeShape

GPUS_PER_WORKER = 8
SPARE_NODES = 20
SETTLE_S = 3.0  # after the job is Running again: the failure's Events and last status write
IDLE_S = 10.0  # the operator's own background rate, measured before each failure phase
JOB = "large"


class GangRecorder:
    """Each worker pod (by UID) and when it was created, Ready, failed, deleted; the job's phases in order."""

    def __init__(self, side: Any) -> None:
        self.side = side
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}
        self.phases: list[tuple[float, str]] = []
        self.pod_events: list[float] = []  # when each pod watch event arrived (what the operator's watch sees too)

    def on_pod(self, t: float, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        index = self.side.index(meta.get("labels") or {})
        if index is None:
            return
        with self.lock:
            self.pod_events.append(t)
            rec = self.pods.setdefault(meta["uid"], {"index": index,
                                                     "name": meta["name"], "created": t})
            if scale.pod_ready(pod):
                rec.setdefault("ready", t)
            if (pod.get("status") or {}).get("phase") == "Failed":
                rec.setdefault("failed", t)
            if kind == "DELETED":
                rec.setdefault("deleted", t)

    def on_job(self, t: float, kind: str, job: dict[str, Any]) -> None:
        phase = self.side.phase(job)
        with self.lock:
            if not self.phases or self.phases[-1][1] != phase:
                self.phases.append((t, phase))

    def live(self) -> dict[int, dict[str, Any]]:
        """Worker index → its newest pod not deleted."""
        with self.lock:
            out: dict[int, dict[str, Any]] = {}
            for uid, rec in self.pods.items():
                if "deleted" not in rec and (rec["index"] not in out or rec["created"] > out[rec["index"]]["created"]):
                    out[rec["index"]] = {**rec, "uid": uid}
            return out

    def running_since(self, after: float) -> float | None:
        """When the job last turned Running, if it is Running now and turned so after ``after``."""
        with self.lock:
            if self.phases and self.phases[-1][1] == "Running" and self.phases[-1][0] > after:
                return self.phases[-1][0]
            return None

    def pod_events_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.pod_events if start <= t < end)

    def left_running_after(self, after: float) -> bool:
        with self.lock:
            return any(t > after and phase != "Running" for t, phase in self.phases)


def large_job(n: int) -> dict[str, Any]:
    """N workers × 8 processes × 8 GPUs, checkpoints on object storage, no backoff before a restart, and a
    ``backoffLimit`` that outlasts the benchmark's failures: each replacement decision counts one restart, and
    the 10 failures at once may be met by more than one (each reconcile replaces the failures its watch shows)."""
    doc = scale.helpers.job_manifest(JOB, n, {"runtimeRef": {"name": scale.BENCH_S3_RUNTIME},
                                              "runPolicy": {"backoffBaseSeconds": 0, "backoffLimit": 100}})
    doc["spec"]["workers"].update({"procsPerWorker": GPUS_PER_WORKER, "gpusPerWorker": GPUS_PER_WORKER})
    return doc


class RLJobGang:
    """rljob's operator and one RLTrainingJob (``large_job``); the job is back once its phase turns Running."""

    name, kind, user, exit_code = "rljob", "RLTrainingJob", scale.OPERATOR_USER, "1"
    back_when_running = True

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def jobs_path(self, namespace: str) -> str:
        return scale.Kube.job_path(namespace)

    def manifest(self, n: int) -> dict[str, Any]:
        return large_job(n)

    def index(self, labels: dict[str, str]) -> int | None:
        return int(labels[scale.LABEL_WORKER_INDEX]) if scale.LABEL_WORKER_INDEX in labels else None

    def phase(self, job: dict[str, Any]) -> str:
        return str((job.get("status") or {}).get("phase") or "")

    def controller(self, namespace: str, log: Path) -> Any:
        return scale.OperatorProcess(self.kubeconfig, namespace, log)


class KubeflowGang:
    """Kubeflow's training operator (``bench/peer_scale.py``) and one PyTorchJob of the same shape: Master × 1 +
    Worker × (N - 1), 8 GPUs each, ``restartPolicy: ExitCode``; index 0 is the master. A failure exits 137
    (retryable for it). Its job's Running condition may never drop for one pod, so a replacement is back once
    Ready."""

    name, kind, user, exit_code = "kubeflow", "PyTorchJob", peer_scale.PEER_USER, peer_scale.FAILURE_EXIT_CODE
    back_when_running = False

    def __init__(self, kube: Any, binary: Path, kubeconfig: Path, threads: int) -> None:
        self.kube, self.binary, self.kubeconfig, self.threads = kube, binary, kubeconfig, threads

    def jobs_path(self, namespace: str) -> str:
        return f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs"

    def manifest(self, n: int) -> dict[str, Any]:
        doc = peer_scale.pytorchjob_manifest(JOB)
        specs = doc["spec"]["pytorchReplicaSpecs"]
        specs["Worker"]["replicas"] = n - 1
        for spec in specs.values():
            spec["template"]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] = GPUS_PER_WORKER
        return doc

    def index(self, labels: dict[str, str]) -> int | None:
        if peer_scale.LABEL_JOB_NAME not in labels or peer_scale.LABEL_REPLICA_INDEX not in labels:
            return None
        master = labels.get(peer_scale.LABEL_REPLICA_TYPE, "").lower() == "master"
        return int(labels[peer_scale.LABEL_REPLICA_INDEX]) + (0 if master else 1)

    def phase(self, job: dict[str, Any]) -> str:
        return peer_scale.PeerRecorder().job_state(job)[0]

    def controller(self, namespace: str, log: Path) -> Any:
        return peer_scale.TrainingOperatorProcess(self.kube, self.binary, self.kubeconfig, namespace, log,
                                                  self.threads)


def job_shape(kube: Any, namespace: str, side: Any) -> dict[str, Any]:
    """The job object's size and what its status holds; the Events about the job."""
    job = kube.request("GET", f"{side.jobs_path(namespace)}/{JOB}")
    status = job.get("status") or {}
    events = kube.request("GET", kube.core_path(namespace, "events"), query={
        "fieldSelector": f"involvedObject.kind={side.kind},involvedObject.name={JOB}"})["items"]
    return {"object_bytes": len(json.dumps(job, separators=(",", ":"))),
            "status_bytes": len(json.dumps(status, separators=(",", ":"))),
            "status_keys": sorted(status),
            "replaced_pods": len((status.get("lastFailure") or {}).get("replacedPods") or []),
            "conditions": len(status.get("conditions") or []),
            "events": len(events), "event_count_sum": sum(int(e.get("count") or 1) for e in events),
            "event_reasons": sorted({e.get("reason") or "" for e in events}),
            "phase": status.get("phase"), "restarts": status.get("restarts")}


def fail_workers(kube: Any, namespace: str, recorder: GangRecorder, indexes: list[int], audit: scale.AuditLog,
                 meter: scale.Meter, operator: Any, timeout: float) -> dict[str, Any]:
    """Make ``indexes``' pods exit 1 at once; time each replacement and check every other pod kept its UID."""
    before = recorder.live()
    t_idle = time.time()
    snap_idle = meter.snapshot()
    time.sleep(IDLE_S)
    snap_start = meter.snapshot()
    reconciles_before = operator.reconciles()
    t_inject = time.time()
    victims = {i: before[i] for i in indexes}
    side = recorder.side
    scale.inject_on_schedule(lambda i: scale.fail_pod(kube, namespace, victims[i]["name"], side.exit_code,
                                                      uid=victims[i]["uid"]),
                             indexes, 0.0)

    def ready_again() -> float | None:
        """When the last replacement turned Ready; None while one is not."""
        live = recorder.live()
        if not all(i in live and live[i]["uid"] != victims[i]["uid"] and "ready" in live[i] for i in indexes):
            return None
        return max(live[i]["ready"] for i in indexes)

    def replaced() -> bool:
        return ready_again() is not None and (not side.back_when_running
                                              or recorder.running_since(t_inject) is not None)

    done = scale.wait_until(replaced, timeout, [operator.check_alive], f"{len(indexes)} replacements Ready")
    t_back = (recorder.running_since(t_inject) if side.back_when_running else ready_again()) if done else time.time()
    time.sleep(max(0.0, (t_back or time.time()) + SETTLE_S - time.time()))
    snap_end = meter.snapshot()
    t_end = time.time()
    reconciles = {k: round(v - reconciles_before.get(k, 0.0), 3) for k, v in operator.reconciles().items()
                  if k in ("ok", "error", "seconds")}
    after = recorder.live()
    with recorder.lock:
        failed = {i: recorder.pods[victims[i]["uid"]].get("failed") for i in indexes}
    created = [after[i]["created"] - failed[i] for i in indexes if failed[i] and after[i]["uid"] != victims[i]["uid"]]
    ready = [after[i]["ready"] - failed[i] for i in indexes
             if failed[i] and after[i]["uid"] != victims[i]["uid"] and "ready" in after[i]]
    others = [i for i in before if i not in indexes]
    changed = [i for i in others if after.get(i, {}).get("uid") != before[i]["uid"]]
    first_failed = min((t for t in failed.values() if t), default=t_inject)
    cpu = scale.Meter.delta(snap_start, snap_end)
    idle_cpu = scale.Meter.delta(snap_idle, snap_start)
    requests = audit.window(t_inject, t_end)
    idle = audit.window(t_idle, t_inject)
    count = len(indexes)
    return {
        "failures": count, "indexes": indexes, "all_replaced": done,
        "replacement_created_s": scale.distribution(created), "replacement_ready_s": scale.distribution(ready),
        "job_running_again_s": round(t_back - first_failed, 3) if done and t_back else None,
        "gang_restarted": recorder.left_running_after(t_inject) and bool(changed),
        "other_pods": len(others), "other_pods_changed": len(changed),
        "window_s": round(t_end - t_inject, 2), "idle_window_s": round(t_inject - t_idle, 2),
        "api_requests": requests, "idle_api_requests": idle,
        "requests_per_failure": round(requests["total"] / count, 2),
        "idle_requests_per_s": round(idle["total"] / max(t_inject - t_idle, 1e-9), 2),
        "cpu_s": cpu, "idle_cpu_s": idle_cpu,
        "operator_reconciles": reconciles, "pod_watch_events": recorder.pod_events_between(t_inject, t_end),
        "operator_cpu_ms_per_failure": round(1000 * cpu.get("operator", float("nan")) / count, 1),
        "idle_operator_cpu_ms_per_s": round(1000 * idle_cpu.get("operator", float("nan"))
                                            / max(t_inject - t_idle, 1e-9), 1),
    }


def run_size(plane: scale.BenchControlPlane, kube: Any, side: Any, audit: scale.AuditLog,
             meter: scale.Meter, n: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One job of ``n`` workers with a fresh operator in a fresh namespace: start, one failure, a burst of failures."""
    namespace = f"large-gang-{side.name}-{n}"
    scale.create_namespace(kube, namespace)
    recorder = GangRecorder(side)
    watches = [scale.Watch(plane, f"/api/v1/namespaces/{namespace}/pods", recorder.on_pod),
               scale.Watch(plane, side.jobs_path(namespace), recorder.on_job)]
    operator = side.controller(namespace, logs / f"{side.name}-{n}.log")
    result: dict[str, Any] = {"side": side.name, "workers": n, "gpus_per_worker": GPUS_PER_WORKER, "namespace": namespace}
    try:
        for w in watches:
            w.start()
            w.listed.wait(30)
        operator.start()
        meter.operator = psutil.Process(operator.pid)
        operator.wait_leader(timeout=90)
        time.sleep(2)
        snap = meter.snapshot()
        print(f"N={n} ({side.name}): applying one job of {n} workers × {GPUS_PER_WORKER} GPUs", flush=True)
        t_apply = time.time()
        kube.request("POST", side.jobs_path(namespace), side.manifest(n))

        def started() -> bool:
            live = recorder.live()
            return len(live) == n and all("ready" in p for p in live.values()) and recorder.running_since(t_apply) is not None

        up = scale.wait_until(started, args.timeout, [operator.check_alive], f"{n} workers Ready, job Running")
        live = recorder.live()
        cpu = scale.Meter.delta(snap, meter.snapshot())
        requests = audit.window(t_apply, time.time())
        result["start"] = {
            "all_running": bool(up),
            "all_pods_created_s": round(max(p["created"] for p in live.values()) - t_apply, 2) if len(live) == n else None,
            "all_pods_ready_s": round(max(p.get("ready", 0.0) for p in live.values()) - t_apply, 2) if up else None,
            "job_running_s": round((recorder.running_since(t_apply) or 0.0) - t_apply, 2) if up else None,
            "api_requests": requests, "cpu_s": cpu, "operator_rss_kib": scale._proc_status(operator.pid)}
        print(f"  created in {result['start']['all_pods_created_s']}s, Running in {result['start']['job_running_s']}s",
              flush=True)
        result["shape_started"] = job_shape(kube, namespace, side)
        if not up:
            return result
        rng = random.Random(args.seed)
        single = [n // 2]
        result["one_failure"] = fail_workers(kube, namespace, recorder, single, audit, meter, operator, args.timeout)
        result["shape_after_one"] = job_shape(kube, namespace, side)
        print(f"  one failure: replacement Ready in {result['one_failure']['replacement_ready_s']['max']}s, "
              f"{result['one_failure']['requests_per_failure']} requests", flush=True)
        burst = rng.sample([i for i in range(1, n) if i not in single], min(args.burst_failures, n - 2))
        result["burst_failures"] = fail_workers(kube, namespace, recorder, sorted(burst), audit, meter, operator,
                                                args.timeout)
        result["shape_after_burst"] = job_shape(kube, namespace, side)
        print(f"  {len(burst)} failures: replacements Ready p99 "
              f"{result['burst_failures']['replacement_ready_s']['p99']}s, "
              f"{result['burst_failures']['requests_per_failure']} requests per failure", flush=True)
        result["operator_peak_rss_mib"] = round(scale._proc_status(operator.pid).get("VmHWM", 0) / 1024, 1)
    finally:
        operator.stop()
        meter.operator = None
        for w in watches:
            w.stop()
        result["operator_log_tail"] = operator.log_tail(5)
    return result


def _pick(run: dict[str, Any], path: str) -> float | None:
    value: Any = run
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


#: (row label, path in a run): the figures compared across gang sizes.
FIGURES = [
    ("apply → all pods created, s", "start.all_pods_created_s"),
    ("apply → all pods Ready, s", "start.all_pods_ready_s"),
    ("apply → job Running, s", "start.job_running_s"),
    ("one failure → replacement created, s", "one_failure.replacement_created_s.max"),
    ("one failure → replacement Ready, s", "one_failure.replacement_ready_s.max"),
    ("one failure → job Running again, s", "one_failure.job_running_again_s"),
    ("one failure: other pods replaced", "one_failure.other_pods_changed"),
    ("one failure: operator API requests", "one_failure.requests_per_failure"),
    ("one failure: operator CPU, ms", "one_failure.operator_cpu_ms_per_failure"),
    ("10 at once → replacements created p50, s", "burst_failures.replacement_created_s.p50"),
    ("10 at once → replacements created max, s", "burst_failures.replacement_created_s.max"),
    ("10 at once → replacements Ready max, s", "burst_failures.replacement_ready_s.max"),
    ("10 at once → job Running again, s", "burst_failures.job_running_again_s"),
    ("10 at once: other pods replaced", "burst_failures.other_pods_changed"),
    ("one failure: the operator's reconciles", "one_failure.operator_reconciles.ok"),
    ("one failure: seconds in reconciles", "one_failure.operator_reconciles.seconds"),
    ("one failure: pod watch events", "one_failure.pod_watch_events"),
    ("10 at once: operator API requests per failure", "burst_failures.requests_per_failure"),
    ("10 at once: operator CPU per failure, ms", "burst_failures.operator_cpu_ms_per_failure"),
    ("idle (before the failures): operator API requests/s", "burst_failures.idle_requests_per_s"),
    ("idle: operator CPU, ms/s", "burst_failures.idle_operator_cpu_ms_per_s"),
    ("job object, bytes (after the failures)", "shape_after_burst.object_bytes"),
    ("job status, bytes (after the failures)", "shape_after_burst.status_bytes"),
    ("status.lastFailure.replacedPods entries", "shape_after_burst.replaced_pods"),
    ("status.conditions", "shape_after_burst.conditions"),
    ("Events about the job (objects)", "shape_after_burst.events"),
    ("operator peak RSS, MiB", "operator_peak_rss_mib"),
]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{b / a:.2f}×" if a and b is not None else "—"


def summary_rows(runs: list[dict[str, Any]], load: float) -> list[dict[str, Any]]:
    """Per side and figure: each size's value and the ratio largest ÷ smallest (≈ 1: does not grow with the
    gang); with the peer, per size and figure: rljob's, the peer's, and the ratio peer ÷ rljob (> 1: rljob better)."""
    where = f"one job × {GPUS_PER_WORKER} GPUs/worker (load {load:.1f} on {os.cpu_count()} cores)"
    rows = []
    sides = list(dict.fromkeys(r["side"] for r in runs))
    for side in sides:
        mine = [r for r in runs if r["side"] == side]
        small, large = mine[0], mine[-1]
        tag = "" if side == "rljob" else f" [{side}]"
        for label, path in FIGURES:
            a, b = _pick(small, path), _pick(large, path)
            rows.append({"metric": f"{where}{tag}: {label} — N={small['workers']} / N={large['workers']} (ratio)",
                         "value": f"{a} / {b} ({_ratio(a, b)})", "unit": ""})
    if "kubeflow" in sides and "rljob" in sides:
        for n in dict.fromkeys(r["workers"] for r in runs):
            ours = next(r for r in runs if r["side"] == "rljob" and r["workers"] == n)
            peer = next(r for r in runs if r["side"] == "kubeflow" and r["workers"] == n)
            for label, path in FIGURES:
                a, b = _pick(ours, path), _pick(peer, path)
                if a is None and b is None:
                    continue
                rows.append({"metric": f"{where}, N={n}: {label} — rljob / Kubeflow (ratio Kubeflow ÷ rljob)",
                             "value": f"{a} / {b} ({_ratio(a, b)})", "unit": ""})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="workers of the job, run in order")
    p.add_argument("--burst-failures", type=int, default=10, help="workers failing at once after the single failure")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each wait")
    p.add_argument("--scheduler-qps", type=int, default=200, help="kube-scheduler --kube-api-qps (0: its default)")
    p.add_argument("--node-grace", type=int, default=120,
                   help="node monitor grace period (heartbeats every 1/5): ~1,000 nodes' heartbeats on 2 cores")
    p.add_argument("--kwok-parallelism", type=int, default=4, help="pod stages KWOK plays at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", default="large_gang", help="write bench/results/RESULT.json")
    p.add_argument("--peer", action="store_true",
                   help="also Kubeflow's training operator's PyTorchJob of each size (alternating which goes first; "
                        "its binary: tools/build-binaries.sh --peers, ~6 min once)")
    p.add_argument("--peer-threads", type=int, default=1, help="the training operator's --controller-threads")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    sizes = sorted(a.sizes)
    nodes = sizes[-1] + SPARE_NODES
    config = ClusterConfig(gpu_nodes=nodes, node_shape=GpuNodeShape(gpus=GPUS_PER_WORKER),
                           node_monitor_grace_s=a.node_grace, start_timeout_s=900,
                           kwok_pod_parallelism=a.kwok_parallelism)
    peer = (peer_scale.peer_binary(), peer_scale.peer_module_dir()) if a.peer else None
    plane = scale.BenchControlPlane(config, a.scheduler_qps,
                                    audit_users=[scale.OPERATOR_USER] + ([peer_scale.PEER_USER] if peer else []))
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rljob-bench-large-") as tmp:
        try:
            print(f"starting the control plane with {nodes} KWOK nodes × {GPUS_PER_WORKER} {GPU_RESOURCE}", flush=True)
            plane.start(build_binaries=False)
            print(f"  up in {time.time() - started:.0f}s", flush=True)
            api_client = plane.api_client()
            kube = scale.Kube(api_client)
            scale.install_crd(kube)
            sides: list[Any] = [RLJobGang(scale.operator_kubeconfig(plane, kube))]
            if peer is not None:
                sides.append(KubeflowGang(kube, peer[0], peer_scale.install_peer(plane, kube, peer[1]), a.peer_threads))
            audits = {s.name: scale.AuditLog(plane.audit_log, s.user) for s in sides}
            meter = scale.Meter(plane)
            for i, n in enumerate(sizes):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    runs.append(run_size(plane, kube, side, audits[side.name], meter, n, a, Path(tmp)))
                    scale.delete_namespace(kube, runs[-1]["namespace"], timeout=max(120, n))
            api_client.close()
        finally:
            plane.stop()
    rows = summary_rows(runs, load_before[0])
    path = write_result(a.result, {
        "config": {"nodes": nodes, "gpus_per_node": GPUS_PER_WORKER, "gpus_per_worker": GPUS_PER_WORKER,
                   "sizes": sizes, "burst_failures": a.burst_failures, "failure_exit_code": 1,
                   "checkpoint": "s3 (durable): one-pod replacement", "backoff_base_s": 0,
                   "scheduler_qps": a.scheduler_qps or "default (50)", "node_monitor_grace_s": a.node_grace,
                   "kwok_pod_parallelism": a.kwok_parallelism, "idle_window_s": IDLE_S, "settle_s": SETTLE_S,
                   "operator": f"defaults ({scale.OperatorSettings.workers} reconcile workers, leader election); "
                               "a service account bound to cluster-admin",
                   "peer": (f"training-operator {peer[1].name.split('@')[1]}, --controller-threads={a.peer_threads}, "
                            "client 20 req/s burst 30, no leader election, webhook disabled (bench/peer_scale.py)")
                           if peer else "not run (--peer)",
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
