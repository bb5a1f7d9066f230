"""``rljob operator`` where a developer runs it: defaults outside a cluster, and the Lease elector's timing.

Unit tests (settings, the elector against a fake API); in ``test_local_cluster.py``, the operator started
with nothing but ``--kubeconfig`` against the test control plane, as against ``make dev-cluster``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_operator import settings as settings_module
from rljob_operator.cluster.leader import LeaderElector, LeaseNamespaceMissing
from rljob_operator.settings import OperatorSettings

# ---------------------------------------------------------------------- settings


@pytest.fixture
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "_own_namespace", lambda: None)


@pytest.mark.usefixtures("outside_a_cluster")
def test_outside_a_cluster_leader_election_is_off_unless_asked_for() -> None:
    assert OperatorSettings.from_env({}).leader_elect is False
    assert OperatorSettings.from_env({}, leader_elect=True).leader_elect is True
    assert OperatorSettings.from_env({"RLJOB_OPERATOR_LEADER_ELECT": "true"}).leader_elect is True
    assert OperatorSettings.from_env({"RLJOB_OPERATOR_LEADER_ELECT": "true"}, leader_elect=False).leader_elect is False


def test_in_a_cluster_leader_election_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "_own_namespace", lambda: "rljob-system")
    assert OperatorSettings.from_env({}).leader_elect is True
    assert OperatorSettings.from_env({}, leader_elect=False).leader_elect is False


# ------------------------------------------------------------------ the elector


class FakeKube:
    """The part of ``Kube`` the elector uses; ``handler(method, path, body)`` answers each request."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.timeout = 30.0
        self.api_client = None
        self.calls: list[tuple[str, float]] = []

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, time.monotonic()))
        return self.handler(method, path, body)


def _not_found() -> ApiException:
    return ApiException(status=404, reason="Not Found", body='{"code": 404}')


def test_a_missing_lease_namespace_stops_acquiring_at_once_naming_what_to_pass() -> None:
    def handler(method: str, path: str, body: Any) -> Any:
        raise _not_found()  # GET: no Lease; POST: no namespace

    elector = LeaderElector(FakeKube(handler), "rljob-system", "rljob-operator", "me", retry_seconds=0.1)  # type: ignore[arg-type]
    with pytest.raises(LeaseNamespaceMissing) as caught:
        asyncio.run(asyncio.wait_for(elector.acquire(), 5))
    assert "'rljob-system'" in str(caught.value) and "--operator-namespace" in str(caught.value)
    assert "--no-leader-elect" in str(caught.value)


def test_a_hung_renewal_gives_the_lease_up_before_it_expires() -> None:
    release = threading.Event()
    created: dict[str, Any] = {}

    def handler(method: str, path: str, body: Any) -> Any:
        if method == "POST":
            created.update(body)
            return body
        if created:  # every request after the create hangs: an API server that stopped answering
            release.wait(30)
        raise _not_found()

    kube = FakeKube(handler)
    elector = LeaderElector(kube, "ns", "lease", "me", lease_seconds=3, renew_seconds=0.5,  # type: ignore[arg-type]
                            retry_seconds=0.5)
    # Each request times out well inside the renew deadline; the caller's client is left alone.
    assert elector.kube.timeout == 1.25 and kube.timeout == 30.0

    async def lead() -> float:
        await elector.acquire()
        acquired = time.monotonic()
        await asyncio.wait_for(elector.hold(), 10)
        return time.monotonic() - acquired

    try:
        held_for = asyncio.run(lead())
    finally:
        release.set()
    # It stopped acting before a standby could take over (lease 3 s after the last renewal).
    assert 2.0 <= held_for < 3.0, held_for


def test_renewals_do_not_wait_behind_busy_reconcile_threads() -> None:
    lease: dict[str, Any] = {}

    def handler(method: str, path: str, body: Any) -> Any:
        if method == "GET":
            if not lease:
                raise _not_found()
            return lease
        lease.update({**body, "metadata": {**body.get("metadata", {}), "resourceVersion": str(time.monotonic())}})
        return lease

    elector = LeaderElector(FakeKube(handler), "ns", "lease", "me")  # type: ignore[arg-type]

    async def renew_while_busy() -> float:
        await elector.acquire()
        # Reconcile workers run in the loop's default executor; fill it with slow calls.
        busy = [asyncio.to_thread(time.sleep, 1.5) for _ in range((os.cpu_count() or 1) + 40)]
        waiting = asyncio.gather(*busy)
        await asyncio.sleep(0.05)
        started = time.monotonic()
        assert await elector._attempt()
        took = time.monotonic() - started
        await waiting
        return took

    assert asyncio.run(renew_while_busy()) < 0.5


# ------------------------------------------------------------ on the control plane
