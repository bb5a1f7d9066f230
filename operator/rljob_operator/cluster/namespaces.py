"""The Namespaces' labels as their watch shows them: what a ClusterRLTrainingRuntime's namespaceSelector is
matched against (``decisions.runtimes.not_allowed``).

The operator enforces the selector itself, so that a cluster whose admission policies are off is not open;
it reads the labels from one cluster-wide stream (``streams.ResourceStream``, as the runtimes'), never with a
GET per reconcile. Only the labels are kept. Until the stream has listed once the store is not ``synced``:
the reconciler waits a moment rather than judge a job by labels it has not seen. A Namespace whose labels
change queues the jobs of that namespace (``changed``): a job the selector no longer admits fails, one it
admits again may run after an edit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kopf._cogs.structs import references

from rljob_operator.cluster.streams import ResourceStream

NAMESPACES = references.Resource("", "v1", "namespaces", kind="Namespace", namespaced=False,
                                 verbs=frozenset({"list", "watch"}))


class NamespaceStore:
    """Namespace name → its labels; written by the stream (event loop), read by reconcile threads."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, str]] = {}
        self.listed = False
        self._listing: set[str] = set()

    def synced(self) -> bool:
        """The stream has listed once: a Namespace absent here does not exist."""
        return self.listed

    def labels(self, name: str) -> dict[str, str]:
        """The labels of Namespace ``name`` (none known: none)."""
        return self.by_name.get(name) or {}


class NamespaceStream(ResourceStream):
    """The Namespaces of the cluster, their labels into ``store``; ``changed(name)`` when a Namespace's labels
    change after the first listing."""

    resource = NAMESPACES
    what = "namespace watch"

    def __init__(self, store: NamespaceStore, changed: Callable[[str], None]) -> None:
        super().__init__(())
        self.store = store
        self.changed = changed

    def handle(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        before = self.store.by_name.get(name)
        if type == "DELETED":
            self.store.by_name.pop(name, None)
        else:
            self.store.by_name[name] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        if type is None:
            self.store._listing.add(name)
        if self.store.listed and before != self.store.by_name.get(name):
            self.changed(name)

    def listed(self, scope: str | None) -> None:
        seen, self.store._listing = self.store._listing, set()
        for name in [n for n in self.store.by_name if n not in seen]:  # deleted while the stream was away
            del self.store.by_name[name]
        self.store.listed = True
