"""Fault tolerance's pure decisions: restart or fail, backoff, OOM batch shape, stalls, force-deletes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from rljob_operator.decisions.children import desired_configmap
from rljob_operator.decisions.failure.observe import first_failure
from rljob_operator.decisions.failure.respond import backoff_seconds
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.names import ANNOTATION_IN_PLACE_RESTARTS, ANNOTATION_REDIALS, CONFIG_KEY
from rljob_operator.times import rfc3339

from tests.support.jobs import ENDPOINT, NOW, make_job, observe, pod_json
from tests.support.operator_process import on_runtime
from tests.support.trainer import deep_update

RUNNING = {"phase": "Running", "startTime": rfc3339(NOW), "gangStartTime": rfc3339(NOW)}


def failed_worker(job: Any, code: int, reason: str | None = None, index: int = 1) -> dict[str, Any]:
    pod = pod_json(job, index, "Failed", False, exit_code=code, message="boom")
    if reason:
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = reason
    return pod


#: Checkpoint storage that outlives the pods (the runtime's).
DURABLE = "s3://ckpt"


def plan_after(job: Any, *pods: dict[str, Any], later: float = 0, storage: str | None = DURABLE) -> Any:
    """A reconcile ``later`` seconds on, the job on a runtime whose checkpoints go to ``storage``."""
    runtime = on_runtime(job, {"checkpoint": {"storage": storage}} if storage else None)
    return plan_reconcile(job, observe(job, *pods), NOW + timedelta(seconds=later), runtime=runtime)


def test_retryable_crash_restarts_the_whole_gang_as_a_new_generation() -> None:
    job = make_job(spec={"runPolicy": {"backoffBaseSeconds": 5}}, status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 1), storage=None)
    s = plan.status
    assert (s["phase"], s["reason"], s["gangGeneration"], s["restarts"]) == ("Restarting", "WorkerFailed", 1, 1)
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"] and plan.create_pods == []
    assert s["lastFailure"] == {"worker": "train-worker-1", "reason": "WorkerFailed", "exitCode": 1,
                                "message": "train-worker-1 exited with code 1: boom", "time": rfc3339(NOW),
                                "disruption": False, "replacedPods": []}
    assert s["nextRestartTime"] == rfc3339(NOW + timedelta(seconds=5))
    assert plan.gang_restart == "WorkerFailed"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "WorkerFailed")]


def test_a_restarting_gang_waits_for_its_backoff_then_starts_generation_plus_one() -> None:
    job = make_job(spec={"runPolicy": {"backoffBaseSeconds": 5}}, status=RUNNING)
    first = plan_after(job, pod_json(job, 0), failed_worker(job, 1), storage=None)
    restarting = make_job(spec={"runPolicy": {"backoffBaseSeconds": 5}}, status=first.status)
    waiting = plan_after(restarting, later=2, storage=None)
    assert waiting.status["phase"] == "Restarting" and waiting.create_pods == []
    assert waiting.requeue_after == 3 and "boom" in waiting.status["message"]
    again = plan_after(restarting, later=5, storage=None)
    assert [p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in again.create_pods] == ["1", "1"]
    assert again.status["restarts"] == 1 and again.status["gangStartTime"] == rfc3339(NOW + timedelta(seconds=5))


def test_the_failure_is_handled_once_when_seen_again() -> None:
    job = make_job(status=RUNNING)
    first = plan_after(job, pod_json(job, 0), failed_worker(job, 1), storage=None)
    # The operator crashed after writing status: the old pods are still there, now of an old generation.
    again = make_job(status=first.status)
    plan = plan_after(again, pod_json(job, 0), failed_worker(job, 1), later=1, storage=None)
    assert plan.status["restarts"] == 1 and plan.status["gangGeneration"] == 1
    assert plan.delete_pods == ["train-worker-0", "train-worker-1"] and plan.events == []


def test_backoff_doubles_and_is_capped() -> None:
    job = make_job(spec={"runPolicy": {"backoffBaseSeconds": 2, "backoffMaxSeconds": 10}})
    assert [backoff_seconds(job, n) for n in (1, 2, 3, 4, 5)] == [2, 4, 8, 10, 10]


def test_backoff_limit_exhausted_fails_the_job() -> None:
    job = make_job(spec={"runPolicy": {"backoffLimit": 2}}, status={**RUNNING, "restarts": 2})
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 1))
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert "backoffLimit (2)" in plan.status["message"] and plan.delete_pods == ["train-worker-0"]


def test_permanent_exit_code_fails_at_once_without_retry() -> None:
    job = make_job(status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 78))
    assert (plan.status["phase"], plan.status["reason"], plan.status["restarts"]) == ("Failed", "PermanentError", 0)


def test_exit_code_policy_treats_low_codes_as_permanent_and_high_as_retryable() -> None:
    job = make_job(spec={"runPolicy": {"restartPolicy": "ExitCode"}}, status=RUNNING)
    low = plan_after(job, pod_json(job, 0), failed_worker(job, 3))
    assert (low.status["phase"], low.status["reason"]) == ("Failed", "WorkerFailed")
    assert "ExitCode" in low.status["message"]
    assert plan_after(job, pod_json(job, 0), failed_worker(job, 137)).status["phase"] == "Restarting"
    on_failure = make_job(status=RUNNING)
    assert plan_after(on_failure, pod_json(on_failure, 0), failed_worker(on_failure, 3)).status["phase"] == "Restarting"


def test_never_policy_fails_on_any_failure() -> None:
    job = make_job(spec={"runPolicy": {"restartPolicy": "Never"}}, status=RUNNING)
    assert plan_after(job, pod_json(job, 0), failed_worker(job, 143)).status["phase"] == "Failed"


def test_disruption_restarts_without_consuming_the_backoff_limit() -> None:
    job = make_job(spec={"runPolicy": {"backoffLimit": 0}}, status=RUNNING)
    evicted = pod_json(job, 1, "Running", False, deleting=True)
    evicted["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                            "reason": "DeletionByTaintManager"})
    plan = plan_after(job, pod_json(job, 0), evicted)
    s = plan.status
    assert (s["phase"], s["restarts"], s["disruptions"], s["gangGeneration"]) == ("Restarting", 0, 1, 1)
    assert s["lastFailure"]["disruption"] is True and s["nextRestartTime"] == rfc3339(NOW)
    vanished = plan_after(job, pod_json(job, 0))
    assert (vanished.status["phase"], vanished.status["reason"]) == ("Restarting", "WorkerLost")


def test_pod_stuck_terminating_is_force_deleted_after_the_grace_period() -> None:
    job = make_job(status={**RUNNING, "phase": "Restarting", "gangGeneration": 1})
    stuck = pod_json(job, 0, deleting=True)  # deletionTimestamp = NOW
    assert plan_reconcile(job, observe(job, stuck), NOW + timedelta(seconds=5), force_delete_after=10) \
        .force_delete_pods == []
    assert plan_reconcile(job, observe(job, stuck), NOW + timedelta(seconds=10), force_delete_after=10) \
        .force_delete_pods == ["train-worker-0"]


def test_oom_halves_the_batch_doubles_accumulation_down_to_the_floor() -> None:
    spec = {"training": {"batchSize": 8, "numGenerations": 4}, "runPolicy": {"oomMinBatchSize": 2}}
    job = make_job(spec=spec, status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 137, "OOMKilled"))
    assert plan.status["reason"] == "OOMKilled"
    assert plan.status["oomRecovery"] == {"batchSize": 4, "gradientAccumulationSteps": 2}
    assert any(e.reason == "OOMRecovery" for e in plan.events)
    config = yaml.safe_load(desired_configmap(make_job(spec=spec, status=plan.status), ENDPOINT)["data"][CONFIG_KEY])
    assert (config["training"]["batchSize"], config["training"]["gradientAccumulationSteps"]) == (4, 2)
    second = plan_after(make_job(spec=spec, status={**RUNNING, **{k: plan.status[k] for k in ("oomRecovery",)}}),
                        pod_json(job, 0), failed_worker(job, 200))
    assert second.status["oomRecovery"] == {"batchSize": 2, "gradientAccumulationSteps": 4}
    floor = make_job(spec=spec, status={**RUNNING, "oomRecovery": second.status["oomRecovery"]})
    third = plan_after(floor, pod_json(job, 0), failed_worker(job, 200))
    assert third.status["oomRecovery"] == {"batchSize": 2, "gradientAccumulationSteps": 4}


def test_oom_recovery_can_be_switched_off() -> None:
    job = make_job(spec={"training": {"batchSize": 8}, "runPolicy": {"oomRecovery": False}}, status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 200))
    assert plan.status["phase"] == "Restarting" and plan.status["oomRecovery"] is None


def test_silent_heartbeats_set_stalled_and_restart_the_gang() -> None:
    status = {**RUNNING, "progress": {"step": 3, "lastHeartbeat": rfc3339(NOW + timedelta(seconds=10))}}
    job = make_job(spec={"runPolicy": {"stallTimeoutSeconds": 30}}, status=status)
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=39).status["phase"] == "Running"
    plan = plan_after(job, pod_json(job, 0), pod_json(job, 1), later=40)
    s = plan.status
    assert (s["phase"], s["reason"], s["restarts"]) == ("Restarting", "HeartbeatTimeout", 1)
    assert "stallTimeoutSeconds=30" in s["message"]
    assert {c["type"]: c["status"] for c in s["conditions"]}["Stalled"] == "True"
    assert ("Warning", "HeartbeatTimeout") in [(e.type, e.reason) for e in plan.events]


def test_a_heartbeat_refused_for_the_jobs_rate_is_a_sign_of_life_not_a_stall() -> None:
    """Issue #30 point 4: a job the status API throttles (429) is alive; its stall clock runs from the refusal."""
    status = {**RUNNING, "progress": {"step": 3, "lastHeartbeat": rfc3339(NOW + timedelta(seconds=10)),
                                      "lastThrottled": rfc3339(NOW + timedelta(seconds=35))}}
    job = make_job(spec={"runPolicy": {"stallTimeoutSeconds": 30}}, status=status)
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=64).status["phase"] == "Running"
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=65).status["reason"] == "HeartbeatTimeout"
    # Refused heartbeats alone (none accepted yet) end the startup clock too.
    started = {**RUNNING, "progress": {"lastThrottled": rfc3339(NOW + timedelta(seconds=50))}}
    job = make_job(spec={"runPolicy": {"startupTimeoutSeconds": 60, "stallTimeoutSeconds": 30}}, status=started)
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=70).status["phase"] == "Running"


def test_no_first_heartbeat_within_the_startup_timeout_restarts_the_gang() -> None:
    job = make_job(spec={"runPolicy": {"startupTimeoutSeconds": 60, "stallTimeoutSeconds": 5}}, status=RUNNING)
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=59).status["phase"] == "Running"
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=60).status["reason"] == "StartupTimeout"


def test_a_running_job_is_looked_at_again_when_its_heartbeat_deadline_falls_due() -> None:
    policy = {"startupTimeoutSeconds": 60, "stallTimeoutSeconds": 20}
    job = make_job(spec={"runPolicy": policy}, status=RUNNING)
    # No heartbeat yet: the startup clock (60 s from the gang's start; +1 s for second-resolution times).
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=10).requeue_after == 51
    beat = {**RUNNING, "progress": {"step": 3, "lastHeartbeat": rfc3339(NOW + timedelta(seconds=30))}}
    job = make_job(spec={"runPolicy": policy}, status=beat)
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1), later=35).requeue_after == 16
    # Not every checkIntervalSeconds: an idle job costs no API requests between its deadlines.
    job = make_job(spec={"runPolicy": {**policy, "checkIntervalSeconds": 7}}, status=RUNNING)
    assert plan_after(job, pod_json(job, 0), pod_json(job, 1)).requeue_after == 61


# ------------------------------------------------------------ in-place replacement (fixed-size and elastic jobs)
#: An elastic job of 3 workers whose checkpoints outlive its pods.
ELASTIC = {"workers": {"minReplicas": 2, "maxReplicas": 3}, "runPolicy": {"backoffBaseSeconds": 5}}
#: A fixed-size job of 3 workers (``make_job(3)``), checkpoints as well.
FIXED = {"runPolicy": {"backoffBaseSeconds": 5}}


@pytest.mark.parametrize("shape", [FIXED, ELASTIC], ids=["fixed-size", "elastic"])
def test_a_job_with_durable_checkpoints_replaces_only_its_failed_worker_and_counts_a_restart(
        shape: dict[str, Any]) -> None:
    job = make_job(3, spec=shape, status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 1), pod_json(job, 2))
    s = plan.status
    assert (s["phase"], s["reason"], s["gangGeneration"], s["restarts"]) == ("Restarting", "WorkerFailed", 0, 1)
    assert plan.delete_pods == ["train-worker-1"] and plan.gang_restart is None
    assert plan.replaced_workers == "WorkerFailed"
    assert s["lastFailure"]["replacedPods"] == ["pod-1-0"] and s["nextRestartTime"] is None
    assert "replacing train-worker-1 in place" in s["message"]
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", "WorkerFailed", s["message"])]
    again = plan_after(make_job(3, spec=shape, status=s), pod_json(job, 0), pod_json(job, 2), later=1)
    assert [p["metadata"]["name"] for p in again.create_pods] == ["train-worker-1"]
    assert [p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in again.create_pods] == ["0"]


def test_an_elastic_job_replaces_only_its_failed_worker_and_counts_a_restart() -> None:
    job = make_job(3, spec=ELASTIC, status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 1), pod_json(job, 2))
    s = plan.status
    assert (s["phase"], s["reason"], s["gangGeneration"], s["restarts"]) == ("Restarting", "WorkerFailed", 0, 1)
    assert plan.delete_pods == ["train-worker-1"] and plan.gang_restart is None
    assert plan.replaced_workers == "WorkerFailed"
    assert s["lastFailure"]["replacedPods"] == ["pod-1-0"] and s["nextRestartTime"] is None
    assert "replacing train-worker-1 in place" in s["message"] and "restart 1 of backoffLimit" in s["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "WorkerFailed")]

    # The next reconcile, before the watch shows the deletion: the replaced pod is stale, not a new
    # failure; its name is taken until it is gone. Then the same generation's worker 1 is created.
    replacing = make_job(3, spec=ELASTIC, status=s)
    waiting = plan_after(replacing, pod_json(job, 0), failed_worker(job, 1), pod_json(job, 2), later=1)
    assert waiting.status["restarts"] == 1
    assert [(e.reason, e.message.split(":")[0]) for e in waiting.events] == [("WaitingForOldPods", "Restarting → Pending")]
    assert waiting.delete_pods == ["train-worker-1"] and waiting.create_pods == []
    assert waiting.status["phase"] == "Pending" and waiting.status["lastFailure"]["replacedPods"] == ["pod-1-0"]
    again = plan_after(replacing, pod_json(job, 0), pod_json(job, 2), later=2)
    assert [p["metadata"]["name"] for p in again.create_pods] == ["train-worker-1"]
    assert [p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in again.create_pods] == ["0"]
    assert again.delete_pods == [] and again.status["restarts"] == 1 and again.status["gangGeneration"] == 0
    # Back to Running once the replacement is ready; the survivors were never touched.
    running = plan_after(make_job(3, spec=ELASTIC, status=again.status), pod_json(job, 0),
                         {**pod_json(job, 1), "metadata": {**pod_json(job, 1)["metadata"], "uid": "pod-1-new"}},
                         pod_json(job, 2), later=30)
    assert running.status["phase"] == "Running" and running.delete_pods == [] and running.create_pods == []


def test_replaced_pods_name_only_the_pods_still_to_be_told_apart() -> None:
    """A second in-place failure while the first replaced pod is still seen keeps that pod's UID (it is
    stale, not a third failure); once gone it is dropped; a gang restart replaces no pod in place, and
    its record says so (no UIDs left over from the earlier failure)."""
    job = make_job(3, spec=ELASTIC, status=RUNNING)
    first = plan_after(job, pod_json(job, 0), failed_worker(job, 1), pod_json(job, 2)).status
    assert first["lastFailure"]["replacedPods"] == ["pod-1-0"]
    replacing = make_job(3, spec=ELASTIC, status=first)
    second = plan_after(replacing, pod_json(job, 0), failed_worker(job, 1), failed_worker(job, 1, index=2), later=1)
    assert second.delete_pods == ["train-worker-1", "train-worker-2"] and second.status["restarts"] == 2
    assert second.status["lastFailure"]["replacedPods"] == ["pod-1-0", "pod-2-0"]
    gone = plan_after(replacing, pod_json(job, 0), failed_worker(job, 1, index=2), later=1).status
    assert gone["lastFailure"]["replacedPods"] == ["pod-2-0"]
    # Worker 0 fails (its agent hosts the rendezvous store): replaced alone too, the survivors dial its new store.
    # (worker 2's pod is the one replaced before, still seen: deleted again, not counted.)
    third = plan_after(make_job(3, spec=ELASTIC, status=second.status), failed_worker(job, 1, index=0),
                       pod_json(job, 2), later=2)
    assert third.gang_restart is None and sorted(third.delete_pods) == ["train-worker-0", "train-worker-2"]
    assert third.status["lastFailure"]["worker"] == "train-worker-0" and third.status["gangGeneration"] == 0
    assert sorted(third.status["lastFailure"]["replacedPods"]) == ["pod-0-0", "pod-2-0"]
    # A survivor an older operator built ends with worker 0's store: the gang restarts, and its record names
    # no pod replaced in place (none left over from the earlier failure).
    older = pod_json(job, 1)
    del older["metadata"]["annotations"][ANNOTATION_REDIALS]
    older["metadata"]["uid"] = "pod-1-replacement"  # the pod created in place of worker 1's
    restart = plan_after(make_job(3, spec=ELASTIC, status=second.status), failed_worker(job, 1, index=0), older,
                         later=2)
    assert restart.gang_restart is not None and restart.status["lastFailure"]["worker"] == "train-worker-0"
    assert restart.status["lastFailure"]["replacedPods"] == []


def test_a_lost_worker_of_an_elastic_job_is_replaced_in_place_as_a_disruption() -> None:
    job = make_job(3, spec=ELASTIC, status=RUNNING)
    plan = plan_after(job, pod_json(job, 0), pod_json(job, 1))  # worker 2 is gone (its node went away)
    s = plan.status
    assert (s["phase"], s["reason"], s["disruptions"], s["restarts"]) == ("Restarting", "WorkerLost", 1, 0)
    assert plan.delete_pods == [] and s["gangGeneration"] == 0 and plan.replaced_workers == "WorkerLost"
    again = plan_after(make_job(3, spec=ELASTIC, status=s), pod_json(job, 0), pod_json(job, 1), later=1)
    assert [p["metadata"]["name"] for p in again.create_pods] == ["train-worker-2"]


@pytest.mark.parametrize("shape", [FIXED, ELASTIC], ids=["fixed-size", "elastic"])
def test_what_still_restarts_the_whole_gang_and_the_status_and_warning_say_why(shape: dict[str, Any]) -> None:
    def gang_restart(*pods_of: Any, storage: str | None = DURABLE, spec: dict[str, Any] | None = None,
                     status: dict[str, Any] = RUNNING, later: float = 0) -> str | None:
        """The restart's message (the status's, the Warning's), or None: some workers were replaced alone."""
        job = make_job(3, spec=deep_update(deep_update({}, shape), spec or {}), status=status)
        plan = plan_after(job, *[p(job) for p in pods_of], storage=storage, later=later)
        if plan.gang_restart is None:
            assert plan.replaced_workers is not None and plan.status["gangGeneration"] == 0
            return None
        message: str = plan.status["message"]
        assert plan.status["gangGeneration"] == 1 and "restarting the gang as generation 1" in message
        assert ("Warning", plan.gang_restart, message) in [(e.type, e.reason, e.message) for e in plan.events]
        return message

    healthy = [lambda j: pod_json(j, 0), lambda j: pod_json(j, 2)]
    worker_1 = [lambda j: failed_worker(j, 1, index=1)]
    assert gang_restart(*healthy, *worker_1) is None
    # Worker 0 hosts the rendezvous store: replaced alone, its survivors' launchers dial the replacement's store;
    # survivors an operator built before they did so would end with it.
    worker_0 = [lambda j: failed_worker(j, 1, index=0)]
    assert gang_restart(*worker_0, lambda j: pod_json(j, 1), lambda j: pod_json(j, 2)) is None

    def no_redial(j: Any, index: int) -> dict[str, Any]:
        pod = pod_json(j, index)
        del pod["metadata"]["annotations"][ANNOTATION_REDIALS]
        return pod

    why = gang_restart(*worker_0, lambda j: no_redial(j, 1), lambda j: pod_json(j, 2))
    assert why is not None and "worker 0 hosts the rendezvous store" in why and "older operator" in why
    assert gang_restart(*healthy, *worker_1) is None and gang_restart(
        lambda j: no_redial(j, 0), lambda j: no_redial(j, 2), *worker_1) is None  # only worker 0's loss needs it
    # Checkpoints that die with a pod: the replacement could not resume where the survivors do.
    why = gang_restart(*healthy, *worker_1, storage=None)
    assert why is not None and "checkpoints are ephemeral" in why
    # Out of memory with OOM recovery: every worker's batch changes (without it, one pod is replaced).
    oom = [*healthy, lambda j: failed_worker(j, 137, "OOMKilled", index=1)]
    why = gang_restart(*oom, spec={"training": {"batchSize": 8, "numGenerations": 2}})
    assert why is not None and "OOM recovery changes every worker's batch" in why
    assert gang_restart(*oom, spec={"runPolicy": {"oomRecovery": False}}) is None
    # Survivors built by an operator before in-place restarts: their agents would end, not meet the replacement.
    def older(j: Any, index: int) -> dict[str, Any]:
        pod = pod_json(j, index)
        del pod["metadata"]["annotations"][ANNOTATION_IN_PLACE_RESTARTS]
        return pod

    why = gang_restart(lambda j: older(j, 0), lambda j: older(j, 2), *worker_1)
    assert why is not None and "built by an older operator" in why
    # A stall: which worker hangs is unknown.
    beat = {**RUNNING, "progress": {"step": 3, "lastHeartbeat": rfc3339(NOW + timedelta(seconds=10))}}
    why = gang_restart(lambda j: pod_json(j, 0), lambda j: pod_json(j, 1), lambda j: pod_json(j, 2),
                       spec={"runPolicy": {"stallTimeoutSeconds": 30}}, status=beat, later=40)
    assert why is not None and "stalled" in why


def test_a_survivor_that_only_lost_its_peer_is_not_the_failure() -> None:
    from rljob_contract.pod import EXIT_PEER_LOST

    job = make_job(3, spec={**ELASTIC, "runPolicy": {"restartPolicy": "ExitCode"}}, status=RUNNING)
    # Worker 2's agent gave up waiting (EXIT_PEER_LOST) after worker 1 crashed: worker 1 is the culprit,
    # and the peer-lost code is not read as a permanent 1-127 exit.
    plan = plan_after(job, pod_json(job, 0), failed_worker(job, 137, index=1), failed_worker(job, EXIT_PEER_LOST, index=2))
    assert plan.status["lastFailure"]["worker"] == "train-worker-1" and plan.status["phase"] == "Restarting"
    assert sorted(plan.delete_pods) == ["train-worker-1", "train-worker-2"]
    alone = plan_after(job, pod_json(job, 0), pod_json(job, 1), failed_worker(job, EXIT_PEER_LOST, index=2))
    assert alone.status["phase"] == "Restarting" and alone.status["lastFailure"]["exitCode"] == EXIT_PEER_LOST


def test_the_most_telling_failure_is_reported() -> None:
    job = make_job()
    crash, config = observe(job, pod_json(job, 0, "Failed", False, exit_code=1),
                            pod_json(job, 1, "Failed", False, exit_code=78))
    assert first_failure([crash, config]) is config


def test_a_burst_of_failures_of_the_gang_that_was_ready_counts_once_and_a_replacements_own_failure_counts() -> None:
    """Workers of the gang that was Ready failing one after another while the first is replaced in place (a rack
    lost, seen by several reconciles) are one incident: one restart counted, so ``backoffLimit: 1`` is enough. A
    replacement's own failure counts again (a worker that keeps failing still uses up the limit)."""
    spec = {"runPolicy": {"backoffBaseSeconds": 5, "backoffLimit": 1}}
    job = make_job(4, spec=spec, status=RUNNING)

    def made(pod: dict[str, Any], seconds: float, uid: str | None = None) -> dict[str, Any]:
        pod["metadata"]["creationTimestamp"] = rfc3339(NOW + timedelta(seconds=seconds))
        if uid:
            pod["metadata"]["uid"] = uid
        return pod

    gang = [made(pod_json(job, i), -3600) for i in range(4)]
    first = plan_after(job, gang[0], made(failed_worker(job, 1), -3600), gang[2], gang[3])
    assert (first.status["restarts"], first.delete_pods) == (1, ["train-worker-1"])
    ready = next(c for c in first.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["lastTransitionTime"]) == ("False", rfc3339(NOW))
    # 5 s later worker 2, of the gang that was Ready, fails too; worker 1's replacement is starting.
    replacement = made(pod_json(job, 1, "Pending", False), 1, uid="pod-1-new")
    second = plan_after(make_job(4, spec=spec, status=first.status), gang[0], replacement,
                        made(failed_worker(job, 1, index=2), -3600), gang[3], later=5)
    s = second.status
    assert (s["phase"], s["restarts"], second.delete_pods) == ("Restarting", 1, ["train-worker-2"])
    assert f"part of the failure being repaired since {rfc3339(NOW)}, counted once: restart 1 of backoffLimit 1" \
        in s["message"]
    assert s["lastFailure"]["worker"] == "train-worker-2" and s["lastFailure"]["replacedPods"] == ["pod-2-0"]
    # Worker 1's replacement fails: its own failure counts, past backoffLimit 1.
    third = plan_after(make_job(4, spec=spec, status=s), gang[0], made(failed_worker(job, 1), 1, uid="pod-1-new"),
                       gang[3], later=10)
    assert (third.status["phase"], third.status["reason"]) == ("Failed", "BackoffLimitExceeded")
    # Without the first failure's repair under way (the job Running again), a failure is counted.
    running = {**RUNNING, "restarts": 1, "lastFailure": s["lastFailure"]}
    again = plan_after(make_job(4, spec=spec, status=running), gang[0], made(failed_worker(job, 1, index=3), -3600),
                       gang[2], later=60)
    assert (again.status["phase"], again.status["reason"]) == ("Failed", "BackoffLimitExceeded")
