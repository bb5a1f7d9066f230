"""What one reconcile does (a :class:`Plan`) and the one builder of the job's status (pure).

Every decision in ``decisions/`` ends in a Plan: ``lifecycle.plan_reconcile`` (a reconcile
of a valid job), ``lifecycle.plan_invalid`` (a spec the models reject) and
``refusals.plan_for_refusal`` (a create the API server refused). The reconciler only
applies Plans. All of them write status the one typed way: a decision fills in a
:class:`StatusDraft` (its records typed: ``LastFailure``, ``OomRecovery``, ``ScalingStatus``),
:func:`job_status` turns it into the API's ``RLTrainingJobStatus`` (conditions from
``conditions.py``, the pod counts), and :func:`status_patch` serialises that model, once, into the
merge patch the reconciler sends. A phase, its conditions and the pod counts are always derived the
same way; a Plan that writes only part of the status names the fields it writes (``*_FIELDS``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar

from pydantic import BaseModel
from rljob_contract.job import (
    Condition,
    LastFailure,
    OomRecovery,
    Phase,
    RLTrainingJob,
    RLTrainingJobStatus,
    RuntimeStatus,
    ScalingStatus,
    WorkersStatus,
)
from rljob_contract.runtime import Resolved

from rljob_operator.decisions.checkpoints import CONDITION as CHECKPOINTS_CONDITION
from rljob_operator.decisions.checkpoints import EPHEMERAL, EVENT_REASON, Durability
from rljob_operator.decisions.children import (
    JobNetwork,
    desired_configmap,
    desired_network_policy,
    desired_service,
)
from rljob_operator.decisions.conditions import (
    STALL_REASONS,
    checkpoints_condition,
    condition,
    make_conditions,
)
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.runtimes import CHANGED as RUNTIME_CHANGED
from rljob_operator.decisions.runtimes import CONDITION as RUNTIME_CONDITION
from rljob_operator.names import StatusEndpoint, selector
from rljob_operator.times import rfc3339

#: Written when a job's spec is rejected before any pod is looked at (``plan_invalid``): the
#: outcome only; the worker counts and restart bookkeeping of earlier reconciles stay as written.
INVALID_SPEC_FIELDS = ("phase", "reason", "message", "observedGeneration", "conditions", "completionTime")
#: Written when the API server rejects a worker pod: the outcome only. This reconcile's first
#: status write already recorded ``observedGeneration``.
REJECTED_POD_FIELDS = ("phase", "reason", "message", "completionTime", "conditions")
#: Written while a create is refused for a reason that may pass (a name taken, a quota): the
#: phase and conditions of this reconcile's first status write stay; only why it is stuck is said.
STUCK_FIELDS = ("reason", "message")
#: Written while a quota refuses a pod: why, in the conditions too (Reconciling True, reason
#: QuotaExceeded; not Stalled, not Failed), so whoever waits on conditions sees the wait.
QUOTA_FIELDS = ("reason", "message", "conditions")


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Children:
    """The ConfigMap and Service a Plan's pods mount and resolve, and the NetworkPolicy that
    admits their traffic, rendered on first use.

    The ConfigMap follows the status the Plan writes (OOM recovery's batch shape, the size in
    use). Rendering the trainer config costs milliseconds, and the reconciler discards a Plan
    decided from its watch when the API server shows another picture: only an applied Plan pays.
    """

    job: RLTrainingJob
    status: RLTrainingJobStatus
    """The status the Plan writes."""
    endpoint: StatusEndpoint | None = None
    network: JobNetwork | None = None
    """The platform's NetworkPolicy settings; None: the operator makes no NetworkPolicy."""
    runtime: Resolved | None = None
    """The job on its runtime (None: on no runtime)."""

    @cached_property
    def configmap(self) -> dict[str, Any]:
        job = self.job.model_copy(update={"status": self.status})
        return desired_configmap(job, self.endpoint, self.runtime)

    @cached_property
    def service(self) -> dict[str, Any]:
        return desired_service(self.job)

    @cached_property
    def networkpolicy(self) -> dict[str, Any] | None:
        return desired_network_policy(self.job, self.network, self.runtime) if self.network is not None else None


@dataclass
class Plan:
    """The whole desired state of one reconcile; the reconciler applies it in this order.

    ``status`` first (it records decisions such as a new gang generation or the start time), then
    ``gate_writes`` (the admission gates' own objects: Kueue's Workload), then ``delete_pods`` and
    ``force_delete_pods``, then
    ``children`` (ConfigMap, Service and NetworkPolicy: a pod no policy selects accepts traffic from anywhere, so the policy exists
    before any pod), then ``create_pods``, then ``rendezvous``, then ``events``, then ``delete_job``.
    """

    status: dict[str, Any]
    """Operator-owned status fields to merge-patch, as :func:`status_patch` serialised them from the typed
    status (never built by hand); ``progress`` belongs to the status API."""
    delete_pods: list[str] = field(default_factory=list)
    force_delete_pods: list[str] = field(default_factory=list)
    """Pods stuck Terminating (their node never confirms): deleted with grace period 0."""
    children: Children | None = None
    """The ConfigMap (brought up to date), Service and NetworkPolicy (brought up to date) to create or
    adopt before any pod (None: not touched)."""
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    rendezvous: dict[str, Any] | None = None
    """The EndpointSlice of the job's Service: the address of the worker 0 the operator created
    (``children.desired_rendezvous``; None: not touched)."""
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    gang_restart: str | None = None
    """Why this reconcile starts a new gang generation (Resumed, SpecChanged, a failure reason)."""
    replaced_workers: str | None = None
    """Why this reconcile replaces failed workers in place, keeping the gang (a failure reason)."""
    replaced: tuple[str, ...] = ()
    """The names of the workers it replaces in place (failed or lost): what the reconciler looks up
    before it trusts the watch with the replacement (``Reconciler._replacement_seen``)."""
    gate_writes: dict[str, object] = field(default_factory=dict)
    """Each admission gate's writes (``integrations/gate.py``) by gate name, applied right after the
    status by that gate's client; only gates that govern the job have an entry."""

    def __post_init__(self) -> None:
        # A pod force-deleted is not deleted gracefully first (that would only add a request).
        if self.force_delete_pods:
            forced = set(self.force_delete_pods)
            self.delete_pods = [p for p in self.delete_pods if p not in forced]

    @property
    def configmap(self) -> dict[str, Any] | None:
        return self.children.configmap if self.children is not None else None

    @property
    def service(self) -> dict[str, Any] | None:
        return self.children.service if self.children is not None else None

    @property
    def networkpolicy(self) -> dict[str, Any] | None:
        return self.children.networkpolicy if self.children is not None else None


@dataclass(frozen=True)
class RuntimeCondition:
    """The ``RuntimeUpToDate`` condition a status carries (``decisions.runtimes``)."""

    up_to_date: bool
    reason: str
    message: str


@dataclass
class StatusDraft:
    """The operator's status of a job as a decision fills it in; :func:`job_status` makes it the API's model.

    Beside the status fields it holds what conditions and worker counts are derived from (``ready``,
    ``reconciling``, ``desired``, ``checkpoints``); ``generation`` is ``gangGeneration``.
    """

    phase: str
    reason: str
    message: str
    ready: bool = False
    reconciling: bool = False
    start_time: str | None = None
    completion_time: str | None = None
    generation: int = 0
    desired: int = 0
    restarts: int = 0
    disruptions: int = 0
    last_failure: LastFailure | None = None
    next_restart_time: str | None = None
    gang_start_time: str | None = None
    oom_recovery: OomRecovery | None = None
    scaling: ScalingStatus | None = None
    checkpoints: Durability | None = None
    """Whether checkpoints outlive the gang (the CheckpointsDurable condition); None: keep the stored one."""
    queue: str | None = None
    """The queue a gate holds the job to (``status.queue``); None writes nothing (never clears it)."""
    runtime: RuntimeStatus | None = None
    """The runtime the current gang was built from (``status.runtime``); None writes nothing."""
    runtime_condition: RuntimeCondition | None = None
    """The RuntimeUpToDate condition; None: keep the stored one (a status written without a runtime)."""

    def carry(self, prev: RLTrainingJobStatus) -> StatusDraft:
        """Keep the restart bookkeeping of ``prev`` (each record written back whole: :func:`whole`) and the
        queue it remembers."""
        self.queue, self.runtime = prev.queue, whole(prev.runtime)
        self.scaling = whole(prev.scaling)
        self.restarts, self.disruptions = prev.restarts, prev.disruptions
        self.last_failure = whole(prev.last_failure)
        self.next_restart_time, self.gang_start_time = prev.next_restart_time, prev.gang_start_time
        self.oom_recovery = whole(prev.oom_recovery)
        return self


M = TypeVar("M", bound=BaseModel)


def whole(record: M | None) -> M | None:
    """A copy of ``record`` with every field set, so :func:`status_patch` writes all of them (a carried
    record is written back as a whole, defaults and nulls included); None stays None."""
    return None if record is None else type(record).model_validate(record.model_dump())


def status_patch(status: BaseModel, fields: Collection[str] | None = None) -> dict[str, Any]:
    """The merge patch of a typed status (camelCase JSON): the one place a status model becomes a patch.

    Every field the decision set is written, a None too (a null clears the field); one it left unset
    is not (a job's ``progress``, an experiment's standings when it only fails). ``fields``: only these
    (camelCase), in that order.
    """
    body = status.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return body if fields is None else {k: body[k] for k in fields}


def _workers(d: StatusDraft, pods: Sequence[ObservedPod]) -> WorkersStatus:
    current = [p for p in pods if p.owned and p.generation == d.generation]
    ready = sum(1 for p in current if p.ready and p.active)
    return WorkersStatus(
        desired=d.desired,
        active=sum(1 for p in pods if p.owned and p.active),
        ready=ready,
        succeeded=sum(1 for p in current if p.phase == "Succeeded"),
        failed=sum(1 for p in current if p.phase == "Failed"),
        summary=f"{ready}/{d.desired}",
        current=sum(1 for p in current if p.phase == "Running" and not p.deleting),
    )


def job_status(
    d: StatusDraft,
    *,
    job_name: str,
    observed_generation: int | None,
    previous_conditions: Sequence[Mapping[str, Any]],
    now: datetime,
    pods: Sequence[ObservedPod] = (),
) -> RLTrainingJobStatus:
    """The operator-owned status of draft ``d``, every field set (``progress`` belongs to the status API);
    ``status_patch(job_status(...), fields)`` is the patch a Plan writes.

    ``pods``: the job's observed pods (the worker counts); ``previous_conditions``: the stored
    conditions, whose ``lastTransitionTime`` is kept while their status does not change.
    """
    stalled = d.phase == Phase.failed.value or (d.phase == Phase.restarting.value and d.reason in STALL_REASONS)
    return RLTrainingJobStatus(
        phase=d.phase or None,
        reason=d.reason,
        message=d.message,
        observed_generation=observed_generation,
        conditions=make_conditions(
            d.phase, d.reason, d.message, ready=d.ready, reconciling=d.reconciling,
            generation=observed_generation, previous=previous_conditions, now=now, stalled=stalled,
        ) + checkpoints_condition(d.checkpoints, generation=observed_generation, previous=previous_conditions,
                                  now=now)
        + _runtime_condition(d.runtime_condition, generation=observed_generation, previous=previous_conditions,
                             now=now),
        workers=_workers(d, pods),
        gang_generation=d.generation,
        selector=selector(job_name),
        start_time=d.start_time,
        completion_time=d.completion_time,
        restarts=d.restarts,
        disruptions=d.disruptions,
        last_failure=d.last_failure,
        next_restart_time=d.next_restart_time,
        gang_start_time=d.gang_start_time,
        oom_recovery=d.oom_recovery,
        scaling=d.scaling,
        **({"queue": d.queue} if d.queue else {}),
        **({"runtime": d.runtime} if d.runtime is not None else {}),
    )


def _runtime_condition(cond: RuntimeCondition | None, *, generation: int | None,
                       previous: Sequence[Mapping[str, Any]], now: datetime) -> list[Condition]:
    """The ``RuntimeUpToDate`` condition (a list of one); ``cond`` None keeps the stored one, if any."""
    if cond is None:
        old = next((c for c in previous if c.get("type") == RUNTIME_CONDITION), None)
        return [Condition.model_validate(old)] if old is not None else []
    return [condition(RUNTIME_CONDITION, cond.up_to_date, cond.reason, cond.message, previous=previous,
                      now=rfc3339(now), generation=generation)]


#: A job waits, Pending with this reason, for a runtime it can run on (``lifecycle.runtime_not_found``).
RUNTIME_NOT_FOUND = "RuntimeNotFound"


def transition_event(prev_phase: str | None, d: StatusDraft) -> list[Event]:
    """The Event of a phase change (none when the phase stays): Warning for trouble, else Normal."""
    if prev_phase == d.phase:
        return []
    trouble = d.phase == Phase.failed.value or (d.phase == Phase.restarting.value and d.reason != "Resizing") \
        or d.reason == RUNTIME_NOT_FOUND
    kind = "Warning" if trouble else "Normal"
    return [Event(kind, d.reason, f"{prev_phase or 'New'} → {d.phase}: {d.message}")]


def checkpoint_event(previous_conditions: list[dict[str, Any]], d: StatusDraft) -> list[Event]:
    """The Warning that a job's checkpoints will not survive a gang restart, posted once: when its
    CheckpointsDurable condition turns Ephemeral (a new job, or a spec edit), not at every reconcile.

    The stored condition is the memory, and the status is written before the Events; a finished
    job's status is not news.
    """
    now = d.checkpoints
    if now is None or now.durable or d.phase in (Phase.failed.value, Phase.succeeded.value):
        return []
    before = next((c for c in previous_conditions if c.get("type") == CHECKPOINTS_CONDITION), {})
    if before.get("reason") == EPHEMERAL:
        return []
    return [Event("Warning", EVENT_REASON, now.message)]


def runtime_event(previous_conditions: list[dict[str, Any]], d: StatusDraft) -> list[Event]:
    """The Event of a gang that stops running on its runtime as it is now (``RuntimeUpToDate`` turning False, or
    False for another reason): Normal for an edit (it applies from the next gang), Warning for a deleted runtime."""
    cond = d.runtime_condition
    if cond is None or cond.up_to_date:
        return []
    before = next((c for c in previous_conditions if c.get("type") == RUNTIME_CONDITION), {})
    if before.get("status") == "False" and before.get("reason") == cond.reason:
        return []
    return [Event("Normal" if cond.reason == RUNTIME_CHANGED else "Warning", cond.reason, cond.message)]


def force_deleted_event(pod_name: str, deleted_node: str | None = None) -> Event:
    """Posted right after a pod stuck Terminating, or bound to ``deleted_node``, is force-deleted."""
    if deleted_node is not None:
        return Event("Warning", "ForceDeleted",
                     f"{pod_name} was bound to node {deleted_node}, which was deleted: force-deleted it")
    return Event("Warning", "ForceDeleted",
                 f"{pod_name} stayed Terminating past its grace period (its node does not answer): force-deleted it")
