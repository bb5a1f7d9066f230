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

from tests.trainer_helpers import rljob_cmd, trainer_env

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[1]
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
    proc = subprocess.run(rljob_cmd("experiment", str(manifest), "--out", str(out), *args), capture_output=True,
                          text=True, timeout=1500, env=trainer_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    return proc.stdout, summary["status"], out


def baseline(status: dict[str, Any]) -> float:
    """The untrained policy's reward: the mean over trials of the reward logged at step 1."""
    first = [t["curve"][0]["value"] for t in status["trials"] if t["curve"] and t["curve"][0]["step"] == 1]
    assert first, status["trials"]
    return sum(first) / len(first)


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
    proc = subprocess.run(rljob_cmd("experiment", str(manifest), "--out", str(tmp_path / "out")),
                          capture_output=True, text=True, timeout=120, env=trainer_env(), cwd=REPO)
    assert proc.returncode == 78
    assert f"{manifest}: spec.arms[0].overrides.training.learningRate: Input should be less than or equal to 1" \
        in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_strategies_example_trains_each_arm_with_its_trl_fields_and_ranks_by_held_out_accuracy(
    tmp_path: Path,
) -> None:
    """examples/experiments/strategies.yaml, shortened: each arm's trial ran TRL with its strategy's fields
    (summary.json reads them back from TRL's config) and the leaderboard ranks by eval/exact_match."""
    from rljob_trainer.algorithms import ALGORITHMS

    doc = yaml.safe_load((REPO / "examples/experiments/strategies.yaml").read_text())
    training = doc["spec"]["template"]["training"]
    training.update(maxSteps=6)
    training["evaluation"].update(everySteps=3, maxPrompts=16)
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
