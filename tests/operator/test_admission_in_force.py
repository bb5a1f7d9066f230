"""Are the admission policies the operator relies on in force? (issue #43 point 6; ``admission.enforcement_problems``)

The operator cannot check what a job's creator may use (it never sees who wrote the job), so it refuses to
start, and pauses, unless the policies that can are present, fail closed, are bound with Deny over every
namespace and hold this version's checks. Cases on the policies as they ship; the real API server's
answers in ``tests/delivery/test_admission_policies_cluster.py``.
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from rljob_operator.admission import QUEUE_LABEL_KEPT, enforcement_problems
from rljob_operator.cluster import runner
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.settings import OperatorSettings

from tests.support.operator_process import REPO

BASE = [d for d in yaml.safe_load_all((REPO / "manifests/base/admission-policies.yaml").read_text()) if d]


def shipped() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The kustomize base's policies by name, and its bindings (copies)."""
    docs = copy.deepcopy(BASE)
    return ({d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"},
            [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"])


def test_the_policies_as_shipped_are_in_force_under_the_operators_default_names() -> None:
    policies, bindings = shipped()
    assert sorted(policies) == sorted(OperatorSettings().admission_policies)
    assert enforcement_problems(policies, bindings) == []


def test_a_missing_policy_or_binding_is_named() -> None:
    policies, bindings = shipped()
    gone = {**policies, "rljob-queues": None}
    problems = enforcement_problems(gone, bindings)
    assert "ValidatingAdmissionPolicy rljob-queues: not found" in problems
    assert any("keeps a queued job's queue label" in p for p in problems)  # its rule went with it
    unbound = [b for b in bindings if b["spec"]["policyName"] != "rljob-job-references"]
    assert enforcement_problems(policies, unbound) == [
        "ValidatingAdmissionPolicy rljob-job-references: no ValidatingAdmissionPolicyBinding enforces it "
        "(validationActions [Deny], no matchResources narrowing it)"]
    assert enforcement_problems({}, bindings)[0].startswith("no admission policy is named")


@pytest.mark.parametrize("change", [
    {"validationActions": ["Warn", "Audit"]},
    {"matchResources": {"namespaceSelector": {"matchLabels": {"team": "a"}}}},
    {"matchResources": {"objectSelector": {"matchLabels": {"checked": "yes"}}}},
    {"matchResources": {"excludeResourceRules": [{"apiGroups": ["rljob.dev"], "apiVersions": ["*"],
                                                  "operations": ["UPDATE"], "resources": ["rltrainingjobs"]}]}},
], ids=["warn-only", "some-namespaces", "some-objects", "updates-excluded"])
def test_a_binding_that_refuses_nothing_or_not_everywhere_does_not_count(change: dict[str, Any]) -> None:
    policies, bindings = shipped()
    for binding in bindings:
        if binding["spec"]["policyName"] == "rljob-queues":
            binding["spec"].update(change)
    assert enforcement_problems(policies, bindings) == [
        "ValidatingAdmissionPolicy rljob-queues: no ValidatingAdmissionPolicyBinding enforces it "
        "(validationActions [Deny], no matchResources narrowing it)"]
    # Another binding that does enforce it everywhere is enough.
    extra = copy.deepcopy(next(b for b in shipped()[1] if b["spec"]["policyName"] == "rljob-queues"))
    extra["metadata"]["name"] = "platform-binding"
    assert enforcement_problems(policies, [*bindings, extra]) == []


def test_a_policy_that_fails_open_does_not_count() -> None:
    policies, bindings = shipped()
    policies["rljob-job-references"]["spec"]["failurePolicy"] = "Ignore"
    assert enforcement_problems(policies, bindings) == [
        "ValidatingAdmissionPolicy rljob-job-references: failurePolicy Ignore lets a job through when its checks "
        "cannot be evaluated; set Fail"]


def test_policies_of_another_version_are_named_as_such() -> None:
    """An operator upgraded without its policies: a reference field the old policy does not check, or the old
    queues policy that let a finished job drop its label."""
    policies, bindings = shipped()
    spec = policies["rljob-job-references"]["spec"]
    spec["validations"] = [v for v in spec["validations"] if "refs0" not in v["expression"]]
    [problem] = enforcement_problems(policies, bindings)
    assert ("lack 1 of this operator's reference checks (first: ConfigMap "
            "training.rewards[].source.configMap.name)") in problem
    policies, bindings = shipped()
    for v in policies["rljob-queues"]["spec"]["validations"]:
        if v["expression"] == QUEUE_LABEL_KEPT:
            v["expression"] = "variables.oldQueue == '' || variables.finished || variables.queue != ''"
    assert enforcement_problems(policies, bindings) == [
        "none of the policies keeps a queued job's queue label (the rule "
        f"{QUEUE_LABEL_KEPT!r} of the chart's <release>-queues policy)"]


def test_without_the_runtime_policies_or_their_checks_the_policies_are_not_in_force() -> None:
    """Issue #42: the runtime-use rule (a job runs only on a runtime its author may use) and the reference checks of
    a namespace's RLTrainingRuntime are this operator's too."""
    from rljob_operator.admission import RUNTIME_USE_CHECK

    policies, bindings = shipped()
    assert any(" ".join(v["expression"].split()) == RUNTIME_USE_CHECK
               for v in policies["rljob-runtime-use"]["spec"]["validations"])
    policies["rljob-runtime-use"]["spec"]["validations"] = []
    assert enforcement_problems(policies, bindings) == [
        "none of the policies asks for `use` of a job's runtime (the rule "
        f"{RUNTIME_USE_CHECK!r} of the chart's <release>-runtime-use policy)"]
    policies, bindings = shipped()
    spec = policies["rljob-runtime-references"]["spec"]
    spec["validations"] = [v for v in spec["validations"] if not v["expression"].startswith("variables.refs1.")]
    [problem] = enforcement_problems(policies, bindings)
    assert "lack 1 of this operator's reference checks (first: Secret checkpoint.credentialsSecret)" in problem


def test_without_the_worker_pods_rule_the_policies_are_not_in_force() -> None:
    """The operator counts a job's workers by their ownerReference: only the rule that keeps that reference the
    operator's (who may patch the job's status) makes it a proof. A policy set without it, from an older chart or
    with the rule weakened, is named; the base's own holds it."""
    from rljob_operator.admission import WORKER_CLAIM_CHECK

    policies, bindings = shipped()
    assert any(" ".join(v["expression"].split()) == WORKER_CLAIM_CHECK
               for v in policies["rljob-worker-pods"]["spec"]["validations"])
    problem = ("none of the policies keeps the operator's claim on its worker pods (the rule "
               f"{WORKER_CLAIM_CHECK!r} of the chart's <release>-worker-pods policy): anyone who may create pods "
               "could have one counted as a job's worker")
    older = {name: policy for name, policy in policies.items() if name != "rljob-worker-pods"}
    assert enforcement_problems(older, bindings) == [problem]
    weakened = copy.deepcopy(policies)
    for v in weakened["rljob-worker-pods"]["spec"]["validations"]:
        v["expression"] = v["expression"].replace("check('patch')", "check('get')")
    assert enforcement_problems(weakened, bindings) == [problem]
    assert enforcement_problems({**policies, "rljob-worker-pods": None}, bindings) == [
        "ValidatingAdmissionPolicy rljob-worker-pods: not found", problem]
    assert enforcement_problems(policies, bindings) == []


def test_running_without_the_policies_is_a_setting_of_its_own_and_a_flag() -> None:
    from rljob.cli import build_parser, operator_settings

    assert OperatorSettings().without_admission_policies is False
    args = build_parser().parse_args(["operator", "--without-admission-policies"])
    assert operator_settings(args, {}).without_admission_policies is True
    assert OperatorSettings.from_env({"RLJOB_OPERATOR_ADMISSION_POLICIES": "a,b"}).admission_policies == ["a", "b"]


def test_no_reconcile_runs_while_the_admission_policies_are_not_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #43 point 6: a job written while the policies were gone was not checked; nothing is built for it
    (nor for anyone) until they are back, and then every job queued meanwhile is reconciled."""
    ran: list[str] = []
    monkeypatch.setattr(runner.Reconciler, "reconcile", lambda self, ns, name: ran.append(name))
    monkeypatch.setattr(runner, "PAUSED_REQUEUE_SECONDS", 0.05)
    policies = SimpleNamespace(in_force=False)

    async def scenario() -> list[str]:
        leading = runner._reconciling(OperatorSettings(workers=2, kueue=False, watch_nodes=False),
                                      SimpleNamespace(configuration=None), SimpleNamespace(), None, None,
                                      policies)  # type: ignore[arg-type]
        try:
            leading.work.queue.add(JobKey("a", "x"))
            await asyncio.sleep(0.3)
            paused = list(ran)
            policies.in_force = True
            for _ in range(100):
                if ran:
                    break
                await asyncio.sleep(0.02)
            return paused
        finally:
            await leading.work.queue.stop()
            leading.threads.shutdown(wait=False)

    assert asyncio.run(scenario()) == [] and ran == ["x"]
