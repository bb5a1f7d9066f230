"""The operator's experiment decisions (pure): trials within parallelism, idempotent rebuilds, pruning,
standings, failure, and the pod profile applied to trials."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from rljob_contract.experiment import (
    MAX_CONFLICTS_LISTED,
    MAX_TRIAL_CHECKPOINT,
    MAX_TRIAL_MESSAGE,
    MAX_TRIALS,
    MIN_CURVE_POINTS,
    RLExperimentStatus,
    SearchParameter,
    curve_points_per_trial,
    parse_experiment,
)
from rljob_contract.job import ManifestError
from rljob_operator.decisions.conditions import condition
from rljob_operator.decisions.experiments import (
    ExperimentPlan,
    invalid_experiment,
    plan_experiment,
    record_uids,
    refused_trial,
)
from rljob_operator.decisions.policy import PodProfile

from tests.support.experiment_maxima import largest_status

NOW = "2026-01-01T00:00:00Z"
TEMPLATE = {"training": {"learningRate": 0.001, "maxSteps": 40, "seed": 7}}


def experiment(spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment",
            "metadata": {"name": "ab", "namespace": "team", "uid": "exp-uid", "generation": 1,
                         "labels": labels or {}},
            "spec": {"template": TEMPLATE, **spec}}


AB = {"arms": [{"name": "high", "overrides": {"training": {"learningRate": 0.003}}},
               {"name": "low", "overrides": {"training": {"learningRate": 1e-5}}}],
      "seeds": 2, "parallelism": 2}


def plan(doc: dict[str, Any], jobs: list[dict[str, Any]], profile: PodProfile | None = None) -> ExperimentPlan:
    return plan_experiment(doc, parse_experiment(doc), jobs, NOW, profile or PodProfile())


def uid(manifest: dict[str, Any]) -> str:
    """The UID the API server gives a trial job (here: one per name)."""
    return f"uid-{manifest['metadata']['name']}"


def job(manifest: dict[str, Any], phase: str, rewards: list[float] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out["metadata"]["uid"] = uid(out)
    curve = [{"step": (i + 1) * 10, "reward": r} for i, r in enumerate(rewards or [])]
    out["status"] = {"phase": phase, "progress": {"curve": curve, "checkpoint": f"s3://b/{out['metadata']['name']}/c"}}
    return out


def step(doc: dict[str, Any], p: ExperimentPlan, created: bool = True) -> dict[str, Any]:
    """The experiment after ``p``'s status was written and (``created``) its trial jobs' UIDs recorded, as the
    operator applies a plan."""
    status = dict(p.status)
    if created:
        status["trials"] = record_uids(p.status, {j["metadata"]["name"]: uid(j) for j in p.create})
    return {**doc, "status": status}


def test_trials_start_within_parallelism_owned_labelled_and_recorded_first() -> None:
    doc = experiment(AB, labels={"kueue.x-k8s.io/queue-name": "gpus", "rljob.dev/experiment": "spoof"})
    first = plan(doc, [])
    names = [j["metadata"]["name"] for j in first.create]
    assert names == ["ab-high-s7", "ab-high-s8"]  # parallelism 2 of 4 trials
    meta = first.create[0]["metadata"]
    assert meta["ownerReferences"] == [{"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "name": "ab",
                                        "uid": "exp-uid", "controller": True, "blockOwnerDeletion": True}]
    assert meta["labels"] == {"kueue.x-k8s.io/queue-name": "gpus", "rljob.dev/experiment": "ab",
                              "rljob.dev/trial": "0", "rljob.dev/arm": "high"}
    assert first.create[0]["spec"]["training"]["learningRate"] == 0.003
    assert [t["name"] for t in first.status["trials"]] == names and first.status["summary"] == "0/4"
    assert [e.reason for e in first.events] == ["TrialStarted", "TrialStarted"]
    # Crashed after the status, before the creates (no jobs yet): the same two, never others.
    again = plan(step(doc, first, created=False), [])
    assert again.create == first.create and again.status["trials"] == first.status["trials"]
    # A trial seen running whose job is then deleted by someone is failed, not started again.
    seen = plan(step(doc, first), [job(j, "Running", [0.1]) for j in first.create])
    gone = plan(step(doc, seen), [job(first.create[0], "Running", [0.1])])
    assert gone.status["trials"][1]["phase"] == "Failed"
    assert [j["metadata"]["name"] for j in gone.create] == ["ab-low-s7"]  # its slot went to the next trial
    assert gone.status["trials"][1]["message"] == "its job was deleted"
    running = [job(j, "Running", [0.1]) for j in first.create]
    assert plan(step(doc, first), running).create == []  # both slots taken


def test_finished_trials_free_slots_then_the_better_arm_wins_with_its_interval() -> None:
    doc = experiment(AB)
    first = plan(doc, [])
    done = [job(j, "Succeeded", [0.2, 0.8, 0.9 - 0.02 * i]) for i, j in enumerate(first.create)]
    second = plan(step(doc, first), done)
    assert [j["metadata"]["name"] for j in second.create] == ["ab-low-s7", "ab-low-s8"]
    jobs = done + [job(j, "Succeeded", [0.1, 0.1, 0.12 + 0.01 * i]) for i, j in enumerate(second.create)]
    final = plan(step(doc, second), jobs)
    status = final.status
    assert status["phase"] == "Succeeded" and status["summary"] == "4/4" and status["bestName"] == "high"
    assert status["winner"]["arm"] == "high" and status["winner"]["runnerUp"] == "low"
    assert [row["name"] for row in status["leaderboard"]] == ["high", "low"]
    high = status["arms"][0]
    assert high["n"] == 2 and high["ci95Low"] <= high["mean"] <= high["ci95High"]
    assert status["best"]["checkpoint"].startswith("s3://b/ab-high-")
    assert {e.reason for e in final.events} >= {"WinnerFound", "TrialsFinished"}
    assert final.requeue_after is None
    # Rebuilt from the same status and trials: nothing new to do, no second WinnerFound.
    again = plan(step(doc, final), jobs)
    assert again.events == [] and again.create == []
    assert again.status == final.status  # nothing to write: a finished experiment causes no status traffic


def forged(manifest: dict[str, Any], name: str, rewards: list[float]) -> dict[str, Any]:
    """A tenant's RLTrainingJob dressed as a trial: the experiment's ownerReference and labels, its own UID,
    Succeeded with a curve (status a tenant with rights on the status subresource can write)."""
    out = job(manifest, "Succeeded", rewards)
    out["metadata"].update(name=name, uid=f"forged-{name}")
    return out


def test_only_jobs_the_experiment_created_are_trials_the_others_are_conflicts() -> None:
    doc = experiment({**AB, "parallelism": 4})
    first = plan(doc, [])
    trials = [job(j, "Running", [0.1]) for j in first.create]
    fake = forged(first.create[0], "ab-winner", [0.99, 0.99])
    seen = plan(step(doc, first), [*trials, fake])
    status = seen.status
    assert status["conflicts"] == ["ab-winner"] and [t["name"] for t in status["trials"]] == [
        j["metadata"]["name"] for j in first.create]
    clash = next(c for c in status["conditions"] if c["type"] == "TrialConflict")
    assert clash["status"] == "True" and "ab-winner" in clash["message"]
    assert [e.reason for e in seen.events] == ["TrialConflict"] and "ab-winner" in seen.events[0].message
    assert plan(step(doc, seen), [*trials, fake]).events == []  # reported once, not at every reconcile
    many = [forged(first.create[0], f"ab-fake-{i:02d}", [0.9]) for i in range(MAX_CONFLICTS_LISTED + 5)]
    flooded = plan(step(doc, seen), [*trials, *many])
    assert len(flooded.events) == MAX_CONFLICTS_LISTED and plan(step(doc, flooded), [*trials, *many]).events == []
    assert f"{MAX_CONFLICTS_LISTED + 5} RLTrainingJob(s)" in next(
        c for c in flooded.status["conditions"] if c["type"] == "TrialConflict")["message"]
    # The trials finish; the forgery's better curve never reaches the leaderboard, the best or the winner.
    done = [job(j, "Succeeded", [0.2, 0.3 + 0.01 * i]) for i, j in enumerate(first.create)]
    final = plan(step(doc, seen), [*done, fake])
    assert final.status["phase"] == "Succeeded" and final.status["summary"] == "4/4"
    assert "ab-winner" not in str(final.status["leaderboard"]) and final.status["best"]["objective"] < 0.5
    # Deleted, the conflict is gone from the status and the condition.
    clean = plan(step(doc, final), done).status
    assert "conflicts" not in clean or clean["conflicts"] == []
    assert next(c for c in clean["conditions"] if c["type"] == "TrialConflict")["status"] == "False"


def test_a_trials_name_taken_before_it_was_created_or_after_its_job_went_is_no_trial() -> None:
    doc = experiment(AB)
    first = plan(doc, [])
    # A tenant created ab-high-s7 between the status write and the operator's create (its POST got 409):
    # no UID was recorded, so the job is a conflict and the trial waits, not re-created, never counted.
    squat = forged(first.create[0], "ab-high-s7", [0.99])
    waiting = plan(step(doc, first, created=False), [squat])
    assert waiting.status["conflicts"] == ["ab-high-s7"]
    assert [j["metadata"]["name"] for j in waiting.create] == ["ab-high-s8"]  # the other recorded trial only
    assert waiting.status["trials"][0]["phase"] == "Pending" and "objective" not in waiting.status["trials"][0]
    # Deleted, the trial is created as recorded.
    assert [j["metadata"]["name"] for j in plan(step(doc, waiting, created=False), []).create] == [
        "ab-high-s7", "ab-high-s8"]
    # A finished trial whose job someone deleted and made again with a better curve keeps its own objective.
    done = [job(j, "Succeeded", [0.2, 0.3]) for j in first.create]
    finished = plan(step(doc, first), done)
    objective = finished.status["trials"][0]["objective"]
    swapped = plan(step(doc, finished), [squat, done[1]])
    assert swapped.status["trials"][0]["objective"] == objective and swapped.status["conflicts"] == ["ab-high-s7"]


def test_a_running_trial_an_older_operator_recorded_without_a_uid_is_adopted_once() -> None:
    doc = experiment(AB)
    first = plan(doc, [])
    running = [job(j, "Running", [0.1]) for j in first.create]
    seen = plan(step(doc, first), running)
    legacy = {**doc, "status": {**seen.status, "trials": [
        {k: v for k, v in t.items() if k != "uid"} for t in seen.status["trials"]]}}
    adopted = plan(legacy, running)
    assert [t.get("uid") for t in adopted.status["trials"]] == [uid(j) for j in first.create]
    assert "conflicts" not in adopted.status or adopted.status["conflicts"] == []


def test_a_hopeless_trial_is_pruned_at_a_rung_and_suspended() -> None:
    doc = experiment({**AB, "seeds": 2, "parallelism": 4,
                      "earlyStopping": {"minSteps": 10, "interval": 10, "minTrials": 2}})
    first = plan(doc, [])
    good = [job(j, "Running", [0.5, 0.6]) for j in first.create[:3]]
    hopeless = job(first.create[3], "Running", [0.0, 0.0])
    p = plan(step(doc, first), [*good, hopeless])
    assert p.suspend == ["ab-low-s8"]
    trial = next(t for t in p.status["trials"] if t["name"] == "ab-low-s8")
    assert trial["phase"] == "Pruned" and trial["pruned"] and trial["prunedAtStep"] in (10, 20)
    assert [e.reason for e in p.events] == ["TrialPruned"]
    # Suspended, its job reports Suspended: it stays Pruned and is not suspended again.
    later = plan(step(doc, p), [*good, job(first.create[3], "Suspended", [0.0, 0.0])])
    assert later.suspend == [] and later.status["trials"][3]["phase"] == "Pruned"


def test_too_many_failed_trials_fail_the_search() -> None:
    doc = experiment({"search": {"maxTrials": 6, "parallelism": 2, "maxFailedTrials": 1, "parameters": [
        {"name": "training.learningRate", "type": "float", "min": 1e-5, "max": 0.01, "log": True}]}})
    first = plan(doc, [])
    assert len(first.create) == 2 and all(t.get("params") for t in first.status["trials"])
    # The parameters are asked once: a crash before the creates creates the recorded trials, as recorded.
    assert plan(step(doc, first), []).create == first.create
    failed = [job(j, "Failed") for j in first.create]
    p = plan(step(doc, first), failed)
    assert p.status["phase"] == "Failed" and p.status["reason"] == "TooManyFailedTrials" and p.create == []
    assert [e.reason for e in p.events].count("TrialFailed") == 2
    # Failed is final for this generation: nothing more is started or written.
    after = plan(step(doc, p), failed)
    assert after.create == [] and after.events == [] and after.status == p.status


def test_the_pod_profile_applies_to_trials() -> None:
    remote = {"training": {**TEMPLATE["training"], "trl": {"trust_remote_code": True}}}
    doc = experiment({**AB, "template": remote})
    p = plan(doc, [])
    assert p.create == [] and p.status["phase"] == "Failed" and p.status["reason"] == "PolicyViolation"
    assert "spec.template.training.trl.trust_remote_code" in p.status["message"]


def test_the_largest_status_is_bounded_whatever_the_trial_jobs_say() -> None:
    """At the maxima (tests/support/experiment_maxima.py) each trial keeps MIN_CURVE_POINTS points, a cut message and
    its checkpoint; the whole status stays under 1 MiB (written to the real API server in
    tests/operator/test_experiments_cluster.py). A checkpoint longer than the bound is not copied."""
    status = largest_status(TEMPLATE)[1]
    assert len(status["trials"]) == MAX_TRIALS and len(json.dumps(status)) < 1024 * 1024
    failed = status["trials"][1]
    assert len(failed["curve"]) == MIN_CURVE_POINTS and len(failed["message"]) == MAX_TRIAL_MESSAGE
    assert len(failed["checkpoint"]) == MAX_TRIAL_CHECKPOINT and len(status["conflicts"]) == MAX_CONFLICTS_LISTED
    RLExperimentStatus.model_validate(status)  # the model the CRD's limits are generated from
    doc = experiment(AB)
    first = plan(doc, [])
    long = job(first.create[0], "Running", [0.1])
    long["status"]["progress"]["checkpoint"] = "s3://" + "c" * MAX_TRIAL_CHECKPOINT
    assert "checkpoint" not in plan(step(doc, first), [long]).status["trials"][0]
    assert [curve_points_per_trial(n) for n in (1, 25, 26, 100, MAX_TRIALS)] == [200, 200, 192, 50, MIN_CURVE_POINTS]
    # A status written before the bounds is read (not refused) and written back within them.
    old = {**step(doc, first), "status": {**first.status, "trials": [
        {**first.status["trials"][0], "phase": "Failed", "message": "m" * 5000, "checkpoint": "s3://" + "c" * 5000}]}}
    again = plan(old, []).status
    assert len(again["trials"][0]["message"]) == MAX_TRIAL_MESSAGE and "checkpoint" not in again["trials"][0]


def test_an_experiment_too_large_for_its_status_is_refused_naming_the_field() -> None:
    arms = [{"name": f"a{i}", "overrides": {}} for i in range(10)]
    with pytest.raises(ManifestError, match=r"spec.seeds: 10 arms × 51 seeds is 510 trials; an experiment runs at "
                                            rf"most {MAX_TRIALS}"):
        parse_experiment(experiment({"arms": arms, "seeds": 51}))
    values = ["x" * 500, "y"]
    search = {"maxTrials": MAX_TRIALS, "parameters": [
        {"name": "training.trl.p", "type": "categorical", "values": values}]}
    with pytest.raises(ManifestError, match=r"spec.search.maxTrials: the status records every trial's parameters "
                                            r"\(522 bytes each.*at most 287 trials of this search fit"):
        parse_experiment(experiment({"search": search}))
    # The estimate is never below what a trial records.
    parameter = SearchParameter.model_validate(search["parameters"][0])
    assert parameter.recorded_bytes() >= len(json.dumps({parameter.name: values[0]}))


def test_an_experiment_failure_writes_only_its_outcome_and_says_it_once() -> None:
    doc = experiment(AB)
    doc["metadata"]["generation"] = 3
    refused = refused_trial(doc, "ab-high-0", 403, "quota exceeded")
    assert refused.status == {"phase": "Failed", "reason": "TrialRejected", "observedGeneration": 3,
                              "message": "the API server refused trial ab-high-0 (HTTP 403): quota exceeded"} \
        and list(refused.status) == ["phase", "reason", "message", "observedGeneration"]  # standings untouched
    assert (refused.event.type, refused.event.reason) == ("Warning", "TrialRejected")
    invalid = invalid_experiment(doc, ["spec.arms[0]: bad", "spec.arms[1]: worse"])
    assert invalid is not None and invalid.status["message"] == "spec.arms[0]: bad; spec.arms[1]: worse"
    assert invalid_experiment({**doc, "status": invalid.status}, ["spec.arms[0]: bad", "spec.arms[1]: worse"]) is None


def test_experiment_conditions_come_from_the_jobs_builder_and_keep_their_transition_time() -> None:
    first = plan(experiment(AB), [])
    conditions = {c["type"]: c for c in first.status["conditions"]}
    assert set(conditions) == {"Ready", "Reconciling", "Stalled", "TrialConflict"}
    assert all("observedGeneration" not in c for c in conditions.values())  # an experiment's carry none
    doc = {**experiment(AB), "status": {**first.status, "conditions": [
        {**c, "lastTransitionTime": "2025-01-01T00:00:00Z"} for c in first.status["conditions"]]}}
    again = {c["type"]: c for c in plan(doc, []).status["conditions"]}
    assert again["Reconciling"]["lastTransitionTime"] == "2025-01-01T00:00:00Z"  # status unchanged: time kept
    assert again["Reconciling"] == {**condition("Reconciling", True, again["Reconciling"]["reason"],
                                                again["Reconciling"]["message"], previous=doc["status"]["conditions"],
                                                now=NOW).model_dump(by_alias=True, exclude_none=True)}
