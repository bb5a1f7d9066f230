"""``rljob experiment`` on this machine: real trials of the quickstart task on CPU.

Calibrated on the quickstart task with one process and 16 completions a step (2 prompts): the
untrained policy scores ~0.04; after 20 steps at learning rate 0.01 the mean of the last 5 rewards
is 0.28 with seed 0 and 0.05 with seed 1 (GRPO on 2 prompts a step is noisy), at 1e-5 it stays
~0.02. Training on CPU is deterministic for a seed, so these runs repeat. (0.003 needs ~30 steps to
separate, which would make these tests half again as long; 0.02 swings between 0 and 0.5.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.trainer import rljob_cmd, trainer_env

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
STEPS = 20
TEMPLATE: dict[str, Any] = {
    "workers": {"replicas": 1, "procsPerWorker": 1},
    "training": {
        "model": "builtin:tiny",
        "dataset": {"name": "builtin:repeat-char", "size": 256},
        "rewards": [{"name": "repeat_char", "kwargs": {"length": 6}}],
        "batchSize": 16, "numGenerations": 8, "maxCompletionLength": 6,
        "learningRate": 0.003, "maxSteps": STEPS, "seed": 0,
        "trl": {"lr_scheduler_type": "constant", "temperature": 1.0},
    },
    "checkpoint": {"everySteps": 1000, "keepLast": 1},
}


def experiment(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": name},
            "spec": {"template": TEMPLATE, **spec}}


def run_experiment(tmp_path: Path, doc: dict[str, Any], *args: str) -> tuple[str, dict[str, Any], Path]:
    """Run ``rljob experiment`` on ``doc``: (its output, summary.json's status, the output folder)."""
    manifest, out = tmp_path / "exp.yaml", tmp_path / "out"
    manifest.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(rljob_cmd("experiment", str(manifest), "--output", str(out), *args), capture_output=True,
                          text=True, timeout=1500, env=trainer_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    return proc.stdout, summary["status"], out


def baseline(status: dict[str, Any]) -> float:
    """The untrained policy's reward: the mean over trials of the reward logged at step 1."""
    first = [t["curve"][0]["value"] for t in status["trials"] if t["curve"] and t["curve"][0]["step"] == 1]
    assert first, status["trials"]
    return sum(first) / len(first)


@pytest.mark.e2e  # minutes of training; make e2e (CI's budget: docs/development.md)
def test_ab_two_learning_rates_the_faster_arm_wins_with_its_interval(tmp_path: Path) -> None:
    doc = experiment("lr-ab", seeds=2, objective={"k": 5}, arms=[
        {"name": "fast", "overrides": {"training": {"learningRate": 0.01}}},
        {"name": "slow", "overrides": {"training": {"learningRate": 0.00001}}},
    ])
    output, status, out = run_experiment(tmp_path, doc, "--parallel", "2")

    assert [t["phase"] for t in status["trials"]] == ["Succeeded"] * 4
    assert {t["name"] for t in status["trials"]} == {"lr-ab-fast-s0", "lr-ab-fast-s1", "lr-ab-slow-s0",
                                                     "lr-ab-slow-s1"}
    assert all(t["steps"] == STEPS and len(t["curve"]) == STEPS for t in status["trials"])
    assert [e["name"] for e in status["leaderboard"]] == ["fast", "slow"]
    fast = next(a for a in status["arms"] if a["name"] == "fast")
    slow = next(a for a in status["arms"] if a["name"] == "slow")
    assert fast["n"] == 2 and fast["ci95Low"] <= fast["mean"] <= fast["ci95High"]
    assert fast["mean"] > slow["mean"] + 0.05, (fast, slow)
    assert fast["mean"] > baseline(status) + 0.05
    winner = status["winner"]
    assert winner["arm"] == "fast" and winner["runnerUp"] == "slow" and winner["test"].startswith("Welch")
    assert winner["pValue"] is not None and winner["significant"] == (winner["pValue"] < 0.05)
    best = status["best"]
    assert best["arm"] == "fast" and Path(best["checkpoint"]).is_dir()
    # One progress line per trial start and end, then the leaderboard table.
    assert output.count("started lr-ab-") == 4 and output.count(" Succeeded: objective ") == 4
    assert "95% interval" in output and "winner: fast" in output
    assert (out / "reward_curves.png").stat().st_size > 5000


@pytest.mark.e2e  # minutes of training; make e2e (CI's budget: docs/development.md)
def test_tpe_search_over_the_learning_rate_finds_one_that_learns(tmp_path: Path) -> None:
    search = {"algorithm": "tpe", "maxTrials": 4, "parallelism": 2, "seed": 0, "parameters": [
        {"name": "training.learningRate", "type": "float", "min": 0.001, "max": 0.03, "log": True}]}
    output, status, out = run_experiment(tmp_path, experiment("lr-search", search=search, objective={"k": 5}))

    trials = status["trials"]
    assert [t["name"] for t in trials] == [f"lr-search-t{i}" for i in range(4)]
    rates = [t["params"]["training.learningRate"] for t in trials]
    assert len(set(rates)) == 4 and all(0.001 <= r <= 0.03 for r in rates)
    assert all(t["phase"] == "Succeeded" for t in trials), trials
    best = status["best"]
    assert best["objective"] == max(t["objective"] for t in trials)
    assert best["objective"] > baseline(status) + 0.1, (best, baseline(status))
    # The trial really ran with the parameter it reports.
    config = json.loads((out / "trials" / best["trial"] / "trainer-config.json").read_text())
    assert config["training"]["learningRate"] == best["params"]["training.learningRate"]
    assert [e["name"] for e in status["leaderboard"]][0] == best["trial"]
    assert "lr-search-t" in output and "learningRate=" in output


@pytest.mark.e2e  # minutes of training; make e2e (CI's budget: docs/development.md)
def test_early_stopping_stops_a_hopeless_trial_before_max_steps(tmp_path: Path) -> None:
    # One after another: the learning trial runs to the end first (nothing to compare it with),
    # then the hopeless one is judged at each rung against it (minTrials 1).
    doc = experiment("stop", objective={"k": 5}, earlyStopping={"minSteps": 8, "interval": 4, "minTrials": 1}, arms=[
        {"name": "learns", "overrides": {"training": {"learningRate": 0.01}}},
        # A long run for the hopeless arm: a step takes ~0.1-0.5 s here, so a trial stopped at its
        # first rung must not be able to reach its end in the second or two a stop takes.
        {"name": "hopeless", "overrides": {"training": {"learningRate": 1e-7, "maxSteps": 3 * STEPS}}},
    ])
    output, status, out = run_experiment(tmp_path, doc, "--parallel", "1")

    learns, hopeless = status["trials"]
    assert learns["phase"] == "Succeeded" and learns["steps"] == STEPS
    assert hopeless["phase"] == "Pruned" and hopeless["pruned"], hopeless
    # Judged at the first rung it was worse at, however late the runner looked (deterministic on CPU).
    assert hopeless["prunedAtStep"] == 8, hopeless
    # It stopped soon after the rung (SIGTERM → it saved and exited), well before its maxSteps.
    assert hopeless["prunedAtStep"] <= hopeless["steps"] < 2 * STEPS
    assert (out / "trials" / hopeless["name"] / "checkpoints").is_dir()
    assert "pruning stop-hopeless-s0" in output and "median" in hopeless["message"]
    assert status["best"]["trial"] == learns["name"]


def test_a_bad_experiment_file_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    doc = experiment("bad", arms=[{"name": "a", "overrides": {"training": {"learningRate": 5}}}])
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    # The old spelling of --output still works (scripts keep running), with a warning.
    proc = subprocess.run(rljob_cmd("experiment", str(manifest), "--out", str(tmp_path / "out")),
                          capture_output=True, text=True, timeout=120, env=trainer_env(), cwd=REPO)
    assert proc.returncode == 78
    assert "rljob: warning: --out is deprecated; use --output" in proc.stderr
    assert f"{manifest}: spec.arms[0].overrides.training.learningRate: Input should be less than or equal to 1" \
        in proc.stderr
    assert not (tmp_path / "out").exists()


def trial_log(out: Path, trial: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "trials" / trial / "metrics.jsonl").read_text().splitlines()]


def test_ab_is_ranked_by_held_out_accuracy_not_by_a_training_reward_that_can_be_gamed(tmp_path: Path) -> None:
    """examples/experiments/ab-held-out.yaml: arm gameable's reward pays for any doubled character, which a
    policy gets by repeating one character whatever the prompt; arm honest's is the task's. Measured (seed 0,
    80 steps): training reward, mean of the last 5 steps, gameable 1.0, honest 0.22; held-out accuracy from
    0.23 for both (the same untrained model) to gameable 0.0 and honest 0.59."""
    doc = yaml.safe_load((REPO / "examples" / "experiments" / "ab-held-out.yaml").read_text())
    doc["spec"]["seeds"] = 1  # seed 0 of each arm: the example's 3 seeds are docs/guides/experiments.md's run
    steps, every = doc["spec"]["template"]["training"]["maxSteps"], 20
    assert doc["spec"]["template"]["training"]["evaluation"]["everySteps"] == every
    output, status, out = run_experiment(tmp_path, doc, "--parallel", "2")

    assert [t["phase"] for t in status["trials"]] == ["Succeeded"] * 2, status["trials"]
    logs = {arm: trial_log(out, f"held-out-ab-{arm}-s0") for arm in ("honest", "gameable")}
    reward = {arm: [r["reward"] for r in log if "reward" in r][-5:] for arm, log in logs.items()}
    accuracy = {arm: {r["step"]: r["eval/exact_match"] for r in log if "eval/exact_match" in r}
                for arm, log in logs.items()}
    print(f"training reward (last 5): {reward}; held-out accuracy: {accuracy}")
    assert all(sorted(a) == list(range(0, steps + 1, every)) for a in accuracy.values()), accuracy
    assert accuracy["honest"][0] == accuracy["gameable"][0] <= 0.35  # the same untrained model: chance
    # By its training reward, gameable is far ahead...
    assert sum(reward["gameable"]) / 5 > sum(reward["honest"]) / 5 + 0.3, reward
    # ...but it learnt the shortcut, not the task: on held-out prompts honest is far ahead.
    assert accuracy["honest"][steps] >= accuracy["gameable"][steps] + 0.25, accuracy
    assert accuracy["honest"][steps] > accuracy["honest"][0], accuracy
    # The experiment ranks by the held-out metric: each trial's objective is its final evaluation.
    trials = {t["arm"]: t for t in status["trials"]}
    assert {arm: trials[arm]["objective"] for arm in trials} == {arm: a[steps] for arm, a in accuracy.items()}
    assert [p["step"] for p in trials["honest"]["curve"]] == sorted(accuracy["honest"])
    assert [e["name"] for e in status["leaderboard"]] == ["honest", "gameable"]
    assert status["winner"]["arm"] == "honest" and status["best"]["trial"] == "held-out-ab-honest-s0"
    assert "mean eval/exact_match" in output and "winner: honest" in output


def test_early_stopping_on_the_held_out_metric_prunes_at_the_evaluation_of_a_rung(tmp_path: Path) -> None:
    """The same A/B with the median rule at rungs 20, 40, 60, where evaluation runs (every 20 steps): the
    honest arm runs first (20 steps, to have something to compare with), then the gameable one, whose
    held-out accuracy at step 20 (0.03) is below honest's (0.14) although its training reward is higher."""
    doc = yaml.safe_load((REPO / "examples" / "experiments" / "ab-held-out.yaml").read_text())
    spec = doc["spec"]
    spec["seeds"] = 1
    spec["earlyStopping"] = {"minSteps": 20, "rungs": [20, 40, 60], "minTrials": 1}
    spec["arms"][0]["overrides"] = {"training": {"maxSteps": 20}}
    assert [a["name"] for a in spec["arms"]] == ["honest", "gameable"]
    output, status, out = run_experiment(tmp_path, doc, "--parallel", "1")

    honest, gameable = status["trials"]
    assert honest["phase"] == "Succeeded" and [p["step"] for p in honest["curve"]] == [0, 20]
    assert gameable["phase"] == "Pruned" and gameable["prunedAtStep"] == 20, gameable
    # Judged by the evaluations logged at the rung, not by the training reward (which favours gameable).
    log = trial_log(out, gameable["name"])
    at_rung = {n: next(r["eval/exact_match"] for r in trial_log(out, t["name"]) if r["step"] == 20
                       and "eval/exact_match" in r) for n, t in (("honest", honest), ("gameable", gameable))}
    rewards = {n: [r["reward"] for r in trial_log(out, t["name"]) if "reward" in r and 16 <= r["step"] <= 20]
               for n, t in (("honest", honest), ("gameable", gameable))}
    print(f"at rung 20: held-out accuracy {at_rung}, training reward (steps 16-20) {rewards}")
    assert at_rung["gameable"] < at_rung["honest"] and sum(rewards["gameable"]) > sum(rewards["honest"])
    assert f"objective {at_rung['gameable']:.4g} at step 20" in gameable["message"]
    assert f"median {at_rung['honest']:.4g} of 1 other" in gameable["message"]
    assert 20 <= max(r["step"] for r in log) < 80  # stopped soon after the rung, not at its end
    assert "pruning held-out-ab-gameable-s0" in output and status["best"]["trial"] == honest["name"]


def test_the_strategies_example_trains_each_arm_with_its_trl_fields_and_ranks_by_held_out_accuracy(
    tmp_path: Path,
) -> None:
    """examples/experiments/strategies.yaml, shortened: each arm's trial ran TRL with its strategy's fields
    (summary.json reads them back from TRL's config) and the leaderboard ranks by eval/exact_match."""
    from rljob_contract.plugins.algorithms import ALGORITHMS

    doc = yaml.safe_load((REPO / "examples/experiments/strategies.yaml").read_text())
    training = doc["spec"]["template"]["training"]
    training.update(maxSteps=6)
    training["evaluation"].update(everySteps=3, maxPrompts=16)
    assert doc["spec"]["seeds"] >= 2  # the example tests its winner; one seed an arm here, to be short
    doc["spec"]["seeds"] = 1
    metric = doc["spec"]["objective"]["metric"]
    assert metric == "eval/exact_match" and doc["spec"]["objective"]["k"] == 1
    _, status, out = run_experiment(tmp_path, doc, "--parallel", "2")

    strategies = ALGORITHMS["grpo"].strategies
    assert [t["phase"] for t in status["trials"]] == ["Succeeded"] * len(strategies)
    assert {t["arm"] for t in status["trials"]} == set(strategies)
    for trial in status["trials"]:
        folder = out / "trials" / trial["name"]
        ran = json.loads((folder / "summary.json").read_text())["algorithm"]
        assert ran["name"] == "grpo" and ran["strategy"] == trial["arm"]
        assert {k: ran["trl"][k] for k in strategies[trial["arm"]].trl} == strategies[trial["arm"]].trl
        evals = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in evals if metric in r]
        assert [r["step"] for r in evals] == [0, 3, 6]  # before training, everySteps, the end
        assert trial["objective"] == evals[-1][metric]  # k: 1 → the final held-out accuracy
    objectives = {t["arm"]: t["objective"] for t in status["trials"]}
    board = [(e["name"], e["objective"]) for e in status["leaderboard"]]
    assert [o for _, o in board] == sorted(objectives.values(), reverse=True)
    assert all(objectives[name] == objective for name, objective in board)
