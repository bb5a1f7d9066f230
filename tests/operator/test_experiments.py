"""RLExperiment core: validation, trials, objective, statistics, search, pruning, leaderboard (pure)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from rljob_contract.experiment import (
    EarlyStoppingSpec,
    ObjectiveSpec,
    RLExperiment,
    TrialStatus,
    parse_experiment,
)
from rljob_contract.job import ManifestError
from rljob_operator.experiments.leaderboard import standings
from rljob_operator.experiments.objective import objective_value, thin
from rljob_operator.experiments.pruning import should_prune
from rljob_operator.experiments.search import next_params
from rljob_operator.experiments.stats import compare, mean_ci95
from rljob_operator.experiments.trials import MAX_TRIAL_NAME_LENGTH, arm_trials, search_trial, trial_name

AB: dict[str, Any] = {
    "apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": "lr-ab"},
    "spec": {
        "template": {"training": {"learningRate": 0.001, "maxSteps": 20, "seed": 7}},
        "arms": [{"name": "high", "overrides": {"training": {"learningRate": 0.003}}},
                 {"name": "low", "overrides": {"training": {"learningRate": 1e-5}}}],
        "seeds": 2,
    },
}
SEARCH: dict[str, Any] = {
    **{k: v for k, v in AB.items() if k != "spec"},
    "spec": {"template": AB["spec"]["template"],
             "search": {"maxTrials": 6, "algorithm": "tpe", "seed": 3, "parameters": [
                 {"name": "training.learningRate", "type": "float", "min": 1e-5, "max": 0.01, "log": True},
                 {"name": "training.numGenerations", "type": "categorical", "values": [4, 8]}]}},
}


def with_spec(doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"].update(spec)
    return out


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as e:
        parse_experiment(doc, "exp.yaml")
    return e.value.problems


# ------------------------------------------------------------------------------ validation


def test_a_bad_arm_override_is_named_at_its_path_after_merging() -> None:
    arms = [{"name": "a", "overrides": {"training": {"learningRate": 2.0}}},
            {"name": "b", "overrides": {"training": {"numGenerations": 3}}}]
    found = problems(with_spec(AB, arms=arms))
    assert "spec.arms[0].overrides.training.learningRate: Input should be less than or equal to 1" in found
    # numGenerations 3 does not divide the template's batch: only the merged spec shows it.
    assert any(p.startswith("spec.arms[1].overrides.training.numGenerations:") for p in found), found


def test_a_bad_template_is_named_under_spec_template() -> None:
    doc = with_spec(AB, template={"training": {"maxSteps": 0}})
    assert problems(doc)[0].startswith("spec.template.training.maxSteps:")


def test_arms_and_search_are_exclusive_and_one_is_required() -> None:
    both = with_spec(AB, search=SEARCH["spec"]["search"])
    assert problems(both)[0].startswith("spec.arms: give exactly one of arms")
    neither = copy.deepcopy(AB)
    del neither["spec"]["arms"]
    assert "got neither" in problems(neither)[0]


@pytest.mark.parametrize(("parameter", "expected"), [
    ({"name": "training.learnRate", "type": "float", "min": 0.1, "max": 0.2},
     "spec.search.parameters[0].name: training has no field 'learnRate'"),
    ({"name": "workers.replicas", "type": "int", "min": 1, "max": 2},
     "spec.search.parameters[0].name: 'workers.replicas' is not under spec.training"),
    ({"name": "training.learningRate", "type": "float", "min": 0.1, "max": 0.01},
     "spec.search.parameters[0].max: must be greater than min"),
    ({"name": "training.learningRate", "type": "float", "min": 0, "max": 0.01, "log": True},
     "spec.search.parameters[0].min: a log-scale range needs min > 0"),
    ({"name": "training.learningRate", "type": "float", "min": 0.1, "max": 3},
     "spec.search.parameters[0].max: 3.0 makes an invalid trial: training.learningRate: Input should be less"),
    ({"name": "training.trl.temperature", "type": "categorical", "values": [0.7, "hot"]},
     "spec.search.parameters[0].values: 'hot' makes an invalid trial: training.trl.temperature"),
    ({"name": "training.maxSteps", "type": "categorical"},
     "spec.search.parameters[0].values: a categorical parameter needs values"),
])
def test_a_bad_search_space_names_the_field(parameter: dict[str, Any], expected: str) -> None:
    doc = copy.deepcopy(SEARCH)
    doc["spec"]["search"]["parameters"] = [parameter]
    found = problems(doc)
    assert any(p.startswith(expected) for p in found), found


# ---------------------------------------------------------------------------------- trials


def test_arm_trials_are_deterministic_full_specs_with_their_seeds() -> None:
    exp = RLExperiment.model_validate(AB)
    trials = arm_trials(exp)
    assert [t.name for t in trials] == ["lr-ab-high-s7", "lr-ab-high-s8", "lr-ab-low-s7", "lr-ab-low-s8"]
    assert [t.spec.training.seed for t in trials] == [7, 8, 7, 8]
    assert [t.spec.training.learning_rate for t in trials] == [0.003, 0.003, 1e-5, 1e-5]
    assert all(t.spec.training.max_steps == 20 for t in trials)  # the template's, kept
    assert [t.name for t in arm_trials(RLExperiment.model_validate(AB))] == [t.name for t in trials]


def test_long_trial_names_stay_dns_labels_and_distinct() -> None:
    a = trial_name("x" * 50, "control-s12")
    b = trial_name("x" * 49 + "y", "control-s12")
    assert len(a) <= MAX_TRIAL_NAME_LENGTH and a.endswith("control-s12") and a != b
    assert trial_name("Exp_A", "t3") == "exp-a-t3"


def test_a_search_trial_sets_its_parameters_and_keeps_the_template_seed() -> None:
    exp = RLExperiment.model_validate(SEARCH)
    t = search_trial(exp, 4, {"training.learningRate": 0.002, "training.numGenerations": 4})
    assert (t.name, t.seed, t.spec.training.learning_rate, t.spec.training.num_generations) == (
        "lr-ab-t4", 7, 0.002, 4)


# ------------------------------------------------------------------------------- objective


CURVE = [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.5), (5, 0.9)]


def test_objective_reductions() -> None:
    assert objective_value(CURVE, ObjectiveSpec(k=2)) == pytest.approx(0.7)
    assert objective_value(CURVE, ObjectiveSpec(reduce="atStep", step=3)) == pytest.approx(0.3)
    assert objective_value(CURVE[:2], ObjectiveSpec(reduce="atStep", step=3)) == pytest.approx(0.2)
    # Trapezoids: (.15 + .25 + .4 + .7) / 4 steps.
    assert objective_value(CURVE, ObjectiveSpec(reduce="area")) == pytest.approx(1.5 / 4)
    assert objective_value(CURVE, ObjectiveSpec(k=2), upto=3) == pytest.approx(0.25)


def test_objective_handles_missing_and_repeated_data() -> None:
    assert objective_value([], ObjectiveSpec()) is None
    assert objective_value([(2, float("nan"))], ObjectiveSpec()) is None
    assert objective_value([(1, 0.1), (2, 0.2), (2, 0.6)], ObjectiveSpec(k=1)) == 0.6  # a resumed run relogged 2
    assert objective_value([(4, 0.5)], ObjectiveSpec(reduce="area")) == 0.5
    assert objective_value(CURVE, ObjectiveSpec(reduce="atStep", step=1), upto=0) is None


def test_thin_keeps_the_ends() -> None:
    points = [(i, float(i)) for i in range(1000)]
    kept = thin(points, 200)
    assert len(kept) == 200 and kept[0] == (0, 0.0) and kept[-1] == (999, 999.0)


# ----------------------------------------------------------------------------------- stats


def test_interval_is_student_t_and_one_seed_gives_none() -> None:
    iv = mean_ci95([1.0, 2.0, 3.0])
    # t(0.975, 2) = 4.3027; sd 1; sem 1/sqrt(3).
    assert iv.mean == 2.0 and iv.low == pytest.approx(2 - 4.3027 / 3 ** 0.5, abs=1e-3)
    assert iv.high == pytest.approx(2 + 4.3027 / 3 ** 0.5, abs=1e-3)
    one = mean_ci95([0.5])
    assert (one.n, one.mean, one.low, one.high) == (1, 0.5, None, None) and "not enough seeds" in (one.note or "")


def test_welch_separates_clear_differences_only() -> None:
    clear = compare([0.9, 0.92, 0.91], [0.2, 0.25, 0.22], "a", "b")
    assert clear.significant and clear.p_value is not None and clear.p_value < 0.001 and "Welch" in clear.test
    noisy = compare([0.5, 0.9], [0.4, 0.8], "a", "b")
    assert not noisy.significant and noisy.p_value is not None and noisy.p_value > 0.05
    single = compare([0.9], [0.2], "a", "b")
    assert not single.significant and single.p_value is None and "not enough seeds" in single.test


# ---------------------------------------------------------------------------------- search


def finished(number: int, params: dict[str, Any], objective: float) -> TrialStatus:
    return TrialStatus(name=f"t{number}", number=number, seed=7, params=params, phase="Succeeded",
                       objective=objective, curve=[{"step": 1, "value": objective}])


def test_search_asks_the_same_for_the_same_history_and_differs_after_more() -> None:
    exp = RLExperiment.model_validate(SEARCH)
    history = [finished(i, {"training.learningRate": lr, "training.numGenerations": 8}, lr * 50)
               for i, lr in enumerate([1e-4, 3e-3, 1e-5])]
    first = next_params(exp.spec, history)
    assert next_params(exp.spec, history) == first  # a restarted operator asks the same
    assert 1e-5 <= first["training.learningRate"] <= 0.01 and first["training.numGenerations"] in (4, 8)
    more = history + [finished(3, first, 0.1)]
    assert next_params(exp.spec, more) != first


def test_tpe_moves_toward_the_good_region() -> None:
    spec = copy.deepcopy(SEARCH)
    spec["spec"]["search"].update(maxTrials=30, parameters=[SEARCH["spec"]["search"]["parameters"][0]])
    exp = RLExperiment.model_validate(spec)
    history: list[TrialStatus] = []
    for i in range(20):  # objective: higher learning rate is better
        params = next_params(exp.spec, history)
        history.append(finished(i, params, params["training.learningRate"]))
    late = [t.params["training.learningRate"] for t in history[12:] if t.params]
    early = [t.params["training.learningRate"] for t in history[:5] if t.params]
    assert sorted(late)[len(late) // 2] > sorted(early)[len(early) // 2]


def test_search_skips_trials_outside_a_changed_space() -> None:
    exp = RLExperiment.model_validate(SEARCH)
    outside = finished(0, {"training.learningRate": 0.5, "training.numGenerations": 8}, 1.0)
    assert next_params(exp.spec, [outside]) == next_params(exp.spec, [outside.model_copy(update={"params": {}})])


# --------------------------------------------------------------------------------- pruning


def line(slope: float, steps: int) -> list[tuple[int, float]]:
    return [(s, slope * s) for s in range(1, steps + 1)]


RULE = EarlyStoppingSpec(minSteps=4, interval=2, minTrials=2)


def test_median_rule_stops_a_trial_below_the_others_at_a_rung() -> None:
    curves = {"good1": line(0.1, 8), "good2": line(0.09, 6), "bad": line(0.01, 6)}
    d = should_prune("bad", curves, ObjectiveSpec(k=1), RULE, max_steps=20)
    # Stopped at the first rung it was worse at (4), not the last it reached (6).
    assert d is not None and d.step == 4 and d.others == 2 and d.median == pytest.approx(0.38)
    assert should_prune("good2", curves, ObjectiveSpec(k=1), RULE, max_steps=20) is None
    # However late it is looked at, the decision is the same: what a watcher in time would decide.
    for reached in (4, 5, 6):
        late = {**curves, "bad": line(0.01, reached)}
        assert should_prune("bad", late, ObjectiveSpec(k=1), RULE, max_steps=20) == d


def test_median_rule_waits_for_enough_others_and_min_steps() -> None:
    objective = ObjectiveSpec(k=1)
    assert should_prune("bad", {"good": line(0.1, 8), "bad": line(0.01, 8)}, objective, RULE, 20) is None
    early = {"g1": line(0.1, 3), "g2": line(0.1, 3), "bad": line(0.01, 3)}
    assert should_prune("bad", early, objective, RULE, 20) is None  # before minSteps
    assert should_prune("bad", early, objective, None, 20) is None  # no early stopping
    # Minimizing: the lower curve is the good one.
    low = ObjectiveSpec(k=1, direction="minimize")
    assert should_prune("g1", {"g1": line(0.1, 8), "b1": line(0.01, 8), "b2": line(0.02, 8)}, low, RULE, 20)


# ----------------------------------------------------------------------------- leaderboard


def arm_trial(arm: str, seed: int, objective: float, phase: str = "Succeeded") -> TrialStatus:
    return TrialStatus(name=f"lr-ab-{arm}-s{seed}", number=seed, arm=arm, seed=seed, phase=phase,
                       objective=objective, checkpoint=f"/runs/{arm}-{seed}/checkpoint-20")


def test_standings_rank_arms_with_intervals_and_a_tested_winner() -> None:
    exp = RLExperiment.model_validate(AB)
    trials = [arm_trial("low", 7, 0.21), arm_trial("low", 8, 0.19),
              arm_trial("high", 7, 0.83), arm_trial("high", 8, 0.88)]
    s = standings(exp.spec, trials)
    assert [e.name for e in s.leaderboard] == ["high", "low"]
    high = next(a for a in s.arms if a.name == "high")
    assert high.n == 2 and high.ci95_low is not None and high.ci95_low < 0.855 < (high.ci95_high or 0)
    assert s.best is not None and s.best.trial == "lr-ab-high-s8" and s.best.checkpoint == "/runs/high-8/checkpoint-20"
    assert s.winner is not None and s.winner.arm == "high" and s.winner.significant and "Welch" in s.winner.test


def test_no_winner_while_trials_run_and_pruned_trials_are_not_ranked() -> None:
    exp = RLExperiment.model_validate(AB)
    trials = [arm_trial("low", 7, 0.2), arm_trial("low", 8, 0.9, phase="Pruned"),
              arm_trial("high", 7, 0.8), arm_trial("high", 8, 0.5, phase="Running")]
    s = standings(exp.spec, trials)
    assert s.winner is None
    assert next(a for a in s.arms if a.name == "low").n == 1


def test_the_experiments_core_imports_without_torch_kopf_optuna_or_scipy() -> None:
    """The operator image has no torch; optuna and scipy load only when a decision needs them."""
    import subprocess
    import sys

    code = ("import sys, rljob_contract.experiment, rljob_operator.experiments.trials, "
            "rljob_operator.experiments.leaderboard, rljob_operator.experiments.pruning, "
            "rljob_operator.experiments.search, rljob_operator.experiments.stats; "
            "print(sorted(m for m in ('torch', 'kopf', 'optuna', 'scipy', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ------------------------------------------------------------------- the local runner's parts


def test_runner_reads_only_whole_metric_lines_and_keeps_the_last_of_a_step(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs: the runner need not import torch to count them
    import subprocess
    from pathlib import Path

    from rljob.experiment import LocalRunner, RunningTrial

    exp = RLExperiment.model_validate(AB)
    runner = LocalRunner(exp, Path(tmp_path), parallel=1)
    trial = arm_trials(exp)[0]
    status = TrialStatus(name=trial.name, number=0, seed=7, arm="high", phase="Running")
    proc = subprocess.Popen(["true"])
    proc.wait()
    rt = RunningTrial(trial, status, proc, Path(tmp_path), Path(tmp_path) / "log", 0.0)
    log = Path(tmp_path) / "metrics.jsonl"
    log.write_text('{"step": 1, "reward": 0.1}\n{"step": 2, "reward": 0.2}\n{"step": 2, "rew')
    runner.read_metrics(rt)
    assert [(p.step, p.value) for p in status.curve] == [(1, 0.1), (2, 0.2)] and status.steps == 2
    with log.open("a") as f:  # the rest of the line arrives; a resumed run logs step 2 again
        f.write('ard": 0.25}\n{"step": 3, "loss": 1.0}\n')
    runner.read_metrics(rt)
    assert [(p.step, p.value) for p in status.curve] == [(1, 0.1), (2, 0.25)] and status.steps == 3
    assert status.objective == pytest.approx((0.1 + 0.25) / 2)


def test_leaderboard_table_and_curves_from_a_status(tmp_path: Any) -> None:
    from pathlib import Path

    from rljob_contract.experiment import CurvePoint, RLExperimentStatus

    from rljob.experiment import leaderboard_table, plot_curves

    exp = RLExperiment.model_validate(AB)
    trials = [arm_trial("low", 7, 0.21), arm_trial("low", 8, 0.19),
              arm_trial("high", 7, 0.83), arm_trial("high", 8, 0.88)]
    for t in trials:
        t.curve = [CurvePoint(step=s, value=(t.objective or 0) * s / 3) for s in (1, 2, 3)]
    s = standings(exp.spec, trials)
    status = RLExperimentStatus(trials=trials, arms=s.arms, leaderboard=s.leaderboard, best=s.best, winner=s.winner)
    table = leaderboard_table(exp, status)
    assert table.splitlines()[1].split()[:4] == ["1", "high", "2", "0.8550"]
    assert "winner: high: high is significantly better than low" in table
    png = Path(tmp_path) / "curves.png"
    plot_curves(exp, status, png)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000


def test_trials_at_once_fit_the_gpus_or_cpus_and_never_share_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob.experiment import default_parallel, gpu_slots, visible_gpus

    exp = RLExperiment.model_validate(with_spec(AB, template={"workers": {"procsPerWorker": 2}}))
    assert default_parallel(exp, ["0", "1", "2", "3", "4"]) == 2  # 2 processes a trial: 5 GPUs hold 2
    assert default_parallel(exp, []) >= 1
    assert gpu_slots(["0", "1", "2", "3"], 2, 2) == ["0,1", "2,3"]
    assert gpu_slots(["0", "1", "2"], 2, 2) == [None, None]  # do not go round: each trial sees all
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus() == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_trials_at_once_share_the_cores_instead_of_each_taking_them_all() -> None:
    from rljob.experiment import cpu_threads, trial_env

    assert cpu_threads(2, 1, 2) == 1  # two one-process trials on 2 cores: a core each
    assert cpu_threads(16, 2, 2) == 4
    assert cpu_threads(2, 2, 2) == 1  # never fewer than one
    assert cpu_threads(8, 1, 1) is None  # alone: torch's default, every core
    env = trial_env({"PATH": "/bin"}, "2,3", 4)
    assert env == {"PATH": "/bin", "RLJOB_PROGRESS": "0", "CUDA_VISIBLE_DEVICES": "2,3", "OMP_NUM_THREADS": "4"}
    assert trial_env({"OMP_NUM_THREADS": "6"}, None, 1)["OMP_NUM_THREADS"] == "6"  # the user's setting stays
    assert "OMP_NUM_THREADS" not in trial_env({}, None, None) and "CUDA_VISIBLE_DEVICES" not in trial_env({}, None, 1)


def test_record_point_grows_a_bounded_curve_and_follows_the_objective() -> None:
    from rljob_contract.experiment import MAX_CURVE_POINTS
    from rljob_operator.experiments.objective import record_point

    trial = TrialStatus(name="t0", number=0, seed=0)
    for step in range(1, 301):
        trial = record_point(trial, step, step / 300, ObjectiveSpec(k=1))
    assert len(trial.curve) == MAX_CURVE_POINTS and trial.curve[-1].step == 300
    assert trial.steps == 300 and trial.objective == pytest.approx(1.0)
    trial = record_point(trial, 301, float("nan"), ObjectiveSpec(k=1))
    assert trial.steps == 301 and trial.objective == pytest.approx(1.0)


def test_summary_json_is_the_experiment_with_its_status(tmp_path: Any) -> None:
    from pathlib import Path

    from rljob_contract.experiment import RLExperimentStatus

    from rljob.experiment import write_outputs

    exp = RLExperiment.model_validate(AB)
    trials = [arm_trial("low", 7, 0.2), arm_trial("high", 7, 0.8)]
    s = standings(exp.spec, trials)
    write_outputs(exp, RLExperimentStatus(phase="Succeeded", trials=trials, arms=s.arms, leaderboard=s.leaderboard,
                                          best=s.best), Path(tmp_path))
    document = json.loads((Path(tmp_path) / "summary.json").read_text())
    again = RLExperiment.model_validate(document)  # it reads back as an RLExperiment, status and all
    assert again.status is not None and again.status.best is not None and again.status.best.trial == "lr-ab-high-s7"
    assert document["status"]["arms"][0]["note"].startswith("not enough seeds")
    assert (Path(tmp_path) / "reward_curves.png").exists()


@pytest.mark.parametrize("name", ["ab-learning-rate.yaml", "search-learning-rate.yaml"])
def test_the_example_experiments_are_valid(name: str) -> None:
    from pathlib import Path

    from rljob_contract.experiment import load_experiment

    exp = load_experiment(Path(__file__).resolve().parents[2] / "examples" / "experiments" / name)
    assert exp.spec.total_trials == 6
