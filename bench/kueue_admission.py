"""Kueue: time from quota freed (a running job finished) to the next queued job Running.

The test harness's control plane with Kueue (tests/cluster/kueue.py) and KWOK GPU nodes, the
operator as a process, a ClusterQueue of 8 ``nvidia.com/gpu``, and ``--queued`` (default 100)
jobs of 2 workers × 2 GPUs queued behind the two that fit. Then, ``--cycles`` times: one
running job's workers exit 0; from the moment its Workload is marked Finished (the quota is
free; seen on a watch) to the moment the next job is Running (its workers Ready; seen on a
watch). Both moments are taken on this machine's clock from watch events, so the figure covers
Kueue's admission, the operator's reaction to it, pod creation, scheduling and KWOK's start.

    python -m bench.kueue_admission                  # ~4 min here
    python -m bench.kueue_admission --queued 20 --cycles 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, write_result

for _folder in ("contract", "operator", "trainer"):  # as the Makefile's PYTHONPATH, for a bare `python -m bench...`
    if str(REPO / _folder) not in sys.path:
        sys.path.insert(0, str(REPO / _folder))

from rljob_operator.cluster.kube import Kube, load_api_client  # noqa: E402

from bench.operator_scale import create_namespace, distribution, install_crd  # noqa: E402
from tests.cluster.controlplane import ClusterConfig, ControlPlane  # noqa: E402
from tests.cluster.waiting import wait_for  # noqa: E402
from tests.support import operator_process as helpers  # noqa: E402

API = "/apis/kueue.x-k8s.io/v1beta2"
NAMESPACE = "kueue-bench"
TARGET_P99_S = 5.0


class Watcher:
    """Local times of jobs turning Running and of Workloads turning Finished, from two watches."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, watch

        self.running: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self._api = client.CustomObjectsApi(load_api_client(str(kubeconfig)))
        self._watch = watch
        self._stop = threading.Event()
        for target in (self._jobs, self._workloads):
            threading.Thread(target=target, daemon=True).start()

    def _stream(self, group: str, version: str, plural: str):  # noqa: ANN202 - a generator of events
        while not self._stop.is_set():
            w = self._watch.Watch()
            try:
                yield from w.stream(self._api.list_namespaced_custom_object, group, version, NAMESPACE, plural,
                                    timeout_seconds=60)
            except Exception:  # noqa: BLE001 - a dropped watch is started again
                time.sleep(0.1)

    def _jobs(self) -> None:
        for event in self._stream("rljob.dev", "v1alpha1", "rltrainingjobs"):
            obj = event["object"]
            if (obj.get("status") or {}).get("phase") == "Running":
                self.running.setdefault(obj["metadata"]["name"], time.monotonic())

    def _workloads(self) -> None:
        for event in self._stream("kueue.x-k8s.io", "v1beta2", "workloads"):
            obj = event["object"]
            conds = (obj.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Finished" and c["status"] == "True" for c in conds):
                job = obj["metadata"]["labels"]["rljob.dev/job"]
                self.finished.setdefault(job, time.monotonic())

    def stop(self) -> None:
        self._stop.set()


def setup_queues(kube: Kube) -> None:
    kube.request("POST", f"{API}/resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                                     "metadata": {"name": "gpu"}})
    kube.request("POST", f"{API}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "bench"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "gpu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}})
    kube.request("POST", f"{API}/namespaces/{NAMESPACE}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
        "spec": {"clusterQueue": "bench"}})


def job(name: str) -> dict[str, Any]:
    doc = helpers.job_manifest(name, 2, {"workers": {"gpusPerWorker": 2}, "runPolicy": {"backoffBaseSeconds": 0}},
                               namespace=NAMESPACE)
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}
    return doc


def run(queued: int, cycles: int) -> dict[str, Any]:
    plane = ControlPlane(config=ClusterConfig(gpu_nodes=2, kueue=True))
    plane.start(build_binaries=False)
    operator = None
    try:
        kube = Kube(load_api_client(str(plane.admin_kubeconfig)))
        install_crd(kube)
        create_namespace(kube, NAMESPACE)
        setup_queues(kube)
        watcher = Watcher(plane.admin_kubeconfig)
        log = Path(tempfile.mkdtemp(prefix="kueue-bench-")) / "operator.log"
        operator = helpers.OperatorProcess(plane.admin_kubeconfig, NAMESPACE, log, leader_elect=False,
                                           env={"RLJOB_OPERATOR_RESYNC_SECONDS": "300"}).start()
        names = [f"job-{i:03d}" for i in range(queued + 2)]
        for name in names:
            kube.request("POST", kube.job_path(NAMESPACE), job(name))
        wait_for(lambda: len(watcher.running) >= 2, 180, message="the first two jobs running")
        latencies = []
        for _ in range(cycles):
            done = sorted((t, n) for n, t in watcher.running.items() if n not in watcher.finished)[0][1]
            before = set(watcher.running)
            for pod in helpers.job_pods(kube, NAMESPACE, done):
                helpers.annotate_pod(kube, NAMESPACE, pod["metadata"]["name"], {"rljob.dev/fake-exit-code": "0"})
            wait_for(lambda done=done, before=before: done in watcher.finished and set(watcher.running) - before,
                     120, interval=0.02, message="the next job running")
            [started] = set(watcher.running) - before
            latencies.append(watcher.running[started] - watcher.finished[done])
        watcher.stop()
        return {"queued": queued, "cycles": cycles, "kueue_start_s": round(plane.kueue_start_seconds or 0, 2),
                "quota_freed_to_running_s": distribution(latencies), "samples": [round(x, 3) for x in latencies]}
    finally:
        if operator is not None:
            operator.stop()
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queued", type=int, default=100, help="jobs waiting behind the two running (100)")
    parser.add_argument("--cycles", type=int, default=30, help="jobs finished, one at a time (30)")
    args = parser.parse_args()
    data = run(args.queued, args.cycles)
    d = data["quota_freed_to_running_s"]
    data["summary"] = [
        {"metric": f"quota freed → next queued job Running, p50 ({args.queued} queued)", "value": d["p50"],
         "unit": "s"},
        {"metric": f"quota freed → next queued job Running, p99 ({args.queued} queued)", "value": d["p99"],
         "unit": "s", "target": f"≤ {TARGET_P99_S} s", "met": d["p99"] is not None and d["p99"] <= TARGET_P99_S},
        {"metric": "Kueue start-up (CRDs installed → webhooks admitting)", "value": data["kueue_start_s"], "unit": "s"},
    ]
    print(write_result("kueue_admission", data))
    print(data["summary"])


if __name__ == "__main__":
    main()
