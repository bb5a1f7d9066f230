"""The watch of the operator's worker pods: a store of them by job, and each event handed on once.

The pods were a kopf index plus a kopf ``on.event`` handler; like the RLTrainingJobs now, they are
read from kopf's own watch stream without kopf's per-object machinery (``streams.ResourceStream``:
why, and what of kopf's internal API it uses), with the label selector of ``kopf_settings``.

What the store promises the reconciler, as kopf's index did: before the first listing of every
watched namespace ended, ``pods()`` answers None (the reconciler then lists the job's pods itself);
afterwards, what the watch last showed, updated before the event is handed on. And one thing kopf's
index did not: a pod deleted while the watch was away (the relisting after 410 Gone misses it) is
dropped at the end of that listing and handed on as DELETED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kopf._cogs.structs import references

from rljob_operator.cluster.streams import ResourceStream
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.observed import slim_pod
from rljob_operator.names import LABEL_JOB

#: What ``kopf_settings`` gives the job label selector to; what this module watches.
PODS = references.Resource("", "v1", "pods", kind="Pod", namespaced=True, verbs=frozenset({"list", "watch"}))
#: ``on_event(type, key, pod, others)``: ``pod`` slimmed, ``others`` the job's pods after the event.
OnEvent = Callable[[str | None, JobKey, dict[str, Any], list[dict[str, Any]]], None]


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


class PodWatch(ResourceStream):
    """One kopf watch stream per scope feeding a ``PodStore`` and ``on_event``."""

    resource = PODS
    what = "pod watch"

    def __init__(self, namespaces: list[str], on_event: OnEvent) -> None:
        super().__init__(namespaces)
        self.store = PodStore(self.scopes)
        self.on_event = on_event

    def handle(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        """One event: the store first, then ``on_event``."""
        applied = self.store.apply(scope, type, body)
        if applied is not None:
            key, pod = applied
            self.on_event(type, key, pod, self.store.job_pods(key))

    def listed(self, scope: str | None) -> None:
        for key, pod in self.store.end_listing(scope):
            self.on_event("DELETED", key, pod, self.store.job_pods(key))
