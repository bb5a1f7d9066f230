"""The floor under "apply → pods created": a controller that costs nothing, on the same control plane.

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

    python -m bench.reaction_floor [--jobs 10 100] [--repeats 2] [--pod-threads 8 32]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
from rljob_operator.api import parse_job
from rljob_operator.cluster.kube import Kube
from rljob_operator.decisions.children import desired_worker_pod

from bench.common import write_result
from bench.operator_scale import (
    GPUS_PER_NODE,
    NODES,
    TARGET_POD_CREATE_P99_S,
    WORKERS,
    BenchControlPlane,
    Meter,
    Recorder,
    Watch,
    create_namespace,
    delete_namespace,
    distribution,
    gang_latencies,
    install_crd,
    job_manifest,
    percentile,
)
from tests.cluster.controlplane import ClusterConfig
from tests.cluster.nodes import GpuNodeShape


def floor_burst(plane: BenchControlPlane, kube: Kube, meter: Meter, n: int, namespace: str,
                timeout: float, pod_threads: int) -> dict[str, Any]:
    create_namespace(kube, namespace)
    recorder = Recorder()
    watch = Watch(plane, f"/api/v1/namespaces/{namespace}/pods", recorder.on_pod)
    watch.start()
    watch.listed.wait(30)
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
    before = meter.snapshot()
    started = time.time()
    try:
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
    finally:
        pod_pool.shutdown(wait=False, cancel_futures=True)
        watch.stop()
    if watch.error is not None:
        raise RuntimeError(f"pod watch: {watch.error}")
    created = lat["pods_created"]
    print(f"  N={n}: {len(created)}/{n} gangs created; apply → pods created p50 "
          f"{percentile(created, 50) or float('nan'):.2f}s p99 {percentile(created, 99) or float('nan'):.2f}s; "
          f"applies took {applies_done - started:.1f}s, pod creates {requests_done - started:.1f}s", flush=True)
    return {"jobs": n, "namespace": namespace, "applies_s": round(applies_done - started, 2),
            "requests_s": round(requests_done - started, 2),
            "latency_s": {k: distribution(v) for k, v in lat.items()},
            "raw_pods_created_s": [round(x, 3) for x in created], "cpu_s": cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[10, 100], help="burst sizes")
    p.add_argument("--repeats", type=int, default=2, help="bursts per size (fresh namespace each)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--pod-threads", type=int, nargs="+", default=[8, 32],
                   help="sizes of the pool creating pods (each size runs every burst)")
    p.add_argument("--scheduler-qps", type=int, default=200)
    p.add_argument("--node-grace", type=int, default=40)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    config = ClusterConfig(gpu_nodes=NODES, node_shape=GpuNodeShape(gpus=GPUS_PER_NODE),
                           node_monitor_grace_s=a.node_grace, start_timeout_s=300)
    plane = BenchControlPlane(config, a.scheduler_qps)
    runs: list[dict[str, Any]] = []
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
            api_client.close()
        finally:
            plane.stop()
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
                row.update(target=f"operator ≤ {TARGET_POD_CREATE_P99_S:g} (p99)",
                           met=all(x is not None and x <= TARGET_POD_CREATE_P99_S for x in p99s))
            summary.append(row)
    path = write_result("reaction_floor", {
        "config": {"nodes": NODES, "gpus_per_node": GPUS_PER_NODE, "workers_per_job": WORKERS,
                   "scheduler_qps": a.scheduler_qps, "node_monitor_grace_s": a.node_grace,
                   "apply_threads": 8, "pod_threads": a.pod_threads, "load_average_before": [round(x, 2) for x in load_before]},
        "runs": runs, "summary": summary})
    for row in summary:
        print(f"{row['metric']}: {row['value']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
