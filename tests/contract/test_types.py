"""Strict numbers: ``rljob validate``/``train`` and the API server agree on every scalar field's type.

The API server refuses ``backoffLimit: true`` and ``backoffLimit: "3"`` (its schema says integer); pydantic's
lax mode took both (as 1 and 3). ``validate_document`` now reads types as the API server does, strictly, as
JSON: these tests walk every scalar field of the generated CRD schema (integer, number, boolean, string)
and set it to a value of each other type. The models must refuse exactly where the schema's type does;
``tests/contract/test_types_cluster.py`` asks the real API server the same questions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from rljob_contract import yamltext
from rljob_contract.job import ManifestError, parse_job
from rljob_operator.crd import crd_manifest

from tests.support.operator_process import job_manifest

#: A value of each JSON type a scalar field may be given; ``3.0`` is an integer to the API server too.
SPELLINGS: dict[str, Any] = {"boolean": True, "string": "3", "integer": 3, "number": 0.5}
#: Which spellings each schema type takes (an integer is a number; a whole float is an integer).
TAKES = {"integer": {"integer"}, "number": {"integer", "number"}, "boolean": {"boolean"}, "string": {"string"}}


def scalar_fields(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, str]]:
    """(dotted path, type) of every scalar field reachable through objects (not lists, maps or free-form)."""
    for name, node in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        kind = node.get("type")
        if kind == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            yield from scalar_fields(node, where)
        elif kind in TAKES and "enum" not in node:
            yield where, kind


def job_spec_fields() -> list[tuple[str, str]]:
    version = crd_manifest()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return sorted(scalar_fields(spec, "spec"))


def with_value(path: str, value: Any) -> dict[str, Any]:
    """The test job with ``path`` (``spec.runPolicy.backoffLimit``) set to ``value``."""
    doc = copy.deepcopy(job_manifest("types", replicas=1))
    node = doc
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return doc


#: pydantic's type errors (``a valid integer``) and ``describe_type``'s (``a boolean or null``); not bounds.
TYPE_REFUSAL = re.compile(r"Input should be (a valid |an? (boolean|integer|number|string|mapping|list)\b)")


def outcome(path: str, value: Any) -> str:
    """``accepted``, ``type`` (pydantic refused ``path`` for its type) or ``other`` (a bound, a rule, a
    field rljob sets itself)."""
    try:
        parse_job(with_value(path, value))
    except ManifestError as e:
        return "type" if any(TYPE_REFUSAL.match(p.removeprefix(f"{path}: ")) for p in e.problems
                             if p.startswith(f"{path}: ")) else "other"
    return "accepted"


FIELDS = job_spec_fields()


def test_the_walk_finds_the_fields_of_each_type() -> None:
    kinds = dict(FIELDS)
    assert kinds["spec.runPolicy.backoffLimit"] == "integer"
    assert kinds["spec.training.learningRate"] == "number"
    assert kinds["spec.runPolicy.suspend"] == "boolean"
    assert kinds["spec.training.model"] == "string"
    assert len(FIELDS) > 40


@pytest.mark.parametrize("path,kind", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_scalar_field_refuses_the_other_types_and_takes_its_own(path: str, kind: str) -> None:
    outcomes = {spelling: outcome(path, value) for spelling, value in SPELLINGS.items()}
    wrong_accepted = [s for s, o in outcomes.items() if s not in TAKES[kind] and o == "accepted"]
    right_refused = [s for s, o in outcomes.items() if s in TAKES[kind] and o == "type"]
    assert (wrong_accepted, right_refused) == ([], []), outcomes


def test_a_whole_float_is_an_integer_and_yaml_numbers_read_as_kubectl_sends_them() -> None:
    assert parse_job(with_value("spec.runPolicy.backoffLimit", 3.0)).spec.run_policy.backoff_limit == 3
    manifest = yamltext.load("apiVersion: rljob.dev/v1alpha1\nkind: RLTrainingJob\nmetadata: {name: y}\n"
                             "spec: {training: {learningRate: 1e-3}, runPolicy: {backoffLimitX: 1}}\n")
    assert manifest["spec"]["training"]["learningRate"] == 0.001  # a string "1e-3" to YAML 1.1
    with pytest.raises(ManifestError, match=r"spec.runPolicy.backoffLimit: Input should be a valid integer"):
        parse_job(with_value("spec.runPolicy.backoffLimit", "3"))
    with pytest.raises(ManifestError, match=r"spec.runPolicy.suspend: Input should be a valid boolean"):
        parse_job(with_value("spec.runPolicy.suspend", "true"))
