"""Experiments use the health signals (issue #47 point 2): a trial whose policy collapsed is marked on the
leaderboard, the winner's message says when it rests on collapsed trials, and ``pruneCollapsed`` stops them;
on a cluster (the operator's pure decisions) and on this machine (``rljob experiment``'s runner)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rljob_contract.experiment import RLExperiment, RLExperimentStatus, TrialStatus, parse_experiment
from rljob_operator.decisions.experiments import plan_experiment, record_uids
from rljob_operator.experiments.health import signals_from_logs, signals_from_progress
from rljob_operator.experiments.leaderboard import standings
from rljob_operator.experiments.trials import arm_trials

NOW = "2026-01-01T00:00:00Z"
STRATEGIES: dict[str, Any] = {
    "apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment",
    "metadata": {"name": "strategies", "namespace": "team", "uid": "exp-uid", "generation": 1},
    "spec": {"template": {"training": {"maxSteps": 40, "seed": 0}},
             "arms": [{"name": "grpo", "overrides": {"training": {"strategy": "grpo"}}},
                      {"name": "dapo", "overrides": {"training": {"strategy": "dapo"}}}],
             "seeds": 2},
}
COLLAPSED = [{"signal": "maskedBatch", "step": 5, "lastStep": 30, "active": True, "value": 0.97, "threshold": 0.5},
             {"signal": "entropyCollapse", "step": 22, "lastStep": 30, "active": True, "value": 0.0,
              "threshold": 0.39}]


def trial(arm: str, seed: int, objective: float, health: list[str] | None = None,
          phase: str = "Succeeded") -> TrialStatus:
    return TrialStatus(name=f"strategies-{arm}-s{seed}", number=seed, arm=arm, seed=seed, phase=phase,
                       objective=objective, health=health or [])


def test_a_collapsed_arm_is_marked_on_the_leaderboard_and_in_the_winners_message() -> None:
    """The issue's ranking: DAPO last at 0.0 after its policy collapsed; now the board says so."""
    exp = RLExperiment.model_validate(STRATEGIES)
    trials = [trial("grpo", 0, 0.80), trial("grpo", 1, 0.84),
              trial("dapo", 0, 0.0, ["entropyCollapse", "maskedBatch"]), trial("dapo", 1, 0.02, ["maskedBatch"])]
    s = standings(exp.spec, trials)
    assert [(e.name, e.collapsed, e.n) for e in s.leaderboard] == [("grpo", 0, 2), ("dapo", 1, 2)]
    assert next(a for a in s.arms if a.name == "dapo").collapsed == 1
    assert s.winner is not None and s.winner.arm == "grpo"
    assert s.winner.message.endswith("but 1 of 2 trial(s) of the runner-up dapo collapsed (entropyCollapse): the "
                                     "ranking says how those runs went, not how the strategy does when it trains "
                                     "(docs/guides/health.md)")


def test_a_winner_that_collapsed_is_never_silent_and_a_healthy_comparison_adds_nothing() -> None:
    exp = RLExperiment.model_validate(STRATEGIES)
    trials = [trial("grpo", 0, 0.5, ["entropyCollapse"]), trial("grpo", 1, 0.6),
              trial("dapo", 0, 0.1), trial("dapo", 1, 0.2)]
    won = standings(exp.spec, trials).winner
    assert won is not None and "1 of 2 trial(s) of the winner grpo collapsed" in won.message
    healthy = standings(exp.spec, [t.model_copy(update={"health": []}) for t in trials]).winner
    assert healthy is not None and "collapsed" not in healthy.message


def test_the_operator_reads_a_trials_health_from_its_jobs_status_and_keeps_it() -> None:
    doc = STRATEGIES
    first = plan_experiment(doc, parse_experiment(doc), [], NOW)
    status = {**first.status, "trials": record_uids(first.status, {j["metadata"]["name"]: "uid-" + j["metadata"][
        "name"] for j in first.create})}
    jobs = [_job(j, "Running", COLLAPSED if "dapo-s0" in j["metadata"]["name"] else []) for j in first.create]
    second = plan_experiment({**doc, "status": status}, parse_experiment(doc), jobs, NOW)
    health = {t["name"]: t.get("health", []) for t in second.status["trials"]}
    assert health["strategies-dapo-s0"] == ["entropyCollapse", "maskedBatch"]  # HealthSignal's order
    assert health["strategies-grpo-s0"] == []
    assert second.suspend == []  # pruneCollapsed is off: a collapsed trial runs on, marked
    assert [(e.type, e.reason, e.message) for e in second.events if e.reason == "TrialCollapsed"] == [
        ("Warning", "TrialCollapsed", "trial strategies-dapo-s0: its policy collapsed (entropyCollapse, maskedBatch; "
                                      "docs/guides/health.md)")]
    # A later status without the warnings (a job's status rewritten) does not unmark the trial.
    later = plan_experiment({**doc, "status": {**second.status}}, parse_experiment(doc),
                            [_job(j, "Running", []) for j in first.create], NOW)
    assert next(t for t in later.status["trials"] if t["name"] == "strategies-dapo-s0")["health"] == [
        "entropyCollapse", "maskedBatch"]
    assert not [e for e in later.events if e.reason == "TrialCollapsed"]  # told once


def test_prune_collapsed_stops_a_collapsed_trial_and_only_that_one() -> None:
    doc = copy.deepcopy(STRATEGIES)
    doc["spec"]["pruneCollapsed"] = True
    first = plan_experiment(doc, parse_experiment(doc), [], NOW)
    status = {**first.status, "trials": record_uids(first.status, {j["metadata"]["name"]: "uid-" + j["metadata"][
        "name"] for j in first.create})}
    masked_only = [w for w in COLLAPSED if w["signal"] == "maskedBatch"]
    health = {"strategies-dapo-s0": COLLAPSED, "strategies-dapo-s1": masked_only}
    jobs = [_job(j, "Running", health.get(j["metadata"]["name"], [])) for j in first.create]
    second = plan_experiment({**doc, "status": status}, parse_experiment(doc), jobs, NOW)
    assert second.suspend == ["strategies-dapo-s0"]  # a masked batch alone is no collapse
    pruned = next(t for t in second.status["trials"] if t["name"] == "strategies-dapo-s0")
    assert pruned["phase"] == "Pruned" and pruned["prunedAtStep"] == 30
    assert pruned["message"].startswith("its policy collapsed (entropyCollapse, maskedBatch;")
    assert any(e.reason == "TrialPruned" and "strategies-dapo-s0" in e.message for e in second.events)


def test_health_read_from_status_and_logs_keeps_known_signals_only() -> None:
    hostile = {"health": [{"signal": "entropyCollapse"}, {"signal": "rm -rf"}, "text", {"signal": None}]}
    assert signals_from_progress(hostile) == ["entropyCollapse"]
    assert signals_from_progress({"health": "entropyCollapse"}) == []
    records = [{"step": 1, "reward": 0.1}, {"step": 9, "health/maskedBatch": 1.0},
               {"step": 20, "health/maskedBatch": 0.0, "health/entropyCollapse": 1.0, "health/bogus": 1.0}]
    assert signals_from_logs(records) == ["entropyCollapse", "maskedBatch"]


def test_the_local_runner_marks_and_prunes_a_trial_from_its_metrics_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    from rljob.experiment import LocalRunner, RunningTrial, leaderboard_table

    doc = copy.deepcopy(STRATEGIES)
    doc["spec"]["pruneCollapsed"] = True
    exp = RLExperiment.model_validate(doc)
    runner = LocalRunner(exp, tmp_path, parallel=1, stream=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    dapo = arm_trials(exp)[2]
    status = TrialStatus(name=dapo.name, number=2, seed=0, arm="dapo", phase="Running")
    proc = subprocess.Popen(["sleep", "30"])
    rt = RunningTrial(dapo, status, proc, tmp_path, tmp_path / "log", 0.0)
    runner.statuses.append(status)
    runner.running[dapo.name] = rt
    (tmp_path / "metrics.jsonl").write_text('{"step": 5, "reward": 0.02, "health/maskedBatch": 1.0}\n')
    runner.read_metrics(rt)
    runner.prune()
    assert status.health == ["maskedBatch"] and rt.stop_sent is None
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 22, "reward": 0.0, "health/maskedBatch": 1.0, "health/entropyCollapse": 1.0}\n')
    runner.read_metrics(rt)
    runner.prune()
    assert proc.wait(timeout=10) == -15  # SIGTERM
    assert status.pruned and status.pruned_at_step == 22 and "its policy collapsed" in (status.message or "")
    runner.stream.close()
    said = (tmp_path / "out.txt").read_text().splitlines()
    assert [line for line in said if "health signal" in line] == [
        f"rljob: [3/4] {dapo.name}: health signal maskedBatch tripped (docs/guides/health.md)",
        f"rljob: [3/4] {dapo.name}: health signal entropyCollapse tripped (docs/guides/health.md)"]

    done = [trial("grpo", 0, 0.8), trial("grpo", 1, 0.9), trial("dapo", 1, 0.1, ["entropyCollapse"]),
            trial("dapo", 2, 0.0, ["entropyCollapse"])]
    s = standings(exp.spec, done)
    table = leaderboard_table(exp, RLExperimentStatus(trials=done, arms=s.arms, leaderboard=s.leaderboard,
                                                      winner=s.winner))
    header, _, dapo_row = table.splitlines()[:3]
    assert header.split()[-1] == "collapsed" and dapo_row.split()[-1] == "2/2"


def _job(manifest: dict[str, Any], phase: str, health: list[dict[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out["metadata"]["uid"] = "uid-" + out["metadata"]["name"]
    out["status"] = {"phase": phase, "progress": {"step": 30, "curve": [{"step": 30, "reward": 0.02}],
                                                  "health": health}}
    return out
