"""A failure, step 4 (pure): the status and Events that say it, in the one Plan that acts on it.

The status records the failure (``lastFailure``), counts it (``restarts``, or ``disruptions`` for one
the cluster caused) and, for a restart, the new gang generation and when it starts; the Plan writes it
before deleting any pod, so a later reconcile only finishes the deletion. A job that fails is
``settled`` as any finishing job is (its pods deleted and looked at until gone).

A burst counts once (``respond.incident_start``): workers of the gang that was last Ready that fail while an
in-place replacement is still under way (a rack lost, say, seen by several reconciles) join that
incident and are replaced without counting again. A replacement's own failure always counts, so a
worker that fails again and again still uses up ``backoffLimit``; an incident leaves uncounted at most
one failure per worker the gang had when it began.
"""

from __future__ import annotations

from datetime import timedelta

from rljob_contract.job import LastFailure, OomRecovery, Phase

from rljob_operator.decisions.failure.classify import Verdict
from rljob_operator.decisions.failure.observe import Observation
from rljob_operator.decisions.failure.respond import Fail, ReplaceInPlace, Response, RestartGang
from rljob_operator.decisions.plan import Event, Plan, StatusDraft, status_patch, whole
from rljob_operator.decisions.situation import WAIT_REQUEUE_SECONDS, Situation, settled, stranger_events
from rljob_operator.names import worker_name
from rljob_operator.times import rfc3339


def record(ctx: Situation, seen: Observation, verdict: Verdict, response: Response) -> Plan:
    """The Plan that writes the failure into the status, posts its Events and does ``response``."""
    events = ctx.lead_events + ([Event("Warning", seen.reason, seen.message)] if seen.stalled else [])
    d = ctx.draft()
    # replacedPods written empty: failing or restarting the gang replaces no pod in place (_replacing fills it).
    d.last_failure = LastFailure(worker=seen.worker, reason=seen.reason, exit_code=seen.exit_code,
                                 message=seen.message, time=rfc3339(ctx.now), disruption=verdict.disruption,
                                 replaced_pods=[])
    if isinstance(response, Fail):
        return _failed(ctx, d, response, events)
    joins = response.joins if isinstance(response, ReplaceInPlace) else None
    counted = _count(ctx, d, verdict) if joins is None else (
        f"part of the failure being repaired since {joins}, counted once: restart {ctx.prev.restarts} of "
        f"backoffLimit {ctx.job.spec.run_policy.backoff_limit}")
    if isinstance(response, ReplaceInPlace):
        return _replacing(ctx, d, seen, response, counted, events)
    return _restarting(ctx, d, seen, response, counted, events)


def _failed(ctx: Situation, d: StatusDraft, response: Fail, events: list[Event]) -> Plan:
    """Failed: the job's running pods are deleted with the rest of a finished job's."""
    d.phase, d.reason, d.completion_time = Phase.failed.value, response.reason, rfc3339(ctx.now)
    d.message = response.message
    return settled(ctx, d, ctx.stale_deletions + [p.name for p in ctx.current if p.active], events)


def _count(ctx: Situation, d: StatusDraft, verdict: Verdict) -> str:
    """Count a restart of the gang or of some of its workers in ``d``; says how it was counted."""
    if verdict.disruption:
        d.disruptions = ctx.prev.disruptions + 1
        return "a disruption, not counted against backoffLimit"
    d.restarts = ctx.prev.restarts + 1
    return f"restart {d.restarts} of backoffLimit {ctx.job.spec.run_policy.backoff_limit}"


def _replacing(ctx: Situation, d: StatusDraft, seen: Observation, response: ReplaceInPlace, counted: str,
               events: list[Event]) -> Plan:
    """Delete only the failed workers; ``progress`` creates them again in the same gang generation.

    Counted as a gang restart is, without the backoff: the surviving workers wait for the replacement in
    the rendezvous. The replaced pods' UIDs go to ``lastFailure.replacedPods`` first, so a later
    reconcile that still sees a replaced pod (the watch lags, the operator restarted) takes it for
    stale, not a new failure; so do those an earlier replacement named that are still seen (a second
    failure while the first replaced pod terminates).
    """
    pods = [ctx.by_index[i] for i in response.workers if i in ctx.by_index]
    assert d.last_failure is not None
    owned = {p.uid for p in ctx.owned}
    previous = ctx.prev.last_failure
    earlier = [uid for uid in (previous.replaced_pods if previous else []) if uid in owned]
    d.last_failure.replaced_pods = earlier + [p.uid for p in pods if p.uid and p.uid not in earlier]
    workers = ", ".join(worker_name(ctx.job.metadata.name, i) for i in response.workers)
    d.next_restart_time = None
    d.phase, d.reason, d.reconciling = Phase.restarting.value, seen.reason, True
    d.message = (f"{seen.message}; replacing {workers} in place: the other workers keep their pods and "
                 f"resume with the replacement from the newest checkpoint ({counted})")
    return _restart_plan(ctx, d, seen, events, [p.name for p in pods if not p.deleting], 0.01,
                         replaced_workers=seen.reason,
                         replaced=tuple(worker_name(ctx.job.metadata.name, i) for i in response.workers))


def _restarting(ctx: Situation, d: StatusDraft, seen: Observation, response: RestartGang, counted: str,
                events: list[Event]) -> Plan:
    """Delete the whole gang and start it again as the next generation, after the backoff."""
    gen = d.generation + 1
    if response.out_of_memory:
        events = events + [_oom_recovery(ctx, d, seen.worker, response.batch)]
    d.generation, d.gang_start_time = gen, None
    d.next_restart_time = rfc3339(ctx.now + timedelta(seconds=response.delay))
    d.phase, d.reason, d.reconciling = Phase.restarting.value, seen.reason, True
    why = f": {response.why}" if response.why else ""
    d.message = f"{seen.message}; restarting the gang as generation {gen} in {response.delay:g}s{why} ({counted})"
    return _restart_plan(ctx, d, seen, events, [p.name for p in ctx.current if not p.deleting],
                         max(min(response.delay, WAIT_REQUEUE_SECONDS), 0.01), gang_restart=seen.reason)


def _oom_recovery(ctx: Situation, d: StatusDraft, worker: str, batch: OomRecovery | None) -> Event:
    """Out of memory: the next gang runs with the halved ``batch`` (same global batch), if there is one."""
    if batch is None:
        return Event("Warning", "OOMRecovery",
                     f"{worker} ran out of memory and batchSize cannot be halved further "
                     f"(oomMinBatchSize {ctx.job.spec.run_policy.oom_min_batch_size}); restarting unchanged")
    d.oom_recovery = whole(batch)
    return Event("Warning", "OOMRecovery",
                 f"{worker} ran out of memory: restarting with batchSize {batch.batch_size} and "
                 f"gradientAccumulationSteps {batch.gradient_accumulation_steps} (same global batch)")


def _restart_plan(ctx: Situation, d: StatusDraft, seen: Observation, events: list[Event], delete: list[str],
                  requeue_after: float, *, gang_restart: str | None = None,
                  replaced_workers: str | None = None, replaced: tuple[str, ...] = ()) -> Plan:
    """The Plan of a restart, of the gang or in place: status first, then the deletions, then the Events.

    Not the usual phase-change Event (``Situation.plan``): the restart's own message says what happens
    next, and is posted once, when the phase turns Restarting.
    """
    restart_event = [] if ctx.prev.phase == d.phase else [Event("Warning", seen.reason, d.message)]
    return Plan(
        status=status_patch(ctx.status(d)),
        delete_pods=ctx.stale_deletions + delete,
        force_delete_pods=ctx.force_delete,
        events=stranger_events(ctx.pods) + events + restart_event,
        requeue_after=requeue_after,
        gang_restart=gang_restart,
        replaced_workers=replaced_workers,
        replaced=replaced,
    )
