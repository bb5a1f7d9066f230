"""One reconcile of one RLTrainingJob: observe, decide (``decisions/``), apply the Plan.

The reconciler decides nothing itself: ``lifecycle.plan_reconcile`` (or ``plan_invalid``) turns
what it observes into a :class:`~rljob_operator.decisions.plan.Plan`, and it applies that Plan
in this order, which is what makes an interrupted reconcile converge:

1. the status (with the gang generation and start time it decided), skipped when already stored,
   then each admission gate's writes (``Plan.gate_writes``: Kueue's Workload), by the gate's client;
2. deletions of stale pods, then force deletions of pods stuck Terminating (each followed by
   its ``ForceDeleted`` Event);
3. the ConfigMap, the Service and the NetworkPolicy, created or adopted concurrently, all
   before any pod (a pod no policy selects accepts traffic from anywhere);
4. the missing pods, under their deterministic names, created concurrently, each with the job as its
   controller ownerReference: the mark that makes a pod the job's gang and lets it speak for the job in
   the status API, which the admission policy ``rljob-worker-pods`` admits only from whoever may patch
   the job's status (``decisions.observed``); then the Service's EndpointSlice, when the address of the worker 0 the operator created changed
   (the rendezvous: ``children.desired_rendezvous``);
5. the Events;
6. the job's deletion, once ``ttlSecondsAfterFinished`` has passed.

A crash between any two steps leaves a state the next reconcile reads and finishes; no step
can produce a second pod for a name. When a create in steps 3-4 is refused, ``refusals.plan_for_refusal`` decides the Plan that replaces the rest (a stuck reason, a failed
job, or nothing), which is applied from step 1 on: its status, then its Events.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from rljob_contract.job import ManifestError, RLTrainingJob, RuntimeStatus, ScalingPolicy, parse_job
from rljob_contract.runtime import Resolved, TrainingRuntime, resolve

from rljob_operator import metrics
from rljob_operator.cluster.events import EventRecorder
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.kube import ChildConflict, Kube
from rljob_operator.cluster.namespaces import NamespaceStore
from rljob_operator.cluster.runtimes import RuntimeStore
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.children import JobNetwork, desired_worker_pod
from rljob_operator.decisions.lifecycle import FORCE_DELETE_AFTER_SECONDS, plan_invalid, plan_reconcile
from rljob_operator.decisions.observed import ObservedPod, controller_uid, slim_pod
from rljob_operator.decisions.plan import Event, Plan, force_deleted_event
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.decisions.refusals import Refusal, namespace_terminating, plan_for_refusal
from rljob_operator.decisions.runtimes import (
    SNAPSHOT_KEY,
    RuntimeInUse,
    read_snapshot,
    recorded,
    runtime_in_use,
    wants_snapshot,
)
from rljob_operator.decisions.scaling import Capacity, NodeInfo
from rljob_operator.decisions.situation import gang_started
from rljob_operator.integrations.client import GateClient
from rljob_operator.integrations.gate import Gated
from rljob_operator.integrations.registry import default_clients
from rljob_operator.names import LABEL_GANG_GENERATION, LABEL_JOB, StatusEndpoint, configmap_name, job_uid
from rljob_operator.times import rfc3339

log = logging.getLogger("rljob.reconciler")
#: How long one look at the cluster's nodes and bound pods serves policy-Capacity jobs (the setting
#: ``capacity_refresh_seconds``, at least ``settings.MIN_CAPACITY_REFRESH_SECONDS``).
CAPACITY_MAX_AGE_SECONDS = 30.0
#: How long a pod this operator created may be absent from its watch before it is no longer looked up.
UNSEEN_CREATE_SECONDS = 30.0
#: How soon a job is looked at again while the runtimes' watches have not listed yet.
RUNTIMES_UNSYNCED_RETRY_SECONDS = 0.5
#: How many snapshots of runtimes read back from jobs' ConfigMaps are remembered (``Reconciler._snapshot``).
SNAPSHOTS_KEPT = 256
#: Threads for a reconcile's concurrent requests (a gang's creates and deletes, its children), per reconcile worker.
REQUEST_THREADS_PER_WORKER = 2


#: Threads writing Events (each reconcile's Events in order, as one task).
EVENT_THREADS = 4
#: The record of created pods an earlier version kept in a job's status (its controller reference, which only the
#: operator may write, now marks a pod as the job's): removed with the job's next status write.
LEGACY_CREATED_PODS = "createdPods"


def _without_nulls(value: Any) -> Any:
    """A value as the API server stores it after a merge patch: null members of objects dropped."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _status_changed(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Would the merge patch ``desired`` change ``current``? (A no-op patch still costs a write.)"""
    return any(_without_nulls(current.get(k)) != _without_nulls(v) for k, v in desired.items())


@dataclass(frozen=True)
class Decided:
    """One decision of a reconcile (``Reconciler._decide``)."""

    plan: Plan
    gated: list[tuple[GateClient, Gated[Any]]]
    """The gates that govern the job, each with what its client observed."""
    runtime: TrainingRuntime | None
    """The runtime the pods are built from."""


class Reconciler:
    """Reconciles jobs through a :class:`Kube`; ``endpoint`` is the status API pods report to.

    ``profile``: what the platform allows a job's pods (default: the restricted profile);
    ``network``: the platform's settings for every job's NetworkPolicy (None: none is made);
    ``gates``: the admission gates' clients (``integrations/registry.py``; None: every known gate, unwatched).
    """

    def __init__(
        self,
        kube: Kube,
        endpoint: StatusEndpoint | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        instance: str = "",
        force_delete_after: float = FORCE_DELETE_AFTER_SECONDS,
        pod_cache: Callable[[str, str], list[dict[str, Any]] | None] | None = None,
        profile: PodProfile | None = None,
        network: JobNetwork | None = None,
        gates: list[GateClient] | None = None,
        node_gone: Callable[[str | None], bool] | None = None,
        request_threads: int = 8,
        job_cache: JobCache | None = None,
        capacity_max_age: float = CAPACITY_MAX_AGE_SECONDS,
        runtimes: RuntimeStore | None = None,
        namespaces: NamespaceStore | None = None,
    ) -> None:
        """``request_threads``: how many of the reconciles' concurrent requests may be in flight at once;
        ``job_cache``: the jobs as the watch shows them (None: every reconcile GETs its job);
        ``capacity_max_age``: how long one look at capacity serves every Capacity job; ``runtimes``: the
        runtimes as their watches show them (None: every job is built on no runtime, for tests of other parts);
        ``namespaces``: the Namespaces' labels as their watch shows them (a runtime's namespaceSelector)."""
        self.kube = kube
        self.runtimes = runtimes
        self.namespaces = namespaces
        """The Namespaces' labels (None: namespaceSelectors not enforced, for tests of other parts)."""
        self._snapshots: dict[tuple[str, str], TrainingRuntime] = {}
        """Snapshots read back from jobs' ConfigMaps, by job uid and runtime hash (``_snapshot``)."""
        self.job_cache = job_cache
        self.node_gone = node_gone
        """Was this Node deleted? (the Node watch; None: not watched, the pod GC removes such pods)."""
        self.gates = {g.name: g for g in (gates if gates is not None else default_clients(kube))}
        """The admission gates' clients by name, in the order they are consulted."""
        self.profile = profile or PodProfile()
        self.network = network
        self.pod_cache = pod_cache
        self.endpoint = endpoint
        self.clock = clock
        self.instance = instance
        self.events = EventRecorder(kube, instance=instance)
        """Its own budget per job, apart from the status API's: pods flooding warnings cannot crowd these out."""
        self.force_delete_after = force_delete_after
        self._capacity: tuple[float, Capacity | None] = (float("-inf"), None)
        self.capacity_max_age = capacity_max_age
        self._pool = ThreadPoolExecutor(max_workers=request_threads, thread_name_prefix="rljob-create")
        self._events = ThreadPoolExecutor(max_workers=EVENT_THREADS, thread_name_prefix="rljob-events")
        """Events are written here, off the reconcile threads (``_post_events``)."""
        self._capacity_denied = False
        self._created: dict[tuple[str, str], dict[str, float]] = {}
        """Per job, the pods this reconciler created (or tried to) that its watch has not shown yet:
        name → when (monotonic)."""
        self._rendezvous: dict[tuple[str, str], tuple[str, str | None]] = {}
        """Per job, its uid and the endpoints (JSON) its rendezvous EndpointSlice was last seen or written with
        (None: it has none)."""
        self._children_verified: dict[tuple[str, str], tuple[str, str | None]] = {}
        """Per job, its uid and the gang generation for which its ConfigMap, Service and NetworkPolicy were
        last created or checked."""

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Reconcile ``namespace/name`` once; returns seconds until it wants another look."""
        started = time.monotonic()
        try:
            requeue = self._reconcile(namespace, name)
            metrics.RECONCILES.labels(result="ok").inc()
            return requeue
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def _read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job from the watch's cache, else (unknown there, or older than our last status write) a GET."""
        if self.job_cache is None:
            return self.kube.get_job(namespace, name)
        raw = self.job_cache.get(JobKey(namespace, name))
        if raw is not None:
            return raw
        raw = self.kube.get_job(namespace, name)
        if raw is not None:
            self.job_cache.got(JobKey(namespace, name), raw)
        return raw

    def _patch_status(self, raw: dict[str, Any], status: dict[str, Any]) -> None:
        """Patch the status of the job read as ``raw``; the cache learns the version this write made."""
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        answer = self.kube.patch_job_status(namespace, name, status)
        if self.job_cache is not None:
            self.job_cache.wrote(JobKey(namespace, name), raw, answer)

    def _reconcile(self, namespace: str, name: str) -> float | None:
        raw = self._read_job(namespace, name)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            self._children_verified.pop((namespace, name), None)
            self._created.pop((namespace, name), None)
            self._rendezvous.pop((namespace, name), None)
            metrics.JOB_PHASES.set((namespace, name), None)
            return None
        now = self.clock()
        try:
            job = parse_job(raw, f"{namespace}/{name}")
        except ManifestError as e:
            cached = self.pod_cache(namespace, name) if self.pod_cache is not None else None
            pods = cached if cached is not None else self._list_pods(namespace, name)
            observed = self._observe(raw, pods)
            plan = plan_invalid(raw, e.problems, now, observed, self.force_delete_after)
            return self._apply(raw, plan, now, pods={p["metadata"]["name"]: p for p in pods})
        found = self._runtime(job)
        if found is None:
            return RUNTIMES_UNSYNCED_RETRY_SECONDS
        capacity = self.capacity() if job.spec.autoscaling.policy == ScalingPolicy.capacity else None
        cached = self.pod_cache(namespace, name) if self.pod_cache is not None else None
        pods = cached if cached is not None else self._list_pods(namespace, name)
        decided = self._decide(raw, job, pods, now, found, capacity)
        plan = decided.plan
        if cached is not None and raw.get("status") and (
                plan.gang_restart or self._gates_recheck(plan)
                or self._unseen_creates(namespace, name, cached, plan)
                or (plan.replaced_workers and not self._replacement_seen(namespace, cached, plan.replaced))):
            # The watch may lag behind the API server by a moment: what is absent from it (a pod just
            # created, one gone) is looked up before a gang is restarted or a gate is told no pod is
            # left (Kueue: a Workload's quota given back), and before a pod this operator created is
            # created again. Before workers are replaced in place, only those workers are looked up
            # (a GET each, ``_replacement_seen``): the whole gang is listed only if one of them is not
            # as the watch shows it, so a failure costs the same whatever the gang's size.
            # Not for a job without status: no reconcile has got as far as its pods (the status is
            # written first), so it has none. Nor for other creates: a pod the cache does not show
            # was confirmed gone by the watch, or never created (its name is deterministic, so a
            # create that still finds it refuses, and creates nothing twice).
            pods = self._list_pods(namespace, name)
            decided = self._decide(raw, job, pods, now, found, capacity, decided)
            plan = decided.plan
        requeue = self._apply(raw, plan, now, pods={p["metadata"]["name"]: p for p in pods})
        unwatched = [c.unwatched_requeue for c, _ in decided.gated if c.unwatched_requeue is not None]
        if unwatched and requeue is None:  # no watch of the gate wakes the job
            requeue = min(unwatched)
        return requeue

    def _decide(self, raw: dict[str, Any], job: RLTrainingJob, pods: list[dict[str, Any]], now: datetime,
                found: tuple[TrainingRuntime | None, str | None], capacity: Capacity | None,
                before: Decided | None = None) -> Decided:
        """The Plan for ``job`` with ``pods``, built on the runtime in use (``_runtime_in_use``: the store's
        ``found``, or the running gang's snapshot), with what each gate observed of it (kept from ``before``, an
        earlier decision of this reconcile, while the pods are built from the same runtime)."""
        observed = self._observe(raw, pods)
        use = self._runtime_in_use(job, observed, now, *found)
        runtime = resolve(job, use.runtime) if use.runtime is not None else None
        if before is not None and before.runtime is use.runtime:
            gated = before.gated
        else:
            gated = self._observe_gates(job, job_uid(job), runtime)
        plan = plan_reconcile(job, observed, now, self.endpoint, self.force_delete_after, capacity, self.profile,
                              self.network, tuple(g for _, g in gated), runtime, use.missing, use)
        return Decided(plan, gated, use.runtime)

    def _runtime(self, job: RLTrainingJob) -> tuple[TrainingRuntime | None, str | None] | None:
        """(the job's runtime as the store shows it, why it has none); None while the runtimes' (or the
        Namespaces') watches have not listed yet."""
        if self.runtimes is None:
            return None, None
        if not self.runtimes.synced() or (self.namespaces is not None and not self.namespaces.synced()):
            return None
        return self.runtimes.lookup(job, self._labels(job))

    def _labels(self, job: RLTrainingJob) -> dict[str, str] | None:
        """The labels of the job's namespace (None: not watched, so no namespaceSelector is enforced: tests)."""
        return self.namespaces.labels(job.metadata.namespace or "") if self.namespaces is not None else None

    def _runtime_in_use(self, job: RLTrainingJob, pods: list[ObservedPod], now: datetime,
                        current: TrainingRuntime | None, missing: str | None) -> RuntimeInUse:
        """The runtime this reconcile builds the job's pods from (``runtimes.runtime_in_use``): the store's, else
        the snapshot of the one the running gang was built from, read from the job's ConfigMap only then."""
        if self.runtimes is None:
            return RuntimeInUse(None)
        record = recorded(job)
        queues = "kueue" in self.gates  # the Kueue gate is among them only while the setting kueue is on
        if record is None or not wants_snapshot(job, current):  # the runtime as the gang was built: no choice
            return runtime_in_use(job, False, current, missing, None, self._labels(job), queues)
        return runtime_in_use(job, gang_started(job, pods, now), current, missing, self._snapshot(job, record),
                              self._labels(job), queues)

    def _snapshot(self, job: RLTrainingJob, record: RuntimeStatus) -> TrainingRuntime | str:
        """The runtime the job's ConfigMap keeps (``runtime.json``), if it is the one ``record`` names; a good one
        is remembered by the job's uid and the hash (the ConfigMap is read once per runtime change)."""
        key = (job_uid(job), record.hash)
        found = self._snapshots.get(key)
        if found is not None:
            return found
        try:
            configmap = self.kube.request("GET", self.kube.core_path(
                job.metadata.namespace or "", "configmaps", configmap_name(job.metadata.name)))
        except ApiException as e:
            if e.status != 404:
                raise
            configmap = {}
        read = read_snapshot(((configmap or {}).get("data") or {}).get(SNAPSHOT_KEY), record)
        if isinstance(read, TrainingRuntime):
            self._snapshots[key] = read
            while len(self._snapshots) > SNAPSHOTS_KEPT:
                self._snapshots.pop(next(iter(self._snapshots)))
        return read

    def _replacement_seen(self, namespace: str, cached: list[dict[str, Any]], names: tuple[str, ...]) -> bool:
        """Does the API server show each worker being replaced (``names``) as the watch's cache does: absent
        where the cache has none, else the same pod as the decisions read it (``slim_pod``)? A GET each."""
        if not names:
            return False
        by_name = {p["metadata"]["name"]: p for p in cached}
        for pod_name in names:
            live = self.kube.get_pod(namespace, pod_name)
            seen = by_name.get(pod_name)
            if (live is None) != (seen is None) or (live is not None and slim_pod(live) != slim_pod(seen or {})):
                return False
        return True

    def _unseen_creates(self, namespace: str, name: str, cached: list[dict[str, Any]], plan: Plan) -> bool:
        """Would ``plan`` create a pod this reconciler created before and the watch has not shown yet?

        Forgets the creates the cache shows, and those older than ``UNSEEN_CREATE_SECONDS``.
        """
        created = self._created.get((namespace, name))
        if not created:
            return False
        seen = {p["metadata"]["name"] for p in cached}
        now = time.monotonic()
        for pod_name, when in list(created.items()):
            if pod_name in seen or now - when > UNSEEN_CREATE_SECONDS:
                del created[pod_name]
        if not created:
            del self._created[(namespace, name)]
        return any(p["metadata"]["name"] in created for p in plan.create_pods)

    def _observe(self, raw: dict[str, Any], pods: list[dict[str, Any]]) -> list[ObservedPod]:
        """The job's pods as the decisions see them: a pod is the job's only if its controller reference is the
        job (``ObservedPod.owned``), which only the operator may write."""
        meta = raw["metadata"]
        return [ObservedPod.from_pod(p, meta["uid"], meta["name"], self.node_gone) for p in pods]

    # ------------------------------------------------------------ admission gates
    def _observe_gates(self, job: RLTrainingJob, uid: str,
                       runtime: Resolved | None) -> list[tuple[GateClient, Gated[Any]]]:
        """The gates that govern ``job``, each with what its client observed (and the worker pod as built on
        ``runtime``: what a gate counts and places)."""
        worker = functools.cache(lambda: desired_worker_pod(job, 0, 0, runtime=runtime)) if runtime is not None else None
        observed = ((client, client.observe(job, uid, worker, runtime=runtime)) for client in self.gates.values())
        return [(client, gated) for client, gated in observed if gated is not None]

    def _gates_recheck(self, plan: Plan) -> bool:
        """Does a gate's write rely on no pod of the job being left (``GateClient.recheck``)?"""
        return any(self.gates[name].recheck(writes) for name, writes in plan.gate_writes.items())

    def _list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.kube.list_pods(namespace, f"{LABEL_JOB}={name}")

    def capacity(self) -> Capacity | None:
        """Nodes and bound pods, shared by the reconciles of the next ``capacity_max_age`` seconds, whatever the
        jobs' ``checkIntervalSeconds`` (a tenant's): each look reads every pod of the cluster, page by page
        (``Kube.list_bound_pods``), keeping what capacity needs of each. The Node watch renews it sooner
        (``node_changed``).

        None when the operator may not list nodes or all pods (its RBAC): Capacity jobs then keep
        their size, as with policy Manual, and the operator says so once in its log.
        """
        taken, snapshot = self._capacity
        if time.monotonic() - taken < self.capacity_max_age:
            return self._without_gone_nodes(snapshot)
        try:
            snapshot = Capacity.from_objects(self.kube.list_nodes(), self.kube.list_bound_pods())
        except ApiException as e:
            if e.status != 403:
                raise
            if not self._capacity_denied:
                log.warning("autoscaling policy Capacity needs list on nodes and pods (all namespaces); "
                            "denied (%s): sizes stay as requested", e.reason)
            self._capacity_denied = True
            snapshot = None
        self._capacity = (time.monotonic(), snapshot)
        return self._without_gone_nodes(snapshot)

    def forget_capacity(self) -> None:
        """The next reconcile that needs capacity looks again."""
        self._capacity = (float("-inf"), None)

    def node_changed(self, type: str | None, node: dict[str, Any]) -> None:
        """A Node watch event: a node added or deleted, or one whose readiness, schedulability, labels, taints or
        allocatable changed from the last look, makes the next reconcile that needs capacity look again. (Nodes
        change at the platform's hand and the kubelets', not a tenant's; a node's heartbeat changes none of that.)"""
        if type in ("ADDED", "DELETED"):
            self.forget_capacity()
            return
        _, snapshot = self._capacity
        if snapshot is None or type is None:
            return
        seen = NodeInfo.from_node(node)
        if next((n for n in snapshot.nodes if n.name == seen.name), None) != seen:
            self.forget_capacity()

    def _without_gone_nodes(self, snapshot: Capacity | None) -> Capacity | None:
        """A snapshot taken before the Node watch saw a node deleted must not count it: the gang that
        lost workers there would be restarted at a size its nodes no longer hold (then shrunk again,
        as Unschedulable, instead of as NodesLost)."""
        if snapshot is None or self.node_gone is None:
            return snapshot
        return snapshot.without_nodes(self.node_gone)

    def _apply(self, raw: dict[str, Any], plan: Plan, now: datetime,
               pods: dict[str, dict[str, Any]] | None = None) -> float | None:
        """Carry ``plan`` out in the module's order; returns seconds until the job wants another look.

        A create the API server refuses ends the plan there: ``refusals.plan_for_refusal`` decides what
        replaces the rest of it, and that Plan is applied the same way.
        """
        meta = raw["metadata"]
        stored = self._write_status(raw, raw.get("status") or {}, plan)
        for gate, writes in plan.gate_writes.items():  # right after the status
            self.gates[gate].apply(raw, writes, plan.status, self._patch_status)
        self._delete_pods(raw, plan, pods or {}, now)
        try:
            self._create(raw, plan)
        except (ChildConflict, ApiException) as e:
            refusal = (Refusal(None, conflict=str(e)) if isinstance(e, ChildConflict)
                       else Refusal(e.status, e.body or "", str(e.reason)))
            rest = plan_for_refusal(raw, plan, refusal, now)
            if rest is None:
                raise
            log.info("%s/%s: a create was refused (%s): %s", meta["namespace"], meta["name"],
                     refusal.status or "ChildConflict", rest.status.get("reason") or "nothing more to do")
            self._write_status(raw, stored, rest)
            plan = rest
        self._write_rendezvous(raw, plan.rendezvous)
        return self._finish(raw, plan, now)

    def _write_status(self, raw: dict[str, Any], stored: dict[str, Any], plan: Plan) -> dict[str, Any]:
        """Patch the plan's status unless it is already stored; returns the status now stored. A record of
        created pods an earlier version kept (``status.createdPods``) is removed with the first write."""
        meta = raw["metadata"]
        patch = {**plan.status, **({LEGACY_CREATED_PODS: None} if LEGACY_CREATED_PODS in stored else {})}
        if _status_changed(stored, patch):
            self._patch_status(raw, patch)
        if "phase" in plan.status:
            metrics.JOB_PHASES.set((meta["namespace"], meta["name"]), plan.status["phase"])
        return _merge_patch(stored, patch)

    def _delete_pods(self, raw: dict[str, Any], plan: Plan, pods: dict[str, dict[str, Any]], now: datetime) -> None:
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        for pod_name in plan.delete_pods:
            log.info("%s/%s: deleting pod %s", namespace, name, pod_name)
        # Independent requests, as the creates: a gang's deletions are sent together (a failure still raises).
        self._together([functools.partial(self.kube.delete_pod, namespace, pod_name,
                                          (pods.get(pod_name) or {}).get("metadata", {}).get("uid"))
                        for pod_name in plan.delete_pods])
        for pod_name in plan.force_delete_pods:
            pod = pods.get(pod_name) or {}
            node = (pod.get("spec") or {}).get("nodeName")
            deleted_node = node if self.node_gone is not None and self.node_gone(node) else None
            log.warning("%s/%s: pod %s %s: force-deleting it", namespace, name, pod_name,
                        f"was on node {deleted_node}, which was deleted" if deleted_node else "is stuck terminating")
            self.kube.delete_pod(namespace, pod_name, pod.get("metadata", {}).get("uid"), force=True)
            self._post_events(raw, [force_deleted_event(pod_name, deleted_node)], now)

    def _create(self, raw: dict[str, Any], plan: Plan) -> None:
        """The ConfigMap, Service and NetworkPolicy (all exist before any pod is created), then the pods."""
        namespace, name, uid = raw["metadata"]["namespace"], raw["metadata"]["name"], raw["metadata"]["uid"]
        if plan.children is not None:
            # Verified once per gang generation (a gang restarted with old pods still terminating is
            # created over several reconciles); after the first generation they most likely exist.
            generations = {(p["metadata"].get("labels") or {}).get(LABEL_GANG_GENERATION) for p in plan.create_pods}
            verified = self._children_verified.get((namespace, name))
            if verified is None or verified[0] != uid or not generations <= {verified[1]}:
                look_first = verified is not None and verified[0] == uid
                children: list[Callable[[], Any]] = [
                    functools.partial(self.kube.create_or_adopt, plan.children.configmap, uid, compare_data=True,
                                      look_first=look_first),
                    functools.partial(self._service, plan.children.service, uid, look_first),
                ]
                if plan.children.networkpolicy is not None:
                    children.append(functools.partial(self.kube.create_or_adopt, plan.children.networkpolicy, uid,
                                                      compare_spec=True, look_first=look_first))
                self._together(children)  # all exist (or raised) before any pod is created
                if len(generations) == 1:
                    self._children_verified[(namespace, name)] = (uid, next(iter(generations)))
        created = self._created.setdefault((namespace, name), {})
        for pod in plan.create_pods:
            log.info("%s/%s: creating pod %s", namespace, name, pod["metadata"]["name"])
            created[pod["metadata"]["name"]] = time.monotonic()
        # A gang's pods are independent requests: send them together; every answer is waited for before a
        # refusal is raised, so no create is still in flight when the refusal's Plan is applied.
        self._together([functools.partial(self.kube.create_pod, pod) for pod in plan.create_pods])

    def _together(self, requests: list[Callable[[], Any]]) -> None:
        """Send independent requests at once, on the request threads; every one is answered before the first
        failure is raised. One request (a worker replaced in place) is sent from this thread: handing it to
        another costs a thread switch, milliseconds when the interpreter is busy, on the failure's path."""
        if len(requests) == 1:
            requests[0]()
            return
        answers = [self._pool.submit(request) for request in requests]
        errors = [a.exception() for a in answers]  # each waited for: no short cut at the first failure
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            raise failed

    def _service(self, service: dict[str, Any], uid: str, look_first: bool) -> None:
        """The job's headless Service, created or adopted; one with a selector (an earlier version's) is made
        again without: a selector routes by labels anyone may copy, and the slices Kubernetes made for it would
        outlive the selector's removal (the EndpointSlice controller leaves a Service without one alone), while
        they go with the Service (its ownerReference)."""
        existing = self.kube.create_or_adopt(service, uid, look_first=look_first)
        if (existing.get("spec") or {}).get("selector"):
            meta = service["metadata"]
            log.info("%s/%s: the Service selects pods by labels: making it again without a selector",
                     meta["namespace"], meta["name"])
            self.kube.recreate_child(service, existing)

    def _write_rendezvous(self, raw: dict[str, Any], desired: dict[str, Any] | None) -> None:
        """Bring the job's rendezvous EndpointSlice to ``desired`` (``Plan.rendezvous``; None: not touched) when
        its endpoints changed: one request when worker 0 gets its address, one when it goes. Never created
        without an endpoint (until the worker 0 the operator created has an address, its name need not resolve).
        What is stored is remembered; after a restart it is looked at once (none for a job without status)."""
        if desired is None:
            return
        meta = raw["metadata"]
        key, uid = (meta["namespace"], meta["name"]), meta["uid"]
        endpoints = json.dumps(desired["endpoints"], sort_keys=True)
        known = self._rendezvous.get(key)
        stored: str | None = None  # the endpoints of this job's slice as stored (None: it has none)
        if known is not None and known[0] == uid:
            stored = known[1]
        elif raw.get("status"):
            existing = self.kube.get_child(desired)
            if existing is not None and controller_uid(existing) == uid:
                stored = json.dumps(existing.get("endpoints") or [], sort_keys=True)
        write = stored != endpoints and (stored is not None or bool(desired["endpoints"]))
        if write:
            self.kube.create_or_adopt(desired, uid, look_first=stored is not None, compare_fields=("endpoints", "ports"))
        self._rendezvous[key] = (uid, endpoints if write or stored is not None else None)

    def _finish(self, raw: dict[str, Any], plan: Plan, now: datetime) -> float | None:
        """Events, then the job's deletion once its TTL passed."""
        meta = raw["metadata"]
        if plan.gang_restart:
            metrics.GANG_RESTARTS.labels(reason=plan.gang_restart).inc()
        if plan.replaced_workers:
            metrics.WORKERS_REPLACED.labels(reason=plan.replaced_workers).inc()
        self._post_events(raw, plan.events, now)
        if plan.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed: deleting the job", meta["namespace"], meta["name"])
            self.kube.delete_job(meta["namespace"], meta["name"], meta["uid"])
            metrics.JOB_PHASES.set((meta["namespace"], meta["name"]), None)
            return None
        return plan.requeue_after

    def _post_events(self, raw: dict[str, Any], events: list[Event], now: datetime) -> None:
        """Write ``events`` from the events threads, as client-go's recorder writes from a goroutine of its
        own: the reconcile's worker goes on to the next job instead of waiting 2 round trips (in a burst
        of new jobs, a third of each first reconcile's time; ``bench/burst_floor.py``). One task per
        reconcile, so its Events keep their order (they share a timestamp: their order is what kubectl shows)."""
        if events:
            self._events.submit(self._write_events, raw, list(events), now)

    def _write_events(self, raw: dict[str, Any], events: list[Event], now: datetime) -> None:
        try:
            for event in events:
                self._event(raw, event, now)
        except Exception:  # an Event is worth a log line; on this thread nothing else would report it
            log.exception("%s/%s: cannot post events", raw["metadata"]["namespace"], raw["metadata"]["name"])

    def close(self) -> None:
        """Wait for the requests and Events in flight, then stop the threads."""
        self._pool.shutdown()
        self._events.shutdown()

    def _event(self, raw: dict[str, Any], event: Event, now: datetime) -> None:
        """Through the recorder: a repeat counts on its Event; a job's Events are bounded (``cluster.events``)."""
        try:
            self.events.record(raw, event.type, event.reason, event.message, rfc3339(now), time.monotonic())
        except ApiException as e:  # an Event is worth a log line, not a failed reconcile
            if not namespace_terminating(e.status, e.body):
                log.warning("cannot post event %s: %s", event.reason, e.reason)


def _merge_patch(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``current`` after the JSON merge patch ``patch`` (RFC 7386): null removes, objects merge."""
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge_patch(out[key], value)
        else:
            out[key] = _without_nulls(value)
    return out
