"""The Namespaces' labels as their watch shows them: what a ClusterRLTrainingRuntime's namespaceSelector is
matched against (``decisions.runtimes.not_allowed``).

The operator enforces the selector itself, so that a cluster whose admission policies are off is not open; it
reads the labels from one cluster-wide stream (``streams.Stream``, as the runtimes'), never with a GET per
reconcile. Only the labels are kept. Until the stream has listed once the store is not ``synced``: the
reconciler waits a moment rather than judge a job by labels it has not seen. A Namespace whose labels change
queues the jobs of that namespace: a job the selector no longer admits fails, a job edited since may run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rljob_operator.cluster.handlers import Enqueue
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.streams import Resource

#: The Namespaces (cluster-scoped: one stream whatever namespaces the operator watches).
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)


class NamespaceStore:
    """Namespace name → its labels; written by the stream's subscriber (event loop), read by reconcile threads."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, str]] = {}
        self.listed = False

    def synced(self) -> bool:
        """The stream has listed once: a Namespace absent here does not exist."""
        return self.listed

    def labels(self, name: str) -> dict[str, str]:
        """The labels of Namespace ``name`` (none known: none)."""
        return self.by_name.get(name) or {}


class NamespaceEvents:
    """The Namespaces stream's subscriber: their labels into the store; a change of a Namespace's labels after
    the first listing queues the jobs of that namespace (``JobCache``)."""

    def __init__(self, store: NamespaceStore, jobs: JobCache, queue: Enqueue) -> None:
        self.store = store
        self.jobs = jobs
        self.queue = queue

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        before = self.store.by_name.get(name)
        if type == "DELETED":
            self.store.by_name.pop(name, None)
        else:
            self.store.by_name[name] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        if self.store.listed and before != self.store.by_name.get(name):
            for key in self.jobs.select(lambda key, _: key.namespace == name):
                self.queue.add(key)

    def listed(self, scope: str | None) -> None:
        """What the listing did not show came as DELETED: the store holds every Namespace."""
        self.store.listed = True
