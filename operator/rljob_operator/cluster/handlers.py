"""What each watch event does: the subscribers of the operator's streams (``streams``), one per
resource, each event queueing a job (or an experiment) for a reconcile.

Handlers stay short: every event (a job created, edited, its status written; a worker pod
scheduled, ready, exited; a Node deleted; an admission gate's object changed; an experiment
edited) only adds a key to the work queue, and the queue runs
:class:`~rljob_operator.cluster.reconciler.Reconciler` serially per job. Two kinds of event wait:
a pod's that only changes what the status reports is queued a moment later, with the others of
its gang (``STATUS_NEWS_SECONDS``); the job's own status write, which the watch shows back, is
not queued at all (``JobCache``, which keeps the jobs the watch shows for the reconciler). One
stream per resource: the RLTrainingJob stream also wakes the experiment of a trial job (its label
``rljob.dev/experiment``). No handler needs a finalizer (kopf timers and daemons would add one and
block ``kubectl delete`` while the operator is down); deadlines and TTLs are delayed re-queues,
and a periodic resync catches anything a watch missed.

The subscribers are small objects wired by the runner: each holds the store it feeds and the queue
(``Enqueue``) it wakes, so nothing refers back to something built after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rljob_contract import experiment as exp_api
from rljob_contract.job import GROUP, PLURAL, VERSION

from rljob_operator import metrics
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.podwatch import PodStore
from rljob_operator.cluster.streams import Resource
from rljob_operator.cluster.workqueue import ExperimentKey, JobKey, Key
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.experiments.trials import LABEL_EXPERIMENT
from rljob_operator.integrations.client import GateWatch

#: The RLTrainingJobs (all of them: every job is the operator's).
JOBS = Resource(GROUP, VERSION, PLURAL)
#: The RLExperiments (their CRD may be installed after the operator starts).
EXPERIMENTS = Resource(GROUP, VERSION, exp_api.PLURAL, optional=True)
#: The Nodes (only where the operator may list and watch them: ``runner.nodes_watchable``).
NODES = Resource("", "v1", "nodes", namespaced=False)

#: How long a pod's watch event that only changes what the status reports (a pod created, scheduled,
#: running, ready before its gang, marked for deletion) waits for the other such events of its job.
STATUS_NEWS_SECONDS = 1.0
#: How long a deleted Node is remembered (its pods are force-deleted long before: the next reconcile).
GONE_NODE_MEMORY_SECONDS = 3600.0


class Enqueue(Protocol):
    """The work queue as the subscribers use it (``workqueue.WorkQueue``)."""

    def add(self, key: Key, delay: float | None = None, low: bool = False, urgent: bool = False) -> None: ...

    def forget(self, key: Key) -> None: ...


class CapacityView(Protocol):
    """What holds a view of the nodes' capacity (the ``Reconciler``)."""

    def node_changed(self, type: str | None, node: dict[str, Any]) -> None: ...


def gate_resource(gate: GateWatch) -> Resource:
    """An admission gate's resource, filtered by the API server to objects naming a job (its label).

    Optional: a gate is watched only where its API is served at start-up, and it may be removed later."""
    return Resource(gate.group, gate.version, gate.plural, label_selector=gate.label, optional=True)


def urgent_pod_event(type: str | None, pod: dict[str, Any], others: Sequence[dict[str, Any]]) -> bool:
    """Does this watch event of a worker pod call for a gang decision ahead of routine ones?

    Yes when the worker ended (its trainer exited, the pod Failed or Succeeded, or the cluster marked
    it for disruption); when a deleted pod was the last of its job's pods still terminating
    (``others``: the job's pods after the event), so the replacements can be created; and when a
    ready pod makes every pod of its job ready (the gang is Running: again, after a restart). A
    pod created, scheduled, marked for deletion or ready before its gang only changes what the
    status reports.
    """
    if type == "DELETED":
        return not any((other.get("metadata") or {}).get("deletionTimestamp") for other in others)
    seen = ObservedPod.from_pod(pod, "")  # the pod watch's slim copy (a full pod reads the same)
    if seen.finished or seen.exit_code is not None or seen.disrupted:
        return True
    return seen.ready and all(o.ready and not o.deleting for o in (ObservedPod.from_pod(p, "") for p in others))


class JobEvents:
    """The RLTrainingJob stream's subscriber: the job cache first, then the job's reconcile, and the
    experiment's of a trial job. Remembers which jobs exist, for the periodic resync."""

    def __init__(self, jobs: JobCache, queue: Enqueue) -> None:
        self.jobs = jobs
        self.queue = queue
        self.known: set[JobKey] = set()

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        """An RLTrainingJob's event (type None: listed, not deleted)."""
        meta = body.get("metadata") or {}
        key = JobKey(meta.get("namespace") or "", meta.get("name") or "")
        deleted = type == "DELETED"
        quiet = self.jobs.seen(key, None if deleted else dict(body))
        self.job_changed(key, deleted=deleted, quiet=quiet, new=not deleted and not body.get("status"))
        experiment = (meta.get("labels") or {}).get(LABEL_EXPERIMENT)
        if experiment:  # a trial: created, its status written by a heartbeat, finished
            self.queue.add(ExperimentKey(key.namespace, experiment))

    def listed(self, scope: str | None) -> None:
        """Nothing to do: what the listing did not show came as DELETED."""

    def job_changed(self, key: JobKey, deleted: bool, quiet: bool = False, new: bool = False) -> None:
        """``quiet``: the event queues nothing now (``JobCache.seen``: this operator's own status write, or
        held for the end of the job's running reconcile). ``new``: a job no reconcile has written a
        status for yet: creating its gang is a gang decision, queued as urgent, so that in a burst new
        jobs are not served after the Running writes of the gangs created before them."""
        if deleted:
            self.known.discard(key)
            self.queue.forget(key)
        else:
            self.known.add(key)
        if not quiet:
            self.queue.add(key, urgent=new)  # a deleted job is reconciled once more: it clears its metrics

    async def resync(self, every: float) -> None:
        """Queue every known job every ``every`` seconds, behind the jobs that events brought."""
        while True:
            await asyncio.sleep(every)
            metrics.RESYNCS.inc()
            for key in list(self.known):
                self.queue.add(key, low=True)


class PodEvents:
    """The pod stream's subscriber: the store first, then the job's reconcile: a gang decision now,
    news for the status only a moment later, with the others of the gang as they come up."""

    def __init__(self, store: PodStore, queue: Enqueue) -> None:
        self.store = store
        self.queue = queue

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        applied = self.store.apply(type, body)
        if applied is None:
            return
        key, pod = applied
        if urgent_pod_event(type, pod, self.store.job_pods(key)):
            self.queue.add(key, urgent=True)
        else:
            self.queue.add(key, delay=STATUS_NEWS_SECONDS)

    def listed(self, scope: str | None) -> None:
        self.store.end_listing(scope)


class GoneNodes:
    """The Nodes the watch saw deleted (and not created again since): what the reconciler asks."""

    def __init__(self) -> None:
        self.when: dict[str, float] = {}
        """Node name → when it was seen deleted (monotonic)."""

    def gone(self, name: str | None) -> bool:
        """Was Node ``name`` deleted (seen by the watch, and not created again since)?"""
        return name is not None and name in self.when

    def deleted(self, name: str) -> None:
        now = time.monotonic()
        for node, when in list(self.when.items()):
            if now - when > GONE_NODE_MEMORY_SECONDS:
                del self.when[node]
        self.when[name] = now

    def exists(self, name: str) -> None:
        self.when.pop(name, None)


class NodeEvents:
    """The Node stream's subscriber: a Node deleted loses the gangs with a worker there now, not after
    the pod garbage collector; the capacity view hears every event (``Reconciler.node_changed``: a
    Node added, deleted or changed where capacity is concerned makes it look again)."""

    def __init__(self, gone: GoneNodes, pods: PodStore, queue: Enqueue, capacity: CapacityView) -> None:
        self.gone = gone
        self.pods = pods
        self.queue = queue
        self.capacity = capacity

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        name = (body.get("metadata") or {}).get("name") or ""
        self.capacity.node_changed(type, dict(body))  # before the jobs below are queued: they size their gangs afresh
        if type == "DELETED":
            self.node_deleted(name)
        else:  # listed, added or modified: a Node of that name exists (again)
            self.gone.exists(name)

    def listed(self, scope: str | None) -> None:
        """Nothing to do: a Node the listing did not show came as DELETED."""

    def node_deleted(self, name: str) -> None:
        """Remember the Node as gone and queue every job with a worker pod bound to it."""
        self.gone.deleted(name)
        for key in self.pods.jobs():
            if any((pod.get("spec") or {}).get("nodeName") == name for pod in self.pods.job_pods(key)):
                self.queue.add(key, urgent=True)


class GateEvents:
    """An admission gate's stream's subscriber: each event of its objects (admitting, preempting or
    evicting a gang) queues the job its label names (``integrations/client.py``)."""

    def __init__(self, gate: GateWatch, queue: Enqueue) -> None:
        self.gate = gate
        self.queue = queue

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(self.gate.label):
            self.queue.add(self.gate.key(labels, meta.get("namespace")))

    def listed(self, scope: str | None) -> None:
        """Nothing to do."""


class ExperimentEvents:
    """The RLExperiment stream's subscriber: each event queues the experiment (its trials' events
    come through ``JobEvents``)."""

    def __init__(self, queue: Enqueue) -> None:
        self.queue = queue

    def event(self, scope: str | None, type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        self.queue.add(ExperimentKey(meta.get("namespace") or "", meta.get("name") or ""))

    def listed(self, scope: str | None) -> None:
        """Nothing to do."""
