"""A failure, step 2 (pure): what the observed failure means: a disruption or the job's own, retryable or not.

A failure is a *disruption* when the cluster caused it (the pod was evicted, preempted, its node went
away, the worker disappeared) and a *worker failure* otherwise. Disruptions always restart (except
under ``restartPolicy: Never``) and are not counted against ``backoffLimit``; worker failures restart
only when the restart policy calls the exit retryable. A stall is the job's own: it restarts, counted,
unless the policy is Never. What to do about it is the next step's (``respond``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rljob_contract.job import RestartPolicy, RLTrainingJob
from rljob_contract.pod import EXIT_PEER_LOST, EXIT_PERMANENT

from rljob_operator.decisions.failure.observe import Observation
from rljob_operator.decisions.observed import ObservedPod

#: Pod reasons and conditions the cluster sets when it, not the trainer, ended a pod.
DISRUPTION_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "NodeShutdown", "Terminated",
                                    "DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"})


@dataclass(frozen=True)
class Verdict:
    """What a failure means for the gang."""

    restart: bool
    disruption: bool
    why: str
    """Why it is permanent, when it is (for the user)."""


def classify(job: RLTrainingJob, seen: Observation) -> Verdict:
    """The verdict on an observed failure: a stall's, or a failed (or lost: no culprit) worker's."""
    return judge_stall(job) if seen.stalled else judge_failure(job, seen.culprit)


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


def is_disruption(pod: ObservedPod) -> bool:
    """The cluster ended this pod: evicted, preempted, node lost (no exit code of the trainer)."""
    return pod.disrupted or (pod.exit_code is None and pod.pod_reason in DISRUPTION_POD_REASONS)


def judge_stall(job: RLTrainingJob) -> Verdict:
    """A hung gang is restarted (and counted: the hang is the job's, not the cluster's), unless Never."""
    if job.spec.run_policy.restart_policy == RestartPolicy.never:
        return Verdict(False, False, "restartPolicy is Never")
    return Verdict(True, False, "")
