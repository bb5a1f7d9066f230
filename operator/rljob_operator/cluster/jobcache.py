"""The jobs as the watch last showed them, so that a reconcile need not GET its job.

A reconcile reads its job from here, not from the API server, unless this operator wrote the
job's status and the watch has not shown that write yet: a decision read from a status older
than the operator's own last write could restart a gang twice or create its pods again, so then
the reconcile GETs the job. Anyone else's change reaches the watch as its own event, which
queues the job, as it would with a GET (a change made during a reconcile is seen by the next).

The watch event of the operator's own status write queues nothing: the reconcile that wrote it
had already acted on everything it shows. Only when nothing else in the job changed meanwhile
(its metadata as the reconcile read it: spec generation, labels, annotations, deletion), since a
watch that restarts shows only an object's latest version. The event often arrives before the
reconcile's thread has read the API server's answer, so the events of a job whose reconcile is
running are held until it ends (``begin``, ``end``; the work queue would only have run it again
afterwards), and then compared with what it wrote.

``seen``, ``begin`` and ``end`` are called from the event loop, the rest from reconcile threads,
under one lock.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from rljob_operator.cluster.workqueue import JobKey

#: How many of a job's own writes are remembered until the watch shows them (a watch that restarts shows
#: only the latest version: the older ones are never shown).
OWN_WRITES_KEPT = 8
#: Metadata a status write changes on its own (what is left must be as the reconcile read it).
_CHANGED_BY_A_STATUS_WRITE = ("resourceVersion", "managedFields")


def _version(body: dict[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("resourceVersion")


def _metadata_but_version(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (body.get("metadata") or {}).items() if k not in _CHANGED_BY_A_STATUS_WRITE}


def _without_managed_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` less its managedFields (a reconcile reads none; they are most of a small job's bytes)."""
    metadata = body.get("metadata") or {}
    if "managedFields" not in metadata:
        return body
    return {**body, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


class JobCache:
    """Each job's latest body from the watch, and this operator's status writes it has not shown yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[JobKey, dict[str, Any]] = {}
        self._written: dict[JobKey, str] = {}
        """Per job, the resourceVersion of this operator's last status write that the watch has not shown yet."""
        self._own: dict[JobKey, dict[str, None]] = {}
        """Per job, the versions of this operator's status writes that changed nothing but the status, until
        the watch shows them."""
        self._held: dict[JobKey, list[str]] = {}
        """Per job whose reconcile runs, the versions of the watch events held until it ends."""

    def seen(self, key: JobKey, body: dict[str, Any] | None) -> bool:
        """The watch showed ``body`` (None: the job was deleted). True if the event queues nothing now: this
        operator's own status write and nothing else, or an event held for the end of a running reconcile."""
        with self._lock:
            if body is None:
                self._bodies.pop(key, None)
                self._written.pop(key, None)
                self._own.pop(key, None)
                return False
            self._bodies[key] = _without_managed_fields(body)
            version = _version(body) or ""
            if self._written.get(key) == version:
                del self._written[key]
            if key in self._held:
                self._held[key].append(version)
                return True
            return self._is_own(key, version)

    def _is_own(self, key: JobKey, version: str) -> bool:
        own = self._own.get(key)
        if own is None or version not in own:
            return False
        del own[version]
        if not own:
            del self._own[key]
        return True

    def begin(self, key: JobKey) -> None:
        """A reconcile of ``key`` starts: its job's events are held until ``end``."""
        with self._lock:
            self._held[key] = []

    def end(self, key: JobKey) -> bool:
        """The reconcile of ``key`` ended: does an event held meanwhile need another (one not its own)?"""
        with self._lock:
            again = False
            for version in self._held.pop(key, []):  # every one: each own write seen is consumed
                if not self._is_own(key, version):
                    again = True
            return again

    def wrote(self, key: JobKey, read: dict[str, Any], answer: dict[str, Any]) -> None:
        """This operator patched the status of the job it had read as ``read``; ``answer``: the API server's
        reply (the job after the write)."""
        version = _version(answer)
        if not version:
            return
        with self._lock:
            if _metadata_but_version(answer) == _metadata_but_version(read):
                own = self._own.setdefault(key, {})
                own[version] = None
                if len(own) > OWN_WRITES_KEPT:
                    del own[next(iter(own))]
            shown = self._bodies.get(key)
            if shown is None or _version(shown) != version:  # else the watch was quicker than this thread
                self._written[key] = version

    def get(self, key: JobKey) -> dict[str, Any] | None:
        """The job as the watch last showed it (a copy); None if unknown, or older than this operator's
        last status write."""
        with self._lock:
            if key in self._written:
                return None
            body = self._bodies.get(key)
        return copy.deepcopy(body) if body is not None else None

    def got(self, key: JobKey, body: dict[str, Any]) -> None:
        """A GET (sent after this operator's last status write) returned ``body``: if the watch shows the
        same version, the watch has caught up with that write (one it will never show, say after a
        restart of the watch that showed only a later version), and ``get`` serves the job again."""
        with self._lock:
            shown = self._bodies.get(key)
            if shown is not None and _version(shown) == _version(body):
                self._written.pop(key, None)
                self._own.pop(key, None)

    def with_reason(self, reason: str) -> list[JobKey]:
        """The jobs whose status, as the watch last showed it, has ``reason`` (say, waiting for a runtime)."""
        with self._lock:
            return [key for key, body in self._bodies.items() if (body.get("status") or {}).get("reason") == reason]
