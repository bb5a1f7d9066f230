"""Every rule of the contract on a real API server: its CEL refuses what the models refuse, and accepts
what they accept, case by case (the cases and the models' side: ``tests/contract/test_rules.py``); and every
field that moved from the job to its runtime, refused in either spelling naming the runtime field (the models'
side: ``tests/contract/test_runtime.py``)."""

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
    NAMESPACED_CASES,
    NAMESPACED_RULES,
    RUNTIME_CASES,
    RUNTIME_RULES,
    experiment_doc,
    job_doc,
    named_doc,
    namespaced_runtime_doc,
    runtime_doc,
)
from tests.contract.test_runtime import MOVED_CASES, moved_patch
from tests.support.operator_process import job_manifest

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


def test_the_api_server_agrees_with_the_models_on_every_runtime_rule(kube, runtime_crds, namespace) -> None:
    kinds = [("/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes", RUNTIME_RULES, RUNTIME_CASES, runtime_doc),
             (f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rltrainingruntimes", NAMESPACED_RULES,
              NAMESPACED_CASES, namespaced_runtime_doc)]
    problems = []
    for path, rules, cases, doc in kinds:
        for rule in rules:
            breaks, keeps = (doc(patch, "rule") for patch in cases[rule.name])
            problems += _problems(kube, path, rule, breaks, keeps)
    assert problems == [], "\n".join(problems)


def test_the_api_server_refuses_every_moved_field_in_either_spelling_naming_the_runtime_field(
        kube, crd_installed, namespace) -> None:
    """The CRD keeps each moved field declared (a tombstone) so its CEL can say where it went: an undeclared
    field would be pruned and the job would run without it, silently."""
    from rljob_contract.job import MOVED_TO_RUNTIME

    path = kube.job_path(namespace)
    problems = []
    for param in MOVED_CASES:
        moved, key = param.values
        where = moved.rsplit(".", 1)[0] + f".{key}"
        expected = f"{where}: moved to the runtime: set {MOVED_TO_RUNTIME[moved]} of the"
        refusal = _dry_run(kube, path, job_manifest("moved", spec=moved_patch(moved, key)))
        if refusal is None or not refusal.startswith("HTTP 422") or expected not in refusal:
            problems.append(f"{param.id}: expected HTTP 422 with {expected!r}, got {refusal}")
    assert problems == [], "\n".join(problems)
