"""One leader at a time on the real control plane: a leader frozen past its lease and thawed writes
nothing; across a kube-apiserver restart every job converges with each pod created once; the operator
watches only its own pods (the rules without a cluster: ``tests/operator/test_leadership.py``)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from rljob_operator.names import LABEL_JOB
from rljob_operator.settings import OperatorSettings

from tests.cluster.waiting import wait_for
from tests.operator.test_leadership import PodHistory
from tests.support.operator_process import (
    FAST_ENV,
    OperatorProcess,
    annotate_pod,
    create_job,
    get_job,
    job_manifest,
    job_pods,
)

LEASE_S = float(FAST_ENV["RLJOB_OPERATOR_LEASE_SECONDS"])


AUDITED = "rljob:audited"


#: CPU-only workers, no backoff before a gang restart: quick gangs that leave the GPU nodes to others.
SPEC = {"workers": {"gpusPerWorker": 0}, "runPolicy": {"backoffBaseSeconds": 0}}


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


#: The operator's reconcile threads (the default; FAST_ENV keeps it): each may hold one request in flight.
WORKERS = OperatorSettings.workers



def _at(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _writes_of(events: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("user", {}).get("username") == user and e.get("verb") in WRITE_VERBS]


def _describe(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    what = "/".join(x for x in (ref.get("resource"), ref.get("subresource"), ref.get("name")) if x)
    return (f"{event['requestReceivedTimestamp']} {event['verb']} {what} "
            f"-> {(event.get('responseStatus') or {}).get('code')}")


def _converged(kube: Any, namespace: str, name: str, replicas: int, generation: int) -> bool:
    status = get_job(kube, namespace, name).get("status") or {}
    pods = job_pods(kube, namespace, name)
    assert len(pods) <= replicas, f"{name}: {len(pods)} pods for {replicas} workers"
    live = sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
                  and p["metadata"]["labels"].get("rljob.dev/gang-generation") == str(generation))
    return (status.get("phase") == "Running" and status.get("gangGeneration") == generation
            and live == [f"{name}-worker-{i}" for i in range(replicas)])


@pytest.fixture
def replicas(control_plane: Any, namespace: str, crd_installed: Any, tmp_path: Path) -> Iterator[Any]:
    """``start(user, **kw) -> OperatorProcess`` acting as admin user ``user`` whose requests are audited."""
    started: list[OperatorProcess] = []

    def start(user: str, **kw: Any) -> OperatorProcess:
        kubeconfig = control_plane.client_kubeconfig(user, groups=("system:masters", AUDITED))
        proc = OperatorProcess(kubeconfig, namespace, tmp_path / f"{user}-{len(started)}.log", **kw).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.alive() and proc.proc is not None:
            proc.proc.send_signal(signal.SIGCONT)  # a frozen process cannot act on SIGTERM
        proc.stop()


@pytest.mark.cluster
def test_a_frozen_leader_thawed_after_its_lease_ended_writes_nothing(
    control_plane: Any, kube: Any, namespace: str, replicas: Any
) -> None:
    old = replicas("rljob-operator-a", identity="leader-a")
    old.wait_leader()
    new = replicas("rljob-operator-b", identity="leader-b")
    wait_for(lambda: "rljob_operator_leader" in _metrics(new), 30, message="standby serving metrics")
    names = [f"gang-{i}" for i in range(6)]
    for name in names:
        create_job(kube, namespace, job_manifest(name, replicas=3, spec=SPEC))
    # Freeze it in the middle of its work: reconcile threads stop between their checks and writes.
    wait_for(lambda: any(job_pods(kube, namespace, n) for n in names), 60, interval=0.02,
             message="the leader creating pods")
    assert old.proc is not None
    old.proc.send_signal(signal.SIGSTOP)
    frozen_at = time.time()

    new.wait_leader(timeout=30)
    for name in names:
        wait_for(lambda n=name: _converged(kube, namespace, n, 3, 0), 90, message=f"{name} running under the new leader")
    time.sleep(max(0.0, frozen_at + 2 * LEASE_S - time.time()))
    thawed_at = time.time()
    old.proc.send_signal(signal.SIGCONT)
    assert old.wait_exit(30) == 1, old.log_tail()
    assert "no longer holds the lease" in old.log.read_text()
    time.sleep(1)  # what it would still send, it sends now
    for name in names:  # the new leader goes on reconciling
        assert _converged(kube, namespace, name, 3, 0), name

    events = control_plane.audit_events()
    old_writes = _writes_of(events, "rljob-operator-a")
    renewals = [e for e in old_writes if (e.get("objectRef") or {}).get("resource") == "leases"
                and 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300]
    assert renewals, "the audit log holds no Lease renewal by the old leader"
    lease_end = max(_at(e["requestReceivedTimestamp"]) for e in renewals) + LEASE_S
    assert lease_end < frozen_at + LEASE_S + 1
    late = [e for e in old_writes if _at(e["requestReceivedTimestamp"]) >= lease_end]
    # After the thaw the guard refuses every write (the Lease is not fresh, and cannot be renewed:
    # the new leader holds it). What may still arrive is a request that had passed the guard just
    # before SIGSTOP and leaves at SIGCONT: at most one per reconcile worker, right at the thaw.
    # That gap is the limit of lease-based election without server-side fencing (client-go's too);
    # a write decided after the lease ended would arrive later, or in numbers, and fails this.
    in_flight = [e for e in late if thawed_at - 0.5 <= _at(e["requestReceivedTimestamp"]) <= thawed_at + 1.0]
    decided_late = [e for e in late if e not in in_flight]
    assert not decided_late and len(in_flight) <= WORKERS, (
        "the old leader wrote after its lease ended:\n" + "\n".join(_describe(e) for e in late))
    # The log tells the replicas apart, and the old leader had been writing before its freeze.
    assert any((e.get("objectRef") or {}).get("resource") == "pods" for e in old_writes)
    assert any((e.get("objectRef") or {}).get("resource") == "rltrainingjobs"
               for e in _writes_of(events, "rljob-operator-b"))


@pytest.mark.cluster
def test_operator_across_an_apiserver_restart_converges_without_duplicate_pods(
    control_plane: Any, kube: Any, namespace: str, replicas: Any, api_client: Any
) -> None:
    workers = 3
    operator = replicas("rljob-operator-r", identity="restarted")
    operator.wait_leader()
    first = ["steady-0", "steady-1"]
    for name in first:
        create_job(kube, namespace, job_manifest(name, replicas=workers, spec=SPEC))
    for name in first:
        wait_for(lambda n=name: _converged(kube, namespace, n, workers, 0), 60, message=f"{name} running")
    window_start = time.time()
    with PodHistory(api_client, namespace, workers) as history:
        fresh = [f"new-{i}" for i in range(3)]
        for name in fresh:
            create_job(kube, namespace, job_manifest(name, replicas=workers, spec=SPEC))
        annotate_pod(kube, namespace, "steady-0-worker-1", {"rljob.dev/fake-exit-code": "1"})  # a gang restart
        wait_for(lambda: any(job_pods(kube, namespace, n) for n in fresh), 30, interval=0.02,
                 message="gangs being created")
        control_plane.restart_apiserver()
        back = time.time()

        restarts = 0

        def renewed_since_the_restart() -> bool:
            # An operator that could not renew while the server was down gives the Lease up and exits
            # (then it is restarted above): until it renewed after the restart, it may still do so.
            lease = kube.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/rljob-operator")
            return lease["spec"].get("holderIdentity") == "restarted" and _at(lease["spec"]["renewTime"]) >= back

        def converged() -> bool:
            nonlocal operator, restarts
            if not operator.alive():  # as a pod would be: it must have stopped cleanly, and restarts
                code = operator.wait_exit(5)
                assert code == 1 and "no longer holds the lease" in operator.log.read_text(), operator.log_tail()
                restarts += 1
                assert restarts <= 3, "the operator keeps stopping"
                operator = replicas("rljob-operator-r", identity="restarted")
            control_plane.revive_crashed()  # kube-scheduler may exit after the restart, as in a cluster
            _report_ready_again(kube, namespace)
            return (all(_converged(kube, namespace, n, workers, 1 if n == "steady-0" else 0) for n in first + fresh)
                    and renewed_since_the_restart() and operator.alive())

        try:
            wait_for(converged, 120, interval=0.5, message="every job running after the restart",
                     ignore=(ApiException, urllib3.exceptions.HTTPError, OSError))
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{_jobs_state(kube, namespace, first + fresh)}\n"
                                 f"operator:\n{operator.log_tail(30)}") from None
        time.sleep(2)
    assert not history.violations, "\n".join(history.violations[:10])
    assert len(history.pods) == workers * 5
    # Nothing is lost from the audit log: each pod of the window was created exactly once (the
    # restarted gang's pods reuse their names, their first generation was created before).
    created = _pod_creates(control_plane.audit_events(), "rljob-operator-r", namespace, window_start)
    expected = {f"{n}-worker-{i}" for n in fresh + ["steady-0"] for i in range(workers)}
    assert set(created) == expected, sorted(set(created) ^ expected)
    twice = {name: count for name, count in created.items() if count != 1}
    assert not twice, f"pods created more than once: {twice}"
    assert operator.alive(), operator.log_tail()
    traceback = [line for line in operator.log.read_text().splitlines() if "Traceback" in line]
    print(f"operator restarts: {restarts}; watch re-lists: {history.gaps}; pod creates: {sum(created.values())}; "
          f"tracebacks in the last log: {len(traceback)}")


def _pod_creates(events: list[dict[str, Any]], user: str, namespace: str, since: float) -> dict[str, int]:
    """Pod name -> how many creates by ``user`` in ``namespace`` the API server answered 2xx."""
    counts: dict[str, int] = {}
    for e in events:
        ref = e.get("objectRef") or {}
        if (e.get("stage") == "ResponseComplete" and e.get("verb") == "create"
                and e.get("user", {}).get("username") == user and ref.get("resource") == "pods"
                and not ref.get("subresource") and ref.get("namespace") == namespace
                and 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300
                and _at(e["requestReceivedTimestamp"]) >= since):
            counts[ref.get("name", "?")] = counts.get(ref.get("name", "?"), 0) + 1
    return counts


def _report_ready_again(kube: Any, namespace: str) -> None:
    """Play the kubelet after an API server restart: it reports its running pods Ready again.

    While kube-apiserver restarts, kwok's node heartbeats stop; the node lifecycle controller may
    then mark the nodes' pods NotReady, and kwok never reports them Ready again once their nodes
    are back (a kubelet does, at its next status sync). Only pods on Ready nodes are touched.
    """
    ready_nodes = {n["metadata"]["name"] for n in kube.list_nodes() if _ready(n) == "Ready=True"}
    for pod in kube.list_pods(namespace, "rljob.dev/job"):
        if ((pod.get("status") or {}).get("phase") == "Running" and _ready(pod) == "Ready=False"
                and not pod["metadata"].get("deletionTimestamp") and pod["spec"].get("nodeName") in ready_nodes
                and "rljob.dev/fake-ready" not in (pod["metadata"].get("annotations") or {})):
            conditions = [{"type": t, "status": "True"} for t in ("Ready", "ContainersReady")]
            kube.request("PATCH", kube.core_path(namespace, "pods", pod["metadata"]["name"]) + "/status",
                         {"status": {"conditions": conditions}},
                         content_type="application/strategic-merge-patch+json")


def _ready(pod: dict[str, Any]) -> str:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((f"Ready={c['status']}" for c in conditions if c["type"] == "Ready"), "Ready?")


def _jobs_state(kube: Any, namespace: str, names: list[str]) -> str:
    lines = []
    for name in names:
        status = get_job(kube, namespace, name).get("status") or {}
        pods = [(p["metadata"]["name"], p["metadata"]["labels"].get("rljob.dev/gang-generation"),
                 (p.get("status") or {}).get("phase"), _ready(p), bool(p["metadata"].get("deletionTimestamp")))
                for p in job_pods(kube, namespace, name)]
        lines.append(f"{name}: phase {status.get('phase')} generation {status.get('gangGeneration')} "
                     f"workers {status.get('workers', {}).get('summary')} pods {pods}")
    return "\n".join(lines)


def _metrics(op: Any) -> str:
    try:
        return str(op.metrics_text())
    except OSError:
        return ""


@pytest.mark.cluster
def test_the_operator_watches_only_its_own_pods_the_api_server_filters_them(
    control_plane: Any, kube: Any, namespace: str, replicas: Any
) -> None:
    # Filtering after the watch sent every pod of the namespace would decode them all: the API server must.
    started = time.time()
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": "someone-elses"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    operator = replicas("rljob-operator-w", identity="watching")
    operator.wait_leader()
    create_job(kube, namespace, job_manifest("own", replicas=2, spec=SPEC))
    wait_for(lambda: _converged(kube, namespace, "own", 2, 0), 60, message="own running")
    reads = [e for e in control_plane.audit_events()
             if e.get("user", {}).get("username") == "rljob-operator-w" and e.get("verb") in ("list", "watch")
             and e.get("objectRef", {}).get("resource") == "pods" and _at(e["requestReceivedTimestamp"]) >= started]
    assert any(e["verb"] == "watch" for e in reads), "the operator never watched pods"
    # The watch selects every job's pods; a relisting before a gang decision (the watch may lag) one job's.
    unfiltered = [e["requestURI"] for e in reads
                  if parse_qs(urlsplit(e["requestURI"]).query).get("labelSelector") not in ([LABEL_JOB],
                                                                                             [f"{LABEL_JOB}=own"])]
    assert not unfiltered, f"pods read without the job label selector: {unfiltered}"
