"""The schema of spec.training.trl and of built-in rewards' kwargs: what fails at start fails at validate.

The API server's side (the same 26 quickstart mutations) is in ``tests/contract/test_crd_cluster.py``.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from rljob_contract.job import ManifestError, parse_job
from rljob_contract.spec import TRL_DEFAULTS, TrainerConfig, python_type
from rljob_contract.trl_fields import TRL_FIELDS
from rljob_contract.trl_rules import MANAGED_TRL_FIELDS
from rljob_trainer.builtin import rewards

from tests.support.schema_mutations import quickstart_mutations
from tests.support.trainer import REPO, deep_update, quickstart_doc, run_rljob, write_manifest


def test_trl_fields_match_the_installed_trl() -> None:
    result = subprocess.run([sys.executable, str(REPO / "trainer/hack/gen_trl_fields.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_validate_refuses_every_quickstart_mutation_naming_the_path(tmp_path: Path) -> None:
    mutations = quickstart_mutations()
    assert len(mutations) == 26  # 8 mappings under spec, 18 leaves
    files = {case: write_manifest(tmp_path / f"{case}.yaml", doc) for case, doc, _ in mutations}
    result = run_rljob("validate", *map(str, files.values()))
    assert result.returncode == 1
    problems = []
    for case, _, path in mutations:
        lines = [line for line in result.stderr.splitlines() if line.startswith(f"{files[case]}: ")]
        if not any(line.startswith(f"{files[case]}: {path}: ") for line in lines):
            problems.append(f"{case}: expected {path}, got {lines}")
    assert not problems, "\n".join(problems)
    assert result.stdout == ""  # not one accepted


def _problems(training: dict[str, Any]) -> list[str]:
    try:
        parse_job(deep_update(quickstart_doc(), {"spec": {"training": training}}))
    except ManifestError as e:
        return e.problems
    return []


@pytest.mark.parametrize("training,expected", [
    ({"trl": {"max_steps": 5}}, ["spec.training.trl.max_steps: set by rljob; use spec.training.maxSteps"]),
    ({"trl": {"report_to": "wandb"}}, ["spec.training.trl.report_to: set by rljob; use spec.training.tracking "
                                       "(MLflow, W&B; TensorBoard is always on)"]),
    ({"trl": {"not_a_field": 1, "temperature": "hot"}},
     ["spec.training.trl.not_a_field: not a field of TRL's GRPOConfig (trl ",
      "spec.training.trl.temperature: Input should be a valid number"]),
    ({"algorithm": "rloo", "trl": {"not_a_field": 1}}, ["spec.training.trl.not_a_field: not a field of TRL's RLOOConfig"]),
    ({"algorithm": "rloo", "trl": {"loss_type": "dapo"}},
     ["spec.training.trl.loss_type: a field of TRL's GRPOConfig only; RLOOConfig (algorithm rloo) has no such field"]),
    ({"trl": {"normalize_advantages": True}},
     ["spec.training.trl.normalize_advantages: a field of TRL's RLOOConfig only; GRPOConfig (algorithm grpo)"]),
    ({"trl": {"lr_scheduler_type": "sometimes"}}, ["spec.training.trl.lr_scheduler_type: Input should be 'linear'"]),
    ({"strategy": "Dapo"}, ["spec.training.strategy: Input should be 'grpo', 'dapo', 'dr-grpo' or 'gspo'"]),
    ({"algorithm": "rloo", "strategy": "grpo"},
     ["spec.training.strategy: algorithm rloo has no strategy 'grpo' (its strategies: none)"]),
    ({"strategy": "dapo", "trl": {"epsilon_high": 0.3, "loss_type": "dapo", "temperature": 1.0}},
     ["spec.training.trl.epsilon_high: set by spec.training.strategy dapo (epsilon_high=0.28); remove it from trl, "
      "or drop the strategy", "spec.training.trl.loss_type: set by spec.training.strategy dapo (loss_type='dapo')"]),
    ({"trl": {"top_k": 1.5, "temperature": "0.7"}}, ["spec.training.trl.top_k: Input should be a valid integer",
                                                     "spec.training.trl.temperature: Input should be a valid number"]),
    ({"trl": {"deepspeed": 3}}, ["spec.training.trl.deepspeed: Input should be a mapping or a string"]),
    ({"trl": {"parallelism_config": {}}}, ["spec.training.trl.parallelism_config: cannot be set in a manifest"]),
    ({"rewards": [{"name": "regex_match", "kwargs": {"pattern": "(", "mode": "search"}}]},
     ["spec.training.rewards[0].kwargs.pattern: not a regular expression"]),
    ({"rewards": [{"name": "regex_match", "kwargs": {"mode": "match", "flags": 1}}]},
     ["spec.training.rewards[0].kwargs.mode: Input should be 'search' or 'fullmatch'",
      "spec.training.rewards[0].kwargs.flags: not an option of the built-in reward regex_match (it takes pattern, mode)"]),
    ({"rewards": [{"name": "repeat_char", "kwargs": {"length": 0}}]},
     ["spec.training.rewards[0].kwargs.length: Input should be greater than or equal to 1"]),
    ({"rewards": [{"name": "digit_match", "kwargs": {"length": 6}}]},
     ["spec.training.rewards[0].kwargs.length: not an option of the built-in reward digit_match (it takes no options)"]),
])
def test_trl_and_builtin_kwargs_are_checked_naming_the_field(training: dict[str, Any], expected: list[str]) -> None:
    problems = _problems(training)
    assert len(problems) == len(expected), problems
    for want in expected:
        assert any(got.startswith(want) for got in problems), (want, problems)


@pytest.mark.parametrize("training", [
    {"trl": {"temperature": 1, "top_k": 50, "lr_scheduler_type": "cosine", "warmup_steps": 10, "eval_steps": None}},
    {"trl": {"deepspeed": "/etc/ds.json", "optim_target_modules": ["q_proj"], "pad_to_multiple_of": 8}},
    {"trl": {"deepspeed": {"zero_optimization": {"stage": 2}}, "pad_to_multiple_of": "auto", "debug": ""}},
    {"trl": {"data_seed": 3, "log_level": "info"}},  # rljob's defaults a user may override
    {"algorithm": "rloo", "trl": {"normalize_advantages": False, "reward_clip_range": [-1, 1.5]}},
    {"algorithm": "grpo", "trl": {"loss_type": "dr_grpo", "scale_rewards": "batch"}},
    {"strategy": "dr-grpo", "trl": {"epsilon_high": 0.28}},  # a field the strategy leaves alone
    {"strategy": None, "trl": {"loss_type": "bnpo"}},  # null: no strategy, TRL's fields by hand
    {"rewards": [{"name": "my_rewards.score:fn", "kwargs": {"anything": [1, {"goes": True}], "length": "long"}}]},
    {"rewards": [{"name": "regex_match", "kwargs": {"pattern": r"^\d+$", "mode": "fullmatch"}},
                 {"name": "exact_match", "kwargs": {"prefix": True}}, {"name": "digit_match"}]},
])
def test_valid_trl_and_kwargs_are_accepted_unchanged(training: dict[str, Any]) -> None:
    assert _problems(training) == []
    job = parse_job(deep_update(quickstart_doc(), {"spec": {"training": training}}))
    # The ConfigMap carries what the user wrote (no coercion, no defaults filled in).
    assert job.spec.training.trl == {**quickstart_doc()["spec"]["training"]["trl"], **training.get("trl", {})}


def test_builtin_reward_options_are_the_functions_keyword_parameters() -> None:
    assert set(rewards.BUILTIN_REWARD_OPTIONS) == set(rewards.BUILTIN_REWARDS)
    for name, func in rewards.BUILTIN_REWARDS.items():
        hints = typing.get_type_hints(func)
        params = {p.name: p for p in inspect.signature(func).parameters.values()
                  if p.default is not inspect.Parameter.empty}
        options = rewards.BUILTIN_REWARD_OPTIONS[name]
        assert set(options) == set(params), name
        for option, schema in options.items():
            assert schema["default"] == params[option].default, (name, option)
            TypeAdapter(python_type(schema)).validate_python(params[option].default)  # the default is valid
            assert hints[option] is {"integer": int, "boolean": bool, "string": str}[schema["type"]], (name, option)


def test_managed_trl_fields_are_one_list_the_worker_follows() -> None:
    from rljob_trainer.worker import trl_arguments

    assert set(MANAGED_TRL_FIELDS) <= set(TRL_FIELDS) and not TRL_DEFAULTS & set(MANAGED_TRL_FIELDS)
    cfg = TrainerConfig.model_validate({"jobName": "j"})
    set_by_worker = set(trl_arguments(cfg, "/tmp/ckpt", use_cpu=True)) | {"resume_from_checkpoint"}  # train()
    assert set_by_worker == set(MANAGED_TRL_FIELDS) | TRL_DEFAULTS


def test_validate_crd_and_help_import_nothing_heavy() -> None:
    heavy = ("torch", "transformers", "trl", "datasets", "accelerate", "kopf", "kubernetes", "boto3", "botocore",
             "aiohttp", "prometheus_client", "cryptography")
    result = _cli_without(heavy, (
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    with contextlib.suppress(SystemExit):\n"
        "        main(['--help'])\n"
        f"    assert main(['validate', {str(REPO / 'examples/quickstart.yaml')!r}]) == 0\n"
        "    assert main(['crd']) == 0\n"
    ))
    assert result.returncode == 0, result.stderr


def _cli_without(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``main`` = the rljob CLI) in a Python where ``modules`` cannot be imported."""
    prelude = f"import sys\nfor name in {modules!r}: sys.modules[name] = None\nfrom rljob.cli import main\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)


def test_commands_of_an_extra_name_it_when_its_packages_are_missing() -> None:
    result = _cli_without(("torch", "kubernetes"), (
        f"assert main(['train', {str(REPO / 'examples/quickstart.yaml')!r}]) == 1\n"
        "assert main(['operator']) == 1\n"
    ))
    assert result.returncode == 0, result.stderr
    assert "`rljob train` needs torch, which this install lacks: pip install 'rljob[trainer]'" in result.stderr
    assert "`rljob operator` needs kubernetes, which this install lacks: pip install 'rljob[operator]'" in result.stderr


def test_trl_values_keep_their_strict_types_in_the_configmap_round_trip() -> None:
    job = parse_job(deep_update(quickstart_doc(), {"spec": {"training": {"trl": {"top_k": 5, "temperature": 1}}}}))
    cfg = job.trainer_config("/out")
    again = TrainerConfig.model_validate_json(cfg.model_dump_json(by_alias=True))
    assert again.training.trl == {"lr_scheduler_type": "constant", "temperature": 1, "top_k": 5}
    with pytest.raises(ValidationError):
        TrainerConfig.model_validate({"jobName": "j", "training": {"trl": {"top_k": "5"}}})
