"""The one way events reach the operator: each resource listed, then watched, through the kubernetes client.

A :class:`Stream` follows one resource (the RLTrainingJobs, their worker pods, Nodes, RLExperiments,
an admission gate's objects) in each scope, a watched namespace or the whole cluster, as client-go's
reflector does, from a thread per scope: a paginated LIST, then a WATCH from the list's
resourceVersion with bookmarks through the client's public ``watch.Watch`` (it splits the stream
into lines, raises its ERROR events and cuts the connection on ``stop``), resumed from the last
resourceVersion seen whenever the API server ends it, and listed afresh when the API server answers
410 Gone (the version is older than its watch cache). The requests carry the operator's own
credentials (its ``Kube``'s configuration, the in-cluster token re-read per request) and the
resource's label selector, so the API server filters what it sends. Each line is decoded by orjson
(``kube.loads``) into the plain dicts the handlers read; no client model is built.

Each event is handed to the stream's :class:`Subscriber` in the event loop, in the order the API
server sent it, with ``type`` None for a listed object, as kopf's ``on.event`` gave it. The
subscriber also hears when a listing ended. An error in the subscriber is logged and never ends the
stream.

What the stream promises beyond the API server's events: an object that is gone from a relisting
(deleted while the stream was away: the relisting after 410 Gone does not show it, and no DELETED
event ever will) is handed on as DELETED at the end of that listing, with what the stream last saw
of it (namespace, name, uid, labels); an object replaced under the same name meanwhile is handed on
as DELETED (the old uid) before its successor.

Errors: a refused or failed request (no connection, a timeout, a line that is not JSON, 5xx, 429,
401, 403) is retried after 1, 1, 2, 3, 5, 8, 13 and 21 s, and then the stream ends; so does one
that cannot succeed (400, 404 for a resource not served, 422). A resource marked ``optional`` (a CRD that may be
installed later: the RLExperiments, a gate's) that is not served is looked for every
``NOT_SERVED_SECONDS`` instead. A stream that ends sets ``failed``: the runner then stops the
operator, which must not go on blind (its pod restarts and lists everything afresh).

Why not kopf's handlers: for every event kopf ran its per-object machinery (a worker task and queue
per object, the event's causes, handler invocation with its keyword views, progress storage, an
object logger): in a burst of 100 jobs that cost more of the operator's one interpreter than every
reconcile together for the pods (``bench/README.md``), for nothing the operator uses. Why not
kopf's own stream: it is kopf's internal API, which a kopf upgrade may move without notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rljob_operator.cluster.kube import Kube, loads

log = logging.getLogger("rljob.streams")

#: Seconds between retries of a failed request; after the last the stream ends.
BACKOFFS = (1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0)
#: Answers worth a retry: no answer (0: a connection or TLS error the client reports as a status), a
#: credential being rotated (401), permissions being granted (403, as during an upgrade), a timeout,
#: too many requests, the server's errors.
RETRIED = frozenset({0, 401, 403, 408, 429, 500, 502, 503, 504})
#: How long the API server keeps a watch open (it ends it after that; the stream resumes at once).
SERVER_TIMEOUT_SECONDS = 300
#: How long the client waits for a byte of a watch before it takes the connection for dead (bookmarks
#: come about every minute; the server ends the watch after ``SERVER_TIMEOUT_SECONDS``).
READ_TIMEOUT_SECONDS = SERVER_TIMEOUT_SECONDS + 30
CONNECT_TIMEOUT_SECONDS = 30.0
#: Objects per page of a listing.
PAGE_SIZE = 500
#: How often a stream looks again for an optional resource that is not served.
NOT_SERVED_SECONDS = 30.0
#: The pause between two watch requests, so that a server ending each at once is not flooded.
RECONNECT_SECONDS = 0.1


@dataclass(frozen=True)
class Resource:
    """A resource to follow, and what the API server filters it by."""

    group: str
    version: str
    plural: str
    namespaced: bool = True
    label_selector: str = ""
    """Only objects with these labels (the API server's syntax; "" for all)."""
    optional: bool = False
    """Not served (its CRD not installed): look again later instead of ending the stream."""

    def path(self, namespace: str | None) -> str:
        """The collection's path: in ``namespace``, or across the cluster (None)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None and self.namespaced:
            return f"{base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{base}/{self.plural}"


class Subscriber(Protocol):
    """What a stream hands its events to, in the event loop."""

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        """One object's event in ``scope`` (its namespace, or None across the cluster): ``type`` is
        ADDED, MODIFIED, DELETED, or None for an object a listing showed."""
        ...

    def listed(self, scope: str | None) -> None:
        """A listing of ``scope`` ended (and what it did not show was handed on as DELETED)."""
        ...


class Stopped(Exception):
    """The stream was stopped (raised inside its threads only)."""


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _tombstone(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a stream keeps of an object it showed, to hand it on as DELETED should it vanish."""
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("namespace", "name", "uid", "labels") if k in meta}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": kept}


class _JsonWatch(watch.Watch):
    """The client's watch with each line decoded by orjson into a plain dict (the client would decode
    it twice and build its model classes for every event)."""

    def unmarshal_event(self, data: str, return_type: Any) -> Any:
        if not data or data.isspace():
            return None
        event = loads(data)
        event["raw_object"] = event.get("object")  # where ``stream`` reads an ERROR event's code
        return event


class _Follower:
    """One scope of a stream: the thread that lists and watches it, and what it has shown."""

    def __init__(self, stream: Stream, scope: str | None) -> None:
        self.stream = stream
        self.scope = scope
        self.resource_version: str | None = None
        """Where the next watch resumes; None: list first."""
        self.known: dict[tuple[str, str], dict[str, Any]] = {}
        """What the stream has shown and not seen deleted, by namespace and name: its tombstone."""
        self.failures = 0
        """Failed requests in a row."""
        self.not_served = False
        """Was the (optional) resource found not served? (said once)"""
        self._watch: _JsonWatch | None = None
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Follow the scope from where it was left (a stopped stream resumes as a reconnect would, once
        its thread has ended)."""
        if self.thread is not None and self.thread.is_alive():
            raise RuntimeError(f"{self.thread.name} is still stopping")
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"rljob-watch-{self.stream.resource.plural}-{self.scope or 'cluster'}")
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        current = self._watch
        if current is not None:
            current.stop()  # shuts the connection down: the blocked read returns

    def _run(self) -> None:
        try:
            self._follow()
        except Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - whatever ends the thread ends the stream
            if not self._stop.is_set():
                self.stream.post(self.stream.ended, self.scope, e)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch_once()
                self._pause(RECONNECT_SECONDS)
            except ApiException as e:
                self._failed(e, e.status or 0)
            except (HTTPError, OSError, ValueError) as e:  # no connection, reset, timed out, cut short; a bad line
                if self._stop.is_set():
                    raise Stopped from None
                self._failed(e, 0)

    def _failed(self, error: Exception, status: int) -> None:
        """Relist, wait, or back off and retry, as ``error`` calls for; raise it when the stream must end."""
        where = f"{self.stream.resource.plural} in {self.scope or 'the cluster'}"
        if status == 410:  # the version is older than the API server's watch cache: list afresh
            log.debug("watch of %s: resourceVersion %s expired, listing again", where, self.resource_version)
            self.resource_version = None
        elif status == 404 and self.stream.resource.optional:
            if not self.not_served:
                log.warning("watch of %s: not served (is its CRD installed?); looking again every %.0f s",
                            where, NOT_SERVED_SECONDS)
            self.not_served = True
            self.resource_version = None
            self._pause(NOT_SERVED_SECONDS)
        elif status in RETRIED and self.failures < len(BACKOFFS):
            delay = BACKOFFS[self.failures]
            self.failures += 1
            log.warning("watch of %s failed (%d in a row), retrying in %.0f s: %s", where, self.failures, delay,
                        error)
            self._pause(delay)
        else:
            raise error

    def _pause(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise Stopped

    def _list(self) -> None:
        """List the scope page by page, handing each object on as it comes, then what is gone as DELETED."""
        resource, seen = self.stream.resource, set()
        query: dict[str, Any] = {"labelSelector": resource.label_selector or None, "limit": PAGE_SIZE}
        while True:
            page = self.stream.kube.request("GET", resource.path(self.scope), query=query, metered=False)
            self.failures = 0
            kind, api_version = (page.get("kind") or "").removesuffix("List"), page.get("apiVersion")
            batch: list[tuple[str | None, Any]] = []
            for item in page.get("items") or []:
                item.setdefault("kind", kind)  # a list's items do not say, a watch's objects do
                item.setdefault("apiVersion", api_version)
                key, uid = _key(item), (item.get("metadata") or {}).get("uid")
                old = self.known.get(key)
                if old is not None and old["metadata"].get("uid") != uid:  # replaced under its name meanwhile
                    batch.append(("DELETED", old))
                self.known[key] = _tombstone(item)
                seen.add(key)
                batch.append((None, item))
            self._hand_on(batch)
            query["continue"] = (page.get("metadata") or {}).get("continue") or None
            if not query["continue"]:
                break
        gone = [("DELETED", self.known.pop(key)) for key in sorted(set(self.known) - seen)]
        self._hand_on([*gone, (LISTED, None)])
        self.resource_version = (page.get("metadata") or {}).get("resourceVersion")

    def _watch_once(self) -> None:
        """One watch request, from ``resource_version`` until the API server ends it."""
        self._watch = _JsonWatch(return_type="object")
        if self._stop.is_set():
            raise Stopped
        try:
            for event in self._watch.stream(self._open, resource_version=self.resource_version,
                                            timeout_seconds=SERVER_TIMEOUT_SECONDS, allow_watch_bookmarks=True):
                if event is None:
                    continue
                self._seen(event["type"], event["object"])
        finally:
            self._watch = None

    def _open(self, *, watch: bool, _preload_content: bool, resource_version: str | None,
              timeout_seconds: int, allow_watch_bookmarks: bool) -> Any:
        """The watch request, for ``watch.Watch.stream`` (which passes it these keywords)."""
        resource = self.stream.resource
        response = self.stream.kube.open(resource.path(self.scope), query={
            "watch": "true", "resourceVersion": resource_version, "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true" if allow_watch_bookmarks else None,
            "labelSelector": resource.label_selector or None,
        }, timeout=(CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS))
        self.failures = 0
        return response

    def _seen(self, type: str, body: dict[str, Any]) -> None:
        """One watch event: remember where it leaves the stream and hand it on (bookmarks only move it)."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = version
        if type not in ("ADDED", "MODIFIED", "DELETED"):  # BOOKMARK: only the version moves
            return
        if type == "DELETED":
            self.known.pop(_key(body), None)
        else:
            self.known[_key(body)] = _tombstone(body)
        self._hand_on([(type, body)])

    def _hand_on(self, batch: list[tuple[str | None, Any]]) -> None:
        if self._stop.is_set():
            raise Stopped
        self.stream.post(self.stream.deliver, self.scope, batch)


#: The marker of a listing's end among a batch's events.
LISTED = "LISTED"


class Stream:
    """One resource followed in each of ``namespaces`` (none: across the cluster; a cluster-scoped
    resource always is), its events handed to ``subscriber`` in the event loop."""

    def __init__(self, kube: Kube, resource: Resource, subscriber: Subscriber, namespaces: Iterable[str] = ()) -> None:
        self.kube = kube
        self.resource = resource
        self.subscriber = subscriber
        scopes: set[str | None] = set(namespaces) if resource.namespaced else set()
        self.followers = [_Follower(self, scope) for scope in sorted(scopes or {None}, key=str)]
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        """Set when the stream ended on its own (``failure`` says why): the operator must not go on blind."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    @property
    def what(self) -> str:
        """How logs name the stream."""
        return f"watch of {self.resource.plural}"

    def start(self) -> None:
        """Start following, from the running event loop (the one the subscriber is called in)."""
        self._loop = asyncio.get_running_loop()
        self._stopped = False
        for follower in self.followers:
            follower.start()

    async def stop(self) -> None:
        """Stop following; nothing more is handed on. The threads end on their own (none blocks the exit)."""
        self._stopped = True
        for follower in self.followers:
            follower.stop()

    def post(self, callback: Any, *args: Any) -> None:
        """Run ``callback(*args)`` in the event loop (from a stream's thread)."""
        if self._loop is None or self._stopped:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: the operator is stopping
            self._loop.call_soon_threadsafe(callback, *args)

    def deliver(self, scope: str | None, batch: list[tuple[str | None, Any]]) -> None:
        """Hand a batch of ``scope``'s events to the subscriber (in the event loop)."""
        for type, body in batch:
            if self._stopped:
                return
            try:
                if type == LISTED:
                    self.subscriber.listed(scope)
                else:
                    self.subscriber.event(scope, type, body)
            except Exception:
                log.exception("%s in %s: an event not handled", self.what, scope or "the cluster")

    def ended(self, scope: str | None, error: BaseException) -> None:
        """A scope's thread ended on its own (in the event loop)."""
        if self._stopped or self.failed.is_set():
            return
        self.failure = error
        self.failed.set()


class Watches:
    """Every stream of the operator: started together, stopped together, and the first that ends."""

    def __init__(self, kube: Kube, namespaces: Iterable[str] = ()) -> None:
        """``namespaces``: those watched (none: the whole cluster)."""
        self.kube = kube
        self.namespaces = tuple(namespaces)
        self.streams: list[Stream] = []

    def add(self, resource: Resource, subscriber: Subscriber) -> Stream:
        """Follow ``resource`` (one stream per resource: a second subscriber fans out from the first)."""
        if any(s.resource.path(None) == resource.path(None) for s in self.streams):
            raise ValueError(f"{resource.path(None)} is watched already: one stream per resource")
        stream = Stream(self.kube, resource, subscriber, self.namespaces)
        self.streams.append(stream)
        return stream

    def start(self) -> None:
        for stream in self.streams:
            stream.start()

    async def stop(self) -> None:
        await asyncio.gather(*(stream.stop() for stream in self.streams))

    async def ended(self) -> Stream:
        """Wait until a stream ends on its own; that stream (its ``failure`` says why)."""
        if not self.streams:
            await asyncio.Event().wait()  # none can end
        waits = {asyncio.ensure_future(stream.failed.wait()): stream for stream in self.streams}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return waits[done.pop()]
