"""A watch's CPU per event: kopf's public ``on.event`` handler beside the operator's ``streams.Stream``.

Issue #44 (point 2) asks that each resource's watch be chosen on measurement: kopf's public handlers,
or a maintained client's watch. This measures what one event costs the process that watches, on the
real control plane: N labelled ConfigMaps of about a worker pod's size (6 KB) are listed by a consumer
process, then M merge patches (M MODIFIED events; each object's last gives it its final value) are
sent from 8 threads, each object's in order; the consumer's CPU (user + system, from /proc) from the
end of its listing until it has seen every object's final value, divided by M (``handler_calls``: how
often the handler ran). The
sides run in turn and then in reverse (kopf, stream | stream, kopf | ...), each in a fresh namespace
and a fresh process; medians per side.

* **kopf**: ``kopf.operator`` with one ``@kopf.on.event`` handler (a coroutine that counts), logged in
  through ``kopf.login_with_kubeconfig``, no diff base (as the operator ran its kopf handlers until
  issue #44), its watch decoded by kopf (the standard library's json).
* **stream**: ``streams.Stream`` (``kubernetes`` client's ``watch.Watch``, a thread per namespace,
  orjson) handing each event to a subscriber that counts, in the event loop.

    python -m bench.watch_cost [--objects 200] [--events 3000] [--repeats 3]

Results: bench/results/watch_cost.json (``--result NAME``: NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from bench.common import REPO, write_result
from tests.cluster.controlplane import ClusterConfig, ControlPlane

LABEL = "rljob.dev/watch-cost"
PAYLOAD = "x" * 6000  # about a worker pod's JSON


class Finals:
    """Which objects a consumer has seen in their final state (the last patch: ``n: final``; events are
    not counted, as kopf may merge an object's events that arrive within its batch window), and how many
    times its handler ran; prints ``listed`` once the listing is in, ``seen N`` once every object is final."""

    def __init__(self, objects: int) -> None:
        self.objects = objects
        self.listed = 0
        self.calls = 0
        self.final: set[str] = set()

    def handled(self, type: str | None, body: Any) -> None:
        if type is None:
            self.listed += 1
            if self.listed == self.objects:
                print("listed", flush=True)
            return
        self.calls += 1
        if (body.get("data") or {}).get("n") == "final":
            self.final.add(body["metadata"]["name"])
            if len(self.final) == self.objects:
                print(f"seen {self.calls}", flush=True)


def consume_stream(kubeconfig: str, namespace: str, objects: int) -> None:
    from rljob_operator.cluster.kube import Kube, load_api_client
    from rljob_operator.cluster.streams import Resource, Stream

    finals = Finals(objects)

    class Subscriber:
        def event(self, scope: str | None, type: str | None, body: Any) -> None:
            finals.handled(type, body)

        def listed(self, scope: str | None) -> None:
            pass

    async def run() -> None:
        stream = Stream(Kube(load_api_client(kubeconfig)), Resource("", "v1", "configmaps", label_selector=LABEL),
                        Subscriber(), [namespace])
        stream.start()
        await asyncio.Event().wait()

    asyncio.run(run())


def consume_kopf(kubeconfig: str, namespace: str, objects: int) -> None:
    import logging

    import kopf

    logging.basicConfig(level=logging.WARNING)  # kopf's own errors, on the run's log

    class NoDiffBase(kopf.DiffBaseStorage):
        def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
            return kopf.BodyEssence()

        def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
            return None

        def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
            return None

    os.environ["KUBECONFIG"] = kubeconfig
    registry = kopf.OperatorRegistry()
    finals = Finals(objects)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.event("", "v1", "configmaps", labels={LABEL: kopf.PRESENT}, registry=registry)
    async def counted(type: str | None, body: kopf.Body, **_: Any) -> None:
        finals.handled(type, body)

    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.scanning.disabled = True
    settings.posting.level = 40
    asyncio.run(kopf.operator(registry=registry, settings=settings, standalone=True, namespaces=[namespace],
                              clusterwide=False))


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def one_run(plane: ControlPlane, kube: Any, side: str, namespace: str, objects: int, events: int,
            logs: Path) -> dict[str, Any]:
    """One side: its consumer lists ``objects`` ConfigMaps, then sees ``events`` patches; its CPU per event."""
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    path = kube.core_path(namespace, "configmaps")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: kube.request("POST", path, {
            "metadata": {"name": f"cm-{i}", "labels": {LABEL: "yes"}}, "data": {"payload": PAYLOAD, "n": "created"}}),
            range(objects)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (logs / f"{namespace}.log").open("w")
    child = subprocess.Popen([sys.executable, "-m", "bench.watch_cost", "--consume", side, "--kubeconfig",
                              str(plane.admin_kubeconfig), "--namespace", namespace, "--objects", str(objects),
                              "--events", str(events)], stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                             cwd=REPO)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "listed":
            raise RuntimeError(f"{side} did not list: see {log.name}")
        proc = psutil.Process(child.pid)
        time.sleep(1.0)  # its listing's work done
        cpu0, wall0 = _cpu(proc), time.monotonic()
        def patch(i: int) -> None:  # one object's patches in order, the last its final value
            rounds = events // objects
            for n in [*map(str, range(rounds - 1)), "final"]:
                kube.request("PATCH", kube.core_path(namespace, "configmaps", f"cm-{i}"), {"data": {"n": n}},
                             content_type="application/merge-patch+json")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(patch, range(objects)))
        sent = time.monotonic() - wall0
        seen = child.stdout.readline().split()
        if seen[:1] != ["seen"]:
            raise RuntimeError(f"{side} never saw every object's last patch: see {log.name}")
        wall, cpu = time.monotonic() - wall0, _cpu(proc) - cpu0
    finally:
        child.kill()
        child.wait()
        log.close()
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}")
    events = objects * (events // objects)
    return {"side": side, "events": events, "handler_calls": int(seen[1]), "cpu_s": round(cpu, 3), "cpu_per_event_ms": round(1000 * cpu / events, 4),
            "wall_s": round(wall, 2), "sent_s": round(sent, 2), "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=200)
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=3, help="runs per side")
    p.add_argument("--result", default="watch_cost")
    p.add_argument("--consume", choices=["kopf", "stream"], help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    p.add_argument("--namespace", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.consume == "stream":
        return consume_stream(a.kubeconfig, a.namespace, a.objects)
    if a.consume == "kopf":
        return consume_kopf(a.kubeconfig, a.namespace, a.objects)

    from rljob_operator.cluster.kube import Kube

    load_before, runs = os.getloadavg(), []
    with tempfile.TemporaryDirectory(prefix="rljob-bench-watch-cost-") as tmp:
        plane = ControlPlane(Path(tmp) / "plane", ClusterConfig(gpu_nodes=1))
        try:
            plane.start(build_binaries=False)
            kube = Kube(plane.api_client())
            for rep in range(a.repeats):
                for side in ("kopf", "stream") if rep % 2 == 0 else ("stream", "kopf"):
                    run = one_run(plane, kube, side, f"cost-{rep}-{side}", a.objects, a.events, Path(tmp))
                    print(run, flush=True)
                    runs.append(run)
        finally:
            plane.stop()
    summary = {side: {"cpu_per_event_ms_median": round(statistics.median(
        r["cpu_per_event_ms"] for r in runs if r["side"] == side), 4),
        "runs_ms": [r["cpu_per_event_ms"] for r in runs if r["side"] == side]} for side in ("kopf", "stream")}
    path = write_result(a.result, {
        "config": {"objects": a.objects, "events": a.events, "repeats": a.repeats, "payload_bytes": len(PAYLOAD),
                   "load_average_before": [round(x, 2) for x in load_before],
                   "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "runs": runs, "summary": summary})
    for side, row in summary.items():
        print(f"{side}: {row['cpu_per_event_ms_median']} ms CPU per event (runs {row['runs_ms']})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
