"""Every rule of the contract, case by case: a document that breaks it and one that keeps it.

The models' side is checked here; ``tests/contract/test_rules_cluster.py`` sends the same documents to a real API
server and checks that its CEL agrees (refused with the rule's message / accepted).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from pydantic import ValidationError
from rljob_contract import experiment, job, runtime, spec, trl_rules
from rljob_contract.experiment import parse_experiment
from rljob_contract.job import ManifestError, parse_job
from rljob_contract.plugins.algorithms import ALGORITHMS
from rljob_contract.rules import Rule, cel_rules
from rljob_contract.runtime import parse_runtime
from rljob_contract.spec import TrainingSpec
from rljob_operator import crd

from tests.support.operator_process import job_manifest, runtime_manifest
from tests.support.trainer import deep_update

#: Every rule list, as crd.py reads them.
JOB_RULES: list[Rule] = [*job.ROOT_RULES, *job.SPEC_RULES, *spec.LORA_RULES, *job.WORKER_RULES, *spec.TRAINING_RULES,
                         *spec.EVALUATION_RULES, *spec.dataset_rules("spec.training.evaluation.dataset"),
                         *spec.EVAL_METRIC_RULES, *spec.dataset_rules("spec.training.dataset"), *spec.REWARD_RULES,
                         *spec.REWARD_SOURCE_RULES]
RUNTIME_RULES: list[Rule] = [*runtime.LIMIT_RULES, *spec.CHECKPOINT_RULES, *spec.MIRROR_RULES]
NAMESPACED_RULES: list[Rule] = list(runtime.NAMESPACED_RULES)
EXPERIMENT_RULES: list[Rule] = [*experiment.EXPERIMENT_ROOT_RULES, *experiment.EXPERIMENT_RULES,
                                *experiment.PARAMETER_RULES, *experiment.OBJECTIVE_RULES]

HELD_OUT = {"heldOutFraction": 0.2}
ELASTIC = {"minReplicas": 1, "maxReplicas": 4}

#: Rule name → (patch of the job's spec that breaks it, one that keeps it). The job: 2 workers × 1
#: process, batchSize 4, numGenerations 4 (a generation batch of 8).
JOB_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "spec.training.numGenerations: whole groups": ({"training": {"numGenerations": 3}}, {"training": {"numGenerations": 8}}),
    "spec.training.generationBatchSize: whole steps": ({"training": {"generationBatchSize": 12}},
                                                       {"training": {"generationBatchSize": 16}}),
    "spec.training.generationBatchSize: whole groups": ({"training": {"generationBatchSize": 8, "numGenerations": 16}},
                                                        {"training": {"generationBatchSize": 16, "numGenerations": 16}}),
    "spec.training.generationBatchSize: not elastic": ({"workers": ELASTIC, "training": {"generationBatchSize": 16}},
                                                       {"workers": ELASTIC, "training": {"stepsPerGeneration": 1}}),
    "spec.training.stepsPerGeneration: whole groups": ({"training": {"stepsPerGeneration": 1, "numGenerations": 16}},
                                                       {"training": {"stepsPerGeneration": 2, "numGenerations": 16}}),
    "spec.training.stepsPerGeneration: whole groups when elastic": (
        {"workers": ELASTIC, "training": {"stepsPerGeneration": 1, "numGenerations": 8}},
        {"workers": ELASTIC, "training": {"stepsPerGeneration": 2, "numGenerations": 8}}),
    # A generation window of 2 × 16 / 8 = 4 micro-batches (= optimizer steps here): the CEL's
    # generationBatchSize and num_iterations branches (the stepsPerGeneration one: test_windows below).
    "spec.checkpoint.everySteps: whole generation windows": (
        {"training": {"generationBatchSize": 16, "trl": {"num_iterations": 2}}, "checkpoint": {"everySteps": 6}},
        {"training": {"generationBatchSize": 16, "trl": {"num_iterations": 2}}, "checkpoint": {"everySteps": 8}}),
    "spec.checkpoint.bestMetric: eval/ needs evaluation": (
        {"checkpoint": {"bestMetric": "eval/exact_match"}},
        {"checkpoint": {"bestMetric": "eval/exact_match"},
         "training": {"evaluation": {**HELD_OUT, "metrics": [{"name": "exact_match"}]}}}),
    "spec.workers: Capacity needs bounds": ({"autoscaling": {"policy": "Capacity"}},
                                            {"autoscaling": {"policy": "Capacity"}, "workers": ELASTIC}),
    "spec.workers: minReplicas ≤ maxReplicas": ({"workers": {"minReplicas": 4, "maxReplicas": 2}},
                                               {"workers": {"minReplicas": 2, "maxReplicas": 4}}),
    "spec.workers.resources.requests: cpu and memory only": (
        {"workers": {"resources": {"requests": {"nvidia.com/gpu": "1"}}}},
        {"workers": {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}}),
    "spec.workers.resources.limits: cpu and memory only": ({"workers": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}},
                                                           {"workers": {"resources": {"limits": {"cpu": "1"}}}}),
    "spec.workers.resources.requests: quantities": ({"workers": {"resources": {"requests": {"memory": "lots"}}}},
                                                    {"workers": {"resources": {"requests": {"memory": "16Gi"}}}}),
    "spec.workers.resources.limits: quantities": ({"workers": {"resources": {"limits": {"cpu": "1.5.2"}}}},
                                                  {"workers": {"resources": {"limits": {"cpu": 2}}}}),
    "spec.training.lora.targetModules: all-linear alone": (
        {"training": {"lora": {"targetModules": ["all-linear", "q_proj"]}}},
        {"training": {"lora": {"targetModules": ["q_proj", "v_proj"]}}}),
    "spec.training.model: a known built-in": ({"training": {"model": "builtin:huge"}}, {"training": {"model": "org/model"}}),
    "spec.training: one generation knob": ({"training": {"generationBatchSize": 16, "stepsPerGeneration": 2}},
                                           {"training": {"stepsPerGeneration": 2}}),
    "spec.training.evaluation: dataset or heldOutFraction": ({"training": {"evaluation": {}}},
                                                             {"training": {"evaluation": HELD_OUT}}),
    "spec.training.evaluation.numGenerations: one when greedy": (
        {"training": {"evaluation": {**HELD_OUT, "numGenerations": 2}}},
        {"training": {"evaluation": {**HELD_OUT, "numGenerations": 2, "decoding": "sampled"}}}),
    "spec.training.evaluation.passAtK: sampled": (
        {"training": {"evaluation": {**HELD_OUT, "passAtK": [1]}}},
        {"training": {"evaluation": {**HELD_OUT, "passAtK": [1, 2], "numGenerations": 2, "decoding": "sampled"}}}),
    "spec.training.evaluation.passAtK: at most numGenerations": (
        {"training": {"evaluation": {**HELD_OUT, "passAtK": [4], "numGenerations": 2, "decoding": "sampled"}}},
        {"training": {"evaluation": {**HELD_OUT, "passAtK": [2], "numGenerations": 2, "decoding": "sampled"}}}),
    "spec.training.evaluation.dataset.name: a known built-in": (
        {"training": {"evaluation": {"dataset": {"name": "builtin:nope"}}}},
        {"training": {"evaluation": {"dataset": {"name": "builtin:add-digits"}}}}),
    "spec.training.evaluation.metrics[].name: a reward or text metric": (
        {"training": {"evaluation": {**HELD_OUT, "metrics": [{"name": "nope"}]}}},
        {"training": {"evaluation": {**HELD_OUT, "metrics": [{"name": "bleu"}]}}}),
    "spec.training.dataset.name: a known built-in": ({"training": {"dataset": {"name": "builtin:nope"}}},
                                                     {"training": {"dataset": {"name": "builtin:add-digits"}}}),
    "spec.training.rewards[].name: built-in or package.module:function": (
        {"training": {"rewards": [{"name": "nope"}]}}, {"training": {"rewards": [{"name": "exact_match"}]}}),
    "spec.training.rewards[].source: custom rewards only": (
        {"training": {"rewards": [{"name": "exact_match", "source": {"uri": "s3://b/m.py"}}]}},
        {"training": {"rewards": [{"name": "m:f", "source": {"uri": "s3://b/m.py"}}]}}),
    "spec.training.rewards[].source: one of configMap, uri": (
        {"training": {"rewards": [{"name": "m:f", "source": {}}]}},
        {"training": {"rewards": [{"name": "m:f", "source": {"configMap": {"name": "c", "key": "m.py"}}}]}}),
    "spec.training.rewards[].source.uri: an s3:// .py object": (
        {"training": {"rewards": [{"name": "m:f", "source": {"uri": "s3://b/m.txt"}}]}},
        {"training": {"rewards": [{"name": "m:f", "source": {"uri": "s3://b/dir/m.py"}}]}}),
}
#: Rule name → (patch of a runtime's spec that breaks it, one that keeps it).
RUNTIME_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "spec.limits.gpusPerWorker: default ≤ max": ({"limits": {"gpusPerWorker": {"default": 4, "max": 2}}},
                                                {"limits": {"gpusPerWorker": {"default": 2, "max": 2}}}),
    "spec.limits.terminationGracePeriodSeconds: default ≤ max": (
        {"limits": {"terminationGracePeriodSeconds": {"default": 300, "max": 60}}},
        {"limits": {"terminationGracePeriodSeconds": {"default": 30, "max": 60}}}),
    "spec.limits.activeDeadlineSeconds: default ≤ max": ({"limits": {"activeDeadlineSeconds": {"default": 7, "max": 6}}},
                                                        {"limits": {"activeDeadlineSeconds": {"max": 6}}}),
    "spec.limits.cpuPerWorker.default: a quantity": ({"limits": {"cpuPerWorker": {"default": "four"}}},
                                                     {"limits": {"cpuPerWorker": {"default": "500m"}}}),
    "spec.limits.cpuPerWorker.max: a quantity": ({"limits": {"cpuPerWorker": {"max": "1e"}}},
                                                 {"limits": {"cpuPerWorker": {"max": 32}}}),
    "spec.limits.cpuPerWorker: default ≤ max": ({"limits": {"cpuPerWorker": {"default": "2", "max": "1500m"}}},
                                               {"limits": {"cpuPerWorker": {"default": "1", "max": "1500m"}}}),
    "spec.limits.memoryPerWorker.default: a quantity": ({"limits": {"memoryPerWorker": {"default": "16GB"}}},
                                                        {"limits": {"memoryPerWorker": {"default": "16G"}}}),
    "spec.limits.memoryPerWorker.max: a quantity": ({"limits": {"memoryPerWorker": {"max": "-1Gi"}}},
                                                    {"limits": {"memoryPerWorker": {"max": "1Ti"}}}),
    "spec.limits.memoryPerWorker: default ≤ max": ({"limits": {"memoryPerWorker": {"default": "2Gi", "max": "2G"}}},
                                                  {"limits": {"memoryPerWorker": {"default": "2G", "max": "2Gi"}}}),
    "spec.checkpoint.storage: the s3:// rule": ({"checkpoint": {"storage": "s3://"}},
                                                {"checkpoint": {"storage": "s3://bucket/run1"}}),
    "spec.checkpoint.storage: the pvc:// rule": ({"checkpoint": {"storage": "pvc://Bad/run1"}},
                                                 {"checkpoint": {"storage": "pvc://claim/run1"}}),
    "spec.checkpoint.mirrors[].location: the pvc:// rule": ({"checkpoint": {"mirrors": [{"location": "pvc://c/../x"}]}},
                                                            {"checkpoint": {"mirrors": [{"location": "pvc://c/m"}]}}),
}
NAMESPACED_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "spec.namespaceSelector: ClusterRLTrainingRuntime only": ({"namespaceSelector": {"matchLabels": {"team": "a"}}},
                                                              {}),
}
#: The rules on the resource itself (metadata is untyped in the CRD): rule → (a name that breaks it, one that keeps
#: it), for jobs and for experiments.
NAME_CASES = {"metadata.name: length": ("j" * (job.MAX_NAME_LENGTH + 1), "j" * job.MAX_NAME_LENGTH),
              "metadata.name: starts with a letter": ("7b-grpo", "grpo-7b")}
EXPERIMENT_NAME_CASES = {"metadata.name: starts with a letter": ("7b-sweep", "sweep-7b")}

EVALUATED = {"training": {"evaluation": {**HELD_OUT, "everySteps": 10}}}
ARM = {"name": "a", "overrides": {"training": {"learningRate": 0.001}}}
LEARNING_RATE = {"name": "training.learningRate", "type": "float", "min": 1e-5, "max": 0.01}
#: Rule name → (patch of an A/B experiment's spec that breaks it, one that keeps it; ``template`` is
#: merged into the template).
EXPERIMENT_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "spec: arms or search": ({"search": {"maxTrials": 2, "parameters": [LEARNING_RATE]}}, {}),
    "spec.seeds: arms × seeds fit the status": (
        {"arms": [{**ARM, "name": f"a{i}"} for i in range(6)], "seeds": 100},
        {"arms": [{**ARM, "name": f"a{i}"} for i in range(5)], "seeds": 100}),
    "spec.objective.metric: eval/ needs evaluation": ({"objective": {"metric": "eval/repeat_char"}},
                                                      {"objective": {"metric": "eval/repeat_char"}, "template": EVALUATED}),
    "spec.earlyStopping: rungs on the evaluation schedule": (
        {"objective": {"metric": "eval/repeat_char"}, "template": EVALUATED, "earlyStopping": {"rungs": [15]}},
        {"objective": {"metric": "eval/repeat_char"}, "template": EVALUATED, "earlyStopping": {"rungs": [20]}}),
    "spec.search.parameters[].name: under training": (
        {"arms": None, "search": {"maxTrials": 2, "parameters": [{**LEARNING_RATE, "name": "learningRate"}]}},
        {"arms": None, "search": {"maxTrials": 2, "parameters": [LEARNING_RATE]}}),
    "spec.search.parameters[]: a range needs min and max": (
        {"arms": None, "search": {"maxTrials": 2, "parameters": [{**LEARNING_RATE, "min": None}]}},
        {"arms": None, "search": {"maxTrials": 2, "parameters": [LEARNING_RATE]}}),
    "spec.search.parameters[]: categorical takes no range": (
        {"arms": None, "search": {"maxTrials": 2, "parameters": [
            {"name": "training.numGenerations", "type": "categorical", "values": [2, 4], "min": 1}]}},
        {"arms": None, "search": {"maxTrials": 2, "parameters": [
            {"name": "training.numGenerations", "type": "categorical", "values": [2, 4]}]}}),
    "spec.search.parameters[].max: above min": (
        {"arms": None, "search": {"maxTrials": 2, "parameters": [{**LEARNING_RATE, "min": 0.01, "max": 1e-5}]}},
        {"arms": None, "search": {"maxTrials": 2, "parameters": [LEARNING_RATE]}}),
    "spec.search.parameters[].min: positive on a log scale": (
        {"arms": None, "search": {"maxTrials": 2, "parameters": [{**LEARNING_RATE, "min": 0.0, "log": True}]}},
        {"arms": None, "search": {"maxTrials": 2, "parameters": [{**LEARNING_RATE, "log": True}]}}),
    "spec.objective.step: atStep needs step": ({"objective": {"reduce": "atStep"}},
                                               {"objective": {"reduce": "atStep", "step": 20}}),
}


def _without_nones(value: Any) -> Any:
    """``None`` in a case means: leave the key out."""
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    return value


def job_doc(patch: dict[str, Any], name: str = "rule") -> dict[str, Any]:
    return deep_update(job_manifest(name), {"spec": patch})


def runtime_doc(patch: dict[str, Any], name: str = "rule") -> dict[str, Any]:
    return runtime_manifest(name, patch)


def namespaced_runtime_doc(patch: dict[str, Any], name: str = "rule") -> dict[str, Any]:
    return runtime_manifest(name, patch, kind="RLTrainingRuntime")


def experiment_doc(patch: dict[str, Any], name: str = "rule") -> dict[str, Any]:
    patch = copy.deepcopy(patch)
    template = copy.deepcopy(job_manifest("t", replicas=1)["spec"])
    template["training"]["maxSteps"] = 40
    template = deep_update(template, patch.pop("template", {}))
    spec_ = _without_nones({"template": template, "arms": [ARM], **patch})
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": name}, "spec": spec_}


def named_field(rule: Rule) -> str:
    """The field a refusal of ``rule`` names: its object's path and fieldPath (``[]`` for any index)."""
    return rule.at + (rule.field_path or "") if rule.at else "metadata.name"


def _names(problems: list[str], field: str) -> bool:
    return any(re.sub(r"\[\d+\]", "[]", p).startswith(field) for p in problems)


def test_every_rule_has_its_cases_and_the_crd_has_every_rule() -> None:
    assert {r.name for r in JOB_RULES} == {*JOB_CASES, *NAME_CASES}
    assert {r.name for r in EXPERIMENT_RULES} == {*EXPERIMENT_CASES, *EXPERIMENT_NAME_CASES}
    crd_rules = [v for rules in crd.CEL_RULES.values() for v in rules]
    assert all(r.cel_rule() in crd_rules for r in JOB_RULES)
    crd_rules = [v for rules in crd.EXPERIMENT_CEL_RULES.values() for v in rules]
    assert all(r.cel_rule() in crd_rules for r in EXPERIMENT_RULES)
    assert {r.name for r in RUNTIME_RULES} == set(RUNTIME_CASES)
    assert {r.name for r in NAMESPACED_RULES} == set(NAMESPACED_CASES)
    crd_rules = [v for rules in crd.RUNTIME_CEL_RULES.values() for v in rules]
    assert all(r.cel_rule() in crd_rules for r in RUNTIME_RULES)
    namespaced = crd.runtime_openapi_schema("RLTrainingRuntime")["properties"]["spec"]["x-kubernetes-validations"]
    assert all(r.cel_rule() in namespaced for r in NAMESPACED_RULES)
    # Each CEL message names the field its refusal is about.
    assert [r.name for r in [*JOB_RULES, *EXPERIMENT_RULES, *RUNTIME_RULES, *NAMESPACED_RULES]
            if named_field(r).replace("[]", "").rsplit(".", 1)[-1] not in r.message] == []


def test_a_rule_needs_a_refusal_or_the_check_that_enforces_it() -> None:
    with pytest.raises(ValueError, match="rule r: give refusal"):
        Rule("r", "spec", "true", "m", None, holds=lambda s: True)
    with pytest.raises(ValueError, match="rule r: a rule with a refusal needs holds"):
        Rule("r", "spec", "true", "m", None, holds=None, refusal="@x: no")
    assert cel_rules([Rule("r", "spec", "true", "m", ".x", holds=None, enforced_by="f")]) == {
        "spec": [{"rule": "true", "message": "m", "fieldPath": ".x"}]}


def _at(model: Any, path: str) -> list[Any]:
    """The objects at a rule's path (``[]``: each item)."""
    objects = [model]
    for part in [p for p in path.split(".") if p][1:] if path else []:
        items = part.endswith("[]")
        name = re.sub(r"(?<!^)([A-Z])", r"_\1", part.removesuffix("[]")).lower()
        objects = [getattr(o, name) for o in objects]
        objects = [i for o in objects for i in o] if items else [o for o in objects if o is not None]
    return objects


def _refused(parse: Any, doc: dict[str, Any]) -> list[str]:
    try:
        parse(doc)
    except ManifestError as e:
        return e.problems
    return []


#: kind → (its rules, its cases, a document from a patch, the parser).
KINDS: dict[str, tuple[list[Rule], dict[str, Any], Any, Any]] = {
    "job": (JOB_RULES, JOB_CASES, job_doc, parse_job),
    "experiment": (EXPERIMENT_RULES, EXPERIMENT_CASES, experiment_doc, parse_experiment),
    "runtime": (RUNTIME_RULES, RUNTIME_CASES, runtime_doc, parse_runtime),
    "namespaced runtime": (NAMESPACED_RULES, NAMESPACED_CASES, namespaced_runtime_doc, parse_runtime),
}


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, (_, cases, _, _) in KINDS.items() for n in sorted(cases)])
def test_the_models_refuse_what_breaks_a_rule_naming_its_field_and_accept_what_keeps_it(kind: str, name: str) -> None:
    rules, cases, doc, parse = KINDS[kind]
    rule = next(r for r in rules if r.name == name)
    breaks, keeps = cases[name]
    problems = _refused(parse, doc(breaks))
    assert _names(problems, named_field(rule)), problems
    kept = _at(parse(doc(keeps)).spec, rule.at)
    assert kept and (rule.holds is None or all(rule.holds(o) for o in kept))
    assert rule.holds is not None or kind == "experiment"  # only the early-stopping schedule is too wide to restate


def named_doc(kind: str, name: str) -> dict[str, Any]:
    """A valid job or experiment (``kind``) named ``name``."""
    return job_manifest(name) if kind == "job" else experiment_doc({}, name)


@pytest.mark.parametrize(("kind", "rule"), [("job", r) for r in NAME_CASES] + [("experiment", r) for r in EXPERIMENT_NAME_CASES])
def test_the_models_refuse_a_bad_name_naming_metadata_name(kind: str, rule: str) -> None:
    rules, _, _, parse = KINDS[kind]
    breaks, keeps = (NAME_CASES if kind == "job" else EXPERIMENT_NAME_CASES)[rule]
    problems = _refused(parse, named_doc(kind, breaks))
    assert _names(problems, "metadata.name"), problems
    found = next(r for r in rules if r.name == rule)
    assert found.holds is not None and found.holds(parse(named_doc(kind, keeps)))


def test_a_name_starting_with_a_digit_is_refused_saying_why() -> None:
    """``7b-grpo`` is a valid object name, but not a Service's: refused before any pod fails InvalidPodSpec."""
    problems = _refused(parse_job, job_manifest("7b-grpo"))
    assert problems == ["metadata.name: '7b-grpo' must start with a lower-case letter: a job's name is also its "
                        "headless Service's, and Kubernetes requires a Service name to (a DNS-1035 label); an "
                        "experiment's name begins its trial jobs' names"]


@pytest.mark.parametrize("refusal", trl_rules.REFUSALS, ids=lambda r: r.name)
def test_a_trl_refusal_is_declared_once_and_the_models_and_the_crd_both_refuse_its_fields(
        refusal: trl_rules.TrlRefusal) -> None:
    """Each refusal under spec.training.trl: the models refuse each of its fields with its message (unless
    an earlier refusal has the key), and its CEL rules, in the CRD, refuse what CEL sees of them."""
    algorithm = refusal.algorithm or "grpo"
    other = next(a for a in ALGORITHMS if a != algorithm)
    rules = refusal.rules()
    crd_rules = [v for rs in crd.CEL_RULES.values() for v in rs]
    assert all(r.cel_rule() in crd_rules for r in rules)
    assert bool(rules) == any(trl_rules.cel_visible(n) for n in refusal.fields)

    def training(trl: dict[str, Any], algorithm: str = algorithm) -> TrainingSpec:
        return TrainingSpec.model_construct(algorithm=algorithm, strategy=refusal.strategy, trl=trl)

    for name in refusal.fields:
        earlier = next(r for r in trl_rules.REFUSALS if r.applies(algorithm, refusal.strategy) and r.refuses(name))
        assert trl_rules.refused_fields({name: 1}, algorithm, refusal.strategy)[name] == earlier.says(name)
        with pytest.raises(ValidationError) as e:
            spec.check_trl({name: 1}, algorithm, refusal.strategy)
        assert earlier.says(name) in str(e.value) and name in str(e.value)
        if refusal.algorithm is not None:  # another algorithm's training: not this refusal
            assert trl_rules.refused_fields({name: 1}, other, refusal.strategy).get(name) != refusal.says(name)
        if not rules or not trl_rules.cel_visible(name):
            continue
        rule = next(r for r in rules if r.field_path in (f".{name}", ".trl"))
        subject: Any = {name: 1} if rule.at == "spec.training.trl" else training({name: 1})
        assert rule.holds is not None and not rule.holds(subject)
        assert rule.holds({} if rule.at == "spec.training.trl" else training({}))
        if refusal.algorithm is not None and refusal.strategy is None:  # (a strategy names its algorithm)
            assert rule.holds(training({name: 1}, other))


def test_a_field_of_another_algorithm_is_refused_and_still_searched_for_credentials() -> None:
    foreign = next(n for n, f in trl_rules.TRL_FIELDS.items() if f["algorithms"] == ["rloo"])
    with pytest.raises(ValidationError) as e:
        spec.check_trl({foreign: {"password": "x"}}, "grpo")
    problems = {err["loc"]: err["msg"] for err in e.value.errors()}
    assert set(problems) == {(foreign,), (foreign, "password")}
    assert "GRPOConfig (algorithm grpo) has no such field" in problems[(foreign,)]
    assert "credentials never go in the manifest" in problems[(foreign, "password")]


@pytest.mark.parametrize(("steps_per_generation", "num_iterations", "accumulation", "window"), [
    (1, 1, 1, 1), (4, 1, 1, 4), (4, 1, 2, 2), (4, 1, 4, 1), (3, 1, 2, 3), (1, 3, 1, 3), (2, 2, 8, 1)])
def test_the_generation_window_is_the_optimizer_steps_between_fresh_generations(
        steps_per_generation: int, num_iterations: int, accumulation: int, window: int) -> None:
    """TRL generates every stepsPerGeneration × num_iterations micro-batches; a step is accumulation of them."""
    assert spec.generation_window(steps_per_generation, num_iterations, accumulation) == window


@pytest.mark.parametrize(("training", "every", "window"), [
    ({"stepsPerGeneration": 4}, 6, 4), ({"stepsPerGeneration": 3, "gradientAccumulationSteps": 2}, 4, 3),
    ({"trl": {"num_iterations": 3}}, 50, 3)])
def test_checkpoints_inside_a_generation_window_are_refused_naming_everysteps_and_the_window(
        training: dict[str, Any], every: int, window: int) -> None:
    problems = _refused(parse_job, job_doc({"training": training, "checkpoint": {"everySteps": every}}))
    assert any("spec.checkpoint.everySteps" in p and f"multiple of {window}" in p for p in problems), problems
    parse_job(job_doc({"training": training, "checkpoint": {"everySteps": every * window}}))
