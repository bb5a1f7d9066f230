"""Every rule of the contract on a real API server: its CEL refuses what the models refuse, and accepts
what they accept, case by case (the cases and the models' side: ``tests/contract/test_rules.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_contract.rules import Rule

from tests.contract.test_rules import (
    EXPERIMENT_CASES,
    EXPERIMENT_NAME_CASES,
    EXPERIMENT_RULES,
    JOB_CASES,
    JOB_RULES,
    NAME_CASES,
    experiment_doc,
    job_doc,
    named_doc,
)

pytestmark = pytest.mark.cluster


def _dry_run(kube: Any, path: str, doc: dict[str, Any]) -> str | None:
    """None when the API server would store ``doc``; else its refusal (HTTP status and body)."""
    try:
        kube.request("POST", path, doc, query={"fieldValidation": "Strict", "dryRun": "All"})
    except ApiException as e:
        try:
            body = json.loads(e.body or "")["message"]
        except (ValueError, KeyError):
            body = e.body or ""
        return f"HTTP {e.status}: {body}"
    return None


def _problems(kube: Any, path: str, rule: Rule, breaks: dict[str, Any], keeps: dict[str, Any]) -> list[str]:
    problems = []
    refusal = _dry_run(kube, path, breaks)
    if refusal is None or not refusal.startswith("HTTP 422") or rule.message not in refusal:
        problems.append(f"{rule.name}: breaking it: expected HTTP 422 with {rule.message!r}, got {refusal}")
    refusal = _dry_run(kube, path, keeps)
    if refusal is not None:
        problems.append(f"{rule.name}: keeping it: refused: {refusal[:600]}")
    return problems


def test_the_api_server_agrees_with_the_models_on_every_job_rule(kube, crd_installed, namespace) -> None:
    path = kube.job_path(namespace)
    problems = []
    for rule in JOB_RULES:
        if rule.name in NAME_CASES:
            breaks, keeps = (named_doc("job", name) for name in NAME_CASES[rule.name])
        else:
            breaks, keeps = (job_doc(patch, "rule") for patch in JOB_CASES[rule.name])
        problems += _problems(kube, path, rule, breaks, keeps)
    assert problems == [], "\n".join(problems)


def test_the_api_server_agrees_with_the_models_on_every_experiment_rule(kube, experiment_crd, namespace) -> None:
    path = f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rlexperiments"
    problems = []
    for rule in EXPERIMENT_RULES:
        if rule.name in EXPERIMENT_NAME_CASES:
            breaks, keeps = (named_doc("experiment", name) for name in EXPERIMENT_NAME_CASES[rule.name])
        else:
            breaks, keeps = (experiment_doc(patch, "rule") for patch in EXPERIMENT_CASES[rule.name])
        problems += _problems(kube, path, rule, breaks, keeps)
    assert problems == [], "\n".join(problems)
