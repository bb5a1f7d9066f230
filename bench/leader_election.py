"""Our Lease elector (``cluster/leader.py``) versus ``kubernetes.leaderelection``, on the real control plane.

Both run as separate candidate processes (``python -m bench.leader_election candidate ...``)
against the test harness's control plane (``tests/cluster``), each pair with the same
implementation and client-go's default timing (lease 15 s, renew deadline 10 s / ours: renew
every 5 s, retry 2 s). Run by hand; not part of ``make bench``. Scenarios:

* ``sigterm``: the leader is stopped cleanly; time until the standby leads.
* ``sigkill``: the leader dies; time until the standby leads.
* ``cut-off``: the leader's connection to the API server stops passing bytes (a TCP proxy that
  freezes; the standby still reaches the server): time until the old leader stops leading, time
  until the standby leads, and how long both believed they led (capped at ``--cap`` seconds).
* ``idle``: requests on ``leases`` per minute while one candidate holds the Lease, from the
  API server's ``apiserver_request_total``.

    python -m bench.leader_election [--cap 60] [--impls ours library] [--scenarios sigterm sigkill cut-off idle]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import REPO, write_result

for _folder in ("contract", "operator", "trainer"):  # as the Makefile's PYTHONPATH, for a bare `python -m bench...`
    if str(REPO / _folder) not in sys.path:
        sys.path.insert(0, str(REPO / _folder))

LEASE, RENEW_DEADLINE, RENEW, RETRY = 15, 10, 5, 2


# ------------------------------------------------------------------ candidates


def say(event: str) -> None:
    print(f"{time.time():.3f} {event}", flush=True)


def candidate_ours(kubeconfig: str, namespace: str, identity: str) -> None:
    from rljob_operator.cluster.kube import Kube, load_api_client
    from rljob_operator.cluster.leader import LeaderElector

    elector = LeaderElector(Kube(load_api_client(kubeconfig)), namespace, "bench", identity, LEASE, RENEW, RETRY)

    async def run() -> None:
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await elector.acquire()
        say("leading")
        holding = asyncio.create_task(elector.hold())
        await asyncio.wait([holding, asyncio.create_task(stopping.wait())], return_when=asyncio.FIRST_COMPLETED)
        if holding.done():
            say("stopped")
            os._exit(1)
        await asyncio.to_thread(elector.release)  # what the operator does on SIGTERM
        say("released")

    asyncio.run(run())


def candidate_library(kubeconfig: str, namespace: str, identity: str) -> None:
    from kubernetes import config
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    config.load_kube_config(config_file=kubeconfig)  # LeaseLock uses the process-wide default client

    def lead() -> None:
        say("leading")
        threading.Event().wait()

    def stopped() -> None:
        say("stopped")
        os._exit(1)

    cfg = electionconfig.Config(LeaseLock("bench", namespace, identity), lease_duration=LEASE,
                                renew_deadline=RENEW_DEADLINE, retry_period=RETRY,
                                onstarted_leading=lead, onstopped_leading=stopped)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the library has no release
    leaderelection.LeaderElection(cfg).run()


# ------------------------------------------------------------------ the harness


class FreezableProxy:
    """TCP proxy to the API server; ``freeze()`` stops it passing bytes (connections stay open)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen.set()

    def _accept(self) -> None:
        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                while self.frozen.is_set():
                    time.sleep(0.05)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass


class Candidate:
    def __init__(self, impl: str, kubeconfig: Path, namespace: str, name: str, log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.err = log_dir / f"{name}.err"
        cmd = [sys.executable, "-m", "bench.leader_election", "candidate", impl, str(kubeconfig), namespace, name]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "contract"), str(REPO / "operator"), str(REPO / "trainer"), str(REPO)])}
        with open(self.log, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env=env)

    def events(self) -> dict[str, float]:
        out = {}
        for line in self.log.read_text().splitlines():
            t, event = line.split(" ", 1)
            out.setdefault(event, float(t))
        return out

    def wait_event(self, event: str, timeout: float) -> float | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if event in self.events():
                return self.events()[event]
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def kubeconfig_via(kubeconfig: Path, port: int, out: Path) -> Path:
    import yaml

    doc = yaml.safe_load(kubeconfig.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(doc))
    return out


def lease_requests(kube: Any) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    resp = kube.api_client.call_api(*kube.api_client.param_serialize(
        method="GET", resource_path="/metrics", auth_settings=["BearerToken"]), _request_timeout=30)
    resp.read()
    total = 0
    for family in text_string_to_metric_families(resp.data.decode()):
        if family.name == "apiserver_request":
            total += sum(int(s.value) for s in family.samples
                         if s.name.endswith("_total") and s.labels.get("resource") == "leases")
    return total


def scenario(impl: str, kind: str, plane: Any, kube: Any, work: Path, cap: float) -> dict[str, Any]:
    namespace = f"le-{impl[:3]}-{kind}-{uuid.uuid4().hex[:4]}"
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    server = plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = FreezableProxy((server[0], int(server[1])))
    leader_config = kubeconfig_via(plane.admin_kubeconfig, proxy.port, work / f"{namespace}.kubeconfig")
    leader = Candidate(impl, leader_config, namespace, f"{namespace}-a", work)
    standby = None
    try:
        led = leader.wait_event("leading", 60)
        assert led, f"{impl} never led: {leader.err.read_text()[-2000:]}"
        if kind == "idle":
            time.sleep(RENEW + 1)
            before, t0 = lease_requests(kube), time.time()
            time.sleep(60)
            return {"lease_requests_per_minute": round((lease_requests(kube) - before) * 60 / (time.time() - t0), 1)}
        standby = Candidate(impl, plane.admin_kubeconfig, namespace, f"{namespace}-b", work)
        time.sleep(RENEW + 3)  # the standby has seen the record and the leader has renewed once
        t0 = time.time()
        if kind == "sigterm":
            leader.proc.send_signal(signal.SIGTERM)
        elif kind == "sigkill":
            leader.proc.kill()
        else:
            proxy.freeze()
        took_over = standby.wait_event("leading", cap)
        result: dict[str, Any] = {"standby_leads_after_s": round(took_over - t0, 2) if took_over else f">{cap}"}
        if kind == "cut-off":
            stopped = leader.wait_event("stopped", max(1.0, t0 + cap - time.time()))
            result["old_leader_stops_after_s"] = round(stopped - t0, 2) if stopped else f">{cap}"
            if took_over:
                end = stopped if stopped else time.time()
                result["both_leading_s"] = round(max(0.0, end - took_over), 2)
                if not stopped:
                    result["both_leading_s"] = f">={result['both_leading_s']} (old leader still leading)"
        return result
    finally:
        leader.stop()
        if standby:
            standby.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "candidate":
        impl, kubeconfig, namespace, identity = argv[1:5]
        (candidate_ours if impl == "ours" else candidate_library)(kubeconfig, namespace, identity)
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap", type=float, default=60.0, help="longest wait for an event, seconds")
    p.add_argument("--scenarios", nargs="+", default=["sigterm", "sigkill", "cut-off", "idle"])
    p.add_argument("--impls", nargs="+", default=["ours", "library"])
    p.add_argument("--result", default="leader_election", help="bench/results/RESULT.json")
    a = p.parse_args(argv)

    import tempfile

    from kubernetes import __version__ as client_version
    from rljob_operator.cluster.kube import Kube

    from tests.cluster.controlplane import ClusterConfig, ControlPlane

    plane = ControlPlane(config=ClusterConfig(gpu_nodes=0))
    plane.start(build_binaries=False)
    work = Path(tempfile.mkdtemp(prefix="rljob-le-"))
    try:
        kube = Kube(plane.api_client())
        results: dict[str, dict[str, Any]] = {}
        for impl in a.impls:
            for kind in a.scenarios:
                results.setdefault(impl, {})[kind] = scenario(impl, kind, plane, kube, work, a.cap)
                print(impl, kind, results[impl][kind], file=sys.stderr, flush=True)
        path = write_result(a.result, {
            "config": {"lease_s": LEASE, "ours": {"renew_s": RENEW, "retry_s": RETRY},
                       "library": {"renew_deadline_s": RENEW_DEADLINE, "retry_period_s": RETRY},
                       "kubernetes_client": client_version, "control_plane": plane.server_version(),
                       "cap_s": a.cap},
            "results": results,
        })
        print(path)
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
