"""The CRD the operator generates from the API models (``rljob_operator.crd``): committed as generated,
structural, documented, with the models' defaults and CEL rules where their fields are; and the models
refuse what the CRD refuses (the API server's side: ``tests/contract/test_crd_cluster.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_contract.job import ManifestError, RLTrainingJob, RLTrainingJobSpec, parse_job
from rljob_operator import crd

from tests.support.operator_process import (
    INVALID_MANIFESTS,
    REPO,
    deep_update,
    invalid_manifest,
    job_manifest,
)


def test_committed_crd_matches_the_models() -> None:
    committed = (REPO / crd.CRD_FILE).read_text(encoding="utf-8")
    assert committed == crd.crd_yaml(), "crds/ drifted from the API models: run `make crd`"


def test_rljob_crd_command_prints_the_crd(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from rljob.cli import main

    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd.crd_yaml()
    assert main(["crd", "-o", str(tmp_path / "crd.yaml")]) == 0
    assert (tmp_path / "crd.yaml").read_text() == crd.crd_yaml()


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key in ("properties",):
            for name, child in (node.get(key) or {}).items():
                yield from _walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _value_validations_only(node: Any, outside: dict[str, Any], path: str) -> None:
    """Kubernetes' structural rule for logical junctors: no types, descriptions, defaults inside, and
    every property they name is also specified outside them."""
    if isinstance(node, list):
        for n in node:
            _value_validations_only(n, outside, path)
        return
    for banned in ("type", "description", "default", "additionalProperties", "nullable", "$ref", "title",
                   "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string"):
        assert banned not in node, f"{path}: {banned} inside a junctor"
    for name, child in (node.get("properties") or {}).items():
        assert name in outside.get("properties", {}), f"{path}: {name} is not specified outside the junctor"
        _value_validations_only(child, outside["properties"][name], f"{path}.{name}")
    for junctor in ("anyOf", "allOf", "oneOf", "not"):
        if junctor in node:
            _value_validations_only(node[junctor], outside, path)


def test_crd_schema_is_structural_and_documented() -> None:
    schema = crd.openapi_schema()
    # The one junctor: a built-in reward's kwargs take only its options (value validations, no types).
    rewards_item = crd._at(schema, "spec.training.rewards[]")
    _value_validations_only(rewards_item["anyOf"], rewards_item, ".spec.training.rewards[]")
    for path, node in _walk(schema):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "title", "$defs", "nullable"):
            assert banned not in node or (node is rewards_item and banned == "anyOf"), f"{path} has {banned}"
        typed = ("type" in node or node.get("x-kubernetes-preserve-unknown-fields")
                 or node.get("x-kubernetes-int-or-string"))
        assert typed, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        if path.startswith(".spec.") and "[]" not in path.split(".")[-1] and not path.endswith("{}"):
            assert node.get("description"), f"{path} has no description (kubectl explain shows it)"
    workers = schema["properties"]["spec"]["properties"]["workers"]
    assert workers["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert workers["properties"]["resources"]["properties"]["limits"]["additionalProperties"] == {
        "x-kubernetes-int-or-string": True
    }
    # trl lists TRL's fields with their types: unknown keys are pruned (refused by strict validation).
    trl = schema["properties"]["spec"]["properties"]["training"]["properties"]["trl"]
    assert trl["type"] == "object" and "x-kubernetes-preserve-unknown-fields" not in trl
    assert trl["properties"]["temperature"]["type"] == "number"
    assert "constant" in trl["properties"]["lr_scheduler_type"]["enum"]
    kwargs = rewards_item["properties"]["kwargs"]
    assert kwargs["x-kubernetes-preserve-unknown-fields"] is True  # a custom reward's kwargs stay free-form
    assert kwargs["properties"]["length"]["type"] == "integer"


def test_crd_defaults_are_the_models_defaults() -> None:
    spec_default = crd.openapi_schema()["properties"]["spec"]["default"]
    assert RLTrainingJobSpec.model_validate(spec_default) == RLTrainingJobSpec()
    training = crd.openapi_schema()["properties"]["spec"]["properties"]["training"]["properties"]
    assert training["maxSteps"]["default"] == 100
    assert training["learningRate"] == {**training["learningRate"], "minimum": 0, "exclusiveMinimum": True}


def test_crd_names_subresources_and_columns() -> None:
    manifest = crd.crd_manifest()
    spec = manifest["spec"]
    assert spec["names"]["shortNames"] == ["rltj"] and "rljob" in spec["names"]["categories"]
    version = spec["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.workers.replicas"
    assert version["subresources"]["status"] == {}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Phase", "Workers", "Step", "Reward", "Eval", "Checkpoints", "Age"]
    conditions = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"


def test_cel_rules_sit_where_their_fields_are() -> None:
    runtime = {"properties": {"spec": crd.runtime_spec_schema()}}
    for schema, table in ((crd.openapi_schema(), crd.CEL_RULES), (runtime, crd.RUNTIME_CEL_RULES)):
        for path, rules in table.items():
            node = crd._at(schema, path)
            assert node["x-kubernetes-validations"][:len(rules)] == rules  # the moved fields' rules follow
            for rule in node["x-kubernetes-validations"]:
                if "fieldPath" in rule:  # the field a rule names exists under it
                    crd._at(node, rule["fieldPath"].strip("."))


@pytest.mark.parametrize(("case", "patch", "field"), INVALID_MANIFESTS, ids=[c[0] for c in INVALID_MANIFESTS])
def test_models_reject_what_the_crd_rejects(case: str, patch: dict[str, Any], field: str) -> None:
    with pytest.raises(ManifestError) as error:
        parse_job(invalid_manifest(case, patch))
    assert any(p.startswith(field) or field in p for p in error.value.problems), error.value.problems


def test_the_valid_base_manifest_and_the_quickstart_parse() -> None:
    parse_job(job_manifest("ok"))
    RLTrainingJob.model_validate(yaml.safe_load((REPO / "examples/quickstart.yaml").read_text()))


def test_deep_update_helper_does_not_mutate() -> None:
    base = {"a": {"b": 1}}
    assert deep_update(base, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}} and base == {"a": {"b": 1}}
