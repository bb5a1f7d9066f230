"""One reconcile decided as a pure function: (job, observed pods, now) → a Plan.

``plan_reconcile`` tries named steps in order over one :class:`Situation`; the first that
decides returns the Plan (``STEPS``). The reconciler carries a Plan out in a fixed order:
status first (it records decisions such as a new gang generation or the start time), then
deletions, then the ConfigMap and Service, then pod creations, then Events. Every step is
idempotent and the next reconcile recomputes the Plan from what it observes, so a reconcile
interrupted anywhere converges.

Phases: ``Pending`` (pods missing or unscheduled) → ``Starting`` (all scheduled, not all
running and ready) → ``Running`` → ``Succeeded`` (worker 0 exited 0) or ``Failed`` (a permanent
worker failure, ``backoffLimit`` exhausted, the deadline passed, or the spec is invalid);
``Restarting`` after a retryable failure, a disruption or a stall (the whole gang is deleted
and, after the backoff, created again as a new gang generation); ``Suspended`` while
``runPolicy.suspend`` is set (pods deleted, the rest kept; resuming starts a new gang
generation and restarts the deadline clock, as for a batch Job).

A failure is acted on once (``failure/``): the reconcile that sees it writes the new gang
generation, ``restarts`` and ``lastFailure`` to status first; the failed pods then belong to an
old generation, and a later reconcile (or another operator replica after a crash) only deletes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from rljob_contract.job import FINISHED_PHASES, Phase, RLTrainingJob, RLTrainingJobStatus

from rljob_operator.decisions.children import JobNetwork, desired_worker_pod
from rljob_operator.decisions.failure import plan_failure
from rljob_operator.decisions.failure.observe import stall_check_in
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.plan import (
    INVALID_SPEC_FIELDS,
    Event,
    Plan,
    StatusDraft,
    job_status,
    status_patch,
)
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.decisions.scaling import Capacity, resize_event_message, scaling_status
from rljob_operator.decisions.situation import (
    FORCE_DELETE_AFTER_SECONDS,
    WAIT_REQUEUE_SECONDS,
    Situation,
    holding_pods,
    settled,
    stopping_look,
    stranger_events,
    stuck_terminating,
)
from rljob_operator.integrations.gate import Gated, Outcome
from rljob_operator.names import StatusEndpoint, worker_name
from rljob_operator.times import parse_time, rfc3339

__all__ = ["FORCE_DELETE_AFTER_SECONDS", "WAIT_REQUEUE_SECONDS", "Event", "Plan", "plan_invalid", "plan_reconcile"]


def finished(ctx: Situation) -> Plan | None:
    """A finished job stays finished; only its TTL and its leftover pods are handled.

    Every pod still running is deleted, whichever way the job ended (a worker that kept running after
    worker 0 exited 0 would keep its GPUs; its job's Kueue Workload waits for it, ``Outcome.pods_left``),
    and looked at again until it is gone (force-deleted once stuck past its grace period).
    """
    prev, phase = ctx.prev, ctx.prev.phase
    if phase not in FINISHED_PHASES or ctx.retry_invalid:
        return None
    assert phase is not None
    d = StatusDraft(phase, prev.reason or phase, prev.message or "", ready=phase == Phase.succeeded.value,
                    start_time=prev.start_time, completion_time=prev.completion_time,
                    generation=prev.gang_generation or 0, desired=ctx.replicas).carry(prev)
    return settled(ctx, d, [p.name for p in ctx.holding if not p.deleting])


def policy_violation(ctx: Situation) -> Plan | None:
    """A job asking for more than the platform's pod profile allows: Failed, reason PolicyViolation.

    Checked before anything else can create a pod; every field at fault is named. No retry: the
    job is looked at again when its spec is edited (``Situation.retry_invalid``). Pods of an
    earlier, allowed spec are deleted with the job's failure.
    """
    if not ctx.violations:
        return None
    d = ctx.draft(spec_checked=False)
    d.phase, d.reason = Phase.failed.value, "PolicyViolation"
    d.message = "; ".join(ctx.violations)[:1024]
    d.completion_time = rfc3339(ctx.now)
    # Already Failed (an edit that still violates): no phase change says so, this Event does.
    again = ctx.prev.phase == d.phase and ctx.prev.message != d.message
    return settled(ctx, d, [p.name for p in ctx.owned if p.active],
                   [Event("Warning", "PolicyViolation", d.message)] if again else [])


def suspended(ctx: Situation) -> Plan | None:
    """``runPolicy.suspend``: delete the pods, keep the rest, wait until they are gone."""
    if not ctx.job.spec.run_policy.suspend:
        return None
    remaining = list(ctx.owned)
    d = StatusDraft(
        Phase.suspended.value, "Suspended",
        f"suspended; {len(remaining)} worker pod(s) still terminating" if remaining
        else "suspended; worker pods deleted, set spec.runPolicy.suspend=false to resume",
        ready=not remaining, reconciling=bool(remaining), generation=ctx.prev.gang_generation or 0, desired=0,
        checkpoints=ctx.checkpoints,
    ).carry(ctx.prev)
    plan = settled(ctx, d, [p.name for p in remaining if not p.deleting])
    plan.requeue_after = WAIT_REQUEUE_SECONDS if remaining else None
    return plan


def deadline_passed(ctx: Situation) -> Plan | None:
    """``activeDeadlineSeconds`` passed: Failed, every pod deleted (checked before the spec is)."""
    if ctx.deadline_left is None or ctx.deadline_left > 0:
        return None
    d = ctx.draft(spec_checked=False)
    d.phase, d.reason = Phase.failed.value, "DeadlineExceeded"
    d.message = f"the job ran longer than activeDeadlineSeconds ({ctx.job.spec.run_policy.active_deadline_seconds}s)"
    d.completion_time = rfc3339(ctx.now)
    return settled(ctx, d, [p.name for p in ctx.owned if p.active])


def succeeded(ctx: Situation) -> Plan | None:
    """Worker 0 exited 0: the job succeeded, and the rest of the gang is deleted.

    Worker 0 exits only after every rank passed the trainer's last barrier (``finish_together``: rank 0's
    final uploads and summary are done), so a worker still running has nothing left to do, or is one
    whose code chose not to stop (a reward module can make worker 0 exit 0 and the rest sleep).
    """
    worker0 = ctx.by_index.get(0)
    if worker0 is None or worker0.phase != "Succeeded":
        return None
    d = ctx.draft()
    d.phase, d.reason, d.message = Phase.succeeded.value, "Completed", "worker 0 finished training"
    d.ready, d.completion_time = True, rfc3339(ctx.now)
    return settled(ctx, d, ctx.stale_deletions + [p.name for p in ctx.current if p.active], ctx.lead_events)


def held(ctx: Situation) -> Plan | None:
    """An admission gate (Kueue, ``integrations/``) holds the gang: Queued, in its words; no pod runs.

    A gang that was running when its gate took the admission back (Kueue's preemption, eviction) is
    stopped as in a resize: SIGTERM (the workers save a checkpoint), a new gang generation that
    resumes from it once admitted again; neither a restart nor a disruption. Nothing counts the
    waiting time: the gang start time (startup and stall timeouts) and, before the first admission,
    the start time (activeDeadlineSeconds) stay unset. An admitted gang its gates cannot place
    fails (``_refused_placement``).
    """
    hold = ctx.hold
    if hold is None:
        return _refused_placement(ctx) if ctx.placement_problems else None
    d = ctx.draft()
    d.reason, d.message = hold.reason, hold.message
    live = [p for p in ctx.current if not p.deleting]
    events = list(ctx.lead_events)
    if live:
        d.generation += 1
        d.message = f"{d.message}; stopping generation {d.generation - 1} (workers save a checkpoint)"
        events.append(Event("Normal", "Evicted", f"{hold.taken_back}: {d.message}"))
    d.phase, d.reconciling = Phase.queued.value, True
    d.gang_start_time = d.next_restart_time = None
    d.start_time = ctx.prev.start_time
    waiting = live or any(p.deleting for p in ctx.pods) or ctx.stale_deletions
    return ctx.plan(d, delete=ctx.stale_deletions + [p.name for p in live], events=events,
                    requeue_after=WAIT_REQUEUE_SECONDS if waiting else hold.retry_after,
                    gang_restart="Evicted" if live else None)


def _refused_placement(ctx: Situation) -> Plan:
    """The placement the gates admitted the gang with cannot be applied to the pods (Kueue: its
    flavors): Failed, every field named."""
    d = ctx.draft()
    d.phase, d.reason = Phase.failed.value, "PolicyViolation"
    d.message = "; ".join(ctx.placement_problems)[:1024]
    d.completion_time = rfc3339(ctx.now)
    return settled(ctx, d, [p.name for p in ctx.owned if p.active])


def resized(ctx: Situation) -> Plan | None:
    """Run the job at a new worker count: record the size first (status), then stop the gang.

    The workers save a checkpoint on SIGTERM (their grace period is
    ``workers.terminationGracePeriodSeconds``); the next gang, of the new size and a new
    generation, resumes from it with gradientAccumulationSteps recomputed for the global batch.
    A resize is neither a restart nor a disruption: it counts against nothing.
    """
    resize = ctx.sizing.resize
    if resize is None or resize.replicas == ctx.replicas:
        return None
    events = ctx.lead_events + ctx.sizing.events + [Event("Normal", "Resized",
                                                          resize_event_message(ctx.job, resize, ctx.now))]
    d = ctx.draft()
    d.scaling = scaling_status(ctx.job, resize.replicas, resize, ctx.now)
    d.desired = resize.replicas
    live = [p for p in ctx.current if not p.deleting]
    if live:
        d.generation += 1
        d.gang_start_time = None
        d.next_restart_time = rfc3339(ctx.now)
        d.phase, d.reason = Phase.restarting.value, "Resizing"
        d.message = f"{resize.message}: stopping generation {d.generation - 1} (workers save a checkpoint)"
    else:
        d.phase = Phase.restarting.value if ctx.prev.phase == Phase.restarting.value else Phase.pending.value
        d.reason, d.message = "Resizing", resize.message
    d.reconciling = True
    return ctx.plan(d, delete=ctx.stale_deletions + [p.name for p in live], events=events,
                    requeue_after=0.01 if not live else WAIT_REQUEUE_SECONDS,
                    gang_restart="Resized" if live else None)


def insufficient_capacity(ctx: Situation) -> Plan | None:
    """Policy Capacity: fewer workers than ``minReplicas`` fit on the nodes: wait before creating a gang."""
    view, low = ctx.size_view, ctx.job.spec.workers.bounds[0]
    if not view.gang_starting or view.total_slots is None or view.total_slots >= low:
        return None
    d = ctx.draft()
    d.scaling = ctx.sizing.scaling
    d.phase, d.reason, d.reconciling = Phase.pending.value, "InsufficientCapacity", True
    d.message = f"waiting for capacity: minReplicas is {low} but {view.total_slots} worker(s) fit on the nodes " \
                "this job may use"
    return ctx.plan(d, delete=ctx.stale_deletions, events=ctx.lead_events + ctx.sizing.events,
                    requeue_after=float(ctx.job.spec.run_policy.check_interval_seconds))


def progress(ctx: Situation) -> Plan:
    """The gang as it goes: create missing workers (after any backoff), report how far it got."""
    replicas, prev = ctx.replicas, ctx.prev
    d = ctx.draft()
    d.scaling = ctx.sizing.scaling
    restarting = prev.phase == Phase.restarting.value
    restart_left = None
    if restarting and not ctx.current:
        due = parse_time(prev.next_restart_time)
        restart_left = (due - ctx.now).total_seconds() if due is not None else None
    occupied = {p.name for p in ctx.pods}
    missing = [i for i in range(replicas) if i not in ctx.by_index]
    create = [] if restart_left is not None and restart_left > 0 else [
        ctx.place(desired_worker_pod(ctx.job, i, ctx.generation, ctx.endpoint)) for i in missing
        if worker_name(ctx.job.metadata.name, i) not in occupied
    ]
    blocked = [worker_name(ctx.job.metadata.name, i) for i in missing
               if worker_name(ctx.job.metadata.name, i) in occupied]
    if create and d.gang_start_time is None:
        d.gang_start_time = rfc3339(ctx.now)
    if create or ctx.current:
        d.next_restart_time = None
    if restarting and not create and not ctx.current:
        _still_restarting(ctx, d, restart_left, blocked)
    else:
        _gang_phase(ctx, d, create, blocked)
    return ctx.plan(d, delete=ctx.stale_deletions, events=ctx.lead_events + ctx.sizing.events,
                    requeue_after=_next_look(ctx, d, blocked, restart_left), gang_restart=ctx.gang_restart,
                    create=create)


def _still_restarting(ctx: Situation, d: StatusDraft, restart_left: float | None, blocked: list[str]) -> None:
    """Still the failure's phase: the old gang is going away, or the backoff has not passed."""
    prev = ctx.prev
    d.phase, d.reason, d.reconciling = Phase.restarting.value, prev.reason or "Restarting", True
    # Absolute times only: a countdown would change status, and so wake the job, every second.
    if restart_left is not None and restart_left > 0:
        d.message = f"restarting the gang as generation {ctx.generation} at {prev.next_restart_time} (backoff)"
    else:
        d.message = f"restarting the gang as generation {ctx.generation}: waiting for old pod(s) " \
                    f"{', '.join(blocked)} to terminate"
    if prev.last_failure is not None and prev.last_failure.message:
        d.message = f"{prev.last_failure.message}; {d.message}"


def _gang_phase(ctx: Situation, d: StatusDraft, create: list[dict[str, Any]], blocked: list[str]) -> None:
    """Pending, Starting or Running, from the current gang's pods."""
    replicas, current = ctx.replicas, ctx.current
    scheduled = [p for p in current if p.scheduled]
    # A worker that already exited 0 counts as running and ready: ranks finish at slightly different times.
    running = [p for p in current if (p.phase == "Running" and not p.deleting) or p.phase == "Succeeded"]
    ready = [p for p in running if p.ready or p.phase == "Succeeded"]
    unschedulable = next((p for p in current if p.unschedulable), None)
    if len(current) < replicas or len(scheduled) < replicas:
        d.phase, d.reconciling = Phase.pending.value, True
        if create:
            d.reason, d.message = "CreatingWorkers", f"creating {len(create)} of {replicas} worker pod(s)"
        elif blocked:
            d.reason, d.message = "WaitingForOldPods", f"waiting for old pod(s) {', '.join(blocked)} to terminate"
        elif unschedulable is not None:
            d.reason, d.message = "Unschedulable", f"{unschedulable.name}: {unschedulable.unschedulable}"
        else:
            d.reason, d.message = "WorkersPending", f"{len(scheduled)}/{replicas} worker pod(s) scheduled"
    elif len(ready) == replicas:
        d.phase, d.reason, d.ready = Phase.running.value, "Running", True
        d.message = f"{replicas}/{replicas} workers ready"
    elif len(running) == replicas and ctx.prev.phase == Phase.running.value and not ctx.restarted:
        d.phase, d.reason = Phase.running.value, "WorkersNotReady"
        d.message = f"{len(ready)}/{replicas} workers ready"
    else:
        d.phase, d.reason, d.reconciling = Phase.starting.value, "WorkersStarting", True
        d.message = f"{len(running)}/{replicas} worker pod(s) running, {len(ready)} ready"
        stuck = next((p for p in current if p.waiting), None)
        if stuck is not None:  # an image that cannot be pulled, a missing Secret: say so
            d.message += f"; {stuck.name}: {stuck.waiting}"


def _next_look(ctx: Situation, d: StatusDraft, blocked: list[str], restart_left: float | None) -> float | None:
    """When this job needs another look without an event: the soonest deadline, wait or check."""
    interval = float(ctx.job.spec.run_policy.check_interval_seconds)
    waits = [ctx.deadline_left] if ctx.deadline_left is not None else []
    if blocked or any(p.deleting for p in ctx.pods) or ctx.stale_deletions:
        waits.append(WAIT_REQUEUE_SECONDS)
    if restart_left is not None and restart_left > 0:
        waits.append(restart_left)
    if ctx.size_view.free_slots is not None:  # policy Capacity: free GPUs come and go without an event
        waits.append(interval)
    if d.phase in (Phase.starting.value, Phase.running.value):  # the stall check, when it falls due
        check = stall_check_in(ctx.job, ctx.now) if not ctx.restarted else None
        waits.append(check if check is not None else interval)
    return min(waits) if waits else None


#: The decisions of one reconcile, in order: the first that returns a Plan decides (``progress`` always does).
STEPS: tuple[Callable[[Situation], Plan | None], ...] = (
    finished, policy_violation, suspended, deadline_passed, succeeded, held, plan_failure, resized,
    insufficient_capacity, progress,
)


def plan_reconcile(
    job: RLTrainingJob, pods: list[ObservedPod], now: datetime, endpoint: StatusEndpoint | None = None,
    force_delete_after: float = FORCE_DELETE_AFTER_SECONDS, capacity: Capacity | None = None,
    profile: PodProfile | None = None,
    network: JobNetwork | None = None,
    gates: tuple[Gated[Any], ...] = (),
) -> Plan:
    """Decide one reconcile of ``job`` given its observed pods (label ``rljob.dev/job``).

    ``force_delete_after``: seconds a pod may stay Terminating past its deletion deadline.
    ``capacity``: the cluster's nodes and bound pods, for policy Capacity (None: not looked at).
    ``profile``: the platform's pod profile every job is checked against first (None: not checked).
    ``gates``: the admission gates that govern the job, with what each observed (empty: none does).
    ``network``: the platform's NetworkPolicy settings (None: the job gets no NetworkPolicy).
    """
    ctx = Situation(job, pods, now, endpoint, capacity, force_delete_after, profile, network, tuple(gates))
    for step in STEPS:
        plan = step(ctx)
        if plan is not None:
            if gates:  # each gate's objects follow the decided phase
                plan.gate_writes = {g.gate.name: g.gate.writes(job, g.view, outcome(ctx, plan)) for g in gates}
            return plan
    raise AssertionError("plan_reconcile: the last step (progress) always decides")


def outcome(ctx: Situation, plan: Plan) -> Outcome:
    """What the gates' writes follow: the decided phase, and which of the job's pods still hold resources.

    A pod outside the gang the plan keeps (of an older generation, or deleted now or before) is *old*:
    the quota it was admitted with is given back once no old pod is left, the job's whole quota once no
    pod is.
    """
    kept = plan.status.get("gangGeneration")
    dropped = set(plan.delete_pods) | set(plan.force_delete_pods)
    old = [p for p in ctx.holding if not p.owned or p.generation != kept or p.deleting or p.name in dropped]
    return Outcome(plan.status.get("phase") or "", plan.status.get("message") or "", bool(ctx.holding), bool(old),
                   ctx.now)


def plan_invalid(raw: dict[str, Any], problems: list[str], now: datetime, pods: Sequence[ObservedPod] = (),
                 force_delete_after: float = FORCE_DELETE_AFTER_SECONDS) -> Plan:
    """A job the models reject (the CRD let it through): Failed, reason InvalidSpec.

    Its pods (``pods``, observed; a running job edited into an invalid spec has some) are deleted as any
    finished job's are, and looked at until they are gone. It is looked at again when its spec changes
    (a new metadata.generation).
    """
    prev = RLTrainingJobStatus.model_validate(raw.get("status") or {})
    message = "; ".join(problems)[:1024]
    d = StatusDraft(Phase.failed.value, "InvalidSpec", message, completion_time=prev.completion_time or rfc3339(now),
                    generation=prev.gang_generation or 0)
    meta = raw.get("metadata") or {}
    status = status_patch(job_status(d, job_name=meta.get("name") or "", observed_generation=meta.get("generation"),
                                     previous_conditions=[c.model_dump(by_alias=True) for c in prev.conditions],
                                     now=now), INVALID_SPEC_FIELDS)
    same = prev.reason == "InvalidSpec" and prev.message == message
    left = holding_pods(pods)
    stuck = stuck_terminating([p for p in pods if p.claims_job], now, force_delete_after)
    return Plan(status=status, events=stranger_events(pods) + ([] if same else [Event("Warning", "InvalidSpec", message)]),
                delete_pods=[p.name for p in left if not p.deleting], force_delete_pods=stuck,
                requeue_after=stopping_look(left, now, force_delete_after))

