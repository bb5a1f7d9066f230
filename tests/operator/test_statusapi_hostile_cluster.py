"""The status API under hostile requests, on the real control plane (issue #14, point 2).

* A job name that is an encoded path (``..%2F..%2F…``) once made the operator read an arbitrary
  object with its own rights: names that are not Kubernetes names get 400 before anything else,
  and the operator sends no request at all for them (counted in its metrics).
* Rejected tokens are remembered for a while (one TokenReview per junk token, not one per
  request), clients are rate-limited and in-flight requests bounded (429 with Retry-After).
* A flood of junk tokens whose reviews are slow (``RLJOB_FAULT_REVIEW_DELAY_SECONDS``) does not
  delay a reconcile or the Lease renewal: reviews run on the status API's own threads.
"""

from __future__ import annotations

import os
import re
import ssl
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cluster.waiting import wait_for
from tests.support.operator_process import FAST_ENV, create_job, job_manifest, token_for

LEASE_S = float(FAST_ENV["RLJOB_OPERATOR_LEASE_SECONDS"])

pytestmark = pytest.mark.cluster

#: Threads of asyncio's default executor in the operator (``asyncio.to_thread``), as Python sizes it.
DEFAULT_EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)


def _api_requests(op: Any, resource: str | None = None) -> float:
    """The operator's ``rljob_operator_api_requests_total``: of ``resource``, or of all but Leases."""
    total = 0.0
    for line in op.metrics_text().splitlines():
        if not line.startswith("rljob_operator_api_requests_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        match = re.search(r'resource="([^"]*)"', labels)
        found = match.group(1) if match else ""
        if found == resource or (resource is None and found != "leases"):
            total += float(value)
    return total


def _ca_file(op: Any, tmp_path: Path) -> str:
    """The status API's self-signed certificate (its own CA outside a cluster), to verify it."""
    path = tmp_path / f"status-{op.status_port}.crt"
    path.write_text(ssl.get_server_certificate(("127.0.0.1", op.status_port)))
    return str(path)


def _send_raw(op: Any, ca: str, method: str, raw_path: str, token: str | None,
              body: Any = None) -> requests.Response:
    """``method`` on ``raw_path`` exactly as written (percent-escapes and all), as an attacker sends it."""
    prepared = requests.Request(method, op.status_url + "/", json=body,
                                headers={"Authorization": f"Bearer {token}"} if token else {}).prepare()
    prepared.url = op.status_url + raw_path  # no re-encoding, no dot-segment removal
    with requests.Session() as session:
        return session.send(prepared, verify=ca, timeout=15)


def _get_raw(op: Any, ca: str, raw_path: str, token: str | None) -> requests.Response:
    return _send_raw(op, ca, "GET", raw_path, token)


def _reader(kube: Any, namespace: str) -> str:
    """A token of a ServiceAccount that may ``get`` every RLTrainingJob of ``namespace`` (and nothing else)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + namespace
    kube.request("POST", f"{rbac}/roles", {
        "metadata": {"name": "read-jobs"},
        "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["get"]}],
    })
    kube.request("POST", f"{rbac}/rolebindings", {
        "metadata": {"name": "reader-reads-jobs"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-jobs"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    })
    return token_for(kube, namespace, "reader")


HOSTILE_NAMES = [
    # Six ".." climb out of /apis/rljob.dev/v1alpha1/namespaces/NS/rltrainingjobs/: the node's status.
    ("name", "..%2F..%2F..%2F..%2F..%2F..%2Fapi%2Fv1%2Fnodes%2Fgpu-node-0"),
    ("name", "%2E%2E"),
    ("name", "st%2Fstatus"),
    ("name", "St"),
    ("name", "a" * 254),
    ("name", "-st"),
    ("name", "st..x"),
    ("namespace", "kube-system%2Fpods%2Fx%2F.."),
    ("namespace", "Kube-System"),
    ("namespace", "a" * 64),
    ("namespace", "a.b"),
]


def test_names_that_are_not_kubernetes_names_get_400_and_nothing_is_read(kube, namespace, operator,
                                                                          tmp_path: Path) -> None:
    op = operator()
    ca = _ca_file(op, tmp_path)
    reader = _reader(kube, namespace)
    # No job exists yet: the operator sends no request but its Lease's, so any other one is the attack's.
    before = _api_requests(op)
    for field, value in HOSTILE_NAMES:
        ns, name = (value, "st") if field == "namespace" else (namespace, value)
        for method, path in (("GET", f"/api/v1/namespaces/{ns}/rltrainingjobs/{name}/status"),
                             ("POST", f"/api/v1/namespaces/{ns}/rltrainingjobs/{name}/heartbeat")):
            response = _send_raw(op, ca, method, path, reader, {"step": 1} if method == "POST" else None)
            assert response.status_code == 400, (method, path, response.status_code, response.text[:300])
            message = response.json()["error"]
            assert f"{field} " in message and "DNS-1123" in message, message
    assert _api_requests(op) == before, "the operator sent API requests for invalid names"

    # A valid request for an existing job still works, and answers that job.
    create_job(kube, namespace, job_manifest("st", replicas=1))
    path = f"/api/v1/namespaces/{namespace}/rltrainingjobs/st/status"
    answer = wait_for(lambda: (r := _get_raw(op, ca, path, reader)).status_code == 200 and r, 20,
                      message="status of st")
    body = answer.json()
    assert body["kind"] == "RLTrainingJob" and body["apiVersion"] == "rljob.dev/v1alpha1"
    assert body["metadata"]["name"] == "st" and body["metadata"]["namespace"] == namespace


def test_rejected_tokens_are_remembered_and_clients_rate_limited(kube, namespace, operator,
                                                                 tmp_path: Path) -> None:
    op = operator(env={"RLJOB_OPERATOR_STATUS_BURST_PER_CLIENT": "10",
                       "RLJOB_OPERATOR_STATUS_RATE_PER_CLIENT": "1"})
    ca = _ca_file(op, tmp_path)
    path = f"/api/v1/namespaces/{namespace}/rltrainingjobs/st/status"

    # The same junk token five times: one TokenReview.
    reviews = _api_requests(op, "tokenreviews")
    for _ in range(5):
        assert _get_raw(op, ca, path, "junk-token-1").status_code == 401
    assert _api_requests(op, "tokenreviews") - reviews == 1

    # 40 different junk tokens at once from one address: the bucket's 5 left, then 429 with Retry-After.
    time.sleep(1.5)  # refill one or two
    reviews = _api_requests(op, "tokenreviews")
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(lambda i: _get_raw(op, ca, path, f"junk-{uuid.uuid4().hex}-{i}"), range(40)))
    elapsed = time.monotonic() - start
    codes = [a.status_code for a in answers]
    assert set(codes) <= {401, 429}, codes
    limited = [a for a in answers if a.status_code == 429]
    assert len(limited) >= 20, codes
    assert all(int(a.headers["Retry-After"]) >= 1 for a in limited)
    assert "rate limit" in limited[0].json()["error"]
    reviewed = _api_requests(op, "tokenreviews") - reviews
    assert reviewed == codes.count(401) <= 5 + 2 + elapsed * 1, (reviewed, codes.count(401), elapsed)
    assert 'rljob_operator_status_api_refused_total{reason="rate_limited"}' in op.metrics_text()


def test_in_flight_requests_are_bounded(kube, namespace, operator, tmp_path: Path) -> None:
    op = operator(env={"RLJOB_OPERATOR_STATUS_MAX_IN_FLIGHT": "3", "RLJOB_FAULT_REVIEW_DELAY_SECONDS": "2"})
    ca = _ca_file(op, tmp_path)
    path = f"/api/v1/namespaces/{namespace}/rltrainingjobs/st/status"
    reviews = _api_requests(op, "tokenreviews")
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda i: _get_raw(op, ca, path, f"slow-junk-{i}"), range(12)))
    codes = [a.status_code for a in answers]
    busy = [a for a in answers if a.status_code == 429]
    assert set(codes) <= {401, 429} and len(busy) >= 6, codes
    assert all(a.headers["Retry-After"] == "1" for a in busy) and "busy" in busy[0].json()["error"]
    assert _api_requests(op, "tokenreviews") - reviews == codes.count(401)


def test_a_junk_token_flood_delays_neither_reconciles_nor_the_lease(kube, namespace, operator,
                                                                    tmp_path: Path) -> None:
    """Reviews taking 1 s each, 8× as many as asyncio's default threads: ~8 s of blocked reconciles before."""
    op = operator(env={"RLJOB_FAULT_REVIEW_DELAY_SECONDS": "1", "RLJOB_OPERATOR_STATUS_BURST_PER_CLIENT": "10",
                       "RLJOB_OPERATOR_STATUS_RATE_PER_CLIENT": "1"})
    ca = _ca_file(op, tmp_path)
    path = f"/api/v1/namespaces/{namespace}/rltrainingjobs/st/status"
    flood_size = 8 * DEFAULT_EXECUTOR_THREADS
    reviews = _api_requests(op, "tokenreviews")
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/rljob-operator"
    answers: list[requests.Response] = []

    def flood() -> None:
        with ThreadPoolExecutor(max_workers=flood_size) as pool:
            answers.extend(pool.map(lambda i: _get_raw(op, ca, path, f"flood-{uuid.uuid4().hex}-{i}"),
                                    range(flood_size)))

    flooding = threading.Thread(target=flood)
    renewals: list[tuple[float, str]] = []
    reconciled_after: float | None = None
    created: float | None = None
    flooding.start()
    started = time.monotonic()
    try:
        # The Lease is watched from the flood's start for at least a lease duration (4 s) and until the
        # flood has ended and the job was reconciled: the per-client burst (10 reviews of 1 s each) may
        # be over in about 2 s, too short a window to see renewals every second in.
        while flooding.is_alive() or reconciled_after is None or time.monotonic() - started < LEASE_S:
            renew = kube.request("GET", lease_path)["spec"]["renewTime"]
            if not renewals or renewals[-1][1] != renew:
                renewals.append((time.monotonic(), renew))
            if created is None and time.monotonic() - started >= 1.0:  # the reviews are queued
                created = time.monotonic()
                create_job(kube, namespace, job_manifest("probe", replicas=1))
            if created is not None and reconciled_after is None:
                job = kube.request("GET", kube.job_path(namespace, "probe"))
                if (job.get("status") or {}).get("phase"):
                    reconciled_after = time.monotonic() - created
            assert time.monotonic() - started < 120, "flood or reconcile did not end"
            time.sleep(0.1)
    finally:
        flooding.join()
    assert reconciled_after is not None and reconciled_after < 4.0, \
        f"the first reconcile of a new job took {reconciled_after:.1f} s under the flood"
    gaps = [b[0] - a[0] for a, b in zip(renewals, renewals[1:], strict=False)]
    assert len(renewals) >= 3 and max(gaps) < 3.0, f"Lease renewals {gaps}"  # lease 4 s, renew every 1 s
    assert op.is_leader() and op.alive()
    codes = [a.status_code for a in answers]
    assert set(codes) <= {401, 429} and codes.count(429) >= flood_size // 2, codes
    assert _api_requests(op, "tokenreviews") - reviews == codes.count(401)
