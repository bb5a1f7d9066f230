"""The runtimes as the watches show them, and which one serves a job (``rljob_contract.runtime``).

Two streams, read like the jobs' (``streams.ResourceStream``: kopf's watch stream without its per-object
machinery): the ClusterRLTrainingRuntimes (cluster-scoped, one stream whatever namespaces the operator
watches) and the RLTrainingRuntimes of the watched namespaces. A reconcile looks its job's runtime up here,
never with a GET. Until every stream has listed once the store is not ``synced`` (a job would otherwise be
told its runtime does not exist while the listing is on its way): the reconciler waits a moment instead.

A runtime event queues the jobs waiting for a runtime (reason ``RuntimeNotFound``): GitOps may apply a
runtime after the jobs that use it. An edit of a runtime applies from a job's next gang (its pods are
built anew only then); what a running gang was built from is the operator side's to record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kopf._cogs.structs import references
from rljob_contract.job import GROUP, VERSION, ManifestError, RLTrainingJob, RuntimeKind
from rljob_contract.runtime import (
    CLUSTER_PLURAL,
    DEFAULT_RUNTIME_ANNOTATION,
    NAMESPACED_PLURAL,
    TrainingRuntime,
    default_runtime,
    parse_runtime,
)

from rljob_operator.cluster.streams import ResourceStream

log = logging.getLogger("rljob.runtimes")

CLUSTER_RUNTIMES = references.Resource(GROUP, VERSION, CLUSTER_PLURAL, kind=RuntimeKind.cluster.value,
                                       namespaced=False, verbs=frozenset({"list", "watch"}))
NAMESPACED_RUNTIMES = references.Resource(GROUP, VERSION, NAMESPACED_PLURAL, kind=RuntimeKind.namespaced.value,
                                          namespaced=True, verbs=frozenset({"list", "watch"}))
#: A runtime's key in the store: (kind, namespace or "", name).
RuntimeKey = tuple[str, str, str]


class RuntimeStore:
    """The runtimes by kind, namespace and name, parsed once per event; read by reconcile threads."""

    def __init__(self, namespaces: Iterable[str] = ()) -> None:
        scopes: list[str | None] = list(namespaces) or [None]
        self.scopes: set[tuple[str, str | None]] = {(RuntimeKind.cluster.value, None)}
        self.scopes |= {(RuntimeKind.namespaced.value, ns) for ns in scopes}
        self.listed: set[tuple[str, str | None]] = set()
        self.runtimes: dict[RuntimeKey, TrainingRuntime | str] = {}
        """A parsed runtime, or why the models refuse it (the CRD let it through)."""

    def synced(self) -> bool:
        """Every stream has listed once: a runtime absent here does not exist."""
        return self.listed >= self.scopes

    def put(self, kind: str, type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (kind, meta.get("namespace") or "", meta.get("name") or "")
        if type == "DELETED":
            self.runtimes.pop(key, None)
            return
        try:
            self.runtimes[key] = parse_runtime({**body, "kind": kind}, f"{kind}/{key[2]}")
        except ManifestError as e:
            self.runtimes[key] = "; ".join(e.problems)

    def keys(self, kind: str, scope: str | None) -> list[RuntimeKey]:
        return [k for k in self.runtimes if k[0] == kind and scope in (None, k[1])]

    def lookup(self, job: RLTrainingJob) -> tuple[TrainingRuntime | None, str | None]:
        """(the job's runtime, None) or (None, why there is none: what to create or name)."""
        namespace, ref = job.metadata.namespace or "", job.spec.runtime_ref
        if ref is not None:
            key = (str(ref.kind), namespace if ref.kind == RuntimeKind.namespaced else "", ref.name)
            found = self.runtimes.get(key)
            where = f" in namespace {namespace}" if ref.kind == RuntimeKind.namespaced else ""
            if found is None:
                return None, (f"spec.runtimeRef: {ref.kind} {ref.name!r} does not exist{where}: create it, or name "
                              "another")
            if isinstance(found, str):
                return None, f"spec.runtimeRef: {ref.kind} {ref.name!r} is invalid: {found}"
            return found, None
        valid = [r for r in self.runtimes.values() if isinstance(r, TrainingRuntime)]
        mine = [r for r in valid if r.kind == RuntimeKind.cluster or r.metadata.namespace == namespace]
        runtime = default_runtime(mine, RuntimeKind.namespaced) or default_runtime(mine, RuntimeKind.cluster)
        if runtime is None:
            return None, (f"the job names no runtime (spec.runtimeRef) and none is the default: mark an "
                          f"RLTrainingRuntime of namespace {namespace} or a ClusterRLTrainingRuntime with the "
                          f"annotation {DEFAULT_RUNTIME_ANNOTATION}: \"true\", or name one")
        return runtime, None


class RuntimeStream(ResourceStream):
    """One runtime kind's watch: each event into the store, then ``changed`` (the jobs waiting are queued)."""

    def __init__(self, resource: references.Resource, namespaces: Iterable[str], store: RuntimeStore,
                 changed: Callable[[], None]) -> None:
        super().__init__(namespaces if resource.namespaced else ())
        self.resource = resource  # type: ignore[misc]  # per instance: two kinds share the class
        self.what = f"{resource.plural} watch"  # type: ignore[misc]
        self.store = store
        self.changed = changed
        self._listing: dict[str | None, set[RuntimeKey]] = {}

    def handle(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        kind = str(self.resource.kind)
        self.store.put(kind, type, body)
        if type is None:
            meta = body.get("metadata") or {}
            self._listing.setdefault(scope, set()).add((kind, meta.get("namespace") or "", meta.get("name") or ""))
        self.changed()

    def listed(self, scope: str | None) -> None:
        kind = str(self.resource.kind)
        seen = self._listing.pop(scope, set())
        for key in self.store.keys(kind, scope):
            if key not in seen:  # deleted while the stream was away
                self.store.runtimes.pop(key, None)
        self.store.listed.add((kind, scope))
        self.changed()


def runtime_streams(namespaces: list[str], store: RuntimeStore, changed: Callable[[], None]) -> list[RuntimeStream]:
    """The two runtime streams feeding ``store``."""
    return [RuntimeStream(CLUSTER_RUNTIMES, namespaces, store, changed),
            RuntimeStream(NAMESPACED_RUNTIMES, namespaces, store, changed)]
