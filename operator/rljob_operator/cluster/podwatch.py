"""The watch of the operator's worker pods: a store of them by job, and each event handed on once.

The pods were a kopf index plus a kopf ``on.event`` handler. For every pod event kopf ran its
per-object machinery: a worker task and queue per pod, the event's causes, handler invocation with
its keyword views, the index's handler state, an object logger. In a burst of 100 jobs (1,200 pod
events) that cost more of the operator's one interpreter than every reconcile together
(``bench/burst_floor.py``, profiled: bench/README.md). The pods need none of it: no handler state,
no finalizer, no patch. So this reads kopf's own watch stream (its paginated listing,
resourceVersion continuation, relisting after 410 Gone, bookmarks, reconnects and the credentials
of ``on.login``) and keeps the store itself.

kopf exports no such stream: ``watching.infinite_watch`` is kopf's internal API (checked for the
locked kopf by ``tests/test_operator_unit.py``). It must run in a task kopf started (an
``on.startup`` activity's), which carries kopf's credentials.

What the store promises the reconciler, as kopf's index did: before the first listing of every
watched namespace ended, ``pods()`` answers None (the reconciler then lists the job's pods itself);
afterwards, what the watch last showed, updated before the event is handed on. And one thing kopf's
index did not: a pod deleted while the watch was away (the relisting after 410 Gone misses it) is
dropped at the end of that listing and handed on as DELETED.
"""

from __future__ import annotations

import asyncio
import json
import logging
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import kopf
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import watching
from kopf._cogs.structs import references

from rljob_operator.cluster.kube import loads
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.observed import slim_pod
from rljob_operator.names import LABEL_JOB

log = logging.getLogger("rljob.podwatch")

#: What ``kopf_settings`` gives the job label selector to; what this module watches.
PODS = references.Resource("", "v1", "pods", kind="Pod", namespaced=True, verbs=frozenset({"list", "watch"}))
#: ``on_event(type, key, pod, others)``: ``pod`` slimmed, ``others`` the job's pods after the event.
OnEvent = Callable[[str | None, JobKey, dict[str, Any], list[dict[str, Any]]], None]


def decode_watches_fast() -> None:
    """Have kopf decode its watch streams' lines with ``kube.loads`` (orjson) instead of ``json.loads``.

    kopf's ``api.stream`` decodes each line with the module ``json`` it imported; decoding the worker pods'
    events was a third of the event loop's time in a burst of 100 jobs (``bench/README.md``). kopf's
    internals again (checked for the locked kopf by ``tests/test_operator_unit.py``); idempotent.
    """
    if getattr(kopf_api.json, "loads", None) is not loads:
        kopf_api.json = cast(Any, types.SimpleNamespace(**{**vars(json), "loads": loads}))


class PodStore:
    """The worker pods of every job, by job and uid, as the watch streams of ``scopes`` show them.

    ``scopes``: the watched namespaces (None: the whole cluster). Only the event loop writes;
    reconcile threads read with ``pods`` (``list()`` of a dict's values is one step for the GIL).
    """

    def __init__(self, scopes: Iterable[str | None]) -> None:
        self.scopes = set(scopes)
        self.by_job: dict[JobKey, dict[str, dict[str, Any]]] = {}
        self.listed: set[str | None] = set()
        """Scopes whose first listing has ended."""
        self._listing: dict[str | None, set[str]] = {}
        """Scope → the uids its listing in progress has shown."""

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]] | None:
        """The job's pods; None until every scope has been listed once."""
        if self.listed != self.scopes:
            return None
        store = self.by_job.get(JobKey(namespace, name))
        return list(store.values()) if store is not None else []

    def jobs(self) -> list[JobKey]:
        return list(self.by_job)

    def job_pods(self, key: JobKey) -> list[dict[str, Any]]:
        return list((self.by_job.get(key) or {}).values())

    def apply(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> tuple[JobKey, dict[str, Any]] | None:
        """Record one event of ``scope``'s stream (type None: listed); the job's key and the slim pod,
        or None for a pod without the job label (the selector makes that a server's bug)."""
        meta = body.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        uid = meta.get("uid")
        if not job or not uid:
            return None
        key, pod = JobKey(meta.get("namespace") or "", job), slim_pod(body)
        if type is None:
            self._listing.setdefault(scope, set()).add(uid)
        if type == "DELETED":
            store = self.by_job.get(key)
            if store is not None:
                store.pop(uid, None)
                if not store:
                    del self.by_job[key]
        else:
            self.by_job.setdefault(key, {})[uid] = pod
        return key, pod

    def end_listing(self, scope: str | None) -> list[tuple[JobKey, dict[str, Any]]]:
        """The listing of ``scope`` ended: drop (and return) the pods it did not show, which were
        deleted while the watch was away."""
        seen = self._listing.pop(scope, set())
        gone = []
        for key, store in list(self.by_job.items()):
            if scope is not None and key.namespace != scope:
                continue
            for uid in [uid for uid in store if uid not in seen]:
                gone.append((key, store.pop(uid)))
            if not store:
                del self.by_job[key]
        self.listed.add(scope)
        return gone


class PodWatch:
    """One kopf watch stream per scope feeding a ``PodStore`` and ``on_event``."""

    def __init__(self, namespaces: list[str], on_event: OnEvent) -> None:
        self.store = PodStore(namespaces or [None])
        self.on_event = on_event
        self.tasks: list[asyncio.Task[None]] = []
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        """Set when a stream ended on its own (``failure`` says why): the operator must not go on blind."""

    def start(self, settings: kopf.OperatorSettings) -> None:
        """Start the streams, from a task kopf started (its credentials are in the task's context)."""
        decode_watches_fast()
        self.tasks = [asyncio.create_task(self._stream(settings, scope), name=f"pod watch {scope or 'cluster'}")
                      for scope in sorted(self.store.scopes, key=str)]
        for task in self.tasks:
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        self.failure = task.exception() or RuntimeError(f"{task.get_name()} ended")
        self.failed.set()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _stream(self, settings: kopf.OperatorSettings, scope: str | None) -> None:
        stream = watching.infinite_watch(settings=settings, resource=PODS, namespace=cast(Any, scope))
        async for event in stream:
            if event is watching.Bookmark.LISTED:
                for key, pod in self.store.end_listing(scope):
                    self.on_event("DELETED", key, pod, self.store.job_pods(key))
                continue
            if isinstance(event, watching.Bookmark) or event.get("type") == "BOOKMARK":
                continue
            self.handle(scope, event.get("type"), event["object"])

    def handle(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        """One event: the store first, then ``on_event`` (an error there is logged, never ends the watch)."""
        applied = self.store.apply(scope, type, body)
        if applied is None:
            return
        key, pod = applied
        try:
            self.on_event(type, key, pod, self.store.job_pods(key))
        except Exception:
            log.exception("pod event of %s not handled", key)
