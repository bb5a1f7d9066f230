"""The algorithms (descriptors: ``rljob_contract.plugins.algorithms``; builders: ``rljob_trainer.algorithms``)
and the GRPO-family strategies, without training.

Each strategy must set exactly the TRL fields the strategy table of docs/guides/training.md documents, those fields must be fields
of the installed TRL's GRPOConfig that take the strategy's values (so a TRL upgrade that renames or
retypes one fails here), and no strategy may touch a field rljob manages.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import trl
import yaml
from rljob_contract import trl_fields
from rljob_contract.plugins.algorithms import ALGORITHMS, CONFIG_CLASSES, STRATEGY_NAMES
from rljob_contract.pod import ConfigError, dump_config, load_config
from rljob_contract.spec import TRL_DEFAULTS, TRL_SCHEMAS, TrainerConfig, check_options
from rljob_contract.trl_rules import MANAGED_TRL_FIELDS
from rljob_trainer.algorithms import BUILDERS
from rljob_trainer.worker import build_trl_config

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ALGORITHMS["grpo"].strategies
#: A row of the strategy table (docs/guides/training.md): | `dapo` | `loss_type='dapo'`, `epsilon_high=0.28` | DAPO, arXiv:2503.14476 |
ROW_RE = re.compile(r"^\| `(?P<name>[a-z-]+)` \| (?P<fields>`[^|]+`) \| (?P<reference>[^|]+) \|$")


def documented_strategies() -> dict[str, tuple[dict[str, Any], str]]:
    """The strategy table of docs/guides/training.md: name -> (TRL fields, reference)."""
    rows: dict[str, tuple[dict[str, Any], str]] = {}
    for line in (REPO / "docs/guides/training.md").read_text().splitlines():
        m = ROW_RE.match(line.strip())
        if m:
            pairs = [p.split("=", 1) for p in re.findall(r"`([^`]+)`", m["fields"])]
            rows[m["name"]] = ({k: ast.literal_eval(v) for k, v in pairs}, m["reference"].strip())
    return rows


def config(**training: Any) -> TrainerConfig:
    return TrainerConfig.model_validate({"jobName": "j", "training": training})


def test_each_strategy_sets_exactly_the_trl_fields_the_guide_documents() -> None:
    documented = documented_strategies()
    assert set(documented) == set(STRATEGIES) == set(STRATEGY_NAMES)
    for name, strategy in STRATEGIES.items():
        fields, reference = documented[name]
        assert fields == strategy.trl, name
        assert strategy.reference in reference and re.fullmatch(r"arXiv:\d{4}\.\d{5}", strategy.reference), name


def test_strategy_fields_are_grpo_config_fields_that_take_the_values(tmp_path: Path) -> None:
    grpo_fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    for name, strategy in STRATEGIES.items():
        assert set(strategy.trl) <= grpo_fields, name
        assert not set(strategy.trl) & (set(MANAGED_TRL_FIELDS) | TRL_DEFAULTS), name
        check_options(strategy.trl, TRL_SCHEMAS, "trl", unknown="not a TRL field")  # the manifest's types
        args = build_trl_config(config(strategy=name), trl.GRPOConfig, str(tmp_path), use_cpu=True)
        assert {k: getattr(args, k) for k in strategy.trl} == strategy.trl, name


def test_strategies_differ_from_each_other_and_from_trl_defaults(tmp_path: Path) -> None:
    defaults = build_trl_config(config(), trl.GRPOConfig, str(tmp_path), use_cpu=True)
    fields = ALGORITHMS["grpo"].strategy_fields()
    effective = {name: ALGORITHMS["grpo"].effective(name, build_trl_config(
        config(strategy=name), trl.GRPOConfig, str(tmp_path), use_cpu=True))["trl"] for name in STRATEGIES}
    unset = ALGORITHMS["grpo"].effective(None, defaults)
    assert unset["strategy"] is None and set(unset["trl"]) == set(fields)
    values = [tuple(sorted(e.items())) for e in [*effective.values(), unset["trl"]]]
    assert len(set(values)) == len(values), effective


def test_no_strategy_builds_the_same_trl_config_as_before_strategies(tmp_path: Path) -> None:
    """Without a strategy the worker passes TRL nothing new: every strategy field keeps TRL's default."""
    fields = ALGORITHMS["grpo"].strategy_fields()
    ours = build_trl_config(config(), trl.GRPOConfig, str(tmp_path), use_cpu=True)
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert {k: getattr(ours, k) for k in fields} == {k: getattr(theirs, k) for k in fields}


def test_the_registry_names_trl_s_classes_and_the_generated_field_table() -> None:
    assert list(ALGORITHMS) == ["grpo", "rloo"]  # the first is the default
    assert list(BUILDERS) == list(ALGORITHMS)  # one implementation per descriptor
    assert CONFIG_CLASSES == trl_fields.CONFIG_CLASSES  # gen_trl_fields read the registry
    for algorithm in ALGORITHMS.values():
        assert BUILDERS[algorithm.name].descriptor is algorithm
        config_cls, trainer_cls = BUILDERS[algorithm.name].trl_classes()
        assert (config_cls.__name__, trainer_cls.__name__) == (algorithm.config_class, algorithm.trainer_class)
        assert algorithm.group_size(8) == 8  # both TRL trainers generate whole groups
    assert config().training.algorithm == "grpo" and config(algorithm="rloo").training.group_size() == 8


@pytest.mark.parametrize("training,field", [
    ({"strategy": "ppo"}, "training.strategy: Input should be 'grpo', 'dapo', 'dr-grpo' or 'gspo'"),
    ({"algorithm": "rloo", "strategy": "gspo"}, "training.strategy: algorithm rloo has no strategy 'gspo'"),
    ({"strategy": "dr-grpo", "trl": {"scale_rewards": "batch"}},
     "training.trl.scale_rewards: set by spec.training.strategy dr-grpo (scale_rewards='none')"),
])
def test_the_worker_s_config_refuses_bad_strategies_naming_the_field(
    tmp_path: Path, training: dict[str, Any], field: str,
) -> None:
    """The ConfigMap the worker reads is checked like the manifest (an edited one too)."""
    doc = yaml.safe_load(dump_config(config()))
    doc["training"].update(training)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert field in str(e.value)
