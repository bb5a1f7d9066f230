"""Bad input: a clear message naming the field or function, the permanent exit code, nothing half-written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_contract.job import API_VERSION, KIND, ManifestError, parse_job

from tests.support.trainer import deep_update, quickstart_doc, run_rljob, write_manifest

EXIT_PERMANENT = 78

REWARDS_MODULE = '''
def boom(prompts, completions, **kwargs):
    raise RuntimeError("reward server unavailable")

def too_few(prompts, completions, **kwargs):
    return [1.0]

def not_numbers(prompts, completions, **kwargs):
    return ["high"] * len(completions)

def no_args():
    return []
'''

T = {"spec": {"training": {}}}


def training(**fields: Any) -> dict[str, Any]:
    return {"spec": {"training": fields}}


# (id, patch to the quickstart, text the error must contain, fails before any process starts)
STATIC_CASES = [
    ("wrong-type-steps", training(maxSteps="many"), "spec.training.maxSteps"),
    ("negative-steps", training(maxSteps=-5), "spec.training.maxSteps"),
    ("zero-learning-rate", training(learningRate=0), "spec.training.learningRate"),
    ("unknown-field-spec", {"spec": {"replicas": 3}}, "spec.replicas: unknown field"),
    ("unknown-field-training", training(epochs=3), "spec.training.epochs: unknown field"),
    ("unknown-field-dataset", training(dataset={"name": "builtin:repeat-char", "colour": "red"}),
     "spec.training.dataset.colour: unknown field"),
    ("unknown-field-reward", training(rewards=[{"name": "repeat_char", "wieght": 2}]),
     "spec.training.rewards[0].wieght: unknown field"),
    ("unknown-algorithm", training(algorithm="ppo"), "spec.training.algorithm"),
    ("unknown-precision", training(precision="fp8"), "spec.training.precision"),
    ("generations-do-not-divide", training(batchSize=3, numGenerations=8), "spec.training.numGenerations"),
    ("unknown-builtin-reward", training(rewards=[{"name": "accuracy"}]), "spec.training.rewards[0].name"),
    ("malformed-reward-ref", training(rewards=[{"name": "my module:fn"}]), "spec.training.rewards[0].name"),
    ("empty-rewards", training(rewards=[]), "spec.training.rewards"),
    ("managed-trl-field", training(trl={"max_steps": 5}), "spec.training.trl"),
    # Checked against the generated TRL fields (rljob_contract.trl_fields), no longer at pre-flight.
    ("unknown-trl-field", training(trl={"not_a_field": 1}),
     "spec.training.trl.not_a_field: not a field of TRL's GRPOConfig"),
    ("wrong-type-trl-field", training(trl={"temperature": "hot"}), "spec.training.trl.temperature"),
    ("unknown-builtin-reward-option", training(rewards=[{"name": "repeat_char", "kwargs": {"lenght": 6}}]),
     "spec.training.rewards[0].kwargs.lenght: not an option of the built-in reward repeat_char"),
    ("zero-replicas", {"spec": {"workers": {"replicas": 0}}}, "spec.workers.replicas"),
    ("a-runtime-field-on-the-job", {"spec": {"workers": {"tolerations": []}}},
     "spec.workers.tolerations: moved to the runtime: set spec.podTemplate.spec.tolerations"),
    ("bad-name", {"metadata": {"name": "Bad_Name"}}, "metadata.name"),
    ("wrong-api-version", {"apiVersion": "rljob.dev/v1"}, "apiVersion must be rljob.dev/v1alpha1"),
]


def _run_case(tmp_path: Path, patch: dict[str, Any], **env: str) -> tuple[Any, Path]:
    (tmp_path / "rljob_test_rewards.py").write_text(REWARDS_MODULE)
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"text": "aaaaaa", "target": "a"}\n' * 16)
    doc = deep_update(quickstart_doc(), patch)
    ds = doc["spec"].get("training", {}).get("dataset", {})
    if ds.get("name") == "DATA":
        ds["name"] = str(data)
    doc["spec"]["training"]["maxSteps"] = doc["spec"]["training"].get("maxSteps", 4)
    manifest = write_manifest(tmp_path / "job.yaml", doc)
    out = tmp_path / "out"
    termination = tmp_path / "termination-log"
    termination.write_text("")
    result = run_rljob("train", str(manifest), "--output", str(out),
                       PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
                       RLJOB_TERMINATION_LOG=str(termination), **env)
    return result, out


def _assert_permanent(result: Any, out: Path, expected: str, tmp_path: Path) -> None:
    assert result.returncode == EXIT_PERMANENT, result.stderr[-2000:]
    assert expected in result.stderr, result.stderr[-2000:]
    # The first error line is also the container's termination message.
    assert expected in (tmp_path / "termination-log").read_text()
    # Nothing half-written: no checkpoint folder at all.
    assert not list(out.glob("checkpoints/checkpoint-*"))


@pytest.mark.parametrize("case,patch,expected", STATIC_CASES, ids=[c[0] for c in STATIC_CASES])
def test_invalid_manifest_names_the_field(tmp_path: Path, case: str, patch: dict[str, Any], expected: str) -> None:
    result, out = _run_case(tmp_path, patch)
    _assert_permanent(result, out, expected, tmp_path)
    assert not out.exists()  # rejected before anything was created
    validate = run_rljob("validate", str(tmp_path / "job.yaml"))
    assert validate.returncode == 1 and expected in validate.stderr


def test_validate_accepts_the_examples() -> None:
    examples = sorted(str(p) for p in (Path(__file__).parents[2] / "examples").glob("*.yaml"))
    result = run_rljob("validate", *examples)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") >= 1


def test_validate_checks_experiments_too_naming_the_field(tmp_path: Path) -> None:
    examples = sorted(str(p) for p in (Path(__file__).parents[2] / "examples" / "experiments").glob("*.yaml"))
    result = run_rljob("validate", *examples)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("RLExperiment/") == len(examples) >= 2
    bad = yaml.safe_load(Path(examples[0]).read_text())
    bad["spec"]["template"]["training"]["learningRate"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    result = run_rljob("validate", str(tmp_path / "bad.yaml"))
    assert result.returncode == 1 and "spec.template.training.learningRate" in result.stderr, result.stderr
    (tmp_path / "other.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = run_rljob("validate", str(tmp_path / "other.yaml"))
    assert result.returncode == 1 and "no RLTrainingJob, RLExperiment, ClusterRLTrainingRuntime, RLTrainingRuntime " \
        "document found" in result.stderr


def test_manifest_errors_list_every_problem_with_its_path() -> None:
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"},
           "spec": {"training": {"maxSteps": 0, "rewards": [{"name": "repeat_char", "weight": "heavy"}]},
                    "checkpoint": {"keepLast": 0}}}
    with pytest.raises(ManifestError) as e:
        parse_job(doc)
    paths = sorted(p.split(":")[0] for p in e.value.problems)
    assert paths == ["spec.checkpoint.keepLast", "spec.training.maxSteps", "spec.training.rewards[0].weight"]
