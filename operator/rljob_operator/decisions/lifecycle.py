"""One reconcile decided as a pure function: (job, observed pods, now) → a Plan.

The reconciler carries a Plan out in a fixed order: status first (it records decisions such
as a new gang generation or the start time), then deletions, then the ConfigMap and Service,
then pod creations, then Events. Every step is idempotent and the next reconcile recomputes
the Plan from what it observes, so a reconcile interrupted anywhere converges.

Phases: ``Pending`` (pods missing or unscheduled) → ``Starting`` (all scheduled, not all
running and ready) → ``Running`` → ``Succeeded`` (worker 0 exited 0) or ``Failed`` (a permanent
worker failure, ``backoffLimit`` exhausted, the deadline passed, or the spec is invalid);
``Restarting`` after a retryable failure, a disruption or a stall (the whole gang is deleted
and, after the backoff, created again as a new gang generation); ``Suspended`` while
``runPolicy.suspend`` is set (pods deleted, the rest kept; resuming starts a new gang
generation and restarts the deadline clock, as for a batch Job).

A failure is acted on once: the reconcile that sees it writes the new gang generation,
``restarts`` and ``lastFailure`` to status first; the failed pods then belong to an old
generation, and a later reconcile (or another operator replica after a crash) only deletes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rljob_operator.api import FINISHED_PHASES, Phase, RLTrainingJob, RLTrainingJobStatus, ScalingPolicy
from rljob_operator.decisions.children import desired_worker_pod, spec_hash
from rljob_operator.decisions.conditions import STALL_REASONS, make_conditions
from rljob_operator.decisions.observed import ObservedPod, failure_message, failure_reason, first_failure
from rljob_operator.decisions.restarts import (
    backoff_seconds,
    halved_batch,
    is_oom,
    judge_failure,
    judge_stall,
    stall,
    stall_check_in,
)
from rljob_operator.decisions.scaling import (
    Capacity,
    Resize,
    SizeView,
    decide,
    requested_size,
    resize_event_message,
    scaling_status,
)
from rljob_operator.names import StatusEndpoint, selector, worker_name
from rljob_operator.times import parse_time, rfc3339

#: How soon to look again while waiting for pods to go away.
WAIT_REQUEUE_SECONDS = 2.0
#: Default for how long a pod may stay Terminating past its deletion before it is force-deleted.
FORCE_DELETE_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class Plan:
    """What one reconcile does, in order."""

    status: dict[str, Any]
    """Operator-owned status fields (camelCase); ``progress`` belongs to the status API."""
    delete_pods: list[str] = field(default_factory=list)
    force_delete_pods: list[str] = field(default_factory=list)
    """Pods stuck Terminating (their node never confirms): deleted with grace period 0."""
    ensure_children: bool = False
    """Create or adopt the ConfigMap and Service (before any pod)."""
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    gang_restart: str | None = None
    """Why this reconcile starts a new gang generation (Resumed, SpecChanged, a failure reason)."""


@dataclass
class _Draft:
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
    last_failure: dict[str, Any] | None = None
    next_restart_time: str | None = None
    gang_start_time: str | None = None
    oom_recovery: dict[str, Any] | None = None
    scaling: dict[str, Any] | None = None

    def carry(self, prev: RLTrainingJobStatus) -> _Draft:
        """Keep the restart bookkeeping of ``prev``."""
        self.scaling = prev.scaling.model_dump(by_alias=True) if prev.scaling else None
        self.restarts, self.disruptions = prev.restarts, prev.disruptions
        self.last_failure = prev.last_failure.model_dump(by_alias=True) if prev.last_failure else None
        self.next_restart_time, self.gang_start_time = prev.next_restart_time, prev.gang_start_time
        self.oom_recovery = prev.oom_recovery.model_dump(by_alias=True) if prev.oom_recovery else None
        return self


def _status(job: RLTrainingJob, prev: RLTrainingJobStatus, d: _Draft, pods: list[ObservedPod],
            now: datetime) -> dict[str, Any]:
    current = [p for p in pods if p.owned and p.generation == d.generation]
    ready = sum(1 for p in current if p.ready and p.active)
    generation = (job.metadata.model_extra or {}).get("generation")
    previous = [c.model_dump(by_alias=True) for c in prev.conditions]
    return {
        "phase": d.phase,
        "reason": d.reason,
        "message": d.message,
        "observedGeneration": generation,
        "conditions": make_conditions(
            d.phase, d.reason, d.message, ready=d.ready, reconciling=d.reconciling,
            generation=generation, previous=previous, now=now,
            stalled=d.phase == Phase.failed.value or (d.phase == Phase.restarting.value and d.reason in STALL_REASONS),
        ),
        "workers": {
            "desired": d.desired,
            "active": sum(1 for p in pods if p.owned and p.active),
            "ready": ready,
            "succeeded": sum(1 for p in current if p.phase == "Succeeded"),
            "failed": sum(1 for p in current if p.phase == "Failed"),
            "summary": f"{ready}/{d.desired}",
            "current": sum(1 for p in current if p.phase == "Running" and not p.deleting),
        },
        "gangGeneration": d.generation,
        "selector": selector(job.metadata.name),
        "startTime": d.start_time,
        "completionTime": d.completion_time,
        "restarts": d.restarts,
        "disruptions": d.disruptions,
        "lastFailure": d.last_failure,
        "nextRestartTime": d.next_restart_time,
        "gangStartTime": d.gang_start_time,
        "oomRecovery": d.oom_recovery,
        "scaling": d.scaling,
    }


def _transition_event(prev: RLTrainingJobStatus, d: _Draft) -> list[Event]:
    before = prev.phase.value if isinstance(prev.phase, Phase) else prev.phase
    if before == d.phase:
        return []
    trouble = d.phase == Phase.failed.value or (d.phase == Phase.restarting.value and d.reason != "Resizing")
    kind = "Warning" if trouble else "Normal"
    return [Event(kind, d.reason, f"{before or 'New'} → {d.phase}: {d.message}")]


def _ttl(job: RLTrainingJob, completion: str | None, now: datetime) -> tuple[bool, float | None]:
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    done = parse_time(completion)
    if ttl is None or done is None:
        return False, None
    left = (done + timedelta(seconds=ttl) - now).total_seconds()
    return left <= 0, (None if left <= 0 else left)


def _stuck_terminating(pods: list[ObservedPod], now: datetime, after: float) -> list[str]:
    """Pods still Terminating ``after`` seconds past their deletion deadline (no kubelet confirms)."""
    out = []
    for p in pods:
        deadline = parse_time(p.deleted_at)
        if p.deleting and deadline is not None and (now - deadline).total_seconds() >= after:
            out.append(p.name)
    return out


def plan_reconcile(
    job: RLTrainingJob, pods: list[ObservedPod], now: datetime, endpoint: StatusEndpoint | None = None,
    force_delete_after: float = FORCE_DELETE_AFTER_SECONDS, capacity: Capacity | None = None,
) -> Plan:
    """Decide one reconcile of ``job`` given its observed pods (label ``rljob.dev/job``).

    ``force_delete_after``: seconds a pod may stay Terminating past its deletion deadline.
    ``capacity``: the cluster's nodes and bound pods, for policy Capacity (None: not looked at).
    """
    prev = job.status or RLTrainingJobStatus()
    prev_phase = prev.phase.value if isinstance(prev.phase, Phase) else prev.phase
    replicas = job.replicas
    owned = [p for p in pods if p.owned]
    gen = prev.gang_generation or 0
    meta_generation = (job.metadata.model_extra or {}).get("generation")
    # A job that failed because of its spec is looked at again once the spec is edited.
    retry_invalid = prev.reason in ("InvalidSpec", "InvalidPodSpec") and prev.observed_generation != meta_generation

    force = _stuck_terminating([p for p in pods if p.owned or p.orphan], now, force_delete_after)

    def finish(d: _Draft, delete: list[str], events: list[Event] | None = None) -> Plan:
        expired, left = _ttl(job, d.completion_time, now)
        d.next_restart_time = None
        return Plan(
            status=_status(job, prev, d, pods, now),
            delete_pods=delete,
            force_delete_pods=force,
            delete_job=expired,
            events=(events or []) + _transition_event(prev, d),
            requeue_after=left,
        )

    # A finished job stays finished; only its TTL and leftover pods of a failure are handled.
    if prev_phase in FINISHED_PHASES and not retry_invalid:
        d = _Draft(prev_phase, prev.reason or prev_phase, prev.message or "", ready=prev_phase == "Succeeded",
                   start_time=prev.start_time, completion_time=prev.completion_time, generation=gen,
                   desired=replicas).carry(prev)
        leftovers = [p.name for p in owned if p.active] if prev_phase == Phase.failed.value else []
        return finish(d, leftovers)

    if job.spec.run_policy.suspend:
        remaining = list(owned)
        d = _Draft(
            Phase.suspended.value, "Suspended",
            f"suspended; {len(remaining)} worker pod(s) still terminating" if remaining
            else "suspended; worker pods deleted, set spec.runPolicy.suspend=false to resume",
            ready=not remaining, reconciling=bool(remaining), generation=gen, desired=0,
        ).carry(prev)
        plan = finish(d, [p.name for p in remaining if not p.deleting])
        plan.requeue_after = WAIT_REQUEUE_SECONDS if remaining else None
        return plan

    events: list[Event] = []
    gang_restart = None
    if prev_phase == Phase.suspended.value:
        gen += 1  # resume: a new gang with a new rendezvous id
        gang_restart = "Resumed"
    start = parse_time(prev.start_time) or now
    draft = _Draft("", "", "", start_time=rfc3339(start), generation=gen, desired=replicas).carry(prev)
    if gang_restart:
        draft.gang_start_time = None

    deadline = job.spec.run_policy.active_deadline_seconds
    deadline_left = None
    if deadline is not None:
        deadline_left = (start + timedelta(seconds=deadline) - now).total_seconds()
        if deadline_left <= 0:
            draft.phase, draft.reason = Phase.failed.value, "DeadlineExceeded"
            draft.message = f"the job ran longer than activeDeadlineSeconds ({deadline}s)"
            draft.completion_time = rfc3339(now)
            return finish(draft, [p.name for p in owned if p.active])

    want_hash = spec_hash(job)
    current = [p for p in owned if p.generation == gen and p.index is not None and p.index < replicas]
    if any(p.spec_hash != want_hash and p.job_generation != meta_generation for p in current if not p.deleting):
        gen += 1
        draft.generation, draft.gang_start_time = gen, None
        gang_restart = "SpecChanged"
        events.append(Event("Normal", "SpecChanged", f"spec changed: restarting the worker gang as generation {gen}"))
        current = []
    restarted = gen != (prev.gang_generation or 0)
    by_index = {p.index: p for p in current}
    stale = [p for p in owned if p not in current]
    # Orphans carrying this job's label (a namesake deleted with --cascade=orphan) would block the
    # gang's names for ever; nothing else manages them.
    stale += [p for p in pods if p.orphan]
    delete = [p.name for p in stale if not p.deleting]

    worker0 = by_index.get(0)
    if worker0 is not None and worker0.phase == "Succeeded":
        draft.phase, draft.reason, draft.message = Phase.succeeded.value, "Completed", "worker 0 finished training"
        draft.ready, draft.completion_time = True, rfc3339(now)
        return finish(draft, delete, events)

    failed = [p for p in current if p.phase == "Failed"]
    watching = not restarted and prev_phase in (Phase.running.value, Phase.starting.value)
    # A worker of a running gang that is gone or being deleted (not by us: ours are stale) was
    # taken by the cluster: its node went away, it was evicted or preempted.
    lost = [] if restarted or prev_phase != Phase.running.value else [
        worker_name(job.metadata.name, i) for i in range(replicas)
        if i not in by_index or by_index[i].deleting
        or (capacity is not None and not capacity.node_ok(by_index[i].node))
    ]
    stalled = stall(job, now) if watching and not failed and not lost else None
    if failed or lost or stalled:
        return _after_failure(job, prev, draft, pods, current, (failed, lost, stalled), now, finish,
                              delete, force, events)

    # The worker count: what the spec asks (kubectl scale), or what capacity allows (policy Capacity).
    spec_size, requested = requested_size(job)
    if draft.scaling is None:
        draft.scaling = scaling_status(job, spec_size, None, now)
    elif requested is not None and requested.replicas == replicas:
        draft.scaling["specReplicas"] = job.spec.workers.replicas
        events.append(Event("Warning", "ScaleClamped", requested.message))
        requested = None
    view = _size_view(job, replicas, current, prev_phase, restarted, capacity, now)
    resize = requested or decide(job, view, now)
    if resize is not None and resize.replicas != replicas:
        return _resize(job, prev, draft, pods, current, resize, now, delete, force, events)
    if view.gang_starting and view.total_slots is not None and view.total_slots < job.spec.workers.bounds[0]:
        draft.phase, draft.reason, draft.reconciling = Phase.pending.value, "InsufficientCapacity", True
        draft.message = (f"waiting for capacity: minReplicas is {job.spec.workers.bounds[0]} but "
                         f"{view.total_slots} worker(s) fit on the nodes this job may use")
        return Plan(status=_status(job, prev, draft, pods, now), delete_pods=delete, force_delete_pods=force,
                    events=events + _transition_event(prev, draft),
                    requeue_after=float(job.spec.run_policy.check_interval_seconds))

    restarting = prev_phase == Phase.restarting.value
    restart_left = None
    if restarting and not current:
        due = parse_time(prev.next_restart_time)
        restart_left = (due - now).total_seconds() if due is not None else None
    occupied = {p.name for p in pods}
    missing = [i for i in range(replicas) if i not in by_index]
    create = [] if restart_left is not None and restart_left > 0 else [
        desired_worker_pod(job, i, gen, endpoint) for i in missing
        if worker_name(job.metadata.name, i) not in occupied
    ]
    blocked = [worker_name(job.metadata.name, i) for i in missing if worker_name(job.metadata.name, i) in occupied]
    if create and draft.gang_start_time is None:
        draft.gang_start_time = rfc3339(now)
    if create or current:
        draft.next_restart_time = None

    scheduled = [p for p in current if p.scheduled]
    # A worker that already exited 0 counts as running and ready: ranks finish at slightly different times.
    running = [p for p in current if (p.phase == "Running" and not p.deleting) or p.phase == "Succeeded"]
    ready = [p for p in running if p.ready or p.phase == "Succeeded"]
    unschedulable = next((p for p in current if p.unschedulable), None)
    if restarting and not create and not current:
        # Still the failure's phase: the old gang is going away, or the backoff has not passed.
        draft.phase, draft.reason, draft.reconciling = Phase.restarting.value, prev.reason or "Restarting", True
        # Absolute times only: a countdown would change status, and so wake the job, every second.
        if restart_left is not None and restart_left > 0:
            draft.message = f"restarting the gang as generation {gen} at {prev.next_restart_time} (backoff)"
        else:
            draft.message = f"restarting the gang as generation {gen}: waiting for old pod(s) " \
                            f"{', '.join(blocked)} to terminate"
        if prev.last_failure is not None and prev.last_failure.message:
            draft.message = f"{prev.last_failure.message}; {draft.message}"
    elif len(current) < replicas or len(scheduled) < replicas:
        draft.phase, draft.reconciling = Phase.pending.value, True
        if create:
            draft.reason, draft.message = "CreatingWorkers", f"creating {len(create)} of {replicas} worker pod(s)"
        elif blocked:
            draft.reason = "WaitingForOldPods"
            draft.message = f"waiting for old pod(s) {', '.join(blocked)} to terminate"
        elif unschedulable is not None:
            draft.reason = "Unschedulable"
            draft.message = f"{unschedulable.name}: {unschedulable.unschedulable}"
        else:
            draft.reason = "WorkersPending"
            draft.message = f"{len(scheduled)}/{replicas} worker pod(s) scheduled"
    elif len(ready) == replicas:
        draft.phase, draft.reason, draft.ready = Phase.running.value, "Running", True
        draft.message = f"{replicas}/{replicas} workers ready"
    elif len(running) == replicas and prev_phase == Phase.running.value and not restarted:
        draft.phase, draft.reason = Phase.running.value, "WorkersNotReady"
        draft.message = f"{len(ready)}/{replicas} workers ready"
    else:
        draft.phase, draft.reason, draft.reconciling = Phase.starting.value, "WorkersStarting", True
        draft.message = f"{len(running)}/{replicas} worker pod(s) running, {len(ready)} ready"
        stuck = next((p for p in current if p.waiting), None)
        if stuck is not None:  # an image that cannot be pulled, a missing Secret: say so
            draft.message += f"; {stuck.name}: {stuck.waiting}"

    waits = [deadline_left] if deadline_left is not None else []
    if blocked or any(p.deleting for p in pods) or delete:
        waits.append(WAIT_REQUEUE_SECONDS)
    if restart_left is not None and restart_left > 0:
        waits.append(restart_left)
    if view.free_slots is not None:  # policy Capacity: free GPUs come and go without an event
        waits.append(float(job.spec.run_policy.check_interval_seconds))
    if draft.phase in (Phase.starting.value, Phase.running.value):  # the stall check, when it falls due
        check = stall_check_in(job, now) if not restarted else None
        waits.append(check if check is not None else float(job.spec.run_policy.check_interval_seconds))
    return Plan(
        status=_status(job, prev, draft, pods, now),
        delete_pods=delete,
        force_delete_pods=force,
        ensure_children=bool(create),
        create_pods=create,
        events=events + _transition_event(prev, draft),
        requeue_after=min(waits) if waits else None,
        gang_restart=gang_restart,
    )


def _size_view(job: RLTrainingJob, size: int, current: list[ObservedPod],
               prev_phase: str | None, restarted: bool, capacity: Capacity | None, now: datetime) -> SizeView:
    live = [p for p in current if not p.deleting]
    ready = [p for p in live if p.phase == "Running" and p.ready]
    unschedulable = any(p.unschedulable for p in live)
    started = parse_time((job.status or RLTrainingJobStatus()).gang_start_time) or now
    free = total = None
    if capacity is not None and job.spec.autoscaling.policy == ScalingPolicy.capacity:
        worker = desired_worker_pod(job, 0, 0)["spec"]  # requests, nodeSelector, tolerations as created
        free = capacity.slots(worker)
        total = capacity.slots(worker, exclude_job=(job.metadata.namespace or "", job.metadata.name))
    return SizeView(
        size=size,
        running=prev_phase == Phase.running.value and not restarted and len(ready) == size,
        gang_starting=not live,
        unschedulable_since=started if unschedulable else None,
        free_slots=free,
        total_slots=total,
    )


def _resize(
    job: RLTrainingJob,
    prev: RLTrainingJobStatus,
    draft: _Draft,
    pods: list[ObservedPod],
    current: list[ObservedPod],
    resize: Resize,
    now: datetime,
    delete: list[str],
    force: list[str],
    events: list[Event],
) -> Plan:
    """Run the job at ``resize.replicas`` workers: record the size first (status), then stop the gang.

    The workers save a checkpoint on SIGTERM (their grace period is
    ``workers.terminationGracePeriodSeconds``); the next gang, of the new size and a new
    generation, resumes from it with gradientAccumulationSteps recomputed for the global batch.
    A resize is neither a restart nor a disruption: it counts against nothing.
    """
    events.append(Event("Normal", "Resized", resize_event_message(job, resize, now)))
    draft.scaling = scaling_status(job, resize.replicas, resize, now)
    draft.desired = resize.replicas
    live = [p for p in current if not p.deleting]
    prev_phase = prev.phase.value if isinstance(prev.phase, Phase) else prev.phase
    if live:
        draft.generation += 1
        draft.gang_start_time = None
        draft.next_restart_time = rfc3339(now)
        draft.phase, draft.reason = Phase.restarting.value, "Resizing"
        draft.message = f"{resize.message}: stopping generation {draft.generation - 1} (workers save a checkpoint)"
    else:
        draft.phase = prev_phase if prev_phase == Phase.restarting.value else Phase.pending.value
        draft.reason, draft.message = "Resizing", resize.message
    draft.reconciling = True
    return Plan(
        status=_status(job, prev, draft, pods, now),
        delete_pods=delete + [p.name for p in live],
        force_delete_pods=force,
        events=events + _transition_event(prev, draft),
        requeue_after=0.01 if not live else WAIT_REQUEUE_SECONDS,
        gang_restart="Resized" if live else None,
    )


def _after_failure(
    job: RLTrainingJob,
    prev: RLTrainingJobStatus,
    draft: _Draft,
    pods: list[ObservedPod],
    current: list[ObservedPod],
    fault: tuple[list[ObservedPod], list[str], tuple[str, str] | None],
    now: datetime,
    finish: Callable[[_Draft, list[str], list[Event]], Plan],
    delete: list[str],
    force: list[str],
    events: list[Event],
) -> Plan:
    """A failed, lost or stalled gang: fail the job, or restart every worker as a new generation."""
    policy = job.spec.run_policy
    failed, lost, stalled = fault
    culprit = first_failure(failed) if failed else None
    if culprit is not None:
        verdict = judge_failure(job, culprit)
        reason, message = failure_reason(culprit), failure_message(culprit)
        worker, exit_code = culprit.name, culprit.exit_code
    elif lost:
        verdict = judge_failure(job, None)
        reason, message = "WorkerLost", f"{', '.join(lost)} disappeared while the job was running"
        worker, exit_code = lost[0], None
    else:
        assert stalled is not None
        verdict = judge_stall(job)
        reason, message = stalled
        worker, exit_code = worker_name(job.metadata.name, 0), None
        events.append(Event("Warning", reason, message))
    draft.last_failure = {"worker": worker, "reason": reason, "exitCode": exit_code, "message": message,
                          "time": rfc3339(now), "disruption": verdict.disruption}
    if not verdict.restart:
        draft.phase, draft.reason, draft.completion_time = Phase.failed.value, reason, rfc3339(now)
        draft.message = f"{message} ({verdict.why})" if reason != "PermanentError" else message
        return finish(draft, delete + [p.name for p in current if p.active], events)
    if not verdict.disruption and prev.restarts + 1 > policy.backoff_limit:
        draft.phase, draft.reason, draft.completion_time = Phase.failed.value, "BackoffLimitExceeded", rfc3339(now)
        draft.message = (f"the gang failed {prev.restarts + 1} times, more than backoffLimit "
                         f"({policy.backoff_limit}); last failure: {message}")
        return finish(draft, delete + [p.name for p in current if p.active], events)

    gen = draft.generation + 1
    if verdict.disruption:
        draft.disruptions = prev.disruptions + 1
        delay = 0.0
        counted = "a disruption, not counted against backoffLimit"
    else:
        draft.restarts = prev.restarts + 1
        delay = backoff_seconds(job, draft.restarts)
        counted = f"restart {draft.restarts} of backoffLimit {policy.backoff_limit}"
    if policy.oom_recovery and is_oom(reason):
        shape = halved_batch(job)
        if shape is not None:
            draft.oom_recovery = shape.model_dump(by_alias=True)
            events.append(Event(
                "Warning", "OOMRecovery",
                f"{worker} ran out of memory: restarting with batchSize {shape.batch_size} and "
                f"gradientAccumulationSteps {shape.gradient_accumulation_steps} (same global batch)",
            ))
        else:
            events.append(Event("Warning", "OOMRecovery",
                                f"{worker} ran out of memory and batchSize cannot be halved further "
                                f"(oomMinBatchSize {policy.oom_min_batch_size}); restarting unchanged"))
    draft.generation, draft.gang_start_time = gen, None
    draft.next_restart_time = rfc3339(now + timedelta(seconds=delay))
    draft.phase, draft.reason, draft.reconciling = Phase.restarting.value, reason, True
    draft.message = f"{message}; restarting the gang as generation {gen} in {delay:g}s ({counted})"
    prev_phase = prev.phase.value if isinstance(prev.phase, Phase) else prev.phase
    return Plan(
        status=_status(job, prev, draft, pods, now),
        delete_pods=delete + [p.name for p in current if not p.deleting],
        force_delete_pods=force,
        events=events + ([] if prev_phase == draft.phase else [Event("Warning", reason, draft.message)]),
        requeue_after=max(min(delay, WAIT_REQUEUE_SECONDS), 0.01),
        gang_restart=reason,
    )


def plan_invalid(raw: dict[str, Any], problems: list[str], now: datetime) -> Plan:
    """A job the models reject (the CRD let it through): Failed, reason InvalidSpec.

    It is looked at again when its spec changes (a new metadata.generation).
    """
    status_doc = raw.get("status") or {}
    prev = RLTrainingJobStatus.model_validate(status_doc)
    message = "; ".join(problems)[:1024]
    generation = (raw.get("metadata") or {}).get("generation")
    draft = _Draft(Phase.failed.value, "InvalidSpec", message,
                   completion_time=prev.completion_time or rfc3339(now),
                   generation=prev.gang_generation or 0)
    same = prev.reason == "InvalidSpec" and prev.message == message
    previous = [c.model_dump(by_alias=True) for c in prev.conditions]
    status = {
        "phase": draft.phase,
        "reason": draft.reason,
        "message": message,
        "observedGeneration": generation,
        "conditions": make_conditions(draft.phase, draft.reason, message, ready=False, reconciling=False,
                                      generation=generation, previous=previous, now=now),
        "completionTime": draft.completion_time,
    }
    events = [] if same else [Event("Warning", "InvalidSpec", message)]
    return Plan(status=status, events=events)
