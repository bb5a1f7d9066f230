"""Strict numbers on a real API server: for every scalar field of the job, the API server refuses a value of
another type exactly where the models do (``tests/contract/test_types.py`` has the models' side alone)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.test_rules_cluster import _dry_run
from tests.contract.test_types import FIELDS, SPELLINGS, TAKES, outcome, with_value

pytestmark = pytest.mark.cluster


def api_outcome(kube: Any, path: str, namespace: str, field: str, value: Any) -> str:
    """``accepted``, ``type`` (the schema refused ``field``'s type) or ``other`` (a bound, a rule)."""
    refusal = _dry_run(kube, path, with_value(field, value))
    if refusal is None:
        return "accepted"
    return "type" if f"{field} in body must be of type" in refusal else "other"


def test_the_api_server_and_the_models_agree_on_every_fields_type(kube, crd_installed, namespace) -> None:
    path = kube.job_path(namespace)
    problems = []
    for field, kind in FIELDS:
        for spelling, value in [*SPELLINGS.items(), ("whole number", 3.0)]:
            takes = spelling in TAKES[kind] or (spelling == "whole number" and kind in ("integer", "number"))
            api, ours = api_outcome(kube, path, namespace, field, value), outcome(field, value)
            if (api == "type") == takes:
                problems.append(f"{field} ({kind}) = {value!r}: the API server says {api}, expected by the schema's type")
            if takes and ours == "type":
                problems.append(f"{field} ({kind}) = {value!r}: the API server takes its type, the models refuse it")
            if not takes and ours == "accepted":
                problems.append(f"{field} ({kind}) = {value!r}: the API server refuses its type, the models take it")
    assert problems == [], "\n".join(problems)
