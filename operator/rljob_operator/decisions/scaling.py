"""Elastic worker counts, decided as pure functions (``spec.autoscaling``, ``status.scaling``).

The size a job runs at lives in ``status.scaling.replicas``. It changes when

* ``spec.workers.replicas`` changes (``kubectl scale``, an HPA, KEDA): the new value, clamped to
  ``[minReplicas, maxReplicas]`` (reason ``ScaleRequested``);
* policy ``Capacity`` sees free GPUs that fit more workers of this job on nodes it may use, the
  gang is Running and the cooldown has passed: grow toward ``maxReplicas`` (``CapacityAvailable``);
* policy ``Capacity`` sees workers unschedulable for ``schedulingTimeoutSeconds`` (``Unschedulable``)
  or a new gang about to start with fewer slots than workers, nodes having gone (``NodesLost``):
  shrink to what fits, never below ``minReplicas``; with fewer slots than that the job waits,
  Pending with reason ``InsufficientCapacity``, and starts again when they are back.

Capacity is what the scheduler would see: for each Ready, schedulable node whose labels match the
job's nodeSelector and whose NoSchedule/NoExecute taints the job tolerates, allocatable minus
the requests of the pods bound to it, divided by one worker's requests (GPUs, and CPU/memory when
the job asks for them). Affinity rules and other schedulers' reservations are not modelled; the
scheduler stays the judge, and a grow that does not fit ends as an ``Unschedulable`` shrink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity
from rljob_contract.job import RLTrainingJob, ScalingPolicy, ScalingStatus

from rljob_operator.names import LABEL_JOB
from rljob_operator.times import parse_time, rfc3339

#: Pods that hold no resources any more.
FINISHED_POD_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeInfo:
    name: str
    ready: bool
    schedulable: bool
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    allocatable: dict[str, Decimal]

    @classmethod
    def from_node(cls, node: dict[str, Any]) -> NodeInfo:
        meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return cls(
            name=meta.get("name", ""),
            ready=ready,
            schedulable=not spec.get("unschedulable", False),
            labels=meta.get("labels") or {},
            taints=spec.get("taints") or [],
            allocatable={k: parse_quantity(v) for k, v in (status.get("allocatable") or {}).items()},
        )


@dataclass(frozen=True)
class PodUsage:
    """A pod bound to a node and what it requests there."""

    node: str
    namespace: str
    name: str
    requests: dict[str, Decimal]
    job: str | None = None
    """Its ``rljob.dev/job`` label: which job's worker it is."""

    @classmethod
    def from_pod(cls, pod: dict[str, Any]) -> PodUsage | None:
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in FINISHED_POD_PHASES:
            return None
        return cls(node, meta.get("namespace", ""), meta.get("name", ""), pod_requests(spec),
                   (meta.get("labels") or {}).get(LABEL_JOB))


def pod_requests(spec: dict[str, Any]) -> dict[str, Decimal]:
    """Requests the scheduler counts: the sum over containers, at least each init container's."""
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = total.get(k, Decimal(0)) + parse_quantity(v)
    for c in spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = max(total.get(k, Decimal(0)), parse_quantity(v))
    total["pods"] = Decimal(1)
    return total


@dataclass(frozen=True)
class Capacity:
    """The cluster as one reconcile sees it (nodes and every pod bound to a node)."""

    nodes: list[NodeInfo]
    pods: list[PodUsage] = field(default_factory=list)

    @classmethod
    def from_objects(cls, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]) -> Capacity:
        usages = [u for u in (PodUsage.from_pod(p) for p in pods) if u is not None]
        return cls([NodeInfo.from_node(n) for n in nodes], usages)

    def without_nodes(self, gone: Callable[[str], bool]) -> Capacity:
        """This snapshot less the nodes ``gone`` names (deleted since it was taken) and their pods."""
        names = {n.name for n in self.nodes if gone(n.name)}
        if not names:
            return self
        return Capacity([n for n in self.nodes if n.name not in names], [p for p in self.pods if p.node not in names])

    def node_ok(self, name: str | None) -> bool:
        """The node exists and is Ready (a pod on any other node is lost); True for no node (unbound)."""
        return name is None or any(n.name == name and n.ready for n in self.nodes)

    def slots(self, pod_spec: dict[str, Any], exclude_job: tuple[str, str] | None = None) -> int:
        """Pods like ``pod_spec`` (a worker's: requests, nodeSelector, tolerations) that fit in free capacity.

        ``exclude_job``: (namespace, job) whose worker pods do not count as using capacity (its own
        gang, which a restart at another size releases) — judged from this same snapshot, so pods
        still terminating are recognised whatever the reconciler's view of them.
        """
        worker = pod_requests(pod_spec)
        used: dict[str, dict[str, Decimal]] = {}
        for p in self.pods:
            if exclude_job is not None and (p.namespace, p.job) == exclude_job:
                continue
            node_used = used.setdefault(p.node, {})
            for k, v in p.requests.items():
                node_used[k] = node_used.get(k, Decimal(0)) + v
        total = 0
        for node in self.nodes:
            if not (node.ready and node.schedulable and eligible(pod_spec, node)):
                continue
            fits = None
            for resource, want in worker.items():
                if want <= 0:
                    continue
                free = node.allocatable.get(resource, Decimal(0)) - used.get(node.name, {}).get(resource, Decimal(0))
                n = int(free // want) if free > 0 else 0
                fits = n if fits is None else min(fits, n)
            total += fits or 0
        return total


def eligible(pod_spec: dict[str, Any], node: NodeInfo) -> bool:
    """The node matches the pod's nodeSelector and the pod tolerates its hard taints."""
    if any(node.labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = pod_spec.get("tolerations") or []
    for taint in node.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return False
    return True


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return bool(toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""))


@dataclass(frozen=True)
class Resize:
    """A decision to run the job at ``replicas`` workers."""

    replicas: int
    reason: str
    message: str


@dataclass(frozen=True)
class SizeView:
    """What the size decision looks at in the current reconcile."""

    size: int
    """Workers the current gang is built with."""
    running: bool
    """The current gang is Running (every worker ready)."""
    gang_starting: bool
    """No pod of the current gang exists yet: the next pods created start a new gang."""
    unschedulable_since: datetime | None
    """Since when some worker of the current gang has been unschedulable (None: none is)."""
    free_slots: int | None
    """Workers that fit in free capacity besides the gang (None: capacity unknown or not used)."""
    total_slots: int | None
    """Workers that fit if the job's own gang were released too."""


def requested_size(job: RLTrainingJob) -> tuple[int, Resize | None]:
    """The size from the spec: replicas clamped to the bounds; a Resize when the spec changed it."""
    workers = job.spec.workers
    prev = job.status.scaling if job.status is not None else None
    want = workers.clamp(workers.replicas)
    clamped = "" if want == workers.replicas else (
        f" (spec.workers.replicas {workers.replicas} clamped to [{workers.bounds[0]}, {workers.bounds[1]}])")
    if prev is None:
        return want, None
    if prev.spec_replicas == workers.replicas:
        return prev.replicas, None
    if want == prev.replicas:
        return want, Resize(want, "ScaleRequested", f"replicas set to {workers.replicas}; staying at {want}{clamped}")
    return want, Resize(want, "ScaleRequested", f"replicas set to {workers.replicas}: {prev.replicas} → {want} "
                                                f"workers{clamped}")


def decide(job: RLTrainingJob, view: SizeView, now: datetime) -> Resize | None:
    """A capacity-driven resize of a job with policy Capacity, or None (see the module doc)."""
    spec = job.spec
    if spec.autoscaling.policy != ScalingPolicy.capacity or view.free_slots is None or view.total_slots is None:
        return None
    low, high = spec.workers.bounds
    size = view.size
    if view.gang_starting:
        # A new gang is about to be created anyway (start, restart after a lost node, waiting).
        fit = min(size, view.total_slots)
        if fit < size and fit >= low:
            failure = job.status.last_failure if job.status is not None else None
            lost = failure is not None and failure.disruption
            return Resize(fit, "NodesLost" if lost else "InsufficientCapacity",
                          f"{view.total_slots} worker(s) fit on the nodes this job may use: {size} → {fit} workers")
        return None
    if view.unschedulable_since is not None:
        waited = (now - view.unschedulable_since).total_seconds()
        if waited >= spec.autoscaling.scheduling_timeout_seconds:
            fit = max(low, min(size - 1, view.total_slots))
            if fit < size:
                return Resize(fit, "Unschedulable",
                              f"workers unschedulable for {waited:.0f}s (schedulingTimeoutSeconds "
                              f"{spec.autoscaling.scheduling_timeout_seconds}); {view.total_slots} fit: "
                              f"{size} → {fit} workers")
        return None
    if view.running and size < high and view.free_slots > 0 and cooldown_left(job, now) <= 0:
        grow = min(high, size + view.free_slots)
        return Resize(grow, "CapacityAvailable",
                      f"{view.free_slots} more worker(s) fit in free GPUs: {size} → {grow} workers")
    return None


def cooldown_left(job: RLTrainingJob, now: datetime) -> float:
    """Seconds until a capacity-driven grow is allowed (from the last resize, else the job's start)."""
    status = job.status
    since = None
    if status is not None:
        since = parse_time(status.scaling.last_scale_time if status.scaling else None) or parse_time(
            status.start_time)
    if since is None:
        return 0.0
    return (since + timedelta(seconds=job.spec.autoscaling.cooldown_seconds) - now).total_seconds()


def scaling_status(job: RLTrainingJob, replicas: int, resize: Resize | None, now: datetime) -> ScalingStatus:
    """``status.scaling`` for a job that runs at ``replicas`` workers (every field set: written whole)."""
    prev = job.status.scaling if job.status is not None else None
    reference = prev.reference_replicas if prev is not None else replicas
    _, accumulation, global_batch = job.batch_shape(replicas, reference)
    last: tuple[str | None, str | None, str | None] = (
        (prev.last_scale_time, prev.last_scale_reason, prev.last_scale_message) if prev else (None, None, None))
    if resize is not None and (prev is None or resize.replicas != prev.replicas):
        last = (rfc3339(now), resize.reason, resize.message)
    return ScalingStatus(replicas=replicas, spec_replicas=job.spec.workers.replicas, reference_replicas=reference,
                         global_batch_size=global_batch, gradient_accumulation_steps=accumulation,
                         last_scale_time=last[0], last_scale_reason=last[1], last_scale_message=last[2])


def resize_event_message(job: RLTrainingJob, resize: Resize, now: datetime) -> str:
    """The Event text of a resize: cause, sizes and what happens to the global batch."""
    before = scaling_status(job, job.replicas, None, now)
    after = scaling_status(job, resize.replicas, resize, now)
    target = job.target_global_batch()
    if after.global_batch_size == target:
        batch = (f"global batch {target} kept (gradientAccumulationSteps {before.gradient_accumulation_steps} → "
                 f"{after.gradient_accumulation_steps})")
    else:
        batch = (f"global batch {target} cannot be kept exactly at {resize.replicas} worker(s): using "
                 f"{after.global_batch_size} (gradientAccumulationSteps {after.gradient_accumulation_steps}, "
                 f"the nearest value numGenerations {job.spec.training.num_generations} allows)")
    return f"{resize.message}; checkpoint, stop, start {resize.replicas} worker(s), resume; {batch}"
