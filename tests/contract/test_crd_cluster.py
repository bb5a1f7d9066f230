"""The generated CRD on a real API server: it rejects what the models reject, naming the field."""

from __future__ import annotations

import subprocess

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_contract.job import ManifestError, RLTrainingJobSpec, parse_job

from tests.support.operator_process import (
    INVALID_MANIFESTS,
    INVALID_RUNTIMES,
    RUNTIMES,
    apply_runtime,
    create_job,
    get_job,
    invalid_manifest,
    invalid_runtime,
    job_manifest,
    runtime_manifest,
)
from tests.support.schema_mutations import UNKNOWN_KEY, quickstart_mutations
from tests.support.trainer import quickstart_doc

pytestmark = pytest.mark.cluster


def test_the_api_server_rejects_invalid_manifests_naming_the_field(kube, crd_installed, namespace) -> None:
    assert len(INVALID_MANIFESTS) >= 15
    problems = [refusal_problem(kube, namespace, case, invalid_manifest(case, patch), field)
                for case, patch, field in INVALID_MANIFESTS]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_the_api_server_rejects_invalid_runtimes_naming_the_field(kube, runtime_crds) -> None:
    problems = [refusal_problem(kube, "", case, invalid_runtime(case, patch), field,
                                create=lambda doc: kube.request("POST", RUNTIMES, doc, query={"fieldValidation": "Strict"}))
                for case, patch, field in INVALID_RUNTIMES]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_a_runtime_round_trips_through_the_api_server(kube, runtime_crds) -> None:
    """What the models accept the API server stores as written (nothing pruned), and reads back the same."""
    from rljob_contract.runtime import parse_runtime

    doc = runtime_manifest("round-trip", {
        "imagePullPolicy": "IfNotPresent", "imagePullSecrets": [{"name": "regcred"}], "gpuResource": "amd.com/gpu",
        "namespaceSelector": {"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "t", "operator": "Exists"}]},
        "podTemplate": {"metadata": {"labels": {"a": "b"}}, "spec": {"priorityClassName": "high", "containers": [
            {"name": "trainer", "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}},
        "limits": {"gpusPerWorker": {"default": 1, "max": 8}, "cpuPerWorker": {"default": "4", "max": 32},
                   "memoryPerWorker": {"max": "256Gi"}, "replicas": {"max": 64},
                   "terminationGracePeriodSeconds": {"default": 120, "max": 600}},
        "jobEnv": "Forbidden", "checkpoint": {"storage": "s3://b/rljob", "credentialsSecret": "keys",
                                              "mirrors": [{"location": "pvc://backup/x"}]},
        "sources": {"allowed": ["s3://b/data/", "hf://"]}, "egress": {"to": [{"cidr": "10.0.0.0/8", "ports": [443]}]},
        "queue": {"name": "team-a", "required": True}})
    stored = apply_runtime(kube, doc)
    assert stored["spec"] == parse_runtime(doc).spec.model_dump(by_alias=True, mode="json", exclude_none=True,
                                                                exclude_defaults=True) | stored["spec"]
    assert parse_runtime(stored).spec == parse_runtime(doc).spec
    assert stored["spec"]["podTemplate"] == doc["spec"]["podTemplate"]  # free-form: kept whole


def refusal_problem(kube, namespace: str, case: str, doc: dict, expected: str, create=None) -> str | None:
    """None when the API server refuses ``doc`` (400/422) naming ``expected``; else what went wrong."""
    try:
        (create or (lambda d: create_job(kube, namespace, d)))(doc)
    except ApiException as e:
        message = e.body or ""
        if e.status not in (400, 422) or expected not in message:
            return f"{case}: HTTP {e.status}, expected {expected!r} in: {message[:400]}"
        return None
    return f"{case}: accepted"


def test_server_side_defaults_are_the_models_defaults(kube, crd_installed, namespace) -> None:
    local = job_manifest("defaults")
    create_job(kube, namespace, local)
    stored = get_job(kube, namespace, "defaults")
    assert stored["spec"]["runPolicy"] == {
        "suspend": False, "restartPolicy": "OnFailure", "backoffLimit": 3, "backoffBaseSeconds": 10,
        "backoffMaxSeconds": 600, "oomRecovery": True, "oomMinBatchSize": 1, "stallTimeoutSeconds": 600,
        "startupTimeoutSeconds": 1800, "checkIntervalSeconds": 30,
    }
    assert stored["spec"]["training"]["algorithm"] == "grpo" and "gpuResource" not in stored["spec"]["workers"]
    assert RLTrainingJobSpec.model_validate(stored["spec"]) == parse_job(local).spec
    minimal = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "minimal"}}
    create_job(kube, namespace, minimal)
    assert RLTrainingJobSpec.model_validate(get_job(kube, namespace, "minimal")["spec"]) == RLTrainingJobSpec()


def test_kubectl_explain_shows_the_models_descriptions(crd_installed, control_plane) -> None:
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig)]
    out = subprocess.run([*kubectl, "explain", "rltj.spec.workers"], capture_output=True, text=True, check=True)
    assert "gpusPerWorker" in out.stdout and "GPUs requested (and limited) per worker pod" in out.stdout
    out = subprocess.run([*kubectl, "explain", "rltj.spec.training.numGenerations"], capture_output=True, text=True,
                         check=True)
    assert "Completions sampled per prompt" in out.stdout


def test_the_api_server_refuses_every_quickstart_mutation_naming_the_path(kube, crd_installed, namespace) -> None:
    """What `rljob validate` refuses (tests/contract/test_schema.py), `kubectl apply` refuses: the same 26 mutations."""
    mutations = quickstart_mutations()
    assert len(mutations) == 26
    create_job(kube, namespace, quickstart_doc())  # the unmutated quickstart is accepted
    problems = []
    for i, (case, doc, path) in enumerate(mutations):
        doc["metadata"]["name"] = f"mutation-{i}"
        # An unknown key inside kwargs (an object that keeps a custom function's keys) is refused by
        # the count of keys, which names kwargs, not the key.
        expected = path.removesuffix(f".{UNKNOWN_KEY}") if path.endswith(f"kwargs.{UNKNOWN_KEY}") else path
        problem = refusal_problem(kube, namespace, case, doc, expected)
        if problem:
            problems.append(problem)
    assert not problems, "\n".join(problems)


def test_the_api_server_applies_the_trl_and_kwargs_rules(kube, crd_installed, namespace) -> None:
    cases = [
        ({"trl": {"max_steps": 5}}, "spec.training.trl.max_steps: set by rljob; use spec.training.maxSteps"),
        ({"algorithm": "rloo", "trl": {"loss_type": "dapo"}}, "loss_type"),
        ({"trl": {"reward_clip_range": [0, 1]}}, "are not fields of TRL's GRPOConfig"),
        ({"rewards": [{"name": "regex_match", "kwargs": {"mode": "match"}}]}, "spec.training.rewards[0].kwargs.mode"),
        ({"rewards": [{"name": "repeat_char", "kwargs": {"length": 0}}]}, "spec.training.rewards[0].kwargs.length"),
        # anyOf failures name the list item (its best-matching branch decides the detail).
        ({"rewards": [{"name": "digit_match", "kwargs": {"length": 6}}]}, "spec.training.rewards[0]"),
    ]
    problems = []
    for i, (training, expected) in enumerate(cases):
        try:
            create_job(kube, namespace, job_manifest(f"rules-{i}", spec={"training": training}))
        except ApiException as e:
            if expected not in (e.body or ""):
                problems.append(f"{training}: expected {expected!r} in: {(e.body or '')[:400]}")
        else:
            problems.append(f"{training}: accepted")
    assert not problems, "\n".join(problems)
    accepted = [
        {"algorithm": "rloo", "trl": {"normalize_advantages": True, "reward_clip_range": [-1, 1]}},
        {"trl": {"deepspeed": "/etc/ds.json", "pad_to_multiple_of": "auto", "loss_type": "dapo"}},
        {"strategy": "dr-grpo", "trl": {"epsilon_high": 0.28}},  # a TRL field the strategy leaves alone
        {"strategy": "gspo"},
        {"rewards": [{"name": "pkg.mod:fn", "kwargs": {"free": {"form": [1]}, "n": 2}},
                     {"name": "regex_match", "kwargs": {"pattern": "a+", "mode": "fullmatch"}}]},
    ]
    for i, training in enumerate(accepted):
        doc = job_manifest(f"fine-{i}", spec={"training": training})
        create_job(kube, namespace, doc)
        stored = get_job(kube, namespace, f"fine-{i}")["spec"]["training"]
        assert stored.get("trl", {}) == training.get("trl", {})  # nothing pruned, no TRL defaults added
        assert stored.get("strategy") == training.get("strategy")  # no strategy unless one is named
        assert parse_job(doc).spec.training.trl == training.get("trl", {})


def test_the_api_server_refuses_bad_evaluation_specs_naming_the_field(kube, crd_installed, namespace) -> None:
    """spec.training.evaluation (#33): the cross-field rules are CEL too, so `kubectl apply` names the field."""
    from tests.support.trainer import deep_update

    cases = [
        ({"everySteps": 0, "heldOutFraction": 0.2}, "spec.training.evaluation.everySteps"),
        ({"everySteps": 10}, "spec.training.evaluation.heldOutFraction: set dataset or heldOutFraction"),
        ({"heldOutFraction": 0.2, "dataset": {"name": "t.jsonl"}}, "spec.training.evaluation.heldOutFraction: set"),
        ({"heldOutFraction": 1.0}, "spec.training.evaluation.heldOutFraction"),
        ({"heldOutFraction": 0.2, "numGenerations": 4}, "spec.training.evaluation.numGenerations: greedy decoding"),
        ({"heldOutFraction": 0.2, "passAtK": [1]}, "spec.training.evaluation.passAtK: pass@k needs decoding: sampled"),
        ({"heldOutFraction": 0.2, "decoding": "sampled", "numGenerations": 2, "passAtK": [4]},
         "spec.training.evaluation.passAtK: each k must be at most numGenerations"),
        ({"heldOutFraction": 0.2, "metrics": [{"name": "blue"}]}, "spec.training.evaluation.metrics[].name must be"),
        ({"dataset": {"name": "builtin:nope"}}, "spec.training.evaluation.dataset.name: unknown built-in dataset"),
    ]
    problems = []
    best = deep_update(quickstart_doc(), {"metadata": {"name": "eval-best"},
                                          "spec": {"checkpoint": {"keepBest": 1, "bestMetric": "eval/exact_match"}}})
    problems.append(refusal_problem(kube, namespace, "bestMetric", best,
                                    "spec.checkpoint.bestMetric: an evaluation metric (eval/...) needs"))
    for i, (evaluation, expected) in enumerate(cases):
        doc = deep_update(quickstart_doc(), {"metadata": {"name": f"eval-{i}"},
                                             "spec": {"training": {"evaluation": evaluation}}})
        problem = refusal_problem(kube, namespace, str(evaluation), doc, expected)
        if problem:
            problems.append(problem)
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
    good = deep_update(quickstart_doc(), {"metadata": {"name": "eval-good"}, "spec": {"training": {"evaluation": {
        "heldOutFraction": 0.2, "everySteps": 40, "decoding": "sampled", "numGenerations": 4, "passAtK": [1, 4],
        "metrics": [{"name": "exact_match", "kwargs": {"prefix": True}}, {"name": "rougeL"}, {"name": "m.n:f"}]}}}})
    create_job(kube, namespace, good)
    stored = get_job(kube, namespace, "eval-good")["spec"]["training"]["evaluation"]
    assert stored["maxPrompts"] == 256 and stored["referenceField"] == "answer"  # the models' defaults


def test_the_api_server_takes_tracking_and_refuses_what_the_models_refuse_naming_the_field(
        kube, crd_installed, namespace) -> None:
    """spec.training.tracking (#49): its patterns and enums are the CRD's, so `kubectl apply` refuses a credential in
    the URI, another W&B mode or a snake_case spelling as `rljob validate` does."""
    from tests.support.trainer import deep_update

    cases = [
        ({"mlflow": {"trackingUri": "http://user:pw@mlflow:5000"}}, "spec.training.tracking.mlflow.trackingUri"),
        ({"mlflow": {"experiment": "bad\nname"}}, "spec.training.tracking.mlflow.experiment"),
        ({"mlflow": {"tracking_uri": "http://mlflow:5000"}}, "tracking_uri"),
        ({"wandb": {"project": "p", "mode": "dryrun"}}, "spec.training.tracking.wandb.mode"),
        ({"wandb": {"mode": "offline"}}, "spec.training.tracking.wandb.project"),
        ({"wandb": {"project": "p", "apiKey": "k"}}, "apiKey"),
    ]
    problems = []
    for i, (tracking, expected) in enumerate(cases):
        doc = deep_update(quickstart_doc(), {"metadata": {"name": f"track-{i}"},
                                             "spec": {"training": {"tracking": tracking}}})
        with pytest.raises(ManifestError):  # the models refuse it too
            parse_job(doc)
        problems.append(refusal_problem(kube, namespace, str(tracking), doc, expected))
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
    good = deep_update(quickstart_doc(), {"metadata": {"name": "track-good"}, "spec": {"training": {"tracking": {
        "mlflow": {"trackingUri": "https://mlflow.example.com/team", "experiment": "grpo tiny"},
        "wandb": {"project": "rl-runs", "entity": "ml-team", "mode": "offline"}}}}})
    parse_job(good)
    create_job(kube, namespace, good)
    stored = get_job(kube, namespace, "track-good")["spec"]["training"]["tracking"]
    assert stored == good["spec"]["training"]["tracking"]
