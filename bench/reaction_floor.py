"""The floors under the reaction targets: a controller that costs nothing, on the same control plane.

``bench/operator_scale.py`` measures rljob's operator from a job's create request to its 4 worker
pods existing. This measures what no controller can beat on this machine: the jobs are created as
``operator_scale.py`` creates them (8 client threads, as fast as the API server takes them), and as
each job's create returns, the client hands it to a second pool of 8 threads that creates its 4
worker pods at once: no watch, no queue, no reconcile, no ConfigMap or Service, no status write. The pods are
the operator's own (``desired_worker_pod`` on the created job), so the API server, etcd, the
scheduler and KWOK do for them exactly the work they do for the operator's pods. Same control plane
and settings as ``operator_scale.py`` (100 KWOK nodes × 48 GPUs, scheduler at 200 requests/s, the
audit policy), measured client-side from a pod watch. Each burst runs in a fresh namespace.

If this floor's p99 is above a target, no operator meets that target on this machine.

``--failures K`` also measures the floor under "failure → replacement gang" with ``--running N``
jobs Running (the issue's target: p99 ≤ 3 s with 1,000): N jobs and their 4 pods are created as
above, then one worker of K distinct jobs is made to exit as ``operator_scale.py`` does it (KWOK's
fake exit code, 0.1 s apart). A controller that costs nothing but does what a gang restart must,
reacts from its pod watch: the failed pod's gang is deleted the way the operator deletes it
(graceful, with a UID precondition, so KWOK confirms each deletion as a kubelet would), and as the
watch sees each old pod gone its replacement of gang generation 1 (same name) is created. No
queue, no job GET, no status write, no ConfigMap or Service. Measured from the pod watch: failed
→ all 4 replacement pods created, and → all Ready.

``--essentials`` runs that floor twice, alternating with a second controller, still with no queue
and no cost of its own, that also does the least a controller people can act on must do per
failure: each job has the operator's own rendezvous Service (``desired_service``: it selects worker
0, so kube-controller-manager's endpoint controllers follow its pods as they follow the operator's),
and per failure it GETs the job, records the restart in its status (one merge patch) and posts one
Event before deleting the gang, and patches the status once more when the replacement gang is
Ready: 12 requests per failure where the operator sends about 22 and the bare floor 8. If this
floor is above the target, no controller that keeps a status and a Service meets it here.

    python -m bench.reaction_floor [--jobs 10 100] [--repeats 2] [--pod-threads 8 32]
    python -m bench.reaction_floor --jobs --failures 100 --running 1000 --pod-threads 32
    python -m bench.reaction_floor --jobs --failures 100 --pod-threads 32 --essentials --repeats 2 \
        --kwok-parallelism 32 --result reaction_floor_essentials

Results: bench/results/reaction_floor.json (bursts), reaction_floor_replacement.json (failures;
``--result NAME`` writes NAME.json instead).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import psutil
from rljob_contract.job import parse_job
from rljob_operator.cluster.kube import Kube
from rljob_operator.decisions.children import desired_service, desired_worker_pod
from rljob_operator.names import LABEL_GANG_GENERATION, LABEL_JOB, LABEL_WORKER_INDEX, worker_name
from rljob_operator.times import rfc3339

from bench.common import write_result
from bench.operator_scale import (
    GPUS_PER_NODE,
    NODES,
    TARGET_POD_CREATE_P99_S,
    TARGET_REPLACEMENT_P99_S,
    WORKERS,
    BenchControlPlane,
    Meter,
    Recorder,
    Watch,
    achieved_rate,
    bench_plane,
    create_namespace,
    delete_namespace,
    distribution,
    fail_pod,
    gang_latencies,
    inject_on_schedule,
    install_crd,
    job_manifest,
    percentile,
    pod_ready,
)
from tests.cluster.waiting import wait_for


@contextlib.contextmanager
def pods_watched(plane: BenchControlPlane, namespace: str, handle: Any, pool: ThreadPoolExecutor) -> Iterator[Watch]:
    """A pod watch of ``namespace`` feeding ``handle``, listed before the body runs; afterwards ``pool``
    is shut down and the watch stopped, and a watch that failed raises."""
    watch = Watch(plane, f"/api/v1/namespaces/{namespace}/pods", handle)
    watch.start()
    watch.listed.wait(30)
    try:
        yield watch
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        watch.stop()
    if watch.error is not None:
        raise RuntimeError(f"pod watch: {watch.error}")


def floor_burst(plane: BenchControlPlane, kube: Kube, meter: Meter, n: int, namespace: str,
                timeout: float, pod_threads: int) -> dict[str, Any]:
    create_namespace(kube, namespace)
    recorder = Recorder()
    sent: dict[str, float] = {}

    def create_pods(job: Any) -> None:
        for index in range(WORKERS):
            kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", desired_worker_pod(job, index, 0))

    pod_pool = ThreadPoolExecutor(max_workers=pod_threads)

    def create(name: str) -> Any:
        sent[name] = time.time()
        job = parse_job(kube.request("POST", Kube.job_path(namespace), job_manifest(name)))
        return pod_pool.submit(create_pods, job)

    names = [f"job-{i:04d}" for i in range(n)]
    with pods_watched(plane, namespace, recorder.on_pod, pod_pool):
        before = meter.snapshot()
        started = time.time()
        with ThreadPoolExecutor(max_workers=8) as pool:
            pods_created = list(pool.map(create, names))
        applies_done = time.time()
        for future in pods_created:
            future.result()
        requests_done = time.time()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lat = gang_latencies(recorder, sent, 0)
            if len(lat["pods_ready"]) == n:
                break
            time.sleep(0.25)
        lat = gang_latencies(recorder, sent, 0)
        cpu = Meter.delta(before, meter.snapshot())
    created = lat["pods_created"]
    print(f"  N={n}: {len(created)}/{n} gangs created; apply → pods created p50 "
          f"{percentile(created, 50) or float('nan'):.2f}s p99 {percentile(created, 99) or float('nan'):.2f}s; "
          f"applies took {applies_done - started:.1f}s, pod creates {requests_done - started:.1f}s", flush=True)
    return {"jobs": n, "namespace": namespace, "applies_s": round(applies_done - started, 2),
            "requests_s": round(requests_done - started, 2),
            "latency_s": {k: distribution(v) for k, v in lat.items()},
            "raw_pods_created_s": [round(x, 3) for x in created], "cpu_s": cpu}


class GangRestarter:
    """The zero-cost reaction to a failed worker: from the pod watch, delete its gang's pods as the
    operator does, and create each replacement (gang generation 1, the same name) once the watch saw
    the old pod gone. ``jobs`` maps a job's name to its parsed job.

    ``essentials``: before deleting the gang, GET the job, record the restart in its status and post
    an Event; when the replacement gang is Ready, patch the status once more."""

    def __init__(self, kube: Kube, namespace: str, jobs: dict[str, Any], pool: ThreadPoolExecutor,
                 essentials: bool = False) -> None:
        self.kube, self.namespace, self.jobs, self.pool = kube, namespace, jobs, pool
        self.essentials = essentials
        self.lock = threading.Lock()
        self.uids: dict[str, str] = {}  # generation-0 pod name -> uid
        self.restarting: dict[str, set[int]] = {}  # job -> worker indexes whose old pod is not gone yet
        self.ready: dict[str, set[int]] = {}  # job -> indexes of its replacement pods seen ready
        self.running_written = 0  # replacement gangs whose Running status was written
        self.errors: list[str] = []

    def on_pod(self, t: float, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        if LABEL_JOB not in labels:
            return
        job, index = labels[LABEL_JOB], int(labels[LABEL_WORKER_INDEX])
        if labels.get(LABEL_GANG_GENERATION) == "1":
            if self.essentials and kind != "DELETED" and pod_ready(pod):
                with self.lock:
                    ready = self.ready.setdefault(job, set())
                    if len(ready) < WORKERS:
                        ready.add(index)
                        if len(ready) == WORKERS:
                            self.pool.submit(self._try, f"status of {job}", self._running, job)
            return
        if labels.get(LABEL_GANG_GENERATION) != "0":
            return
        with self.lock:
            if kind == "DELETED":
                pending = self.restarting.get(job)
                if pending is not None and index in pending:
                    pending.discard(index)
                    self.pool.submit(self._try, f"create {meta['name']}", self.kube.create_pod,
                                     desired_worker_pod(self.jobs[job], index, 1))
                return
            self.uids[meta["name"]] = meta["uid"]
            if (pod.get("status") or {}).get("phase") == "Failed" and job not in self.restarting:
                self.restarting[job] = set(range(WORKERS))
                uids = {worker_name(job, i): self.uids.get(worker_name(job, i)) for i in range(WORKERS)}
                if self.essentials:
                    self.pool.submit(self._try, f"restart {job}", self._restart, job, uids)
                else:
                    self._delete_gang(uids)

    def _restart(self, job: str, uids: dict[str, str | None]) -> None:
        """What a controller people can act on does before deleting the gang: read the job, record
        the restart in its status, say so in an Event."""
        raw = self.kube.get_job(self.namespace, job)
        if raw is None:
            raise RuntimeError(f"job {job} not found")
        self.kube.patch_job_status(self.namespace, job, {"phase": "Restarting", "reason": "WorkerFailed",
                                                         "restarts": 1})
        self._delete_gang(uids)
        self.kube.post_event(raw, "Warning", "GangRestarting", "a worker failed: the gang is restarted",
                             rfc3339(datetime.now(UTC)))

    def _running(self, job: str) -> None:
        self.kube.patch_job_status(self.namespace, job, {"phase": "Running", "reason": "GangReady"})
        with self.lock:
            self.running_written += 1

    def _delete_gang(self, uids: dict[str, str | None]) -> None:
        for name, uid in uids.items():
            self.pool.submit(self._try, f"delete {name}", self.kube.delete_pod, self.namespace, name, uid)

    def _try(self, what: str, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as error:  # noqa: BLE001 - counted and reported
            self.errors.append(f"{what}: {error}")


def replacement_floor(plane: BenchControlPlane, kube: Kube, meter: Meter, n: int, failures: int,
                      interval: float, namespace: str, timeout: float, threads: int, seed: int,
                      essentials: bool = False) -> dict[str, Any]:
    """``n`` jobs Running (their pods created by the client), then ``failures`` workers made to exit;
    seconds from each failure to its replacement gang created and Ready, restarted by :class:`GangRestarter`
    (with ``essentials``, each job also has its Service, and the restarter its status writes and Event)."""
    create_namespace(kube, namespace)
    recorder = Recorder()
    jobs: dict[str, Any] = {}
    pool = ThreadPoolExecutor(max_workers=threads)
    restarter = GangRestarter(kube, namespace, jobs, pool, essentials)

    def on_pod(t: float, kind: str, pod: dict[str, Any]) -> None:
        recorder.on_pod(t, kind, pod)
        restarter.on_pod(t, kind, pod)

    names = [f"job-{i:04d}" for i in range(n)]

    def create(name: str) -> None:
        job = jobs[name] = parse_job(kube.request("POST", Kube.job_path(namespace), job_manifest(name)))
        if essentials:
            kube.request("POST", kube.core_path(namespace, "services"), desired_service(job))
        for index in range(WORKERS):
            kube.create_pod(desired_worker_pod(job, index, 0))

    def all_ready(gen: int, of: list[str]) -> bool:
        return all(len([p for p in recorder.gang(name, gen) if "ready" in p]) == WORKERS for name in of)

    with pods_watched(plane, namespace, on_pod, pool) as watch:
        started = time.time()
        with ThreadPoolExecutor(max_workers=threads) as creators:
            list(creators.map(create, names))
        deadline = time.monotonic() + timeout
        while not all_ready(0, names) and time.monotonic() < deadline:
            time.sleep(0.5)
        running_after = time.time() - started
        print(f"  {n} jobs' pods Ready after {running_after:.0f}s; injecting {failures} worker failures"
              f"{' (essentials)' if essentials else ''}", flush=True)
        time.sleep(5)  # let the control plane settle after the burst, as operator_scale's idle phase does
        rng = random.Random(seed)
        victims = rng.sample(names, min(failures, n))
        pods = [worker_name(name, rng.randrange(WORKERS)) for name in victims]
        before = meter.snapshot()
        sent = inject_on_schedule(lambda pod: fail_pod(kube, namespace, pod), pods, interval)
        window = [min(sent.values()), max(sent.values())]
        deadline = time.monotonic() + timeout
        while not all_ready(1, victims) and time.monotonic() < deadline and watch.error is None:
            time.sleep(0.25)
        if essentials:  # the last status writes, so the phase's CPU counts them
            wait_for(lambda: restarter.running_written >= len(victims), 30, interval=0.25,
                     message="the Running status of every replacement gang")
        cpu = Meter.delta(before, meter.snapshot())
    latencies: dict[str, list[float]] = {"replacement_created": [], "replacement_ready": []}
    for name in victims:
        failed = [p["failed"] for p in recorder.gang(name, 0) if "failed" in p]
        gang = recorder.gang(name, 1)
        if not failed or len(gang) < WORKERS:
            continue
        latencies["replacement_created"].append(max(p["created"] for p in gang) - min(failed))
        if all("ready" in p for p in gang):
            latencies["replacement_ready"].append(max(p["ready"] for p in gang) - min(failed))
    created = latencies["replacement_created"]
    print(f"  {len(created)}/{len(victims)} gangs replaced; failure → replacement created p50 "
          f"{percentile(created, 50) or float('nan'):.2f}s p99 {percentile(created, 99) or float('nan'):.2f}s; "
          f"{len(restarter.errors)} request errors", flush=True)
    return {"jobs": n, "failures": len(victims), "interval_s": interval,
            "achieved_per_s": achieved_rate(window, len(victims)), "namespace": namespace,
            "essentials": essentials, "pods_ready_after_s": round(running_after, 1),
            "errors": restarter.errors[:20], "latency_s": {k: distribution(v) for k, v in latencies.items()},
            "raw_replacement_created_s": [round(x, 3) for x in created], "cpu_s": cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, nargs="*", default=[10, 100], help="burst sizes (none: only --failures)")
    p.add_argument("--repeats", type=int, default=2, help="bursts per size (fresh namespace each)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--pod-threads", type=int, nargs="+", default=[8, 32],
                   help="sizes of the pool creating pods (each size runs every burst)")
    p.add_argument("--scheduler-qps", type=int, default=200)
    p.add_argument("--node-grace", type=int, default=40)
    p.add_argument("--failures", type=int, default=0,
                   help="also measure failure → replacement: this many worker failures ...")
    p.add_argument("--running", type=int, default=1000, help="... with this many jobs Running")
    p.add_argument("--failure-interval", type=float, default=0.1, help="seconds between injected failures")
    p.add_argument("--essentials", action="store_true",
                   help="with --failures: alternate the bare floor with one that keeps a Service, a status and "
                        "an Event per failure, --repeats times each")
    p.add_argument("--kwok-parallelism", type=int, default=4,
                   help="pod stages kwok plays at once (4: kwok's default; it plays the kubelet of every node)")
    p.add_argument("--result", default=None,
                   help="results/NAME.json for the failures (default reaction_floor_replacement)")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    plane = bench_plane(a)
    runs: list[dict[str, Any]] = []
    replacements: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rljob-bench-floor-"):
        try:
            print(f"starting the control plane with {NODES} KWOK nodes × {GPUS_PER_NODE} GPUs", flush=True)
            plane.start(build_binaries=False)
            api_client = plane.api_client()
            kube = Kube(api_client)
            install_crd(kube)
            meter = Meter(plane)
            meter.operator = psutil.Process(os.getpid())  # the client is the "controller" here
            for repeat in range(a.repeats):
                for threads in a.pod_threads:
                    for n in a.jobs:
                        runs.append(floor_burst(plane, kube, meter, n, f"floor-{n}-{threads}-{repeat}", a.timeout,
                                                threads))
                        runs[-1]["pod_threads"] = threads
                        delete_namespace(kube, runs[-1]["namespace"], timeout=max(60, n))
            if a.failures:
                # With --essentials, bare and essentials alternate (bare, essentials, essentials, bare, ...),
                # each in its own namespace, deleted before the next: the GPUs hold one set of jobs.
                sides = [False, True] if a.essentials else [False]
                order = [side for r in range(a.repeats if a.essentials else 1)
                         for side in (sides if r % 2 == 0 else sides[::-1])]
                for i, essentials in enumerate(order):
                    namespace = f"floor-replace-{a.running}-{i}"
                    replacements.append(replacement_floor(plane, kube, meter, a.running, a.failures,
                                                          a.failure_interval, namespace, a.timeout,
                                                          max(a.pod_threads), seed=1 + i, essentials=essentials))
                    if i + 1 < len(order):
                        delete_namespace(kube, namespace, timeout=600)
            api_client.close()
        finally:
            plane.stop()
    config = {"nodes": NODES, "gpus_per_node": GPUS_PER_NODE, "workers_per_job": WORKERS,
              "kwok_pod_parallelism": a.kwok_parallelism, "scheduler_qps": a.scheduler_qps,
              "node_monitor_grace_s": a.node_grace, "apply_threads": 8, "pod_threads": a.pod_threads, "load_average_before": [round(x, 2) for x in load_before]}
    if runs:
        summary = []
        for threads in a.pod_threads:
            for n in a.jobs:
                mine = [r for r in runs if r["jobs"] == n and r["pod_threads"] == threads]
                p99s = [r["latency_s"]["pods_created"]["p99"] for r in mine]
                p50s = [r["latency_s"]["pods_created"]["p50"] for r in mine]
                row: dict[str, Any] = {
                    "metric": f"floor, {n} jobs: apply → {WORKERS} pods created by a zero-cost controller "
                              f"({threads} pod threads), p50 / p99 per burst",
                    "value": "; ".join(f"{a_} / {b_}" for a_, b_ in zip(p50s, p99s, strict=True)), "unit": "s"}
                if n == 100:
                    row.update(target=f"floor under the operator's p99 ≤ {TARGET_POD_CREATE_P99_S:g}",
                               met=all(x is not None and x <= TARGET_POD_CREATE_P99_S for x in p99s))
                summary.append(row)
        report("reaction_floor", {"config": config, "runs": runs, "summary": summary})
    if replacements:
        summary = []
        for essentials in sorted({r["essentials"] for r in replacements}):
            mine = [r for r in replacements if r["essentials"] == essentials]
            what = ("a controller that costs nothing but keeps a Service, a status and an Event per failure"
                    if essentials else "a zero-cost controller")
            p99s = [r["latency_s"]["replacement_created"]["p99"] for r in mine]
            summary.append({
                "metric": f"floor, {mine[0]['failures']} worker failures with {mine[0]['jobs']} jobs Running "
                          f"(KWOK {a.kwok_parallelism}): failure → replacement gang created by {what}, p50 / p99 "
                          f"(Ready p50 / p99), per run",
                "value": "; ".join(f"{r['latency_s']['replacement_created']['p50']} / "
                                   f"{r['latency_s']['replacement_created']['p99']} "
                                   f"({r['latency_s']['replacement_ready']['p50']} / "
                                   f"{r['latency_s']['replacement_ready']['p99']})" for r in mine),
                "unit": "s",
                "target": f"floor under the operator's p99 ≤ {TARGET_REPLACEMENT_P99_S:g}",
                "met": all(x is not None and x <= TARGET_REPLACEMENT_P99_S for x in p99s)})
            summary.append({
                "metric": f"floor, {what}: machine CPU per failure (kube-apiserver, kube-controller-manager), per run",
                "value": "; ".join(f"{r['cpu_s']['machine_busy'] / r['failures']:.3f} "
                                   f"({r['cpu_s']['kube-apiserver'] / r['failures']:.3f}, "
                                   f"{r['cpu_s']['kube-controller-manager'] / r['failures']:.3f})" for r in mine),
                "unit": "s"})
        report(a.result or "reaction_floor_replacement", {
            "config": {**config, "failures": a.failures, "running": a.running,
                       "failure_interval_s": a.failure_interval, "essentials": a.essentials},
            "replacements": replacements, "summary": summary})


def report(name: str, data: dict[str, Any]) -> None:
    """Write bench/results/NAME.json and print its summary."""
    path = write_result(name, data)
    for row in data["summary"]:
        print(f"{row['metric']}: {row['value']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
