"""A job's pods cannot flood (issue #30 point 4), on the real control plane.

Job ``flood``'s reward function (a user's code, holding the pod's real token) sends valid heartbeats
as fast as it can from several threads, each carrying ten warnings, some repeated and some new;
job ``victim`` beside it sends a heartbeat every half second through the trainer's own
``Heartbeat`` sender, from the same address (as pods behind one node or proxy would). The victim's
heartbeats all land and its status follows them, it is never taken for stalled (its stall timeout is
6 s), the flooder is answered 429 with Retry-After, and the flooder's Events stay within
``EventLimits().bound(t)``, with repeats counted on one Event.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from rljob_contract.pod import heartbeat_path
from rljob_operator.cluster.events import COMBINED_PREFIX, EventLimits
from rljob_trainer.heartbeat import Heartbeat

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    create_job,
    events_for,
    get_job,
    job_manifest,
    token_for,
    wait_phase,
)

pytestmark = pytest.mark.cluster

FLOOD_SECONDS = 15.0
FLOOD_THREADS = 6
VICTIM_EVERY = 0.5
REPEATED = [f"checkpoint-{i} failed verification; resumed from an older one" for i in range(5)]


def _worker_token(kube: Any, namespace: str, job: str) -> str:
    pod = kube.request("GET", kube.core_path(namespace, "pods", f"{job}-worker-0"))
    return token_for(kube, namespace, "default", "rljob-status", pod=pod)


def _flood(url: str, token: str, ca: str, until: float, answers: list[tuple[int, str | None]]) -> None:
    """One thread of the flooding reward function: valid heartbeats, ten warnings each, back to back."""
    with requests.Session() as session:
        step = 0
        while time.monotonic() < until:
            step += 1
            warnings = REPEATED + [f"flood {uuid.uuid4().hex[:8]}" for _ in range(5)]
            r = session.post(url, json={"step": step, "reward": 0.0, "warnings": warnings},
                             headers={"Authorization": f"Bearer {token}"}, verify=ca, timeout=10)
            answers.append((r.status_code, r.headers.get("Retry-After")))


def _metric(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_flooding_job_gets_429_and_bounded_events_while_its_neighbours_heartbeats_land(
        kube, namespace, operator, tmp_path: Path) -> None:
    op = operator(env={"RLJOB_OPERATOR_STATUS_RATE_PER_JOB": "5", "RLJOB_OPERATOR_STATUS_BURST_PER_JOB": "10"})
    create_job(kube, namespace, job_manifest("flood", replicas=1))
    create_job(kube, namespace, job_manifest("victim", replicas=1, spec={
        "runPolicy": {"stallTimeoutSeconds": 6, "startupTimeoutSeconds": 60}}))
    wait_phase(kube, namespace, "flood", "Running")
    wait_phase(kube, namespace, "victim", "Running")
    ca = tmp_path / "status-ca.crt"
    ca.write_text(kube.request("GET", kube.core_path(namespace, "configmaps", "victim-config"))["data"]["status-ca.crt"])
    victim_token = tmp_path / "victim-token"
    victim_token.write_text(_worker_token(kube, namespace, "victim"))
    flood_token = _worker_token(kube, namespace, "flood")

    # The victim: the trainer's own sender (retries, Retry-After), one heartbeat every half second; five
    # before the flood, for the latency without it (the first pays the TokenReview).
    victim = Heartbeat(op.status_url + heartbeat_path(namespace, "victim"), str(victim_token), str(ca),
                       "victim-worker-0")
    step = 0

    def beat() -> float:
        nonlocal step
        step += 1
        sent = time.monotonic()
        victim.send(step=step, reward=0.5, loss=1.0)
        wait_for(lambda n=step: victim.accepted >= n, 10, interval=0.01, message=f"victim heartbeat {step}")
        latency = time.monotonic() - sent
        time.sleep(max(0.0, sent + VICTIM_EVERY - time.monotonic()))
        return latency

    quiet = [beat() for _ in range(5)][1:]
    answers: list[tuple[int, str | None]] = []
    started = time.monotonic()
    until = started + FLOOD_SECONDS
    flood_url = op.status_url + heartbeat_path(namespace, "flood")
    flooders = [threading.Thread(target=_flood, args=(flood_url, flood_token, str(ca), until, answers))
                for _ in range(FLOOD_THREADS)]
    for thread in flooders:
        thread.start()

    latencies: list[float] = []
    try:
        while time.monotonic() < until:
            latencies.append(beat())
    finally:
        for thread in flooders:
            thread.join()
    elapsed = time.monotonic() - started

    # The victim: every heartbeat landed, none refused, its status follows, never stalled.
    assert (victim.accepted, victim.refused) == (step, 0)
    wait_for(lambda: (get_job(kube, namespace, "victim")["status"].get("progress") or {}).get("step") == step, 10,
             message="victim's last step in its status")
    status = get_job(kube, namespace, "victim")["status"]
    assert status["phase"] == "Running" and not status.get("restarts"), status
    assert not [e for e in events_for(kube, namespace, "victim") if e["reason"] in ("HeartbeatTimeout",
                                                                                    "StartupTimeout")]

    # The flooder: its share, then 429 with Retry-After (the job's, after authentication).
    codes = [c for c, _ in answers]
    assert set(codes) <= {202, 429}, set(codes)
    throttled = [r for c, r in answers if c == 429]
    accepted = codes.count(202)
    assert throttled and all(r is not None and int(r) >= 1 for r in throttled)
    assert accepted <= 10 + 5 * elapsed + 5, (accepted, elapsed)  # burst + rate × t (+ a second's slack)
    assert (get_job(kube, namespace, "flood")["status"].get("progress") or {}).get("lastThrottled")

    # The flooder's Events: within the bound, repeats counted on one Event.
    time.sleep(1.0)  # the last accepted heartbeats' Events
    flood_events = [e for e in events_for(kube, namespace, "flood") if e["reason"] == "CheckpointFallback"]
    bound = EventLimits().bound(elapsed)
    writes = sum(e.get("count") or 1 for e in flood_events)
    metrics = op.metrics_text()
    dropped = _metric(metrics, 'rljob_operator_events_dropped_total{reason="CheckpointFallback"}')
    warnings_sent = 10 * accepted
    print(f"\nflood: {len(answers)} heartbeats in {elapsed:.1f} s, {accepted} accepted, {len(throttled)} throttled; "
          f"{warnings_sent} warnings -> {len(flood_events)} Event objects ({writes} writes, bound {bound}), "
          f"{dropped:.0f} dropped; victim: {len(latencies)} heartbeats in the flood, {victim.retried} sent again, "
          f"latency median {statistics.median(latencies):.3f} s, max {max(latencies):.3f} s "
          f"(without the flood: median {statistics.median(quiet):.3f} s, max {max(quiet):.3f} s)")
    assert 0 < len(flood_events) <= writes <= bound, (len(flood_events), writes, bound)
    assert max(e.get("count") or 1 for e in flood_events) > 1
    # Distinct messages beyond ten share one combined Event (whether the flood's tokens reach them first
    # depends on how its concurrent heartbeats interleave; the unit tests prove the combining itself).
    combined = [e for e in flood_events if e["message"].startswith(COMBINED_PREFIX)]
    assert len(flood_events) - len(combined) <= EventLimits().max_similar and len(combined) <= 1
    assert dropped >= warnings_sent - bound
    assert max(latencies) < 6.0  # never near the victim's stall timeout


def test_a_job_the_status_api_throttles_is_not_taken_for_stalled(kube, namespace, operator, tmp_path: Path) -> None:
    """One heartbeat accepted per 20 s, stall timeout 6 s: the refused ones (429) keep the job's stall clock
    running from ``lastThrottled``, so a busy status API never restarts a live job."""
    op = operator(env={"RLJOB_OPERATOR_STATUS_RATE_PER_JOB": "0.05", "RLJOB_OPERATOR_STATUS_BURST_PER_JOB": "1"})
    create_job(kube, namespace, job_manifest("busy", replicas=1, spec={
        "runPolicy": {"stallTimeoutSeconds": 6, "startupTimeoutSeconds": 60}}))
    wait_phase(kube, namespace, "busy", "Running")
    ca = tmp_path / "status-ca.crt"
    ca.write_text(kube.request("GET", kube.core_path(namespace, "configmaps", "busy-config"))["data"]["status-ca.crt"])
    token = _worker_token(kube, namespace, "busy")
    url = op.status_url + heartbeat_path(namespace, "busy")
    codes = []
    with requests.Session() as session:
        until = time.monotonic() + 15.0  # 2.5 stall timeouts
        while time.monotonic() < until:
            r = session.post(url, json={"step": 1}, headers={"Authorization": f"Bearer {token}"}, verify=str(ca),
                             timeout=10)
            codes.append(r.status_code)
            time.sleep(1.0)
    assert codes[0] == 202 and codes.count(202) <= 2 and codes.count(429) >= len(codes) - 2 >= 9, codes
    status = get_job(kube, namespace, "busy")["status"]
    assert status["phase"] == "Running" and not status.get("restarts"), status
    assert status["progress"]["lastThrottled"] > status["progress"]["lastHeartbeat"]
    assert not [e for e in events_for(kube, namespace, "busy") if e["reason"] == "HeartbeatTimeout"]


def test_status_reads_with_a_valid_token_still_pay_per_address(kube, namespace, operator, tmp_path: Path) -> None:
    """Only heartbeats are charged to their job once their token is known; a read (a SubjectAccessReview and a
    GET each) with a valid reader token keeps the per-address bucket."""
    from tests.operator.test_statusapi_hostile_cluster import _ca_file, _get_raw, _reader

    op = operator(env={"RLJOB_OPERATOR_STATUS_RATE_PER_CLIENT": "1", "RLJOB_OPERATOR_STATUS_BURST_PER_CLIENT": "5"})
    create_job(kube, namespace, job_manifest("st", replicas=1))
    ca, reader = _ca_file(op, tmp_path), _reader(kube, namespace)
    path = f"/api/v1/namespaces/{namespace}/rltrainingjobs/st/status"
    wait_for(lambda: _get_raw(op, ca, path, reader).status_code == 200, 20, message="a first read")
    time.sleep(5.0)  # the bucket full again
    codes = [_get_raw(op, ca, path, reader).status_code for _ in range(12)]
    assert codes.count(200) <= 5 + 2 and codes.count(429) >= 5, codes
