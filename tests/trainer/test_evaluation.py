"""Evaluation on held-out data (#33), the pure parts: the field, the held-out split, the metrics."""

from __future__ import annotations

import math
from typing import Any

import datasets
import pytest
from rljob_contract.job import ManifestError, parse_job
from rljob_contract.spec import EvaluationSpec, RewardSpec
from rljob_trainer.builtin.tasks import builtin_rows
from rljob_trainer.data import split_held_out, training_and_eval_prompts
from rljob_trainer.errors import PermanentError
from rljob_trainer.evaluation import EvalSet, Scorer, eval_summary, pass_at_k

from tests.support.trainer import deep_update, quickstart_doc


def job_with(evaluation: dict[str, Any]) -> dict[str, Any]:
    return deep_update(quickstart_doc(), {"spec": {"training": {"evaluation": evaluation}}})


def problems(evaluation: dict[str, Any]) -> str:
    with pytest.raises(ManifestError) as e:
        parse_job(job_with(evaluation), "job.yaml")
    return str(e.value)


@pytest.mark.parametrize(("evaluation", "expected"), [
    ({"everySteps": 0, "heldOutFraction": 0.2}, "spec.training.evaluation.everySteps: Input should be greater"),
    ({}, "spec.training.evaluation.heldOutFraction: set dataset or heldOutFraction (exactly one)"),
    ({"heldOutFraction": 0.2, "dataset": {"name": "x.jsonl"}},
     "spec.training.evaluation.heldOutFraction: set dataset or heldOutFraction"),
    ({"heldOutFraction": 1.0}, "spec.training.evaluation.heldOutFraction: Input should be less than 1"),
    ({"heldOutFraction": 0.2, "numGenerations": 4},
     "spec.training.evaluation.numGenerations: greedy decoding makes one completion per prompt"),
    ({"heldOutFraction": 0.2, "decoding": "sampled", "numGenerations": 4, "passAtK": [8]},
     "spec.training.evaluation.passAtK: k=8 is more than numGenerations (4)"),
    ({"heldOutFraction": 0.2, "passAtK": [1]}, "spec.training.evaluation.passAtK: pass@k needs decoding: sampled"),
    ({"heldOutFraction": 0.2, "decoding": "beam"}, "spec.training.evaluation.decoding: Input should be 'greedy'"),
    ({"heldOutFraction": 0.2, "metrics": [{"name": "blue"}]},
     "spec.training.evaluation.metrics[0].name: unknown built-in reward or metric 'blue'"),
    ({"heldOutFraction": 0.2, "metrics": [{"name": "bleu", "kwargs": {"n": 2}}]},
     "spec.training.evaluation.metrics[0].kwargs: the text metric bleu takes no kwargs"),
    ({"heldOutFraction": 0.2, "metrics": [{"name": "exact_match", "kwargs": {"prefx": True}}]},
     "spec.training.evaluation.metrics[0].kwargs.prefx: not an option of the built-in reward exact_match"),
    ({"heldOutFraction": 0.2, "metrics": [{"name": "bleu"}, {"name": "bleu"}]},
     "spec.training.evaluation.metrics: two metrics have the same name"),
    ({"heldOutFraction": 0.2, "maxPrompt": 3}, "spec.training.evaluation.maxPrompt: unknown field"),
    ({"dataset": {"name": "builtin:nope"}}, "spec.training.evaluation.dataset.name: unknown built-in dataset"),
])
def test_bad_evaluation_specs_are_refused_naming_the_field(evaluation: dict[str, Any], expected: str) -> None:
    assert expected in problems(evaluation)


def test_good_evaluation_specs_are_accepted_with_greedy_defaults() -> None:
    job = parse_job(job_with({"heldOutFraction": 0.25, "everySteps": 10,
                              "metrics": [{"name": "exact_match", "kwargs": {"prefix": True}}, {"name": "rougeL"},
                                          {"name": "tests.trainer.test_evaluation:first_char"}]}), "job.yaml")
    evaluation = job.spec.training.evaluation
    assert evaluation is not None and evaluation.decoding == "greedy" and evaluation.num_generations == 1
    assert [m.label() for m in evaluation.metrics] == ["exact_match", "rougeL", "first_char"]
    sampled = parse_job(job_with({"dataset": {"name": "data/test.jsonl"}, "decoding": "sampled",
                                  "numGenerations": 4, "passAtK": [1, 4]}), "job.yaml")
    assert sampled.spec.training.evaluation is not None
    # Without the section nothing is evaluated (the quickstart's default run is unchanged).
    assert parse_job(quickstart_doc(), "job.yaml").spec.training.evaluation is None


def test_metrics_default_to_the_training_rewards() -> None:
    spec = EvaluationSpec(held_out_fraction=0.2)
    rewards = [RewardSpec(name="repeat_char", kwargs={"length": 6}), RewardSpec(name="length_penalty")]
    assert [(m.name, m.kwargs) for m in spec.metric_specs(rewards)] == [
        ("repeat_char", {"length": 6}), ("length_penalty", {})]


def rows_dataset(rows: list[dict[str, str]]) -> datasets.Dataset:
    return datasets.Dataset.from_list(rows)


def test_held_out_split_never_shares_a_prompt_and_is_deterministic() -> None:
    ds = rows_dataset(builtin_rows("builtin:add-digits", 2000, seed=3))
    train, held = split_held_out(ds, 0.2, seed=7)
    train_prompts, held_prompts = set(train["prompt"]), set(held["prompt"])
    assert not train_prompts & held_prompts
    assert len(train) + len(held) == len(ds)
    distinct = len(set(ds["prompt"]))
    assert len(held_prompts) == round(0.2 * distinct)
    # The same prompts again, whatever the row order; another seed holds out others.
    again_train, again_held = split_held_out(ds.shuffle(seed=1), 0.2, seed=7)
    assert set(again_held["prompt"]) == held_prompts and set(again_train["prompt"]) == train_prompts
    assert set(split_held_out(ds, 0.2, seed=8)[1]["prompt"]) != held_prompts


def test_held_out_split_keeps_at_least_one_prompt_each_side_and_refuses_one_prompt() -> None:
    ds = rows_dataset(builtin_rows("builtin:repeat-char", 300, seed=0))  # 6 distinct prompts
    train, held = split_held_out(ds, 0.01, seed=0)
    assert len(set(held["prompt"])) == 1 and len(set(train["prompt"])) == 5
    train, held = split_held_out(ds, 0.99, seed=0)
    assert len(set(train["prompt"])) == 1 and len(set(held["prompt"])) == 5
    with pytest.raises(PermanentError, match="spec.training.evaluation.heldOutFraction: .*1 distinct"):
        split_held_out(rows_dataset([{"prompt": "aaaaaa"}] * 4), 0.5, seed=0)


def test_training_never_sees_a_held_out_prompt_and_max_prompts_caps_the_eval_set(tmp_path: Any) -> None:
    job = parse_job(deep_update(job_with({"heldOutFraction": 0.3, "maxPrompts": 50}),
                                {"spec": {"training": {"dataset": {"name": "builtin:add-digits", "size": 1000}}}}),
                    "job.yaml")
    train, held = training_and_eval_prompts(job.spec.training, str(tmp_path))
    assert len(held) == 50
    assert not set(train["prompt"]) & set(held["prompt"])
    assert set(train.column_names) == {"prompt", "answer"} == set(held.column_names)


def first_char(prompts: Any, completions: Any, **_: Any) -> list[float]:
    """A custom metric resolved by module, as a custom training reward is."""
    return [1.0 if c[:1] == p[:1] else 0.0 for p, c in zip(prompts, completions, strict=True)]


def test_exact_match_is_accuracy_and_a_custom_function_resolves_by_module() -> None:
    spec = EvaluationSpec.model_validate({"heldOutFraction": 0.2, "metrics": [
        {"name": "exact_match"}, {"name": "tests.trainer.test_evaluation:first_char"}]})
    data = EvalSet(prompts=["1+1=", "2+2=", "3+3=", "4+4="], columns={"answer": ["2", "4", "6", "8"]})
    values = Scorer(spec, []).score(data, [["2"], ["4"], ["5"], [" 8 "]])
    assert values == {"eval/exact_match": 0.75, "eval/first_char": 0.0}


def test_bleu_and_rouge_are_the_libraries_values() -> None:
    import sacrebleu
    from rouge_score import rouge_scorer

    hyps = ["the cat sat on the mat", "a dog barked loudly at night"]
    refs = ["the cat sat on a mat", "the dog barked at night"]
    spec = EvaluationSpec.model_validate({"heldOutFraction": 0.2, "metrics": [
        {"name": "bleu"}, {"name": "rouge1"}, {"name": "rougeL"}]})
    values = Scorer(spec, []).score(EvalSet(prompts=["p1", "p2"], columns={"answer": refs}), [[h] for h in hyps])
    assert values["eval/bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert 10 < values["eval/bleu"] < 100  # a partial match: neither nothing nor everything
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    want = sum(scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs, strict=True)) / 2
    assert values["eval/rougeL"] == pytest.approx(want)
    assert values["eval/rouge1"] > values["eval/rougeL"] * 0.99 and values["eval/rouge1"] < 1.0
    perfect = Scorer(spec, []).score(EvalSet(prompts=["p1", "p2"], columns={"answer": refs}), [[r] for r in refs])
    assert perfect == {"eval/bleu": pytest.approx(100.0), "eval/rouge1": 1.0, "eval/rougeL": 1.0}


def test_a_text_metric_without_its_reference_column_names_reference_field() -> None:
    spec = EvaluationSpec.model_validate({"heldOutFraction": 0.2, "referenceField": "target",
                                          "metrics": [{"name": "bleu"}]})
    with pytest.raises(PermanentError, match=r"spec.training.evaluation.referenceField: column 'target'"):
        Scorer(spec, []).score(EvalSet(prompts=["p"], columns={"answer": ["a"]}), [["a"]])


def test_an_unimportable_metric_names_its_field() -> None:
    spec = EvaluationSpec.model_validate({"heldOutFraction": 0.2, "metrics": [
        {"name": "bleu"}, {"name": "no_such_module:fn"}]})
    with pytest.raises(PermanentError, match=r"spec.training.evaluation.metrics\[1\].name: cannot import"):
        Scorer(spec, [])


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    spec = EvaluationSpec.model_validate({"heldOutFraction": 0.2, "decoding": "sampled", "numGenerations": 4,
                                          "passAtK": [1, 2], "metrics": [{"name": "exact_match"}]})
    data = EvalSet(prompts=["a", "b"], columns={"answer": ["x", "y"]})
    values = Scorer(spec, []).score(data, [["x", "z", "z", "z"], ["q", "q", "q", "q"]])
    assert values == {"eval/exact_match": 0.125, "eval/exact_match/pass_at_1": pytest.approx(0.125),
                      "eval/exact_match/pass_at_2": pytest.approx(0.25)}


def test_summary_keeps_latest_and_best_with_its_step() -> None:
    history = [{"step": 1, "reward": 0.1, "loss": 0.0}, {"step": 0, "eval/acc": 0.0},
               {"step": 10, "eval/acc": 0.8}, {"step": 20, "eval/acc": 0.8}, {"step": 30, "eval/acc": 0.5}]
    summary = eval_summary(history, "eval/acc")
    assert summary is not None
    assert summary["latest"] == {"step": 30, "eval/acc": 0.5}
    assert summary["best"] == {"step": 20, "eval/acc": 0.8}  # the newer of equals, as keepBest picks
    assert [h["step"] for h in summary["history"]] == [0, 10, 20, 30]
    assert eval_summary([{"step": 1, "reward": 0.1}], "eval/acc") is None


class RecordingHeartbeat:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.evaluation: dict[str, Any] | None = None

    def send(self, **body: Any) -> None:
        self.sent.append(body)


def test_a_scrape_never_shows_one_evaluations_step_with_anothers_values() -> None:
    """A scrape that arrives while an evaluation is being recorded waits for all of it: it showed the new
    step with the old values (a race a test's scrape loop once caught)."""
    import threading

    from prometheus_client.parser import text_string_to_metric_families
    from rljob_trainer.telemetry import TrainerMetrics

    metrics = TrainerMetrics()
    metrics.observe_eval(40, {"eval/exact_match": 0.25})
    scraped: list[str] = []

    def scrape() -> None:
        body = metrics.app({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, lambda status, headers: None)
        scraped.append(b"".join(body).decode())

    real_set = metrics.eval_step.set
    scraper = threading.Thread(target=scrape)

    def set_step_then_scrape(value: float) -> None:  # a scrape between the step and the values
        real_set(value)
        scraper.start()
        scraper.join(timeout=0.5)
        assert scraper.is_alive(), "the scrape did not wait for the evaluation"

    metrics.eval_step.set = set_step_then_scrape  # type: ignore[method-assign]
    metrics.observe_eval(80, {"eval/exact_match": 0.5})
    scraper.join(timeout=5)
    samples = {s.name: s.value for f in text_string_to_metric_families(scraped[0]) for s in f.samples}
    assert (samples["rljob_trainer_eval_step"], samples["rljob_trainer_eval"]) == (80, 0.5), samples


def test_an_evaluation_is_reported_to_every_sink_and_the_heartbeat_validates(tmp_path: Any) -> None:
    from rljob_contract.pod import HeartbeatBody
    from rljob_trainer.evaluation import EvalReporter
    from rljob_trainer.telemetry import TrainerMetrics

    metrics, heartbeat, history = TrainerMetrics(), RecordingHeartbeat(), [{"step": 3, "reward": 0.5}]
    reporter = EvalReporter(metrics, heartbeat, tmp_path / "metrics.jsonl", str(tmp_path / "tb"), "eval/exact_match")
    reporter.report(4, {"eval/exact_match": 0.75, "eval/exact_match/pass_at_2": 0.9, "eval/rougeL": math.nan},
                    history)
    assert history[-1] == {"step": 4, "eval/exact_match": 0.75, "eval/exact_match/pass_at_2": 0.9,
                           "eval/rougeL": history[-1]["eval/rougeL"]}
    assert '"eval/exact_match": 0.75' in (tmp_path / "metrics.jsonl").read_text()
    assert metrics.eval.labels(metric="exact_match/pass_at_2")._value.get() == 0.9
    assert metrics.eval_step._value.get() == 4
    (body,) = heartbeat.sent
    assert body["step"] == 4 and body["metrics"] == {"eval/exact_match": 0.75, "eval/exact_match/pass_at_2": 0.9}
    HeartbeatBody(**body)  # what the status API accepts (names of letters, digits and _ . : / -)
    # The heartbeats from now on carry the latest evaluation and the best so far (the job's status shows them).
    reporter.report(8, {"eval/exact_match": 0.5, "eval/rougeL": 0.25}, history)
    report = HeartbeatBody(step=8, evaluation=heartbeat.evaluation).wire()["evaluation"]
    assert report == {"metric": "eval/exact_match", "step": 8, "values": {"eval/exact_match": 0.5, "eval/rougeL": 0.25},
                      "best_step": 4, "best_value": 0.75}
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_a_long_evaluation_keeps_sending_heartbeats() -> None:
    from rljob_trainer.evaluation import HeartbeatTicker

    heartbeat = RecordingHeartbeat()
    tick = HeartbeatTicker(heartbeat, step=40, interval=0.0)
    tick()
    tick()
    assert [b["step"] for b in heartbeat.sent] == [40, 40]
    quiet = HeartbeatTicker(heartbeat, step=41, interval=3600.0)
    quiet()
    assert len(heartbeat.sent) == 2  # at most one per interval


EVAL_SECTION = {"heldOutFraction": 0.2, "everySteps": 10, "metrics": [{"name": "exact_match"}, {"name": "rougeL"}]}


@pytest.mark.parametrize(("checkpoint", "evaluation", "expected"), [
    ({"bestMetric": "eval/exact_match", "keepBest": 1}, None,
     "spec.checkpoint.bestMetric: 'eval/exact_match' is an evaluation metric, but spec.training.evaluation is not set"),
    ({"bestMetric": "eval/bleu", "keepBest": 1}, EVAL_SECTION,
     "spec.checkpoint.bestMetric: 'eval/bleu' is not logged by spec.training.evaluation; it logs eval/exact_match, "
     "eval/rougeL"),
    ({"bestMetric": "eval/rougeL", "keepBest": 1}, EVAL_SECTION, None),
    ({"bestMetric": "reward", "keepBest": 1}, None, None),
])
def test_keep_best_may_rank_by_an_evaluation_metric_that_is_logged(checkpoint: dict[str, Any],
                                                                    evaluation: dict[str, Any] | None,
                                                                    expected: str | None) -> None:
    doc = deep_update(quickstart_doc(), {"spec": {"checkpoint": checkpoint}})
    if evaluation is not None:
        doc = deep_update(doc, {"spec": {"training": {"evaluation": evaluation}}})
    if expected is None:
        parse_job(doc, "job.yaml")
    else:
        with pytest.raises(ManifestError, match=expected.replace("(", r"\(")):
            parse_job(doc, "job.yaml")


def experiment_doc(metric: str, evaluation: dict[str, Any] | None) -> dict[str, Any]:
    import yaml

    from tests.support.trainer import REPO

    doc = yaml.safe_load((REPO / "examples" / "experiments" / "ab-learning-rate.yaml").read_text())
    doc["spec"]["objective"] = {"metric": metric, "reduce": "lastMean", "k": 1}
    if evaluation is not None:
        doc["spec"]["template"]["training"]["evaluation"] = evaluation
    return doc


def test_an_experiment_objective_may_be_an_evaluation_metric_of_its_template() -> None:
    from rljob_contract.experiment import parse_experiment

    parse_experiment(experiment_doc("eval/exact_match", EVAL_SECTION), "x.yaml")
    with pytest.raises(ManifestError, match=r"spec.objective.metric: 'eval/exact_match' is an evaluation metric"):
        parse_experiment(experiment_doc("eval/exact_match", None), "x.yaml")


def test_an_eval_objective_reads_the_eval_lines_of_metrics_jsonl_and_the_eval_points_of_the_status_curve() -> None:
    from rljob_contract.experiment import ObjectiveSpec
    from rljob_operator.decisions.curve import curve_point, merge_curve, series
    from rljob_operator.experiments.objective import curve_from_logs, objective_value

    # metrics.jsonl as rank 0 writes it: training lines every step, an evaluation line every 10 (#33).
    records = [{"step": s, "reward": s / 30, "loss": 0.1} for s in range(1, 31)]
    records += [{"step": s, "eval/exact_match": s / 40} for s in (0, 10, 20, 30)]
    objective = ObjectiveSpec(metric="eval/exact_match", reduce="lastMean", k=2)
    curve = curve_from_logs(sorted(records, key=lambda r: r["step"]), "eval/exact_match")
    assert curve == [(0, 0.0), (10, 0.25), (20, 0.5), (30, 0.75)]
    assert objective_value(curve, objective) == pytest.approx(0.625)
    # The status curve: each evaluation's heartbeat precedes the training heartbeat of its step; they merge.
    points = []
    for s in range(0, 31):
        if s % 10 == 0:
            points.append(curve_point(s, metrics={"eval/exact_match": s / 40}))
        if s:
            points.append(curve_point(s, reward=s / 30, loss=0.1))
    status_curve = merge_curve([], [p for p in points if p is not None])
    assert series(status_curve, "eval/exact_match") == curve
    assert series(status_curve, "reward")[-1] == (30, 1.0)


def test_rljob_evaluate_dataset_replaces_the_manifests_prompts_and_keeps_its_metrics() -> None:
    from rljob_trainer.checkpoints.evaluate import with_dataset

    job = parse_job(job_with({"heldOutFraction": 0.2, "maxPrompts": 7, "metrics": [{"name": "rougeL"}]}), "job.yaml")
    cfg = with_dataset(job.trainer_config(output_dir="."), "data/test.jsonl", None)
    evaluation = cfg.training.evaluation
    assert evaluation is not None and evaluation.held_out_fraction is None
    assert evaluation.dataset is not None and evaluation.dataset.name == "data/test.jsonl"
    assert evaluation.max_prompts == 7 and [m.name for m in evaluation.metrics] == ["rougeL"]
    # A manifest without evaluation: --dataset alone is enough (the training rewards are the metrics) ...
    plain = parse_job(quickstart_doc(), "job.yaml").trainer_config(output_dir=".")
    alone = with_dataset(plain, "squad", "validation").training.evaluation
    assert alone is not None and alone.dataset is not None and alone.dataset.split == "validation"
    # ... and without either there is nothing to evaluate on.
    with pytest.raises(PermanentError, match="spec.training.evaluation: the manifest has no evaluation section"):
        with_dataset(plain, None, None)


def test_conversational_prompts_give_reward_metrics_message_completions_as_training_does() -> None:
    seen: list[Any] = []

    spec = EvaluationSpec.model_validate({"heldOutFraction": 0.2, "metrics": [{"name": "exact_match"}]})
    scorer = Scorer(spec, [])
    fn = scorer.rewards["exact_match"]
    scorer.rewards["exact_match"] = lambda **kw: seen.append(kw["completions"]) or fn(**kw)
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}]]
    values = scorer.score(EvalSet(prompts=prompts, columns={"answer": ["2", "4"]}), [["2"], ["5"]])
    assert values == {"eval/exact_match": 0.5}
    assert seen == [[[{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "5"}]]]


def test_the_evaluation_section_survives_the_configmap_round_trip(tmp_path: Any) -> None:
    from rljob_contract.job import load_job
    from rljob_contract.pod import dump_config, load_config

    from tests.support.trainer import REPO

    cfg = load_job(REPO / "examples" / "held-out.yaml").trainer_config(output_dir="/workspace/output")
    (tmp_path / "trainer.yaml").write_text(dump_config(cfg))
    again = load_config(tmp_path / "trainer.yaml")
    assert again == cfg and again.training.evaluation is not None
    assert again.training.evaluation.metrics[0].kwargs == {"prefix": True}


def held_out_ab(**spec: Any) -> dict[str, Any]:
    """examples/experiments/ab-held-out.yaml (evaluation every 20 steps of 80, objective eval/exact_match)."""
    import yaml

    from tests.support.trainer import REPO

    doc = yaml.safe_load((REPO / "examples" / "experiments" / "ab-held-out.yaml").read_text())
    return deep_update(doc, {"spec": spec})


@pytest.mark.parametrize(("spec", "expected"), [
    ({"earlyStopping": {"minSteps": 20, "interval": 20}}, None),
    ({"earlyStopping": {"minSteps": 20, "rungs": [20, 60]}}, None),
    ({"earlyStopping": {"minSteps": 20, "rungs": [20, 30]}},
     "spec.earlyStopping.rungs: rung 30 is not a step where eval/exact_match is logged (spec.template.training."
     "evaluation runs at everySteps 20: steps 20, 40, …); with an eval/ objective every rung must be a multiple of "
     "spec.template.training.evaluation.everySteps (in template)"),
    ({"earlyStopping": {"minSteps": 20, "interval": 10}}, "spec.earlyStopping.interval: rung 30 is not a step"),
    ({"earlyStopping": {}}, "spec.earlyStopping.minSteps: rung 10 is not a step"),  # minSteps 10, every 10
    ({"earlyStopping": {"minSteps": 20, "interval": 20},
      "template": {"training": {"evaluation": {"everySteps": None}}}},
     "spec.earlyStopping.interval: rung 20 is not a step where eval/exact_match is logged (spec.template.training."
     "evaluation runs at no everySteps: only before the first step and at the end)"),
    ({"earlyStopping": {"minSteps": 20, "interval": 20},
      "arms": [{"name": "a"}, {"name": "b", "overrides": {"training": {"evaluation": {"everySteps": 15}}}}]},
     "spec.earlyStopping.interval: rung 20 is not a step where eval/exact_match is logged (spec.template.training."
     "evaluation runs at everySteps 15: steps 15, 30, …); with an eval/ objective every rung must be a multiple of "
     "spec.template.training.evaluation.everySteps (in arm b)"),
    # Rungs anywhere for a training metric (logged every step), or without early stopping.
    ({"earlyStopping": {"minSteps": 5, "interval": 7}, "objective": {"metric": "reward"}}, None),
    ({"earlyStopping": None, "template": {"training": {"evaluation": {"everySteps": None}}}}, None),
])
def test_pruning_on_an_eval_objective_needs_every_rung_to_be_an_evaluation_step(spec: dict[str, Any],
                                                                                 expected: str | None) -> None:
    from rljob_contract.experiment import parse_experiment

    doc = held_out_ab(**spec)
    if expected is None:
        parse_experiment(doc, "x.yaml")
        return
    with pytest.raises(ManifestError) as e:
        parse_experiment(doc, "x.yaml")
    assert any(p.startswith(expected) for p in e.value.problems), e.value.problems


#: Held-out accuracy (eval/exact_match) of the two arms of examples/experiments/ab-held-out.yaml, as
#: rljob experiment logged it (seed 0, CPU): the same untrained model, then the gamed arm collapses.
HONEST = [(0, 0.234375), (20, 0.140625), (40, 0.203125), (60, 0.390625), (80, 0.59375)]
GAMEABLE = [(0, 0.234375), (20, 0.03125), (40, 0.0), (60, 0.0)]


def test_the_median_rule_on_an_eval_objective_judges_the_evaluation_logged_at_the_rung() -> None:
    from rljob_contract.experiment import EarlyStoppingSpec, ObjectiveSpec
    from rljob_operator.experiments.pruning import should_prune

    objective = ObjectiveSpec(metric="eval/exact_match", reduce="lastMean", k=1)
    rule = EarlyStoppingSpec(minSteps=20, interval=20, minTrials=1)
    curves = {"honest": HONEST, "gameable": GAMEABLE}
    decision = should_prune("gameable", curves, objective, rule, max_steps=80)
    assert decision is not None and (decision.step, decision.value, decision.median) == (20, 0.03125, 0.140625)
    assert should_prune("honest", curves, objective, rule, max_steps=80) is None
    # Only curves that reached the rung count: before its evaluation at 20 the gamed arm is not judged
    # (its baseline at step 0 is no verdict), however many training steps it has logged meanwhile.
    assert should_prune("gameable", {**curves, "gameable": GAMEABLE[:1]}, objective, rule, 80) is None
    # A rung that is not an evaluation step (refused at apply time, see above) would be judged by the
    # latest evaluation before it, once the curve has passed it: rung 10 by the untrained baseline, a tie.
    loose = EarlyStoppingSpec(minSteps=10, interval=10, minTrials=1)
    assert should_prune("gameable", {**curves, "gameable": GAMEABLE[:2]}, objective, loose, 80) == decision
