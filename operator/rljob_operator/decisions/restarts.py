"""Restart decisions (pure): which failures restart the gang, after how long, with what batch shape.

A failure is a *disruption* when the cluster caused it (the pod was evicted, preempted, its
node went away) and a *worker failure* otherwise. Disruptions always restart the gang (except
under ``restartPolicy: Never``) and are not counted against ``backoffLimit``; worker failures
restart it only when the restart policy calls the exit retryable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rljob_contract.job import OomRecovery, RestartPolicy, RLTrainingJob, RLTrainingJobStatus
from rljob_contract.pod import EXIT_PEER_LOST, EXIT_PERMANENT

from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.times import parse_time

#: Pod reasons and conditions the cluster sets when it, not the trainer, ended a pod.
DISRUPTION_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "NodeShutdown", "Terminated",
                                    "DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"})
OOM_REASONS = frozenset({"OOMKilled", "CudaOutOfMemory"})


@dataclass(frozen=True)
class Verdict:
    """What a failure means for the gang."""

    restart: bool
    disruption: bool
    why: str
    """Why it is permanent, when it is (for the user)."""


def is_disruption(pod: ObservedPod) -> bool:
    """The cluster ended this pod: evicted, preempted, node lost (no exit code of the trainer)."""
    return pod.disrupted or (pod.exit_code is None and pod.pod_reason in DISRUPTION_POD_REASONS)


def judge_failure(job: RLTrainingJob, pod: ObservedPod | None) -> Verdict:
    """Restart or fail, for a failed pod (``None``: a worker that disappeared, a disruption)."""
    policy = job.spec.run_policy.restart_policy
    disruption = pod is None or is_disruption(pod)
    if policy == RestartPolicy.never:
        return Verdict(False, disruption, "restartPolicy is Never")
    if disruption:
        return Verdict(True, True, "")
    assert pod is not None
    code = pod.exit_code
    if code == EXIT_PERMANENT:
        return Verdict(False, False, f"exit code {EXIT_PERMANENT} is the trainer's permanent error; "
                                     "fix the cause and resubmit")
    # A rank that lost its peer says so (in-place restarts); its own code is not the fault's.
    if policy == RestartPolicy.exit_code and code is not None and 1 <= code <= 127 and code != EXIT_PEER_LOST:
        return Verdict(False, False, f"restartPolicy ExitCode treats exit code {code} (1-127) as permanent")
    return Verdict(True, False, "")


def in_place_restarts(job: RLTrainingJob) -> int:
    """How often a worker of this job may restart its ranks to meet a replaced peer (0: never).

    Elastic jobs (``minReplicas``/``maxReplicas``) replace a failed worker other than worker 0 in
    place (``failures.in_place``) and the survivors' agents re-rendezvous with it; each
    replacement counts against ``backoffLimit``, which therefore also bounds the agents' restarts.
    """
    policy = job.spec.run_policy
    if not job.spec.workers.elastic or policy.restart_policy == RestartPolicy.never:
        return 0
    return policy.backoff_limit


def judge_stall(job: RLTrainingJob) -> Verdict:
    """A hung gang is restarted (and counted: the hang is the job's, not the cluster's), unless Never."""
    if job.spec.run_policy.restart_policy == RestartPolicy.never:
        return Verdict(False, False, "restartPolicy is Never")
    return Verdict(True, False, "")


def backoff_seconds(job: RLTrainingJob, restarts: int) -> float:
    """Wait before gang restart number ``restarts`` (1-based): base × 2^(restarts-1), capped."""
    policy = job.spec.run_policy
    if restarts <= 0:
        return 0.0
    return float(min(policy.backoff_max_seconds, policy.backoff_base_seconds * 2 ** (restarts - 1)))


def is_oom(reason: str) -> bool:
    return reason in OOM_REASONS


def effective_batch(job: RLTrainingJob) -> tuple[int, int]:
    """(batchSize, gradientAccumulationSteps) the gang runs with (OOM recovery's batch, the current size)."""
    batch, accumulation, _ = job.batch_shape()
    return batch, accumulation


def halved_batch(job: RLTrainingJob) -> OomRecovery | None:
    """Half the per-device batch, twice the accumulation (same global batch); None at the floor.

    The batch must stay a whole number of ``numGenerations`` groups across the world, so an
    odd batch cannot be halved exactly and stays as it is.
    """
    batch, accumulation = effective_batch(job)
    floor = job.spec.run_policy.oom_min_batch_size
    if batch % 2 or batch // 2 < floor:
        return None
    return OomRecovery(batch_size=batch // 2, gradient_accumulation_steps=accumulation * 2)


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
