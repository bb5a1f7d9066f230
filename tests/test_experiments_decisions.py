"""The operator's experiment decisions (pure): trials within parallelism, idempotent rebuilds, pruning,
standings, failure, and the pod profile applied to trials."""

from __future__ import annotations

import copy
from typing import Any

from rljob_operator.decisions.experiments import ExperimentPlan, plan_experiment
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.experiments.api import parse_experiment

NOW = "2026-01-01T00:00:00Z"
TEMPLATE = {"image": "ghcr.io/rljob/trainer:0.1.0",
            "training": {"learningRate": 0.001, "maxSteps": 40, "seed": 7}}


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


def job(manifest: dict[str, Any], phase: str, rewards: list[float] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    curve = [{"step": (i + 1) * 10, "reward": r} for i, r in enumerate(rewards or [])]
    out["status"] = {"phase": phase, "progress": {"curve": curve, "checkpoint": f"s3://b/{out['metadata']['name']}/c"}}
    return out


def step(doc: dict[str, Any], p: ExperimentPlan) -> dict[str, Any]:
    """The experiment after ``p``'s status was written."""
    return {**doc, "status": p.status}


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
    again = plan(step(doc, first), [])
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
    doc = experiment({**AB, "template": {**TEMPLATE, "image": "evil.example/miner:1"}})
    p = plan(doc, [])
    assert p.create == [] and p.status["phase"] == "Failed" and p.status["reason"] == "PolicyViolation"
    assert "spec.template.image" in p.status["message"]
