"""What one reconcile decides from (pure): a job, its observed pods, the time, and values derived from them.

A :class:`Situation` is built once per reconcile; each derived value is computed on first use
and then shared by the decision steps of ``lifecycle`` (a finished job never computes its spec
hash or its size). It also turns a :class:`~rljob_operator.decisions.plan.StatusDraft` into a
:class:`~rljob_operator.decisions.plan.Plan`, so every step renders status and events the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, overload

from rljob_contract.job import (
    Phase,
    RLTrainingJob,
    RLTrainingJobStatus,
    RuntimeStatus,
    ScalingPolicy,
    ScalingStatus,
)
from rljob_contract.runtime import Resolved

from rljob_operator.decisions.checkpoints import Durability, durability
from rljob_operator.decisions.children import (
    JobNetwork,
    desired_rendezvous,
    desired_worker_pod,
    resolved,
    spec_hash,
)
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.plan import (
    Children,
    Event,
    Plan,
    RuntimeCondition,
    StatusDraft,
    checkpoint_event,
    job_status,
    runtime_event,
    status_patch,
    transition_event,
    whole,
)
from rljob_operator.decisions.policy import PodProfile, checked
from rljob_operator.decisions.runtimes import NOT_ALLOWED, UP_TO_DATE, Stale, runtime_record
from rljob_operator.decisions.scaling import (
    Capacity,
    Resize,
    SizeView,
    decide,
    requested_size,
    scaling_status,
)
from rljob_operator.integrations.gate import Gated, Hold, Queueing, Verdict
from rljob_operator.names import StatusEndpoint
from rljob_operator.times import parse_time, rfc3339

#: How soon to look again while waiting for pods to go away.
WAIT_REQUEUE_SECONDS = 2.0
#: Failures caused by the spec (or what the API server made of it): looked at again after a spec edit.
RECHECKED_REASONS = frozenset({"InvalidSpec", "InvalidPodSpec", "PolicyViolation", "PodRejected", NOT_ALLOWED})
#: Default for how long a pod may stay Terminating past its deletion before it is force-deleted.
FORCE_DELETE_AFTER_SECONDS = 60.0


T = TypeVar("T")


class derived(Generic[T]):
    """A value derived from a Situation, computed on first use and then kept in the instance.

    ``functools.cached_property`` does the same but, before Python 3.12, takes a lock on every
    first use, which made a reconcile's decisions markedly slower; a Situation lives in one thread.
    """

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> derived[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | derived[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)  # shadows this descriptor from now on
        return value


@dataclass(frozen=True)
class Sizing:
    """The worker count decision: the scaling status to write, its Events, and a resize (if any)."""

    scaling: ScalingStatus
    events: list[Event]
    resize: Resize | None


def stuck_terminating(pods: list[ObservedPod], now: datetime, after: float) -> list[str]:
    """Pods no kubelet will confirm: still Terminating ``after`` seconds past their deletion
    deadline, or bound to a node that was deleted (what the pod garbage collector force-deletes
    after its 40 s quarantine)."""
    out = []
    for p in pods:
        deadline = parse_time(p.deleted_at)
        if p.node_lost or (p.deleting and deadline is not None and (now - deadline).total_seconds() >= after):
            out.append(p.name)
    return out


def holding_pods(pods: Sequence[ObservedPod]) -> list[ObservedPod]:
    """Pods that claim the job (``ObservedPod.claims_job``: its own, and strangers it deletes) that may still
    hold their node's resources: not in a terminal phase. A quota is given back only once none is left, as a
    batch Job's terminal condition waits for its terminating pods since Kubernetes 1.31; a pod that exited
    holds nothing."""
    return [p for p in pods if p.claims_job and not p.finished]


def stranger_events(pods: Sequence[ObservedPod]) -> list[Event]:
    """A ForeignPod Warning for each stranger (``ObservedPod.stranger``) not yet being deleted: the reconcile
    that deletes it says so once, naming the pod and who its creator said it was."""
    events = []
    for p in pods:
        if p.stranger and not p.deleting:
            said = f" (its creator named itself {p.creator!r})" if p.creator else ""
            events.append(Event("Warning", "ForeignPod",
                                f"pod {p.name}{said} claims this job but the operator did not create it for the "
                                "job: it is not counted, decides nothing, and is deleted"))
    return events


def stopping_look(holding: Sequence[ObservedPod], now: datetime, force_delete_after: float) -> float | None:
    """When to look again at pods still holding resources (``holding_pods``; None: none is left).

    A Terminating pod is looked at when it falls due for force-deletion (``force_delete_after`` past its
    deletion deadline): no event comes from a pod whose kubelet never answers. A pod not yet seen
    Terminating (deleted by this very plan) is looked at again shortly, in case its event is lost.
    """
    looks = []
    for p in holding:
        deadline = parse_time(p.deleted_at)
        due = None if deadline is None else (deadline - now).total_seconds() + force_delete_after
        looks.append(WAIT_REQUEUE_SECONDS if due is None else max(due, WAIT_REQUEUE_SECONDS))
    return min(looks) if looks else None


@dataclass(frozen=True)
class Situation:
    """One reconcile's inputs and the values derived from them (cached on first use)."""

    job: RLTrainingJob
    pods: list[ObservedPod]
    now: datetime
    endpoint: StatusEndpoint | None = None
    capacity: Capacity | None = None
    """The cluster's nodes and bound pods, for policy Capacity (None: not looked at)."""
    force_delete_after: float = FORCE_DELETE_AFTER_SECONDS
    """Seconds a pod may stay Terminating past its deletion deadline."""
    profile: PodProfile | None = None
    """What the platform allows the job's pods (None: not checked, for tests of other decisions)."""
    network: JobNetwork | None = None
    """The platform's NetworkPolicy settings (None: the operator makes no NetworkPolicy)."""
    gates: tuple[Gated[Any], ...] = ()
    """The admission gates that govern the job, each with what it observed (``integrations/gate.py``)."""
    runtime: Resolved | None = None
    """The job on its runtime (``rljob_contract.runtime.resolve``); None: on no runtime, for tests of other
    decisions (the reconciler always resolves one, or says why not in ``runtime_missing``)."""
    runtime_missing: str | None = None
    """Why the job's runtime cannot be had (it names none and there is no default, or the one it names does
    not exist, and no snapshot serves it): the job waits, Pending with reason RuntimeNotFound."""
    runtime_not_allowed: str | None = None
    """Why the job may not use its runtime (a ClusterRLTrainingRuntime's namespaceSelector): Failed."""
    runtime_stale: Stale | None = None
    """Why ``runtime`` is a snapshot rather than the runtime as it is now (``decisions.runtimes``)."""

    @derived
    def resolved(self) -> Resolved:
        """The job on its runtime (on no runtime when ``runtime`` is None)."""
        return resolved(self.job, self.runtime)

    @derived
    def runtime_record(self) -> RuntimeStatus | None:
        """What ``status.runtime`` says of a gang built now (None: on no runtime)."""
        runtime = self.resolved.runtime
        return runtime_record(runtime) if runtime is not None else None

    @derived
    def runtime_condition(self) -> RuntimeCondition | None:
        """The RuntimeUpToDate condition: False while the gang runs on a snapshot (None: on no runtime)."""
        if self.resolved.runtime is None:
            return None
        if self.runtime_stale is not None:
            return RuntimeCondition(False, self.runtime_stale.reason, self.runtime_stale.message)
        return RuntimeCondition(True, UP_TO_DATE, f"the gang is built from {self.resolved.ref} at generation "
                                                  f"{self.resolved.runtime.generation}")

    @derived
    def worker(self) -> dict[str, Any]:
        """Worker 0 of gang 0 as built: its requests, placement and volumes."""
        return desired_worker_pod(self.job, 0, 0, runtime=self.resolved)

    # ---------------------------------------------------------------- the job as stored
    @derived
    def prev(self) -> RLTrainingJobStatus:
        """The status as last written (its phase a plain str: see ``RLTrainingJobStatus``)."""
        return self.job.status or RLTrainingJobStatus()

    @derived
    def replicas(self) -> int:
        return self.job.replicas

    @derived
    def meta_generation(self) -> int | None:
        return (self.job.metadata.model_extra or {}).get("generation")

    @derived
    def retry_invalid(self) -> bool:
        """A job that failed because of its spec is looked at again once the spec is edited."""
        return self.prev.reason in RECHECKED_REASONS and \
            self.prev.observed_generation != self.meta_generation

    @derived
    def violations(self) -> list[str]:
        """Fields of the job the platform's pod profile does not allow (``policy.violations``)."""
        found = checked(self.job, self.profile, self.resolved) if self.profile is not None else []
        return found + [v for g in self.gates for v in g.gate.violations(self.job, g.view)]

    @derived
    def previous_conditions(self) -> list[dict[str, Any]]:
        """The conditions as last written, as dicts."""
        return [c.model_dump(by_alias=True) for c in self.prev.conditions]

    @derived
    def checkpoints(self) -> Durability:
        """Whether the job's checkpoints outlive its gang (the CheckpointsDurable condition)."""
        return durability(self.resolved.checkpoint, lambda: self.worker)

    @derived
    def start(self) -> datetime:
        return parse_time(self.prev.start_time) or self.now

    @derived
    def deadline_left(self) -> float | None:
        """Seconds left of ``activeDeadlineSeconds`` (None: no deadline)."""
        deadline = self.resolved.active_deadline_seconds
        if deadline is None:
            return None
        return (self.start + timedelta(seconds=deadline) - self.now).total_seconds()

    # ---------------------------------------------------------------------- the pods
    @derived
    def owned(self) -> list[ObservedPod]:
        return [p for p in self.pods if p.owned]

    @derived
    def force_delete(self) -> list[str]:
        return stuck_terminating([p for p in self.pods if p.claims_job], self.now, self.force_delete_after)

    @derived
    def holding(self) -> list[ObservedPod]:
        """The job's pods (owned, or orphans with its label) that may still hold their node's resources."""
        return holding_pods(self.pods)

    def stopping_look(self) -> float | None:
        """When to look again at pods still holding resources (None: none is left): ``stopping_look``."""
        return stopping_look(self.holding, self.now, self.force_delete_after)

    # ------------------------------------------------------------------- the gang
    @derived
    def resumed(self) -> bool:
        """Resuming a suspended job: a new gang with a new rendezvous id."""
        return self.prev.phase == Phase.suspended.value

    @derived
    def base_generation(self) -> int:
        """The gang generation before a spec change is looked for."""
        return (self.prev.gang_generation or 0) + (1 if self.resumed else 0)

    @derived
    def _same_generation(self) -> list[ObservedPod]:
        # A pod replaced in place (``failure.respond.replaceable``) is stale though of this generation.
        replaced = set(self.prev.last_failure.replaced_pods) if self.prev.last_failure is not None else set()
        return [p for p in self.owned
                if p.generation == self.base_generation and p.index is not None and p.index < self.replicas
                and (p.uid is None or p.uid not in replaced)]

    @derived
    def spec_changed(self) -> bool:
        """The running gang was built from a spec the user has since edited (``spec_hash``)."""
        want = spec_hash(self.job)
        return any(p.spec_hash != want and p.job_generation != self.meta_generation
                   for p in self._same_generation if not p.deleting)

    @derived
    def generation(self) -> int:
        """The gang generation this reconcile works on."""
        return self.base_generation + (1 if self.spec_changed else 0)

    @derived
    def gang_started(self) -> bool:
        """The pods of the gang generation this reconcile works on were created (its ``gangStartTime`` is
        recorded): they were built from the runtime ``status.runtime`` records."""
        return self.generation == (self.prev.gang_generation or 0) and self.prev.gang_start_time is not None

    @derived
    def restarted(self) -> bool:
        """This reconcile starts a new gang (resumed or spec changed)."""
        return self.generation != (self.prev.gang_generation or 0)

    @derived
    def gang_restart(self) -> str | None:
        return "SpecChanged" if self.spec_changed else "Resumed" if self.resumed else None

    @derived
    def lead_events(self) -> list[Event]:
        """Events every plan after the spec check starts with."""
        if not self.spec_changed:
            return []
        return [Event("Normal", "SpecChanged", f"spec changed: restarting the worker gang as generation "
                                               f"{self.generation}")]

    @derived
    def current(self) -> list[ObservedPod]:
        """Pods of the current gang, one per index in use."""
        return [] if self.spec_changed else self._same_generation

    @derived
    def by_index(self) -> dict[int | None, ObservedPod]:
        return {p.index: p for p in self.current}

    @derived
    def rendezvous(self) -> dict[str, Any]:
        """The EndpointSlice of the job's Service: the current gang's worker 0 (one the operator created), while
        it is neither finished nor being deleted; no endpoint otherwise (``children.desired_rendezvous``)."""
        worker0 = self.by_index.get(0)
        return desired_rendezvous(self.job, worker0 if worker0 is not None and worker0.active else None)

    @derived
    def stale_deletions(self) -> list[str]:
        """Pods of old gangs or beyond the size, orphans under the job's worker names, and strangers, not yet
        being deleted."""
        # By identity: the current gang's pods are some of ``owned``'s objects, and ``p not in self.current``
        # compared every field of every pair, N² at N workers (1,000 workers: most of a reconcile's CPU).
        current = {id(p) for p in self.current}
        stale = [p for p in self.owned if id(p) not in current]
        # Orphans under a worker's name (a namesake deleted with --cascade=orphan) would block the gang's
        # names for ever, and so would strangers (pods claiming the job the operator did not create):
        # nothing else manages them.
        stale += [p for p in self.pods if p.claims_job and not p.owned]
        return [p.name for p in stale if not p.deleting]

    @derived
    def strangers(self) -> list[str]:
        """Strangers (``ObservedPod.stranger``) not yet being deleted: every Plan deletes them."""
        return [p.name for p in self.pods if p.stranger and not p.deleting]

    # ------------------------------------------------------------ admission gates
    @derived
    def verdicts(self) -> list[Verdict]:
        """Each gate's verdict on the gang, in the registry's order."""
        return [g.gate.verdict(self.job, g.view, self.prev, self.profile) for g in self.gates]

    @derived
    def queue(self) -> str | None:
        """The queue the job waits in (``status.queue``): what a gate with queues names, else the stored one."""
        named = (g.gate.queue(self.job, g.view) for g in self.gates if isinstance(g.gate, Queueing))
        return next((q for q in named if q), None) or self.prev.queue

    @derived
    def hold(self) -> Hold | None:
        """Why the gang may not run: the first gate that holds it (None: every gate admits it)."""
        return next((v.hold for v in self.verdicts if v.hold is not None), None)

    @derived
    def placement_problems(self) -> list[str]:
        """Why the admitted gang cannot be placed where its gates said (empty: it can)."""
        return [p for v in self.verdicts for p in v.problems]

    def place(self, pod: dict[str, Any]) -> dict[str, Any]:
        """``pod`` placed where every gate's admission says (node labels, tolerations...)."""
        for verdict in self.verdicts:
            pod = verdict.place(pod)
        return pod

    # ---------------------------------------------------------------------- sizing
    @derived
    def size_view(self) -> SizeView:
        """The gang as the scaling policy sees it."""
        live = [p for p in self.current if not p.deleting]
        ready = [p for p in live if p.phase == "Running" and p.ready]
        started = parse_time(self.prev.gang_start_time) or self.now
        free = total = None
        if self.capacity is not None and self.job.spec.autoscaling.policy == ScalingPolicy.capacity:
            worker = self.worker["spec"]  # requests, nodeSelector, tolerations as created
            free = self.capacity.slots(worker)
            total = self.capacity.slots(worker, exclude_job=(self.job.metadata.namespace or "", self.job.metadata.name))
        return SizeView(
            size=self.replicas,
            running=self.prev.phase == Phase.running.value and not self.restarted and len(ready) == self.replicas,
            gang_starting=not live,
            unschedulable_since=started if any(p.unschedulable for p in live) else None,
            free_slots=free,
            total_slots=total,
        )

    @derived
    def sizing(self) -> Sizing:
        """The worker count: what the spec asks (kubectl scale), or what capacity allows (policy Capacity)."""
        job, prev = self.job, self.prev
        spec_size, requested = requested_size(job)
        events: list[Event] = []
        scaling = whole(prev.scaling)
        if scaling is None:
            scaling = scaling_status(job, spec_size, None, self.now)
        elif requested is not None and requested.replicas == self.replicas:
            scaling.spec_replicas = job.spec.workers.replicas
            events.append(Event("Warning", "ScaleClamped", requested.message))
            requested = None
        return Sizing(scaling, events, requested or decide(job, self.size_view, self.now))

    # ------------------------------------------------------------------ rendering
    def draft(self, *, spec_checked: bool = True) -> StatusDraft:
        """A status draft of the gang: restart bookkeeping carried, the gang generation decided.

        ``spec_checked=False``: the generation before a spec change is looked for (the deadline
        check runs first).
        """
        generation = self.generation if spec_checked else self.base_generation
        d = StatusDraft("", "", "", start_time=rfc3339(self.start), generation=generation,
                        desired=self.replicas, checkpoints=self.checkpoints,
                        runtime_condition=self.runtime_condition).carry(self.prev)
        if generation != (self.prev.gang_generation or 0):
            d.gang_start_time = None  # a new gang: set when its pods are created
        return d

    def status(self, d: StatusDraft) -> RLTrainingJobStatus:
        """The full status of draft ``d`` (``plan.job_status``), with the queue the job waits in;
        ``plan.status_patch`` writes it."""
        d.queue = self.queue
        return job_status(
            d, job_name=self.job.metadata.name, observed_generation=self.meta_generation,
            previous_conditions=self.previous_conditions,
            now=self.now, pods=self.pods,
        )

    def plan(self, d: StatusDraft, *, delete: list[str], events: list[Event], requeue_after: float | None,
             gang_restart: str | None = None, create: list[dict[str, Any]] | None = None,
             serving: bool = True) -> Plan:
        """A Plan writing draft ``d``; the phase-change Event follows ``events``.

        Pods are created with the ConfigMap and Service they mount and resolve, and the
        NetworkPolicy that admits their traffic (``Children``). Strangers are deleted, whatever
        the step decided, each with its ForeignPod Event. ``serving``: the gang may run, and its
        worker 0 is the rendezvous (False: no endpoint, as for a job that is stopping its pods).
        """
        status = self.status(d)
        return Plan(
            status=status_patch(status),
            delete_pods=delete + [name for name in self.strangers if name not in delete],
            force_delete_pods=self.force_delete,
            children=Children(self.job, status, self.endpoint, self.network, self.resolved) if create else None,
            create_pods=create or [],
            rendezvous=self.rendezvous if serving else desired_rendezvous(self.job, None),
            events=stranger_events(self.pods) + events + transition_event(self.prev.phase, d)
            + checkpoint_event(self.previous_conditions, d) + runtime_event(self.previous_conditions, d),
            requeue_after=requeue_after,
            gang_restart=gang_restart,
        )


def gang_started(job: RLTrainingJob, pods: list[ObservedPod], now: datetime) -> bool:
    """Were the pods of the gang generation a reconcile of ``job`` works on created (``Situation.gang_started``)?
    The reconciler asks before it chooses the runtime the pods are built from (``runtimes.runtime_in_use``)."""
    return Situation(job, pods, now).gang_started


def _ttl(job: RLTrainingJob, completion: str | None, now: datetime) -> tuple[bool, float | None]:
    """Has ``ttlSecondsAfterFinished`` passed since ``completion``, and if not, how many seconds are left."""
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    done = parse_time(completion)
    if ttl is None or done is None:
        return False, None
    left = (done + timedelta(seconds=ttl) - now).total_seconds()
    return left <= 0, (None if left <= 0 else left)


def settled(ctx: Situation, d: StatusDraft, delete: list[str], events: list[Event] | None = None) -> Plan:
    """A Plan for a job that is finished, finishing or suspended: no restart pending, no pod created.

    Looked at again while a pod still holds resources (to force-delete it once it is stuck past its
    grace period: the quota waits for it) and when ``ttlSecondsAfterFinished`` passes; the job is
    deleted once the TTL has passed and no pod is left (deleting it sooner would let the garbage
    collector take its quota, the Kueue Workload, while a pod still runs)."""
    expired, left = _ttl(ctx.job, d.completion_time, ctx.now)
    d.next_restart_time = None
    looks = [t for t in (left, ctx.stopping_look()) if t is not None]
    plan = ctx.plan(d, delete=delete, events=events or [], requeue_after=min(looks) if looks else None,
                    serving=False)
    plan.delete_job = expired and not ctx.holding
    return plan
