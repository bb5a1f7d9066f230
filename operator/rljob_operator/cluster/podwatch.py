"""The worker pods: a store of them by job, fed by the pod stream (``handlers.PodEvents``).

The pods come from ``streams.Stream`` (the API server filters them by the job label, ``PODS``), not
from a kopf index: kopf's per-object machinery cost more than every reconcile in a burst (``streams``).

What the store promises the reconciler, as kopf's index did: before the first listing of every
watched namespace ended, ``pods()`` answers None (the reconciler then lists the job's pods itself);
afterwards, what the watch last showed, updated before the event is handed on. A pod deleted while
the watch was away reaches it as the stream's DELETED at the end of the relisting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rljob_operator.cluster.streams import Resource
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.observed import slim_pod
from rljob_operator.names import LABEL_JOB

#: The operator's worker pods: those with the job label, filtered by the API server.
PODS = Resource("", "v1", "pods", label_selector=LABEL_JOB)


class PodStore:
    """The worker pods of every job, by job and uid, as the streams of ``scopes`` show them.

    ``scopes``: the watched namespaces (None: the whole cluster). Only the event loop writes;
    reconcile threads read with ``pods`` (``list()`` of a dict's values is one step for the GIL).
    """

    def __init__(self, scopes: Iterable[str | None]) -> None:
        self.scopes = set(scopes)
        self.by_job: dict[JobKey, dict[str, dict[str, Any]]] = {}
        self.listed: set[str | None] = set()
        """Scopes whose first listing has ended."""

    @classmethod
    def watching(cls, namespaces: Iterable[str]) -> PodStore:
        """The store for an operator watching ``namespaces`` (none: the whole cluster)."""
        return cls(set(namespaces) or {None})

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

    def apply(self, type: str | None, body: Mapping[str, Any]) -> tuple[JobKey, dict[str, Any]] | None:
        """Record one event (type None: listed); the job's key and the slim pod (for DELETED, as the
        store last had it), or None for a pod without the job label (the selector makes that a server's bug)."""
        meta = body.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        uid = meta.get("uid")
        if not job or not uid:
            return None
        key = JobKey(meta.get("namespace") or "", job)
        if type == "DELETED":
            store = self.by_job.get(key)
            kept = store.pop(uid, None) if store is not None else None
            if store is not None and not store:
                del self.by_job[key]
            return key, kept if kept is not None else slim_pod(body)
        pod = slim_pod(body)
        self.by_job.setdefault(key, {})[uid] = pod
        return key, pod

    def end_listing(self, scope: str | None) -> None:
        """The listing of ``scope`` ended: the store serves once every scope's has."""
        self.listed.add(scope)
