"""The failure step of a reconcile (pure): a failed, lost or stalled gang fails the job or restarts.

What went wrong is found first (:func:`find_fault`: a worker that exited non-zero, workers the
cluster took away, or a stall), judged by ``restarts.judge_failure`` / ``judge_stall``, then
acted on once: the status records the new gang generation, ``restarts`` or ``disruptions`` and
``lastFailure`` before any pod is deleted, so a later reconcile only finishes the deletion.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from rljob_contract.job import LastFailure, Phase

from rljob_operator.decisions.observed import failure_message, failure_reason, first_failure
from rljob_operator.decisions.plan import Event, Plan, StatusDraft, status_patch, whole
from rljob_operator.decisions.restarts import (
    Verdict,
    backoff_seconds,
    halved_batch,
    in_place_restarts,
    is_oom,
    judge_failure,
    judge_stall,
    stall,
)
from rljob_operator.decisions.situation import WAIT_REQUEUE_SECONDS, Situation, settled
from rljob_operator.names import worker_name
from rljob_operator.times import rfc3339


@dataclass(frozen=True)
class Fault:
    """What went wrong with the current gang, and the verdict on it."""

    reason: str
    message: str
    worker: str
    exit_code: int | None
    verdict: Verdict
    stalled: bool = False


def find_fault(ctx: Situation) -> Fault | None:
    """The current gang's failure: a worker that failed, workers lost while running, or a stall."""
    job, phase = ctx.job, ctx.prev.phase
    failed = [p for p in ctx.current if p.phase == "Failed"]
    culprit = first_failure(failed) if failed else None
    if culprit is not None:
        return Fault(failure_reason(culprit), failure_message(culprit), culprit.name, culprit.exit_code,
                     judge_failure(job, culprit))
    lost = [worker_name(job.metadata.name, i) for i in lost_indices(ctx)]
    if lost:
        return Fault("WorkerLost", f"{', '.join(lost)} disappeared while the job was running", lost[0], None,
                     judge_failure(job, None))
    watching = not ctx.restarted and phase in (Phase.running.value, Phase.starting.value)
    stalled = stall(job, ctx.now) if watching else None
    if stalled is None:
        return None
    reason, message = stalled
    return Fault(reason, message, worker_name(job.metadata.name, 0), None, judge_stall(job), stalled=True)


def lost_indices(ctx: Situation) -> list[int]:
    """Workers of a running gang that are gone or being deleted (not by us: ours are stale): taken by
    the cluster (their node went away, they were evicted or preempted)."""
    if ctx.restarted or ctx.prev.phase != Phase.running.value:
        return []
    return [i for i in range(ctx.replicas)
            if i not in ctx.by_index or ctx.by_index[i].deleting or ctx.by_index[i].node_lost
            or (ctx.capacity is not None and not ctx.capacity.node_ok(ctx.by_index[i].node))]


def plan_failure(ctx: Situation) -> Plan | None:
    """A failed, lost or stalled gang: fail the job, or restart every worker as a new generation."""
    fault = find_fault(ctx)
    if fault is None:
        return None
    policy, prev, now = ctx.job.spec.run_policy, ctx.prev, ctx.now
    events = ctx.lead_events + ([Event("Warning", fault.reason, fault.message)] if fault.stalled else [])
    d = ctx.draft()
    # replacedPods written empty: a gang restart or the end replaces no pod in place (_replace_in_place fills it).
    d.last_failure = LastFailure(worker=fault.worker, reason=fault.reason, exit_code=fault.exit_code,
                                 message=fault.message, time=rfc3339(now), disruption=fault.verdict.disruption,
                                 replaced_pods=[])
    active = ctx.stale_deletions + [p.name for p in ctx.current if p.active]
    if not fault.verdict.restart:
        d.phase, d.reason, d.completion_time = Phase.failed.value, fault.reason, rfc3339(now)
        d.message = f"{fault.message} ({fault.verdict.why})" if fault.reason != "PermanentError" else fault.message
        return settled(ctx, d, active, events)
    if not fault.verdict.disruption and prev.restarts + 1 > policy.backoff_limit:
        d.phase, d.reason, d.completion_time = Phase.failed.value, "BackoffLimitExceeded", rfc3339(now)
        d.message = (f"the gang failed {prev.restarts + 1} times, more than backoffLimit "
                     f"({policy.backoff_limit}); last failure: {fault.message}")
        return settled(ctx, d, active, events)
    replace = in_place(ctx, fault)
    if replace is not None:
        return _replace_in_place(ctx, d, fault, events, replace)
    return _restart_gang(ctx, d, fault, events)


def in_place(ctx: Situation, fault: Fault) -> list[int] | None:
    """The workers to replace in place (their indices), or None: the whole gang restarts.

    Only for an elastic job (``restarts.in_place_restarts``: its agents restart their ranks to meet
    a replaced peer) whose checkpoints outlive a pod (the replacement resumes from the same
    checkpoint as the survivors), for a worker failure or loss that spares worker 0 (it hosts the
    rendezvous store; its loss ends every agent's rendezvous). Not for a stall (which worker hangs is
    unknown) nor an out-of-memory failure that OOM recovery answers (every worker's batch changes).
    """
    job = ctx.job
    if fault.stalled or not in_place_restarts(job) or not ctx.checkpoints.durable:
        return None
    if job.spec.run_policy.oom_recovery and is_oom(fault.reason) and halved_batch(job) is not None:
        return None
    failed = [p.index for p in ctx.current if p.phase == "Failed" and p.index is not None]
    faulty = sorted(set(failed) | set(lost_indices(ctx)))
    return faulty if faulty and 0 not in faulty else None


def _replace_in_place(ctx: Situation, d: StatusDraft, fault: Fault, events: list[Event], faulty: list[int]) -> Plan:
    """Delete only the failed workers; ``progress`` creates them again in the same gang generation.

    Counted as a gang restart is (``restarts`` or ``disruptions``, ``lastFailure``, the Warning),
    without the backoff: the surviving workers wait for the replacement in the rendezvous. The
    replaced pods' UIDs go to ``lastFailure.replacedPods`` first, so a later reconcile that still
    sees a replaced pod (the watch lags, the operator restarted) takes it for stale, not a new failure;
    so do those an earlier replacement named that are still seen (a second failure while the first
    replaced pod terminates).
    """
    prev, name = ctx.prev, ctx.job.metadata.name
    counted = _count(ctx, d, fault)
    pods = [ctx.by_index[i] for i in faulty if i in ctx.by_index]
    assert d.last_failure is not None
    seen = {p.uid for p in ctx.owned}
    earlier = [uid for uid in (prev.last_failure.replaced_pods if prev.last_failure else []) if uid in seen]
    d.last_failure.replaced_pods = earlier + [p.uid for p in pods if p.uid and p.uid not in earlier]
    workers = ", ".join(worker_name(name, i) for i in faulty)
    d.next_restart_time = None
    d.phase, d.reason, d.reconciling = Phase.restarting.value, fault.reason, True
    d.message = (f"{fault.message}; replacing {workers} in place: the other workers keep their pods and "
                 f"resume with the replacement from the newest checkpoint ({counted})")
    restart_event = [] if prev.phase == d.phase else [Event("Warning", fault.reason, d.message)]
    return Plan(
        status=status_patch(ctx.status(d)),
        delete_pods=ctx.stale_deletions + [p.name for p in pods if not p.deleting],
        force_delete_pods=ctx.force_delete,
        events=events + restart_event,
        requeue_after=0.01,
        replaced_workers=fault.reason,
    )


def _restart_gang(ctx: Situation, d: StatusDraft, fault: Fault, events: list[Event]) -> Plan:
    """Delete the whole gang and start it again as the next generation, after the backoff."""
    policy, prev, now = ctx.job.spec.run_policy, ctx.prev, ctx.now
    gen = d.generation + 1
    counted = _count(ctx, d, fault)
    delay = 0.0 if fault.verdict.disruption else backoff_seconds(ctx.job, d.restarts)
    if policy.oom_recovery and is_oom(fault.reason):
        events = events + [_oom_recovery(ctx, d, fault.worker)]
    d.generation, d.gang_start_time = gen, None
    d.next_restart_time = rfc3339(now + timedelta(seconds=delay))
    d.phase, d.reason, d.reconciling = Phase.restarting.value, fault.reason, True
    d.message = f"{fault.message}; restarting the gang as generation {gen} in {delay:g}s ({counted})"
    # Not the usual phase-change Event: the restart's own message says what happens next.
    restart_event = [] if prev.phase == d.phase else [Event("Warning", fault.reason, d.message)]
    return Plan(
        status=status_patch(ctx.status(d)),
        delete_pods=ctx.stale_deletions + [p.name for p in ctx.current if not p.deleting],
        force_delete_pods=ctx.force_delete,
        events=events + restart_event,
        requeue_after=max(min(delay, WAIT_REQUEUE_SECONDS), 0.01),
        gang_restart=fault.reason,
    )


def _count(ctx: Situation, d: StatusDraft, fault: Fault) -> str:
    """Count a restart of the gang or of some of its workers in ``d``; says how it was counted."""
    if fault.verdict.disruption:
        d.disruptions = ctx.prev.disruptions + 1
        return "a disruption, not counted against backoffLimit"
    d.restarts = ctx.prev.restarts + 1
    return f"restart {d.restarts} of backoffLimit {ctx.job.spec.run_policy.backoff_limit}"


def _oom_recovery(ctx: Situation, d: StatusDraft, worker: str) -> Event:
    """Out of memory: halve batchSize for the next gang (same global batch) while it can be halved."""
    shape = halved_batch(ctx.job)
    if shape is None:
        return Event("Warning", "OOMRecovery",
                     f"{worker} ran out of memory and batchSize cannot be halved further "
                     f"(oomMinBatchSize {ctx.job.spec.run_policy.oom_min_batch_size}); restarting unchanged")
    d.oom_recovery = whole(shape)
    return Event("Warning", "OOMRecovery",
                 f"{worker} ran out of memory: restarting with batchSize {shape.batch_size} and "
                 f"gradientAccumulationSteps {shape.gradient_accumulation_steps} (same global batch)")
