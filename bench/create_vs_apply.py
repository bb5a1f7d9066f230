"""POST (create_or_adopt) versus server-side apply for a gang's children, on the real control plane.

The reconciler creates a gang's ConfigMap, Service and worker pods with ``Kube.create_or_adopt``:
a POST, and on 409 a GET (plus a PATCH to adopt or update). Server-side apply would send one
``PATCH application/apply-patch+yaml`` per object whether or not it exists. This measures both on
the test harness's control plane (``tests/cluster``, run by hand; it is not part of ``make bench``):

* ``create``: gangs whose children do not exist yet (the common case: a new gang generation);
* ``again``: the same gangs sent once more (children exist: a retried or interrupted reconcile).

Each round creates ``--gangs`` RLTrainingJobs (not timed; real owners, so the garbage collector
leaves the children alone) and then, timed, their children from ``decisions.children`` one
request after another. Rounds alternate POST and apply, each in a fresh namespace. Recorded per
way: wall time and per-object latency (p50/p99), requests sent (counted by the client, checked
against the API server's ``apiserver_request_total``), and CPU seconds of kube-apiserver and etcd.

    python -m bench.create_vs_apply [--gangs 25] [--replicas 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

import psutil

from bench.common import REPO, write_result

for _folder in ("contract", "operator", "trainer"):  # as the Makefile's PYTHONPATH, for a bare `python -m bench...`
    if str(REPO / _folder) not in sys.path:
        sys.path.insert(0, str(REPO / _folder))

from kubernetes.client.exceptions import ApiException  # noqa: E402
from rljob_contract.job import parse_job  # noqa: E402
from rljob_operator.cluster.kube import FIELD_MANAGER, Kube  # noqa: E402
from rljob_operator.decisions.children import desired_configmap, desired_service, desired_worker_pods  # noqa: E402
from rljob_operator.names import StatusEndpoint  # noqa: E402

from bench.operator_scale import install_crd  # noqa: E402
from tests.cluster.controlplane import ClusterConfig, ControlPlane  # noqa: E402
from tests.support.operator_process import job_manifest  # noqa: E402

ENDPOINT = StatusEndpoint("https://rljob-operator.rljob-system.svc:8443", "-----BEGIN CERTIFICATE-----\nx\n")
CHILD_RESOURCES = ("pods", "configmaps", "services")


class CountingKube(Kube):
    """``Kube`` that counts the requests it sends, by verb."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: Counter[str] = Counter()

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        self.sent[method] += 1
        return super().request(method, path, *args, **kwargs)


def children_of(kube: Kube, namespace: str, gangs: int, replicas: int) -> list[tuple[dict[str, Any], str]]:
    """(object, owner uid) for every child of ``gangs`` new jobs in ``namespace``."""
    out: list[tuple[dict[str, Any], str]] = []
    for i in range(gangs):
        doc = job_manifest(f"bench-{i}", replicas, namespace=namespace)
        created = kube.request("POST", kube.job_path(namespace), doc)
        job = parse_job(created)
        uid = created["metadata"]["uid"]
        for obj in [desired_configmap(job, ENDPOINT), desired_service(job), *desired_worker_pods(job, 0, ENDPOINT)]:
            out.append((obj, uid))
    return out


def apply(kube: Kube, obj: dict[str, Any]) -> Any:
    """Server-side apply of one child (JSON is YAML); force: the operator owns these fields."""
    meta = obj["metadata"]
    path = kube.core_path(meta["namespace"], obj["kind"].lower() + "s", meta["name"])
    return kube.request("PATCH", path, obj, query={"fieldManager": FIELD_MANAGER, "force": "true"},
                        content_type="application/apply-patch+yaml")


def server_requests(kube: Kube) -> Counter[tuple[str, str]]:
    """kube-apiserver's ``apiserver_request_total`` for the children's resources, by (verb, resource)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = kube.api_client.call_api(*kube.api_client.param_serialize(
        method="GET", resource_path="/metrics", auth_settings=["BearerToken"]), _request_timeout=30)
    text.read()
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text.data.decode()):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("resource") in CHILD_RESOURCES:
                counts[(s.labels["verb"], s.labels["resource"])] += int(s.value)
    return counts


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        t = psutil.Process(pid).cpu_times()
        out[name] = t.user + t.system
    return out


def timed_pass(kube: CountingKube, send: Any, objects: list[tuple[dict[str, Any], str]],
               pids: dict[str, int]) -> dict[str, Any]:
    """Send every object once; wall time, latencies, client and server request counts, server CPU."""
    kube.sent.clear()
    server_before, cpu_before = server_requests(kube), cpu_seconds(pids)
    latencies = []
    started = time.perf_counter()
    for obj, uid in objects:
        t = time.perf_counter()
        send(obj, uid)
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - started
    cpu_after, server_after = cpu_seconds(pids), server_requests(kube)
    latencies.sort()
    return {
        "objects": len(objects),
        "wall_s": round(wall, 3),
        "p50_ms": round(1000 * statistics.median(latencies), 2),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        "client_requests": dict(kube.sent),
        "server_requests": {f"{v} {r}": n for (v, r), n in sorted((server_after - server_before).items())},
        "cpu_s": {k: round(cpu_after[k] - cpu_before[k], 3) for k in pids},
    }


def run_round(kube: CountingKube, way: str, gangs: int, replicas: int, pids: dict[str, int]) -> dict[str, Any]:
    namespace = f"bench-{way}-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        objects = children_of(kube, namespace, gangs, replicas)
        if way == "post":
            def send(obj: dict[str, Any], uid: str) -> Any:
                return kube.create_or_adopt(obj, uid, compare_data=obj["kind"] == "ConfigMap")
        else:
            def send(obj: dict[str, Any], uid: str) -> Any:
                return apply(kube, obj)
        return {"create": timed_pass(kube, send, objects, pids), "again": timed_pass(kube, send, objects, pids)}
    finally:
        with contextlib.suppress(ApiException):
            kube.request("DELETE", f"/api/v1/namespaces/{namespace}")


def summarize(rounds: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    picks = [r[phase] for r in rounds]
    return {
        "wall_s_median": round(statistics.median(p["wall_s"] for p in picks), 3),
        "p50_ms_median": round(statistics.median(p["p50_ms"] for p in picks), 2),
        "p99_ms_median": round(statistics.median(p["p99_ms"] for p in picks), 2),
        "requests_per_object": round(sum(sum(p["client_requests"].values()) for p in picks)
                                     / sum(p["objects"] for p in picks), 2),
        "apiserver_cpu_s_median": round(statistics.median(p["cpu_s"]["kube-apiserver"] for p in picks), 3),
        "etcd_cpu_s_median": round(statistics.median(p["cpu_s"]["etcd"] for p in picks), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gangs", type=int, default=25, help="jobs per round (children: ConfigMap, Service, pods)")
    p.add_argument("--replicas", type=int, default=2, help="worker pods per gang")
    p.add_argument("--rounds", type=int, default=3, help="rounds per way, alternating")
    a = p.parse_args(argv)
    plane = ControlPlane(config=ClusterConfig(gpu_nodes=0))
    plane.start(build_binaries=False)
    try:
        kube = CountingKube(plane.api_client())
        install_crd(kube)
        pids = {r.name: r.pid for r in plane.processes if r.name in ("kube-apiserver", "etcd")}
        results: dict[str, list[dict[str, Any]]] = {"post": [], "apply": []}
        for i in range(a.rounds):
            for way in (("post", "apply") if i % 2 == 0 else ("apply", "post")):
                results[way].append(run_round(kube, way, a.gangs, a.replicas, pids))
                print(f"round {i} {way}: {results[way][-1]['create']['wall_s']} s", file=sys.stderr)
        summary = {way: {phase: summarize(rs, phase) for phase in ("create", "again")} for way, rs in results.items()}
        path = write_result("create_vs_apply", {
            "config": {"gangs": a.gangs, "replicas": a.replicas, "rounds": a.rounds,
                       "objects_per_round": a.gangs * (2 + a.replicas), "control_plane": plane.server_version(),
                       "client": "one thread, requests in sequence; the harness's control plane, no nodes"},
            "summary_by_way": summary,
            "rounds": results,
        })
        print(path)
        for way, phases in summary.items():
            for phase, s in phases.items():
                print(f"{way:6} {phase:6} {s}")
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
