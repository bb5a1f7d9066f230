"""Events a job's pods cause, merged and rate-limited as client-go's EventRecorder does (issue #30 point 4).

A heartbeat's ``warnings`` come from the job's own pods, so they are hostile input even with a
valid token: one Event per warning would let a job write Events without bound. The reconciler's
Events (whose messages may quote a worker's termination message) go through a recorder too. The
``EventCorrelator`` (pure, the clock a parameter) decides for each warning what client-go's
``EventCorrelator`` (k8s.io/client-go/tools/record/events_cache.go) would:

1. **spam filter**: a token bucket per job (``burst`` Event writes at once, then one every
   ``refill_seconds``: client-go's 25 and 5 minutes); a warning beyond it is dropped and counted
   (``rljob_operator_events_dropped_total{reason}``);
2. **aggregation**: at most ``max_similar`` distinct messages per (job, type, reason) within
   ``similar_window_seconds`` get an Event of their own; later ones share one Event whose message is
   ``(combined from similar events): <the latest>`` (client-go: 10 within 10 minutes);
3. **deduplication**: a repeat of an Event already written (same job, type, reason, message) is a
   PATCH of its ``count`` and ``lastTimestamp``, not a new Event.

The bound: every write, creation or patch, spends a token, so one job causes at most
``burst + t / refill_seconds`` Event writes, hence Event objects, in any t seconds (25 in the
first 5 minutes, one more every 5 minutes), however fast its pods send; and at most
``max_similar + 1`` Event objects per reason in a window. ``EventRecorder`` applies the decisions.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from rljob_operator import metrics
from rljob_operator.cluster.kube import Kube
from rljob_operator.server.guard import RateLimiter

log = logging.getLogger("rljob.events")
COMBINED_PREFIX = "(combined from similar events): "


@dataclass(frozen=True)
class EventLimits:
    """How many Events one job may cause (client-go's defaults)."""

    burst: int = 25
    refill_seconds: float = 300.0
    max_similar: int = 10
    similar_window_seconds: float = 600.0
    max_events: int = 4096
    """Events remembered for deduplication (least recently seen forgotten first), all jobs together."""

    def bound(self, seconds: float) -> int:
        """The most Event objects one job can cause in ``seconds``."""
        return self.burst + int(seconds // self.refill_seconds)


@dataclass(frozen=True)
class Decision:
    """What to write for one warning: ``create``, ``patch`` (Event ``name``, to ``count``) or ``drop``."""

    action: str
    key: tuple[str, ...] = ()
    message: str = ""
    count: int = 0
    name: str | None = None


@dataclass
class _Similar:
    since: float
    messages: set[str] = field(default_factory=set)


class EventCorrelator:
    """Pure decisions over what it has seen; ``now`` is a parameter (monotonic seconds)."""

    def __init__(self, limits: EventLimits | None = None) -> None:
        self.limits = limits or EventLimits()
        self._spam = RateLimiter(1.0 / self.limits.refill_seconds, self.limits.burst)
        self._similar: dict[tuple[str, ...], _Similar] = {}
        self._seen: OrderedDict[tuple[str, ...], tuple[str | None, int]] = OrderedDict()

    def decide(self, job: str, type_: str, reason: str, message: str, now: float) -> Decision:
        """The write for ``message`` on job ``job`` (its key: ``namespace/name/uid``), its token spent, or ``drop``."""
        if self._spam.take(job, now):
            return Decision("drop")
        message = self._aggregated((job, type_, reason), message, now)
        key = (job, type_, reason, message if not message.startswith(COMBINED_PREFIX) else COMBINED_PREFIX)
        name, count = self._seen.pop(key, (None, 0))
        self._seen[key] = (name, count + 1)
        if len(self._seen) > self.limits.max_events:
            self._seen.popitem(last=False)
        if name is None:  # never written (or its creation failed): create it, with every repeat counted
            return Decision("create", key, message, count + 1)
        return Decision("patch", key, message, count + 1, name)

    def _aggregated(self, similar_key: tuple[str, ...], message: str, now: float) -> str:
        similar = self._similar.get(similar_key)
        if similar is None or now - similar.since > self.limits.similar_window_seconds:
            similar = self._similar[similar_key] = _Similar(now)
            if len(self._similar) > self.limits.max_events:
                self._similar.clear()
                self._similar[similar_key] = similar
        if message in similar.messages or len(similar.messages) < self.limits.max_similar:
            similar.messages.add(message)
            return message
        return COMBINED_PREFIX + message

    def written(self, key: tuple[str, ...], name: str, count: int) -> None:
        """The Event for ``key`` now exists as ``name`` with ``count`` (repeats patch it)."""
        self._seen[key] = (name, max(count, self._seen.get(key, (None, 0))[1]))

    def forget(self, key: tuple[str, ...]) -> None:
        """The Event for ``key`` is gone (expired, deleted): the next repeat creates it again."""
        self._seen.pop(key, None)


class EventRecorder:
    """Writes Events on jobs as its ``EventCorrelator`` decides: create, patch the count, or drop.

    The correlator's state has one lock; each job's writes another, so a repeat finds the name of
    the Event its predecessor created while other jobs' writes go on.
    """

    def __init__(self, kube: Kube, limits: EventLimits | None = None, component: str = "rljob-operator",
                 instance: str = "") -> None:
        self.kube = kube
        self.correlator = EventCorrelator(limits)
        self.component = component
        self.instance = instance
        self._lock = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}

    def _job_lock(self, key: str) -> threading.Lock:
        with self._lock:
            if key not in self._job_locks and len(self._job_locks) >= self.correlator.limits.max_events:
                self._job_locks.clear()  # bounded; at worst two writes of one job race (a second Event)
            return self._job_locks.setdefault(key, threading.Lock())

    def record(self, job: dict[str, Any], type_: str, reason: str, message: str, now: str, clock: float) -> str:
        """Create, count or drop an Event on ``job``; the action taken (``create``, ``patch`` or ``drop``).

        ``clock``: monotonic seconds (the correlator's time); ``now``: the Event's RFC 3339 timestamp.
        """
        meta = job["metadata"]
        key = f"{meta['namespace']}/{meta['name']}/{meta.get('uid', '')}"  # a job made again is another job
        with self._job_lock(key):
            with self._lock:
                decision = self.correlator.decide(key, type_, reason, message, clock)
            if decision.action == "drop":
                metrics.EVENTS_DROPPED.labels(reason=reason).inc()
                return "drop"
            if decision.action == "patch" and decision.name and self._patched(meta["namespace"], decision, now):
                return "patch"
            created = self.kube.post_event(job, type_, reason, decision.message, now, component=self.component,
                                           instance=self.instance, count=decision.count)
            name = ((created or {}).get("metadata") or {}).get("name")
            if name:
                with self._lock:
                    self.correlator.written(decision.key, str(name), decision.count)
            return "create"

    def _patched(self, namespace: str, decision: Decision, now: str) -> bool:
        """Patch the Event ``decision`` repeats; False when it has expired (the API server's Event TTL)."""
        assert decision.name is not None
        try:
            self.kube.patch_event(namespace, decision.name, decision.count, decision.message, now)
            return True
        except ApiException as e:
            if e.status != 404:
                raise
        with self._lock:
            self.correlator.forget(decision.key)
        return False
