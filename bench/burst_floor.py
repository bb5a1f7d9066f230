"""Apply → pods created at 100 jobs: the operator beside the floor with essentials, in one run.

#17's burst target (apply → 4 worker pods created p99 ≤ 2 s at 100 jobs) is below this machine's
floor even for a controller that costs nothing (``bench/reaction_floor.py``). Restated (issue 31):
the operator's p99 ≤ 1.5× that of a zero-cost controller that sends what a controller people can
act on must send, measured on the same control plane in the same run, the sides alternating
(floor, operator, operator, floor, ...), each burst in a fresh namespace; medians per side.

**The floor with essentials** sends, per job, the requests of the operator's own first reconcile
and of its Running write, in the operator's order, and nothing else: as the job's create returns
(no watch, no queue), one of W threads patches the status the operator's plan writes first,
creates the ConfigMap, Service and NetworkPolicy together, then the 4 pods together (through R
request threads shared by all jobs), then posts the plan's Events (from 4 threads of their own, as
the operator does); when the pod watch shows the gang Ready it patches the status Running and posts
that Event. The plan is the operator's
(``plan_reconcile``), computed before the burst for each job's manifest (the job's uid is filled
in when its create returns), so the floor pays nothing for it. It acts as the operator's service
account, so API Priority and Fairness and RBAC treat both alike and the audit log records both.

**Where the time goes**, per job and side, from the audit log (the operator's user only) and the
client's clock (one machine: one clock): *reaction* (create sent → the first request about the job
reaches the API server: for the operator, its watch, queue and planning), *before pods* (→ the first
pod create reaches it: the status write and the children), *pods* (→ the last pod create
answered). And the operator's own counters: reconciles in the burst, the seconds they took, the
queue waits per tier.

The bare floor of ``bench/reaction_floor.py`` (each job's 4 pods and nothing else, 32 threads)
runs beside them, so one run shows what the essentials cost and what the operator adds. Two floors
with essentials by default: W:R = 16:8 (the operator's concurrency until 2026-12-03: 16 reconcile
workers; it now runs 32) and 32:32; the ratio is taken against the lower of the two.

    python -m bench.burst_floor [--jobs 100] [--repeats 2] [--floor-threads 16:8 32:32] [--against REV]

``--against REV`` adds commit REV's operator (a git worktree) as a third side, for A/Bs of a change.
Results: bench/results/burst_floor.json (``--result NAME``: NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from rljob_contract.job import parse_job
from rljob_operator.cluster.kube import FIELD_MANAGER, Kube
from rljob_operator.cluster.reconciler import EVENT_THREADS
from rljob_operator.decisions.children import JobNetwork
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.names import LABEL_GANG_GENERATION, LABEL_JOB, StatusEndpoint
from rljob_operator.server.tls import self_signed
from rljob_operator.settings import OperatorSettings
from rljob_operator.times import rfc3339

from bench.common import REPO, write_result
from bench.operator_scale import (
    GPUS_PER_NODE,
    NODES,
    WORKERS,
    AuditLog,
    BenchControlPlane,
    Meter,
    Recorder,
    RLJobSide,
    Watch,
    bench_plane,
    create_namespace,
    delete_namespace,
    distribution,
    gang_latencies,
    install_crd,
    job_manifest,
    operator_kubeconfig,
    percentile,
    pod_ready,
    run_burst,
    source_state,
)
from bench.reaction_floor import floor_burst as bare_burst

#: The restated target: the operator's apply → pods created p99 over the floor's with essentials.
TARGET_RATIO = 1.5
UID_PLACEHOLDER = "00000000-0000-4000-8000-0000000000ff"


def planned(name: str, namespace: str, endpoint: StatusEndpoint, network: JobNetwork | None) -> str:
    """The operator's plan for a new job ``name``, as JSON with the uid left to fill in."""
    manifest = job_manifest(name)
    manifest["metadata"].update(namespace=namespace, uid=UID_PLACEHOLDER, generation=1,
                                creationTimestamp=rfc3339(datetime.now(UTC)))
    plan = plan_reconcile(parse_job(manifest), [], datetime.now(UTC), endpoint, network=network)
    assert plan.children is not None and len(plan.create_pods) == WORKERS, f"{name}: not a new gang"
    children = [plan.children.configmap, plan.children.service]
    if plan.children.networkpolicy is not None:
        children.append(plan.children.networkpolicy)
    return json.dumps({"status": plan.status, "children": children, "pods": plan.create_pods,
                       "events": [[e.type, e.reason, e.message] for e in plan.events]})


class EssentialsFloor:
    """The floor's controller: each job's requests as its create returns, and its Running write from the pod watch."""

    def __init__(self, kube: Kube, namespace: str, plans: dict[str, str], workers: int, requests: int) -> None:
        self.kube, self.namespace, self.plans = kube, namespace, plans
        self.workers = ThreadPoolExecutor(max_workers=workers)
        self.requests = ThreadPoolExecutor(max_workers=requests)
        self.events = ThreadPoolExecutor(max_workers=EVENT_THREADS)  # as the operator's: off the workers
        self.lock = threading.Lock()
        self.jobs: dict[str, dict[str, Any]] = {}  # name -> the created job
        self.ready: dict[str, set[str]] = {}
        self.started: list[Future[None]] = []
        self.running_written = 0
        self.errors: list[str] = []

    def created(self, raw: dict[str, Any]) -> None:
        name = raw["metadata"]["name"]
        with self.lock:
            self.jobs[name] = raw
        self.started.append(self.workers.submit(self._try, name, self._start, raw))

    def _start(self, raw: dict[str, Any]) -> None:
        name = raw["metadata"]["name"]
        plan = json.loads(self.plans[name].replace(UID_PLACEHOLDER, raw["metadata"]["uid"]))
        self.kube.patch_job_status(self.namespace, name, plan["status"])
        children = [self.requests.submit(self.kube.request, "POST", Kube.child_path(c), c,
                                         query={"fieldManager": FIELD_MANAGER}) for c in plan["children"]]
        for child in children:
            child.result()
        for pod in self.requests.map(self.kube.create_pod, plan["pods"]):
            assert pod
        self.events.submit(self._try, name, self._events, raw, plan["events"], rfc3339(datetime.now(UTC)))

    def _events(self, raw: dict[str, Any], events: list[list[str]], now: str) -> None:
        for type_, reason, message in events:
            self.kube.post_event(raw, type_, reason, message, now)

    def on_pod(self, t: float, kind: str, pod: dict[str, Any]) -> None:
        labels = pod["metadata"].get("labels") or {}
        job = labels.get(LABEL_JOB)
        if job is None or kind == "DELETED" or labels.get(LABEL_GANG_GENERATION) != "0" or not pod_ready(pod):
            return
        with self.lock:
            ready = self.ready.setdefault(job, set())
            if len(ready) == WORKERS:
                return
            ready.add(pod["metadata"]["name"])
            if len(ready) < WORKERS:
                return
        self.workers.submit(self._try, job, self._running, job)

    def _running(self, job: str) -> None:
        self.kube.patch_job_status(self.namespace, job, {
            "phase": "Running", "reason": "GangReady", "message": f"all {WORKERS} workers are ready",
            "readyWorkers": WORKERS})
        self.events.submit(self._try, job, self._events, self.jobs[job], [[
            "Normal", "GangReady", f"Starting → Running: all {WORKERS} workers are ready"]], rfc3339(datetime.now(UTC)))
        with self.lock:
            self.running_written += 1

    def _try(self, what: str, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as error:  # noqa: BLE001 - counted and reported
            self.errors.append(f"{what}: {error}")

    def close(self) -> None:
        self.workers.shutdown(wait=True, cancel_futures=False)
        self.requests.shutdown(wait=True)
        self.events.shutdown(wait=True)


def floor_burst(plane: BenchControlPlane, kube: Kube, meter: Meter, audit: AuditLog, n: int, namespace: str,
                endpoint: StatusEndpoint, network: JobNetwork | None, timeout: float, threads: str) -> dict[str, Any]:
    """One burst of ``n`` jobs with the floor's controller (``threads``: "WORKERS:REQUESTS"); the same
    shape as ``run_burst``'s result."""
    create_namespace(kube, namespace)
    names = [f"job-{i:04d}" for i in range(n)]
    plans = {name: planned(name, namespace, endpoint, network) for name in names}
    workers, requests = (int(x) for x in threads.split(":"))
    floor = EssentialsFloor(kube, namespace, plans, workers, requests)
    recorder = Recorder()

    def on_pod(t: float, kind: str, pod: dict[str, Any]) -> None:
        recorder.on_pod(t, kind, pod)
        floor.on_pod(t, kind, pod)

    watches = [Watch(plane, f"/api/v1/namespaces/{namespace}/pods", on_pod),
               Watch(plane, Kube.job_path(namespace), recorder.on_job)]
    for w in watches:
        w.start()
        w.listed.wait(30)
    sent: dict[str, float] = {}

    def create(name: str) -> None:
        sent[name] = time.time()
        floor.created(kube.request("POST", Kube.job_path(namespace), job_manifest(name)))

    try:
        before = meter.snapshot()
        t_burst = time.time()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, names))
        deadline = time.monotonic() + timeout
        while floor.running_written + len(floor.errors) < n and time.monotonic() < deadline:
            time.sleep(0.25)
        t_end = time.time()
        cpu = Meter.delta(before, meter.snapshot())
    finally:
        floor.close()
        for w in watches:
            w.stop()
    latencies = gang_latencies(recorder, sent, 0)
    created = latencies["pods_created"]
    print(f"  floor {threads} N={n}: {len(created)}/{n} gangs created; apply → pods created p50 "
          f"{percentile(created, 50) or float('nan'):.2f}s p99 {percentile(created, 99) or float('nan'):.2f}s; "
          f"{len(floor.errors)} errors", flush=True)
    time.sleep(0.5)
    return {"side": f"floor {threads}", "jobs": n, "namespace": namespace, "errors": floor.errors[:20],
            "running_written": floor.running_written, "all_running_s": round(t_end - t_burst, 2),
            "latency_s": {k: distribution(v) for k, v in latencies.items()},
            "raw_latency_s": {"pods_created": [round(x, 3) for x in created]},
            "cpu_s": {"burst": cpu}, "api_requests": {"burst": audit.window(t_burst, t_end + 5)},
            "where": where_the_time_goes(audit, namespace, sent)}


def where_the_time_goes(audit: AuditLog, namespace: str, sent: dict[str, float]) -> dict[str, Any]:
    """Per job, seconds from its create sent to its first request at the API server (*reaction*),
    from there to its first pod create received (*before_pods*), and to its last pod create
    answered (*pods*); distributions over the jobs."""
    audit.read()
    mine: dict[str, list[dict[str, Any]]] = {}
    for r in audit.requests.values():
        if r["namespace"] != namespace or not r.get("name") or r["verb"] not in ("create", "patch"):
            continue
        job = r["name"].split("-worker-")[0] if r["resource"] == "pods" else r["name"]
        mine.setdefault(job, []).append(r)
    out: dict[str, list[float]] = {"reaction": [], "before_pods": [], "pods": []}
    for job, start in sent.items():
        requests = [r for r in mine.get(job, []) if r["resource"] != "events"]
        pods = [r for r in requests if r["resource"] == "pods" and r["latency"] is not None]
        if not requests or len(pods) < WORKERS:
            continue
        first = min(r["t"] for r in requests)
        first_pod = min(r["t"] for r in pods)
        out["reaction"].append(first - start)
        out["before_pods"].append(first_pod - first)
        out["pods"].append(max(r["t"] + r["latency"] for r in pods) - first_pod)
    return {k: distribution(v) for k, v in out.items()}


def operator_burst(plane: BenchControlPlane, kube: Kube, side: RLJobSide, audit: AuditLog, meter: Meter,
                   n: int, namespace: str, logs: Path, timeout: float) -> dict[str, Any]:
    """``run_burst`` of ``operator_scale``, without its idle window and failures, plus where the time went."""
    args = argparse.Namespace(timeout=timeout, idle_seconds=0.0, failures=0)
    sent: dict[str, float] = {}
    result = run_burst(plane, kube, side, audit, meter, n, args, logs, with_failures=False, namespace=namespace,
                       sent_out=sent)
    result["where"] = where_the_time_goes(audit, namespace, sent)
    return result


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summary(runs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Per side, the medians over its runs; the operator's p99 over the floor's, against the target."""
    sides = list(dict.fromkeys(r["side"] for r in runs))
    rows: list[dict[str, Any]] = []
    p99: dict[str, float | None] = {}
    for side in sides:
        mine = [r for r in runs if r["side"] == side]
        p99[side] = _median([r["latency_s"]["pods_created"]["p99"] for r in mine])
        p50 = _median([r["latency_s"]["pods_created"]["p50"] for r in mine])
        rows.append({"metric": f"{side}, {n} jobs: apply → {WORKERS} pods created p50 / p99 (median of "
                               f"{len(mine)} bursts; each: {', '.join(str(r['latency_s']['pods_created']['p99']) for r in mine)})",
                     "value": f"{p50} / {p99[side]}", "unit": "s"})
        if "where" not in mine[0]:  # the bare floor: its requests are the 4 pod creates
            continue
        per_job = _median([r["api_requests"]["burst"]["total"] / n for r in mine])
        parts = "; ".join(f"{k} p50 {_median([r['where'][k]['p50'] for r in mine])} / p99 "
                          f"{_median([r['where'][k]['p99'] for r in mine])}" for k in ("reaction", "before_pods", "pods"))
        rows.append({"metric": f"{side}: where a job's time goes (s): {parts}; API requests per job",
                     "value": per_job, "unit": "requests"})
    floors = [side for side in sides if side.startswith("floor") and p99[side]]
    best = min(floors, key=lambda side: p99[side] or 0.0) if floors else None
    for side in sides:
        if side.startswith(("floor", "bare")) or best is None:
            continue
        ratio = round(p99[side] / p99[best], 2) if p99[side] else None  # type: ignore[operator]
        rows.append({"metric": f"{side} ÷ the lower floor with essentials ({best}), apply → pods created p99 "
                               f"at {n} jobs", "value": ratio, "unit": "×", "target": f"≤ {TARGET_RATIO:g}",
                     "met": ratio is not None and ratio <= TARGET_RATIO})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2, help="bursts per side")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--scheduler-qps", type=int, default=200)
    p.add_argument("--node-grace", type=int, default=40)
    p.add_argument("--kwok-parallelism", type=int, default=4)
    p.add_argument("--floor-threads", nargs="+", default=["16:8", "32:32"],
                   help="floors with essentials to run, each WORKERS:REQUESTS threads (32:32 is nearer the "
                        "operator's 32 reconcile workers)")
    p.add_argument("--bare", type=int, default=32, metavar="THREADS",
                   help="also the bare floor of bench/reaction_floor.py (4 pods per job, nothing else) with this "
                        "many pod threads (0: not)")
    p.add_argument("--against", metavar="REV", default=None, help="also commit REV's operator (a git worktree)")
    p.add_argument("--result", default="burst_floor")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    plane = bench_plane(a)
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rljob-bench-burst-floor-") as tmp:
        worktree = Path(tmp) / "against"
        try:
            print(f"starting the control plane with {NODES} KWOK nodes × {GPUS_PER_NODE} GPUs", flush=True)
            plane.start(build_binaries=False)
            admin = plane.api_client()
            kube = Kube(admin)
            install_crd(kube)
            kubeconfig = operator_kubeconfig(plane, kube)
            as_operator = plane.api_client(kubeconfig)
            audit = AuditLog(plane.audit_log)
            meter = Meter(plane)
            sides: list[Any] = [*([f"bare {a.bare}"] if a.bare else []), *(f"floor {t}" for t in a.floor_threads),
                                RLJobSide(kubeconfig)]
            if a.against:
                subprocess.run(["git", "worktree", "add", "--detach", str(worktree), a.against], cwd=REPO,
                               check=True, capture_output=True)
                sides.append(RLJobSide(kubeconfig, worktree, name=f"rljob@{a.against}"))
            # The endpoint and NetworkPolicy settings the operator runs with (the floor's plan is its plan).
            endpoint = StatusEndpoint("https://rljob-operator.rljob-bench-system.svc:8443",
                                      self_signed(["rljob-operator.rljob-bench-system.svc"]).cert_pem)
            network = JobNetwork() if OperatorSettings().network_policy else None
            for rep in range(a.repeats):
                for i, side in enumerate(sides if rep % 2 == 0 else sides[::-1]):
                    namespace = f"burst-{rep}-{i}"
                    if isinstance(side, str) and side.startswith("bare"):
                        meter.operator = psutil.Process(os.getpid())
                        runs.append({"side": side, **bare_burst(plane, Kube(as_operator), meter, a.jobs, namespace,
                                                                a.timeout, a.bare)})
                    elif isinstance(side, str):
                        meter.operator = psutil.Process(os.getpid())
                        runs.append(floor_burst(plane, Kube(as_operator), meter, audit, a.jobs, namespace,
                                                endpoint, network, a.timeout, side.split()[1]))
                    else:
                        runs.append(operator_burst(plane, kube, side, audit, meter, a.jobs, namespace, Path(tmp),
                                                   a.timeout))
                    delete_namespace(kube, namespace, timeout=max(60, a.jobs))
            as_operator.close()
            admin.close()
        finally:
            plane.stop()
            if a.against:
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False,
                               capture_output=True)
    rows = summary(runs, a.jobs)
    path = write_result(a.result, {
        "config": {"nodes": NODES, "gpus_per_node": GPUS_PER_NODE, "workers_per_job": WORKERS, "jobs": a.jobs,
                   "repeats": a.repeats, "against": a.against, "kwok_pod_parallelism": a.kwok_parallelism,
                   "scheduler_qps": a.scheduler_qps, "source": source_state(),
                   "load_average_before": [round(x, 2) for x in load_before],
                   "load_average_after": [round(x, 2) for x in os.getloadavg()],
                   "wall_s": round(time.time() - started, 1)},
        "runs": runs, "summary": rows})
    for row in rows:
        print(f"{row['metric']}: {row['value']} {row['unit']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
