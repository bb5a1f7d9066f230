"""A failure, step 3 (pure): what to do about it.

In this order: a permanent failure fails the job; a failure of workers of the gang that was last Ready
while an in-place replacement is under way joins it, uncounted (``incident_start``: a burst counts once);
a worker failure that would exceed ``backoffLimit`` fails the job (disruptions are not counted); a job whose checkpoints outlive a pod, fixed-size or
elastic, has its failed or lost workers replaced in place, worker 0 included; any other
gang restarts as a new generation after the backoff (none after a disruption), with half the per-device
batch after running out of memory (OOM recovery), and says why it could not replace one pod. Saying it
in the status and Events is the next step's (``record``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rljob_contract.job import OomRecovery, Phase, RLTrainingJob

from rljob_operator.decisions.children import in_place_restarts
from rljob_operator.decisions.failure.classify import Verdict
from rljob_operator.decisions.failure.observe import Observation
from rljob_operator.decisions.situation import Situation
from rljob_operator.times import parse_time, rfc3339

OOM_REASONS = frozenset({"OOMKilled", "CudaOutOfMemory"})


@dataclass(frozen=True)
class Fail:
    """The job fails: the failure is permanent, or the restarts are used up."""

    reason: str
    message: str


@dataclass(frozen=True)
class ReplaceInPlace:
    """Replace these workers (indices) in the same gang generation; the others keep running."""

    workers: tuple[int, ...]
    joins: str | None = None
    """When the in-place repair this failure joins began (``incident_start``): not counted again; None: counted."""


@dataclass(frozen=True)
class RestartGang:
    """Delete the whole gang and start the next generation after ``delay`` seconds (the backoff)."""

    delay: float
    out_of_memory: bool
    """OOM recovery answers this failure (an Event says how, or that the batch cannot shrink)."""
    batch: OomRecovery | None = None
    """The halved batch the next gang runs with; None: unchanged."""
    why: str = ""
    """Why the failed workers could not be replaced alone (``replaceable``), for the status and Event."""


Response = Fail | ReplaceInPlace | RestartGang


def respond(ctx: Situation, seen: Observation, verdict: Verdict) -> Response:
    """Fail, replace in place, or restart the gang: the first that applies, in that order."""
    policy, restarts = ctx.job.spec.run_policy, ctx.prev.restarts
    if not verdict.restart:
        # The trainer's permanent error says why in its own message.
        message = seen.message if seen.reason == "PermanentError" else f"{seen.message} ({verdict.why})"
        return Fail(seen.reason, message)
    workers = replaceable(ctx, seen)
    if isinstance(workers, tuple) and not verdict.disruption and (joins := incident_start(ctx, workers)) is not None:
        return ReplaceInPlace(workers, joins)
    if not verdict.disruption and restarts + 1 > policy.backoff_limit:
        return Fail("BackoffLimitExceeded", f"the gang failed {restarts + 1} times, more than backoffLimit "
                                            f"({policy.backoff_limit}); last failure: {seen.message}")
    if isinstance(workers, tuple):
        return ReplaceInPlace(workers)
    oom = policy.oom_recovery and is_oom(seen.reason)
    delay = 0.0 if verdict.disruption else backoff_seconds(ctx.job, restarts + 1)
    return RestartGang(delay, oom, halved_batch(ctx.job) if oom else None, why=workers)


def incident_start(ctx: Situation, workers: tuple[int, ...]) -> str | None:
    """When the in-place repair that a failure of ``workers`` (to replace in place) joins began (RFC 3339); None:
    it is a failure of its own, counted against backoffLimit.

    It joins one when the job is Restarting from a counted in-place replacement (``lastFailure`` names
    replaced pods, no disruption), has not been Ready since (the Ready condition False since then), and every
    worker it replaces is a pod created before the Ready condition turned False: a worker of the gang that
    was Ready, not a replacement, whose own failures always count.
    """
    prev, last = ctx.prev, ctx.prev.last_failure
    if prev.phase != Phase.restarting.value or last is None or last.disruption or not last.replaced_pods \
            or not prev.restarts:
        return None
    ready = next((c for c in prev.conditions if c.type == "Ready"), None)
    since = parse_time(ready.last_transition_time) if ready is not None and ready.status == "False" else None
    if since is None:
        return None
    pods = [ctx.by_index.get(i) for i in workers]
    for pod in pods:
        made = parse_time(pod.created_at) if pod is not None else None
        if made is None or made >= since:
            return None
    return rfc3339(since)


def replaceable(ctx: Situation, seen: Observation) -> tuple[int, ...] | str:
    """The workers to replace in place (their indices), or why the whole gang restarts instead.

    For any job, fixed-size or elastic, whose agents may restart their ranks to meet a replaced peer
    (``children.in_place_restarts``, as often as the pods are told) and whose checkpoints outlive a pod
    (the replacement resumes from the same checkpoint as the survivors), for a worker failure or loss,
    when every surviving pod was built to restart its ranks (``ObservedPod.meets_replacements``: not a pod
    of an older operator, whose agent would end, each survivor then counted as one more failure) and, when
    worker 0 is among them (its agent hosts the rendezvous store), to dial the store again where worker 0's
    replacement hosts a new one (``ObservedPod.redials``). Not for
    a stall (which worker hangs is unknown) nor an out-of-memory failure that OOM recovery answers
    (every worker's batch changes). The reasons are said to the user as they are, after "restarting the
    gang": the status and the Warning tell a one-pod replacement from a gang restart, and why.
    """
    job = ctx.job
    if seen.stalled:
        return "a stalled gang restarts whole: which worker hangs is unknown"
    if not ctx.checkpoints.durable:
        return ("checkpoints are ephemeral (CheckpointsDurable is False): a new pod could not resume "
                "where the others do")
    if not in_place_restarts(job):
        return "backoffLimit is 0: no worker may restart its ranks to meet a replaced peer"
    if job.spec.run_policy.oom_recovery and is_oom(seen.reason) and halved_batch(job) is not None:
        return "OOM recovery changes every worker's batch"
    if not seen.faulty:
        return "no one worker failed"
    survivors = [p for p in ctx.current if p.active and p.index not in seen.faulty]
    if any(not p.meets_replacements for p in survivors):
        return "the other workers' pods were built by an older operator: their agents cannot meet a replacement"
    if 0 in seen.faulty and any(not p.redials for p in survivors):
        return ("worker 0 hosts the rendezvous store and the other workers' pods were built by an older operator: "
                "their launchers end with it")
    return seen.faulty


def backoff_seconds(job: RLTrainingJob, restarts: int) -> float:
    """Wait before gang restart number ``restarts`` (1-based): base × 2^(restarts-1), capped."""
    policy = job.spec.run_policy
    if restarts <= 0:
        return 0.0
    return float(min(policy.backoff_max_seconds, policy.backoff_base_seconds * 2 ** (restarts - 1)))


def is_oom(reason: str) -> bool:
    return reason in OOM_REASONS


def halved_batch(job: RLTrainingJob) -> OomRecovery | None:
    """Half the per-device batch, twice the accumulation (same global batch); None at the floor.

    The batch must stay a whole number of ``numGenerations`` groups across the world, so an
    odd batch cannot be halved exactly and stays as it is.
    """
    batch, accumulation, _ = job.batch_shape()  # as the gang runs: OOM recovery's batch, the size in use
    floor = job.spec.run_policy.oom_min_batch_size
    if batch % 2 or batch // 2 < floor:
        return None
    return OomRecovery(batch_size=batch // 2, gradient_accumulation_steps=accumulation * 2)
