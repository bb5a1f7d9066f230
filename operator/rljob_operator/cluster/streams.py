"""kopf's watch streams without kopf's per-object machinery: the RLTrainingJobs and (``podwatch``) their
worker pods.

Both were kopf ``on.event`` handlers (the pods also a kopf index). For every event kopf ran its
per-object machinery: a worker task and queue per object, the event's causes, handler invocation
with its keyword views, progress storage and handler state, an object logger. In a burst of 100
jobs that cost more of the operator's one interpreter than every reconcile together for the pods,
and ~8% of it for the jobs (``bench/burst_floor.py``, profiled: bench/README.md), for nothing: no
handler state, no finalizer, no patch. So a ``ResourceStream`` reads kopf's own watch stream (its
paginated listing, resourceVersion continuation, relisting after 410 Gone, bookmarks, reconnects and
the credentials of ``on.login``) per scope, a namespace or the cluster, and hands each event on.

kopf exports no such stream: ``watching.infinite_watch`` is kopf's internal API (checked for the
locked kopf by ``tests/operator/test_operator_unit.py``). It must run in a task kopf started (an
``on.startup`` activity's), which carries kopf's credentials. A stream that ends on its own (say
403 Forbidden) sets ``failed``: the runner then stops the operator, which must not go on blind.

One thing kopf's handlers did not: an object deleted while the stream was away (the relisting after
410 Gone does not show it) is handed on as DELETED at the end of that listing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, cast

import kopf
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import watching
from kopf._cogs.structs import references
from rljob_contract.job import GROUP, PLURAL, VERSION

from rljob_operator.cluster.kube import loads
from rljob_operator.cluster.workqueue import JobKey

log = logging.getLogger("rljob.streams")

#: The RLTrainingJobs, watched without a label selector.
JOBS = references.Resource(GROUP, VERSION, PLURAL, kind="RLTrainingJob", namespaced=True,
                           verbs=frozenset({"list", "watch"}))
#: ``on_event(type, key, job)``: type None for a listed job, as kopf's ``on.event`` gave.
OnJobEvent = Callable[[str | None, JobKey, Mapping[str, Any]], None]


def decode_watches_fast() -> None:
    """Have kopf decode its watch streams' lines with ``kube.loads`` (orjson) instead of ``json.loads``.

    kopf's ``api.stream`` decodes each line with the module ``json`` it imported; decoding the worker pods'
    events was a third of the event loop's time in a burst of 100 jobs (``bench/README.md``). kopf's
    internals again (checked for the locked kopf by ``tests/operator/test_operator_unit.py``); idempotent.
    """
    if getattr(kopf_api.json, "loads", None) is not loads:
        kopf_api.json = cast(Any, types.SimpleNamespace(**{**vars(json), "loads": loads}))


class ResourceStream:
    """One kopf watch stream of ``resource`` per scope: each of ``namespaces``, or the whole cluster (None)
    if none. Each event goes to ``handle``, each end of a (re)listing to ``listed``; an error there is
    logged, never ends the stream."""

    resource: ClassVar[references.Resource]
    what: ClassVar[str]
    """What the stream is called in task names and logs ("pod watch")."""

    def __init__(self, namespaces: Iterable[str]) -> None:
        self.scopes: set[str | None] = set(namespaces) or {None}
        self.tasks: list[asyncio.Task[None]] = []
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        """Set when a stream ended on its own (``failure`` says why): the operator must not go on blind."""

    def handle(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        """One event of ``scope``'s stream (type None: listed)."""
        raise NotImplementedError

    def listed(self, scope: str | None) -> None:
        """The (re)listing of ``scope`` ended: every object it did not show is gone."""
        raise NotImplementedError

    def start(self, settings: kopf.OperatorSettings) -> None:
        """Start the streams, from a task kopf started (its credentials are in the task's context)."""
        decode_watches_fast()
        self.tasks = [asyncio.create_task(self._stream(settings, scope), name=f"{self.what} {scope or 'cluster'}")
                      for scope in sorted(self.scopes, key=str)]
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
        stream = watching.infinite_watch(settings=settings, resource=self.resource, namespace=cast(Any, scope))
        async for event in stream:
            try:
                if event is watching.Bookmark.LISTED:
                    self.listed(scope)
                elif not isinstance(event, watching.Bookmark) and event.get("type") != "BOOKMARK":
                    self.handle(scope, event.get("type"), event["object"])
            except Exception:
                log.exception("%s %s: an event not handled", self.what, scope or "cluster")


class JobStream(ResourceStream):
    """The RLTrainingJobs, each event handed to ``on_event``."""

    resource = JOBS
    what = "job watch"

    def __init__(self, namespaces: Iterable[str], on_event: OnJobEvent) -> None:
        super().__init__(namespaces)
        self.on_event = on_event
        self.keys: set[JobKey] = set()
        """The jobs the stream shows."""
        self._listing: dict[str | None, set[JobKey]] = {}
        """Scope → the jobs its listing in progress has shown."""

    def handle(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = JobKey(meta.get("namespace") or "", meta.get("name") or "")
        if type is None:
            self._listing.setdefault(scope, set()).add(key)
        if type == "DELETED":
            self.keys.discard(key)
        else:
            self.keys.add(key)
        self.on_event(type, key, body)

    def listed(self, scope: str | None) -> None:
        seen = self._listing.pop(scope, set())
        for key in sorted((k for k in self.keys if k not in seen and scope in (None, k.namespace)), key=str):
            self.keys.discard(key)
            self.on_event("DELETED", key, {"metadata": {"namespace": key.namespace, "name": key.name}})
