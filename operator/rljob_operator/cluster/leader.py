"""Leader election on a ``coordination.k8s.io/v1`` Lease: only one operator replica reconciles.

Every replica serves the status API and health endpoints; only the Lease holder runs the
watches and the reconcile workers. As in client-go, a Lease counts as expired when its
record has not changed for ``leaseDurationSeconds`` of *this* replica's clock (no trust in
other clocks); updates carry the resourceVersion, so two candidates cannot both win. A
holder that cannot renew in time stops acting (the caller exits and is restarted as a
candidate); a holder that shuts down cleanly releases the Lease for a quick hand-over.

Why not ``kubernetes.leaderelection`` (client 37): its LeaseLock talks through the process-wide
default client (not our kubeconfig's), its requests have no timeout (a hung renew keeps a holder
"leading" past its lease), it never releases the Lease (every hand-over waits a full lease), its
loops cannot be stopped (SIGTERM while standby) and it exits the process on periods under 1 s.
Measured against ours on the control plane: ``bench/leader_election.py``.

Two timing rules, from client-go: each Lease request times out well inside the renew deadline
(``request_timeout``), so one slow call still leaves time for a retry; and the attempts run on a
thread of their own, so reconcile workers busy on a slow API server cannot delay a renewal.

A third rule is ours: leadership is *fresh* only until ``lease_seconds - retry_seconds`` after
the moment the last successful renewal was *sent* (a standby starts counting when it first sees
the new record, which is never earlier). ``write_guard`` gives that check to the reconciler's
``Kube``, which refuses every write once it fails. Giving up in ``hold`` is not enough on its
own: a process frozen (SIGSTOP, a paused VM, a long GC) past its lease resumes with reconcile
threads mid-flight, and they would write before the event loop runs ``hold`` again.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from rljob_operator import metrics
from rljob_operator.cluster.kube import Kube

log = logging.getLogger("rljob.leader")


def _short(error: Exception) -> str:
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}: {(error.body or '')[:200]}"
    return str(error)


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseNamespaceMissing(Exception):
    """The Lease's namespace does not exist: a setting to fix, not a moment to wait out."""


class LeaderElector:
    """Acquire, hold and release one Lease; see the module docstring for the rules."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
        retry_seconds: float = 2.0,
    ) -> None:
        # Half the renew deadline per request (client-go: max(RenewDeadline/2, 1s)): GET and PUT fit
        # inside the deadline even when the first is slow, and never outlast the lease.
        self.request_timeout = max(1.0, min(kube.timeout, (lease_seconds - retry_seconds) / 2))
        self.kube = copy.copy(kube)  # the same client and connection pool, its own timeout
        self.kube.timeout = self.request_timeout
        self.kube.write_guard = None  # the Lease itself is how leadership is kept
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        """Monotonic time at which the last successful acquire/renew request was sent."""
        self._leading = False

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def try_acquire_or_renew(self) -> bool:
        """One attempt (blocking); True when this replica holds the Lease afterwards."""
        now = _micro_time()
        # Taken before the request: the API server stores the renewal after it was sent, and a
        # standby counts the lease from when it sees it; a time taken after the answer could be
        # later than both by the request's whole latency.
        sent = time.monotonic()
        try:
            lease = self.kube.request("GET", self.path)
        except ApiException as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self.kube.request("POST", self.path.rsplit("/", 1)[0], body, count_write=False)
            except ApiException as e2:
                if e2.status == 409:
                    return False
                if e2.status == 404:  # only the namespace can be missing on a create
                    raise LeaseNamespaceMissing(
                        f"leader election: namespace {self.namespace!r} for Lease {self.name!r} does not exist; "
                        "create it, pass --operator-namespace NAMESPACE, or run one replica with --no-leader-elect"
                    ) from e2
                raise
            self._renewed(sent)
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        expired = time.monotonic() - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.identity else now
        lease["spec"] = self._spec(acquire or now, now, transitions)
        try:
            self.kube.request("PUT", self.path, lease, count_write=False)  # carries resourceVersion
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self._renewed(sent)
        return True

    def _renewed(self, sent: float) -> None:
        self._last_renew = max(self._last_renew, sent)
        self._leading = True

    @property
    def fresh_until(self) -> float:
        """Monotonic time after which this replica must not act as the leader any more."""
        return self._last_renew + self.lease_seconds - self.retry_seconds

    def fresh(self) -> bool:
        """True while this replica holds the Lease and its last renewal is recent enough to act on."""
        return self._leading and time.monotonic() < self.fresh_until

    def write_guard(self) -> str | None:
        """For ``Kube.write_guard``: why a write must not be sent now, or None when it may be."""
        if not self._leading:
            return f"this replica ({self.identity}) does not hold the lease {self.namespace}/{self.name}"
        age, limit = time.monotonic() - self._last_renew, self.lease_seconds - self.retry_seconds
        if age >= limit:
            return (f"the lease {self.namespace}/{self.name} was last renewed {age:.1f}s ago (acting limit "
                    f"{limit:.1f}s): another replica may lead by now")
        return None

    def _spec(self, acquire: str, renew: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_seconds)),
            "acquireTime": acquire,
            "renewTime": renew,
            "leaseTransitions": transitions,
        }

    async def _attempt(self) -> bool:
        """``try_acquire_or_renew`` on the elector's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.try_acquire_or_renew)

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease; raises ``LeaseNamespaceMissing`` at once."""
        logged = False
        while True:
            try:
                if await self._attempt():
                    log.info("became leader (lease %s/%s, identity %s)", self.namespace, self.name, self.identity)
                    metrics.LEADER.set(1)
                    return
            except LeaseNamespaceMissing:
                raise
            except Exception as e:  # the API server may be briefly away; keep trying
                log.warning("leader election: %s", _short(e))
            if not logged:
                log.info("waiting for lease %s/%s (held by another replica)", self.namespace, self.name)
                logged = True
            await asyncio.sleep(self.retry_seconds)

    async def hold(self) -> None:
        """Renew until the Lease is lost; returns then (the caller must stop acting).

        Renewals come every ``renew_seconds``, retries after a failure every ``retry_seconds``;
        the holder gives up once ``lease_seconds - retry_seconds`` pass without a renewal, even
        while a request hangs, so it stops before a standby may take over. The per-request
        timeout alone would not do: urllib3 retries a timed-out GET, so with the client's 30 s
        timeout a leader cut off from the API server went on acting for over a minute
        (``bench/leader_election.py``, scenario cut-off).
        """
        try:
            await self._renew_until_lost()
        finally:
            self._leading = False
            metrics.LEADER.set(0)

    async def _renew_until_lost(self) -> None:
        pause = self.renew_seconds
        while True:
            await asyncio.sleep(pause)
            deadline = self.fresh_until
            try:
                if await asyncio.wait_for(self._attempt(), max(0.0, deadline - time.monotonic())):
                    pause = self.renew_seconds
                    continue
                log.error("lost the lease %s/%s to another replica", self.namespace, self.name)
                break
            except TimeoutError:
                log.error("could not renew the lease %s/%s in time: the API server did not answer",
                          self.namespace, self.name)
                break
            except Exception as e:
                if time.monotonic() + self.retry_seconds < deadline:
                    log.warning("cannot renew the lease yet: %s", _short(e))
                    pause = self.retry_seconds
                    continue
                log.error("could not renew the lease in time: %s", _short(e))
                break

    def release(self) -> None:
        """Give the Lease up (clean shutdown), so a standby takes over at once."""
        self._leading = False  # nothing is written as the leader from here on
        try:
            lease = self.kube.request("GET", self.path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = None
            lease["spec"]["leaseDurationSeconds"] = 1
            self.kube.request("PUT", self.path, lease, count_write=False)
            metrics.LEADER.set(0)
        except Exception as e:
            log.warning("cannot release the lease: %s", _short(e))
