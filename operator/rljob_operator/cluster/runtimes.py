"""The runtimes as the watches show them, and which one serves a job (``rljob_contract.runtime``).

Two streams (``streams.Stream``), one per kind: the ClusterRLTrainingRuntimes (cluster-scoped, one stream
whatever namespaces the operator watches) and the RLTrainingRuntimes of the watched namespaces, each with a
``RuntimeEvents`` subscriber feeding one ``RuntimeStore``. A reconcile looks its job's runtime up there,
never with a GET. Until every stream has listed once the store is not ``synced`` (a job would otherwise be
told its runtime does not exist while the listing is on its way): the reconciler waits a moment instead.

A runtime event queues the jobs waiting for a runtime (reason ``RuntimeNotFound``): GitOps may apply a
runtime after the jobs that use it. An edit of a runtime applies from a job's next gang (its pods are
built anew only then); what a running gang was built from is the operator side's to record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from rljob_contract.job import GROUP, VERSION, ManifestError, RLTrainingJob, RuntimeKind
from rljob_contract.runtime import (
    CLUSTER_PLURAL,
    DEFAULT_RUNTIME_ANNOTATION,
    NAMESPACED_PLURAL,
    TrainingRuntime,
    default_runtime,
    parse_runtime,
)

from rljob_operator.cluster.handlers import Enqueue
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.streams import Resource
from rljob_operator.decisions.plan import RUNTIME_NOT_FOUND

log = logging.getLogger("rljob.runtimes")

#: The ClusterRLTrainingRuntimes (cluster-scoped: one stream whatever namespaces are watched).
CLUSTER_RUNTIMES = Resource(GROUP, VERSION, CLUSTER_PLURAL, namespaced=False)
#: The RLTrainingRuntimes of the watched namespaces.
NAMESPACED_RUNTIMES = Resource(GROUP, VERSION, NAMESPACED_PLURAL)
#: Each runtime resource and its kind.
RUNTIME_RESOURCES = ((CLUSTER_RUNTIMES, RuntimeKind.cluster), (NAMESPACED_RUNTIMES, RuntimeKind.namespaced))
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


class RuntimeEvents:
    """One runtime kind's stream's subscriber: each event into the store, then the jobs waiting for a
    runtime (reason ``RuntimeNotFound``, ``JobCache.with_reason``) are queued to look again."""

    def __init__(self, kind: RuntimeKind, store: RuntimeStore, jobs: JobCache, queue: Enqueue) -> None:
        self.kind = kind
        self.store = store
        self.jobs = jobs
        self.queue = queue

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        self.store.put(self.kind.value, type, body)
        self.waiting_jobs()

    def listed(self, scope: str | None) -> None:
        """What the listing did not show came as DELETED: the store now holds the scope's runtimes."""
        self.store.listed.add((self.kind.value, scope))
        self.waiting_jobs()

    def waiting_jobs(self) -> None:
        for key in self.jobs.with_reason(RUNTIME_NOT_FOUND):
            self.queue.add(key)
