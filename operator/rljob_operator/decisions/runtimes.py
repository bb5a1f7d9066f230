"""Which runtime a job's pods are built from, what the job keeps of it, and who may use it (pure).

**Snapshots, not finalizers.** When the pods of a gang generation are first created, the job records the
runtime they were built from in ``status.runtime`` (kind, name, generation and the SHA-256 of its kind, name
and spec: :func:`runtime_record`) and the runtime itself in its ConfigMap, key ``runtime.json``
(:func:`snapshot`). Until that gang ends:

* an edit of the runtime changes nothing of it: a worker replaced in place is built from the snapshot, as its
  peers were (never a mixed gang), and the condition ``RuntimeUpToDate`` is False, reason ``RuntimeChanged``,
  naming the generation that applies from the next gang start;
* a deleted runtime neither breaks nor silently changes the job: the gang keeps running, and a new gang (a
  restart) is built from the snapshot too and says so (reason ``RuntimeDeleted``); a job with no snapshot (it
  never ran) waits, Pending ``RuntimeNotFound``.

A finalizer on the runtime would instead block the platform team's deletion until every job on it ended (a
week of training, say), and an edit would still need the record. The snapshot is read back only while the
runtime the store shows is not the recorded one (:func:`wants_snapshot`), and used only when its hash is the
one the status records (:func:`read_snapshot`): a job's creator may edit the ConfigMaps of their namespace,
not the job's status, so a forged ``runtime.json`` shapes no pod.

**Who may use a runtime.** A ClusterRLTrainingRuntime's ``namespaceSelector`` is enforced by the operator
itself (:func:`not_allowed`), from the Namespace labels its watch shows, so a cluster whose admission policies
are off is not open: a job outside it fails, reason ``RuntimeNotAllowed``, naming the selector.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rljob_contract.job import ManifestError, RLTrainingJob, RuntimeKind, RuntimeStatus
from rljob_contract.runtime import API_VERSION, TrainingRuntime, parse_runtime

#: The job's condition saying whether its gang runs on its runtime as it is now.
CONDITION = "RuntimeUpToDate"
UP_TO_DATE = "UpToDate"
CHANGED = "RuntimeChanged"
DELETED = "RuntimeDeleted"
#: A job outside its ClusterRLTrainingRuntime's namespaceSelector fails with this reason.
NOT_ALLOWED = "RuntimeNotAllowed"
#: The key of the job's ConfigMap holding the runtime its gang was built from.
SNAPSHOT_KEY = "runtime.json"
#: The metadata a snapshot keeps (what names the runtime and says which version it was).
_SNAPSHOT_METADATA = ("name", "namespace", "uid", "generation", "creationTimestamp")


def runtime_hash(runtime: TrainingRuntime) -> str:
    """The SHA-256 of the runtime's kind, name and spec: what the pods are built from (an edit changes it; an
    annotation, such as the default marker, does not)."""
    body = {"kind": str(runtime.kind), "name": runtime.metadata.name,
            "spec": runtime.spec.model_dump(by_alias=True, mode="json")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def runtime_record(runtime: TrainingRuntime) -> RuntimeStatus:
    """``status.runtime`` of a gang built from ``runtime``."""
    return RuntimeStatus(kind=str(runtime.kind), name=runtime.metadata.name, generation=runtime.generation,
                         hash=runtime_hash(runtime))


def snapshot(runtime: TrainingRuntime) -> str:
    """The runtime as the job's ConfigMap keeps it (``runtime.json``): enough to build the gang again."""
    meta = runtime.metadata.model_dump(by_alias=True, mode="json")
    doc = {"apiVersion": API_VERSION, "kind": str(runtime.kind),
           "metadata": {k: meta[k] for k in _SNAPSHOT_METADATA if meta.get(k) is not None},
           "spec": runtime.spec.model_dump(by_alias=True, mode="json", exclude_none=True)}
    return json.dumps(doc, sort_keys=True, indent=1)


def recorded(job: RLTrainingJob) -> RuntimeStatus | None:
    """The runtime the job's current gang was built from (``status.runtime``), if any."""
    return job.status.runtime if job.status is not None else None


def wants_snapshot(job: RLTrainingJob, current: TrainingRuntime | None) -> bool:
    """Is the runtime the store shows not the one the job's gang was built from (edited, deleted, another
    default)? Then its snapshot may be needed (``runtime_in_use``)."""
    record = recorded(job)
    return record is not None and (current is None or runtime_hash(current) != record.hash)


def read_snapshot(text: str | None, record: RuntimeStatus) -> TrainingRuntime | str:
    """The runtime the ConfigMap's ``runtime.json`` holds, or why it cannot be used: absent, not a runtime, or
    not the one ``status.runtime`` records (its hash differs: edited since the operator wrote it)."""
    where = f"the job's ConfigMap key {SNAPSHOT_KEY}"
    if not text:
        return f"{where} is missing"
    try:
        runtime = parse_runtime(json.loads(text), where)
    except ValueError as e:
        return f"{where} is not JSON: {e}"
    except ManifestError as e:
        return f"{where} is not a runtime: {'; '.join(e.problems)}"
    if (str(runtime.kind), runtime.metadata.name) != (record.kind, record.name) or runtime_hash(runtime) != record.hash:
        return f"{where} is not the runtime status.runtime records ({record.kind}/{record.name}, hash {record.hash[:12]}…)"
    return runtime


# --------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class Stale:
    """Why the gang does not run on the runtime as it is now: the ``RuntimeUpToDate=False`` condition."""

    reason: str
    """``RuntimeChanged`` or ``RuntimeDeleted``."""
    message: str


@dataclass(frozen=True)
class RuntimeInUse:
    """The runtime this reconcile builds the job's pods from, and what the job must be told."""

    runtime: TrainingRuntime | None
    missing: str | None = None
    """Why there is none: the job waits, Pending ``RuntimeNotFound``."""
    not_allowed: str | None = None
    """Why the job may not use it (the namespaceSelector): Failed ``RuntimeNotAllowed``."""
    stale: Stale | None = None
    """Set while the pods are built from a snapshot, or the snapshot cannot be had for a changed runtime."""


def runtime_in_use(job: RLTrainingJob, gang_started: bool, current: TrainingRuntime | None, missing: str | None,
                   snapshot: TrainingRuntime | str | None = None,
                   namespace_labels: Mapping[str, str] | None = None, queues: bool = True) -> RuntimeInUse:
    """The runtime ``job``'s pods are built from in this reconcile.

    ``gang_started``: the current gang generation's pods were created (``Situation.gang_started``): they were
    built from ``status.runtime``. ``current``: the runtime the store shows for the job (None: ``missing`` says
    why); ``snapshot``: the runtime the ConfigMap keeps (``read_snapshot``; None when not read: only
    ``wants_snapshot`` jobs need it); ``namespace_labels``: those of the job's namespace, for the
    runtime's namespaceSelector (None: not known, so not enforced: a reconciler without the Namespaces' watch, in
    tests of other parts); ``queues``: the operator runs jobs through Kueue (its setting ``kueue``): without it
    a runtime that requires a queue (``spec.queue.required``) serves no job, which would otherwise run unqueued.
    """
    record = recorded(job)
    if current is not None and (record is None or not gang_started or runtime_hash(current) == record.hash):
        use, stale = current, None  # unchanged, or a new gang: the runtime as it is now
    elif isinstance(snapshot, TrainingRuntime) and record is not None:
        use, stale = snapshot, _stale(record, current, missing, gang_started)
    elif current is not None:  # changed under a running gang, and its snapshot cannot be had
        use, stale = current, Stale(CHANGED, f"{current.ref} changed under the running gang and its snapshot cannot "
                                             f"be read ({snapshot or 'not read'}): pods created from now on are "
                                             f"built from generation {current.generation}")
    else:
        why = f"; no snapshot of {record.kind}/{record.name} to run on ({snapshot})" \
            if record is not None and isinstance(snapshot, str) else ""
        return RuntimeInUse(None, missing=f"{missing or 'the job has no runtime'}{why}")
    refused = not_allowed(use, job.metadata.namespace or "", namespace_labels) if namespace_labels is not None else None
    if refused is None and use.spec.queue.required and not queues:
        refused = (f"spec.runtimeRef: {use.ref} requires a Kueue LocalQueue (its spec.queue.required), and this "
                   "operator does not run jobs through Kueue (its setting kueue, the chart's kueue.enabled, is false): "
                   "the job would run unqueued; name another runtime, or ask the platform team to enable Kueue")
    return RuntimeInUse(use, not_allowed=refused, stale=stale)


def _stale(record: RuntimeStatus, current: TrainingRuntime | None, missing: str | None, gang_started: bool) -> Stale:
    """The condition of a gang built from its snapshot."""
    was = f"{record.kind}/{record.name} generation {record.generation}"
    if current is not None:
        now = current.ref if (str(current.kind), current.metadata.name) != (record.kind, record.name) \
            else f"generation {current.generation}"
        return Stale(CHANGED, f"the running gang was built from {was}; the job's runtime is now {current.ref} at "
                              f"generation {current.generation}: {now} applies from the next gang start")
    gang = "the running gang keeps it" if gang_started else "the new gang is built from it"
    return Stale(DELETED, f"{missing or 'the runtime was deleted'}; the job runs on its snapshot of {was} (its "
                          f"ConfigMap's {SNAPSHOT_KEY}): {gang}, until the runtime is there again")


def not_allowed(runtime: TrainingRuntime, namespace: str, labels: Mapping[str, str]) -> str | None:
    """Why a job of ``namespace`` may not use ``runtime`` (a ClusterRLTrainingRuntime whose namespaceSelector
    does not select it), else None."""
    selector = runtime.spec.namespace_selector
    if runtime.kind != RuntimeKind.cluster or selector is None or selector.matches(dict(labels)):
        return None
    return (f"spec.runtimeRef: {runtime.ref} serves only the namespaces its spec.namespaceSelector selects "
            f"({selector.describe()}), and namespace {namespace} is not one of them: name another runtime, or ask "
            "the platform team to label the namespace")


def selects(runtime: TrainingRuntime, labels: Mapping[str, str] | None) -> bool:
    """Does ``runtime`` serve a namespace with ``labels`` (no selector: every namespace)?"""
    selector = runtime.spec.namespace_selector
    return selector is None or selector.matches(dict(labels or {}))


def snapshot_data(runtime: Any) -> dict[str, str]:
    """The ConfigMap data of the runtime the pods are built from (``Resolved.runtime``; none: nothing)."""
    return {SNAPSHOT_KEY: snapshot(runtime)} if isinstance(runtime, TrainingRuntime) else {}
