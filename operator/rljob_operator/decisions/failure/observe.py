"""A failure, step 1 (pure): what went wrong with the current gang, as observed.

In this order: a worker that exited non-zero (the one that explains the gang's failure, its reason and
message from the trainer's exit-code contract), workers the cluster took away from a running gang (gone,
being deleted by someone else, on a deleted or NotReady node), or a gang whose heartbeats stopped (the
stall clock below, which ``lifecycle`` also reads to know when to look again). What it means is the
next step's (``classify``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rljob_contract.job import Phase, RLTrainingJob, RLTrainingJobStatus
from rljob_contract.pod import EXIT_CUDA_OOM, EXIT_PEER_LOST, EXIT_PERMANENT

from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.situation import Situation
from rljob_operator.names import worker_name
from rljob_operator.times import parse_time


@dataclass(frozen=True)
class Observation:
    """What went wrong with the current gang, before anything is judged."""

    reason: str
    message: str
    worker: str
    """The worker the failure is told of."""
    exit_code: int | None
    culprit: ObservedPod | None = None
    """The failed worker that explains the gang's failure; None: workers were lost, or the gang stalled."""
    stalled: bool = False
    faulty: tuple[int, ...] = ()
    """The workers (indices) that failed or were lost: what a replacement in place would replace."""


def observe(ctx: Situation) -> Observation | None:
    """The current gang's failure: a worker that failed, workers lost while running, or a stall (None: none)."""
    return _failed_worker(ctx) or _lost_workers(ctx) or _stalled(ctx)


def _failed_worker(ctx: Situation) -> Observation | None:
    failed = [p for p in ctx.current if p.phase == "Failed"]
    if not failed:
        return None
    culprit = first_failure(failed)
    faulty = {p.index for p in failed if p.index is not None} | set(lost_indices(ctx))
    return Observation(failure_reason(culprit), failure_message(culprit), culprit.name, culprit.exit_code,
                       culprit=culprit, faulty=tuple(sorted(faulty)))


def first_failure(failed: list[ObservedPod]) -> ObservedPod:
    """The failure that explains the gang's: permanent beats OOM beats the earliest, lowest index; a
    worker that only lost a peer (``EXIT_PEER_LOST``) explains nothing while another failed."""

    def rank(p: ObservedPod) -> tuple[int, str, int]:
        severity = {EXIT_PERMANENT: 0, EXIT_CUDA_OOM: 1, EXIT_PEER_LOST: 3}.get(p.exit_code or -1, 2)
        return severity, p.finished_at or "~", p.index if p.index is not None else 1 << 30

    return min(failed, key=rank)


def failure_reason(pod: ObservedPod) -> str:
    """CamelCase reason of a failed worker, from the trainer's exit-code contract."""
    if pod.exit_code == EXIT_PERMANENT:
        return "PermanentError"
    if pod.exit_code == EXIT_CUDA_OOM:
        return "CudaOutOfMemory"
    if pod.container_reason == "OOMKilled":
        return "OOMKilled"
    if pod.exit_code is None:
        return pod.pod_reason or ("Disrupted" if pod.disrupted else "WorkerLost")
    return "WorkerFailed"


def failure_message(pod: ObservedPod) -> str:
    """What a failed worker did (its exit code, or why it has none) and the first line of its message."""
    if pod.exit_code is None:
        what = f"{pod.name} failed ({pod.pod_reason or 'no exit code'})"
    else:
        what = f"{pod.name} exited with code {pod.exit_code}"
    first = (pod.message or "").strip().splitlines()
    return f"{what}: {first[0].strip()}" if first else what


def _lost_workers(ctx: Situation) -> Observation | None:
    lost = lost_indices(ctx)
    if not lost:
        return None
    names = [worker_name(ctx.job.metadata.name, i) for i in lost]
    return Observation("WorkerLost", f"{', '.join(names)} disappeared while the job was running", names[0], None,
                       faulty=tuple(lost))


def lost_indices(ctx: Situation) -> list[int]:
    """Workers of a running gang that are gone or being deleted (not by us: ours are stale): taken by
    the cluster (their node went away, they were evicted or preempted)."""
    if ctx.restarted or ctx.prev.phase != Phase.running.value:
        return []
    return [i for i in range(ctx.replicas)
            if i not in ctx.by_index or ctx.by_index[i].deleting or ctx.by_index[i].node_lost
            or (ctx.capacity is not None and not ctx.capacity.node_ok(ctx.by_index[i].node))]


def _stalled(ctx: Situation) -> Observation | None:
    """A gang starting or running (not one this reconcile replaces) whose heartbeats stopped."""
    watching = not ctx.restarted and ctx.prev.phase in (Phase.running.value, Phase.starting.value)
    found = stall(ctx.job, ctx.now) if watching else None
    if found is None:
        return None
    reason, message = found
    return Observation(reason, message, worker_name(ctx.job.metadata.name, 0), None, stalled=True)


# ---------------------------------------------------------------------------------- the stall clock


def stall(job: RLTrainingJob, now: datetime) -> tuple[str, str] | None:
    """(reason, message) when a running gang has stopped sending heartbeats, else None."""
    clock = _stall_clock(job)
    if clock is None:
        return None
    beating, since, timeout = clock
    waited = (now - since).total_seconds()
    if waited < timeout:
        return None
    if not beating:
        return "StartupTimeout", (
            f"no progress heartbeat {int(waited)}s after the gang started (startupTimeoutSeconds="
            f"{timeout}): check worker 0's logs (model download, rendezvous); restarting the gang"
        )
    return "HeartbeatTimeout", (
        f"no progress heartbeat for {int(waited)}s (stallTimeoutSeconds={timeout}): "
        "training hangs (a collective that never returns, a dead peer); restarting the gang from the "
        "newest checkpoint"
    )


def stall_check_in(job: RLTrainingJob, now: datetime) -> float | None:
    """Seconds until ``stall`` could first find the gang stalled (None: no clock is running).

    A heartbeat writes status, and so brings the job back anyway; the reconciler needs to look
    on its own only when this deadline falls due (status times have 1 s resolution: +1 s).
    """
    clock = _stall_clock(job)
    if clock is None:
        return None
    _, since, timeout = clock
    return max(since.timestamp() + timeout - now.timestamp(), 0.0) + 1.0


def _stall_clock(job: RLTrainingJob) -> tuple[bool, datetime, int] | None:
    """(heartbeat seen, since when, timeout) of the clock that judges the gang, or None (no gang yet).

    Before the gang's first heartbeat the clock is ``startupTimeoutSeconds`` from the gang's
    start; after it, ``stallTimeoutSeconds`` from the last heartbeat. A heartbeat the status API
    refused for the job's rate (``lastThrottled``) counts as one: an authenticated worker of the job
    sent it, so a job a busy status API turns away is not taken for a hung one.
    """
    status = job.status or RLTrainingJobStatus()
    policy = job.spec.run_policy
    started = parse_time(status.gang_start_time)
    if started is None:
        return None
    beat = _last_sign_of_life(status)
    if beat is None or beat < started:
        return False, started, policy.startup_timeout_seconds
    return True, beat, policy.stall_timeout_seconds


def _last_sign_of_life(status: RLTrainingJobStatus) -> datetime | None:
    """The later of the last accepted heartbeat and the last one refused for the job's rate."""
    progress = status.progress
    if progress is None:
        return None
    times = [t for t in (parse_time(progress.last_heartbeat), parse_time(progress.last_throttled)) if t is not None]
    return max(times, default=None)
