"""Tenant isolation (issue #30, points 1-3; issue #42): one spelling, null is not absent, one table of references.

* One spelling: every entry point (a manifest, a runtime, an experiment's arm merged into its template, a
  trainer config, ``rljob train``'s file) reads camelCase only; a Python spelling is an unknown field whose
  error names the API's, and the runtime's free-form ``podTemplate`` is checked against Kubernetes' own schema.
* Null is not absent: the ``podTemplate`` merge keeps every field the operator sets when the runtime's template
  says null, {}, [] or nothing, and the pod profile judges the pod as built.
* One table: ``rljob_contract.references`` lists every reference field of a job (its reward modules'
  ConfigMaps) and of a runtime (its pod template, pull Secrets, checkpoint storage); the admission policies are
  generated from it (the committed ones must equal the generated), the operator's checks read it, and the
  ``cluster`` test (``test_references_cluster.py``) walks the API server's PodSpec for reference fields the table lacks.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_snake
from rljob_contract import references as refs
from rljob_contract.experiment import parse_experiment
from rljob_contract.job import ManifestError, load_job, parse_job
from rljob_contract.pod import ConfigError, load_config
from rljob_contract.runtime import parse_runtime
from rljob_operator.decisions import policy
from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.policy import PodProfile, violations

from tests.delivery.test_chart import REPO
from tests.support.operator_process import TEST_RUNTIME, job_manifest, on_runtime, runtime_manifest
from tests.support.scripts import load_script
from tests.support.trainer import deep_update

PROFILE = PodProfile(allowed_images=("registry.invalid/rljob-trainer:*",))
OTHER = "other-team"
#: The item a list gets, by the list's field (its label key set so refusals can name it).
_ITEMS = {"mirrors": {"location": "s3://bucket/mirror"}, "envFrom": {}, "sources": {},
          "rewards": {"name": "team_rewards:score"}}
RUNTIME = f"ClusterRLTrainingRuntime/{TEST_RUNTIME}: "


def reference_spec(ref: refs.Reference, name: str = OTHER) -> tuple[dict[str, Any], str]:
    """(a spec patch naming ``name`` at ``ref``'s field, the field as the admission policy labels it)."""
    parts = ref.path.split(".")
    spec = _build(parts, f"{ref.scheme}{name}/run" if ref.scheme else name, ref)
    if parts[0] == "checkpoint":
        spec = deep_update({"checkpoint": {"storage": "s3://bucket/ckpt"}}, spec)
    if parts[0] == "training":
        spec["training"]["rewards"][0]["source"]["configMap"]["key"] = "team_rewards.py"
    return spec, "spec." + _label(spec, parts)


def _build(parts: list[str], leaf: str, ref: refs.Reference) -> dict[str, Any]:
    key = parts[0].removesuffix("[]")
    value: Any = _build(parts[1:], leaf, ref) if len(parts) > 1 else leaf
    if len(parts) == 2 and ref.kind == refs.TYPED:
        value["kind"] = "PersistentVolumeClaim"
    if parts[0].endswith("[]"):
        value = [{**copy.deepcopy(_ITEMS.get(key, {"name": "item"})), **value}]
    return {key: value}


def _label(value: Any, parts: list[str]) -> str:
    out = []
    for part in parts:
        key = part.removesuffix("[]")
        value = value[key]
        if part.endswith("[]"):
            label = _ITEMS.get(key, {"name": None})
            label_key = next(iter(label), None)
            value = value[0]
            key += f"[{label_key}={value[label_key]}]" if label_key else "[]"
        out.append(key)
    return ".".join(out)


def _on_runtime(ref: refs.Reference, name: str = OTHER) -> tuple[Any, Any]:
    """(a plain job, resolved on a runtime naming ``name`` at ``ref``'s field)."""
    spec, _ = reference_spec(ref, name)
    job = parse_job(job_manifest("refs"))
    return job, on_runtime(job, spec)


# -------------------------------------------------------------------------------- the table


def test_the_committed_admission_policies_are_generated_from_the_table() -> None:
    gen = load_script(REPO / "charts/rljob/hack/gen_admission.py")
    for path in gen.FILES:
        text = path.read_text()
        assert gen.rendered(text, path) == text, f"{path} drifted from the table: run 'make generate'"
    # Every reference field has its own validation, and arms have theirs.
    policy_doc = next(yaml.safe_load_all((REPO / "manifests/base/admission-policies.yaml").read_text()))
    assert len(policy_doc["spec"]["validations"]) == len(refs.JOB_REFERENCES) + 1


@pytest.mark.parametrize("ref", [pytest.param(ref, id=ref.path) for ref in refs.JOB_REFERENCES])
def test_each_reference_of_a_job_is_found_where_a_job_names_it(ref: refs.Reference) -> None:
    spec, _ = reference_spec(ref)
    job = parse_job(job_manifest("refs", spec=spec))
    found = refs.references(job.spec.model_dump(by_alias=True, mode="json"))
    assert [(f.kind, f.name) for f in found] == [(ref.kind, OTHER)], found


@pytest.mark.parametrize("ref", [pytest.param(ref, id=ref.path) for ref in refs.RUNTIME_REFERENCES])
def test_each_reference_of_a_runtime_is_found_where_a_runtime_names_it(ref: refs.Reference) -> None:
    spec, _ = reference_spec(ref)
    runtime = parse_runtime(runtime_manifest(spec=spec))
    found = refs.references(runtime.spec.model_dump(by_alias=True, mode="json"), table=refs.RUNTIME_REFERENCES)
    assert [(f.kind, f.name) for f in found] == [(ref.kind, OTHER)], found


def test_a_job_names_no_pod_field_any_more() -> None:
    """The job's table is its reward modules' ConfigMaps alone: everything that shapes the pod is the runtime's."""
    assert [r.path for r in refs.JOB_REFERENCES] == ["training.rewards[].source.configMap.name"]
    assert not any(r.path.startswith("workers.") for r in refs.JOB_REFERENCES)
    assert {r.path for r in refs.POD_REFERENCES} == {r.path.removeprefix("podTemplate.spec.")
                                                     for r in refs.RUNTIME_REFERENCES if r.path.startswith("podTemplate.")}


@pytest.mark.parametrize("ref", [pytest.param(r, id=r.path) for r in refs.RUNTIME_REFERENCES
                                 if r.kind in (refs.SECRET, refs.SERVICE_ACCOUNT)])
def test_the_pod_profile_checks_every_secret_and_service_account_of_the_runtime(ref: refs.Reference) -> None:
    """A ServiceAccount the profile does not allow, and (with allowSecretReferences false) any Secret, is refused
    wherever the table says a runtime can name it, naming the runtime and that field."""
    job, runtime = _on_runtime(ref)
    no_secrets = PodProfile(allowed_images=PROFILE.allowed_images, allow_secret_references=False)
    allowed = PodProfile(allowed_images=PROFILE.allowed_images, allowed_service_accounts=(OTHER,))
    refused, permitted = (no_secrets, PROFILE) if ref.kind == refs.SECRET else (PROFILE, allowed)
    named = [p.removeprefix(RUNTIME).split(": ")[0] for p in violations(job, refused, runtime) if f"'{OTHER}'" in p]
    assert [n.replace("[0]", "") for n in named] == ["spec." + ref.path.replace("[]", "")], named
    assert [p for p in violations(job, permitted, runtime) if f"'{OTHER}'" in p] == []


# ----------------------------------------------------------------------------- one spelling

#: Typed fields of a job whose Python spelling differs: each must be an unknown field naming the API's spelling.
SNAKE_FIELDS = [("workers", "gpusPerWorker"), ("workers", "minReplicas"), ("checkpoint", "subPath"),
                ("checkpoint", "keepLast"), (None, "runtimeRef")]


@pytest.mark.parametrize("section,field", SNAKE_FIELDS)
def test_the_python_spelling_of_a_field_is_refused_naming_the_api_spelling(
        section: str | None, field: str, tmp_path: Path) -> None:
    value: Any = {"name": OTHER} if field == "runtimeRef" else "x" if field == "subPath" else 2
    doc = job_manifest("snake", spec={section: {to_snake(field): value}} if section else {to_snake(field): value})
    where = f"spec.{section}." if section else "spec."
    expected = f"{where}{to_snake(field)}: unknown field (field names are camelCase: write {field!r})"
    with pytest.raises(ManifestError) as err:
        parse_job(doc)
    assert expected in err.value.problems
    # rljob train reads its file through the same parse.
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ManifestError) as err:
        load_job(path)
    assert expected in err.value.problems


@pytest.mark.parametrize("section,field", [("checkpoint", "credentialsSecret"), (None, "gpuResource"),
                                           (None, "podTemplate"), ("limits", "gpusPerWorker")])
def test_a_runtimes_python_spelling_is_refused_naming_the_api_spelling(section: str | None, field: str) -> None:
    value: Any = {} if field in ("podTemplate", "gpusPerWorker") else OTHER
    doc = runtime_manifest(spec={section: {to_snake(field): value}} if section else {to_snake(field): value})
    where = f"spec.{section}." if section else "spec."
    with pytest.raises(ManifestError) as err:
        parse_runtime(doc)
    assert f"{where}{to_snake(field)}: unknown field (field names are camelCase: write {field!r})" in err.value.problems


def test_the_trainer_config_file_takes_the_api_spelling_only(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump({"jobName": "x", "checkpoint": {"storage": "s3://b/c", "credentials_secret": "s"}}))
    with pytest.raises(ConfigError, match="checkpoint.credentials_secret: unknown field .*'credentialsSecret'"):
        load_config(path)


#: The pod-level references of the runtime's table, each spelled the Python way inside its podTemplate.
SNAKE_POD = [pytest.param(ref, id=ref.path) for ref in refs.RUNTIME_REFERENCES
             if ref.path.startswith("podTemplate.") and any(to_snake(p) != p for p in ref.path.split(".")[2:])]


@pytest.mark.parametrize("ref", SNAKE_POD)
def test_a_python_spelling_inside_the_runtimes_pod_template_is_refused(ref: refs.Reference) -> None:
    """podTemplate is free-form in the CRD: Kubernetes' own schema checks it, naming the runtime and the field."""
    parts = ref.path.split(".")
    at = next(i for i, p in enumerate(parts) if i >= 2 and to_snake(p.removesuffix("[]")) != p.removesuffix("[]"))
    spelled = refs.Reference(".".join([*parts[:at], to_snake(parts[at]), *parts[at + 1:]]), ref.kind)
    job, runtime = _on_runtime(spelled)
    camel = parts[at].removesuffix("[]")
    assert any(p.startswith(RUNTIME + "spec.podTemplate.") and
               f".{to_snake(camel)}: unknown field (field names are camelCase: write {camel!r})" in p
               for p in violations(job, PROFILE, runtime)), violations(job, PROFILE, runtime)


def _experiment(overrides: dict[str, Any]) -> dict[str, Any]:
    template = job_manifest("t")["spec"]
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": "e"},
            "spec": {"template": template, "arms": [{"name": "a", "overrides": overrides}]}}


@pytest.mark.parametrize("spelling", ["camel", "snake", "null"])
def test_an_arm_may_not_change_the_runtime_in_any_spelling(spelling: str) -> None:
    """Trials inherit the template's runtimeRef: an experiment compares training settings on one pod shape."""
    key = "runtime_ref" if spelling == "snake" else "runtimeRef"
    with pytest.raises(ManifestError) as err:
        parse_experiment(_experiment({key: None if spelling == "null" else {"name": OTHER}}))
    assert any(p.startswith(f"spec.arms[0].overrides.{key}: an arm may not set {key}: the runtime is the template's")
               for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("ref", [pytest.param(ref, id=ref.path) for ref in refs.JOB_REFERENCES])
def test_an_arm_may_not_name_an_object_the_template_does_not(ref: refs.Reference) -> None:
    spec, _ = reference_spec(ref)
    with pytest.raises(ManifestError) as err:
        parse_experiment(_experiment(spec))
    assert any(re.match(r"spec\.arms\[0\]\.overrides\..*: an arm may not set .* names ", p) for p in err.value.problems), \
        err.value.problems


def test_an_arm_may_override_rewards_that_name_nothing() -> None:
    parse_experiment(_experiment({"training": {"rewards": [{"name": "regex_match", "kwargs": {"pattern": "a"}}]}}))


# --------------------------------------------------------------------------- null is not absent

#: (where in the built pod, the operator's value): the fields it sets for safety.
SAFETY = [
    (("automountServiceAccountToken",), False),
    (("securityContext",), None),
    (("securityContext", "runAsNonRoot"), True),
    (("securityContext", "seccompProfile"), {"type": "RuntimeDefault"}),
    (("securityContext", "seccompProfile", "type"), "RuntimeDefault"),
    (("containers", 0, "securityContext"), None),
    (("containers", 0, "securityContext", "allowPrivilegeEscalation"), False),
    (("containers", 0, "securityContext", "capabilities"), {"drop": ["ALL"]}),
    (("containers", 0, "securityContext", "capabilities", "drop"), ["ALL"]),
    (("containers", 0, "securityContext", "readOnlyRootFilesystem"), True),
]
_NOTHING = object()


def _template_at(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A podTemplate.spec setting ``path`` to ``value`` (the container by its name)."""
    out: Any = value
    for part in reversed(path):
        out = [{"name": "trainer", **out}] if isinstance(part, int) else {part: out}
    return out  # type: ignore[no-any-return]


def _at(value: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@pytest.mark.parametrize("path", [p for p, _ in SAFETY], ids=[".".join(map(str, p)) for p, _ in SAFETY])
@pytest.mark.parametrize("empty", [None, {}, [], "", _NOTHING], ids=["null", "object", "list", "string", "absent"])
def test_an_empty_template_value_never_removes_a_safety_field(path: tuple[str | int, ...], empty: Any) -> None:
    plain = desired_worker_pod(parse_job(job_manifest("plain")), 0, 0)["spec"]
    template = {} if empty is _NOTHING else _template_at(path, empty)
    job = parse_job(job_manifest("empty"))
    runtime = on_runtime(job, {"podTemplate": {"spec": template}})
    built = desired_worker_pod(job, 0, 0, runtime=runtime)["spec"]
    for where, value in SAFETY:
        assert _at(built, where) == _at(plain, where), (where, _at(built, where))
        if value is not None:
            assert _at(built, where) == value
    assert violations(job, PROFILE, runtime) == []


def test_dropped_capabilities_are_added_to_all_never_replace_it() -> None:
    job = parse_job(job_manifest("drop"))
    runtime = on_runtime(job, {"podTemplate": {"spec": _template_at(
        ("containers", 0, "securityContext", "capabilities", "drop"), ["NET_RAW"])}})
    drop = desired_worker_pod(job, 0, 0, runtime=runtime)["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"]
    assert drop == ["ALL", "NET_RAW"]


def _without(*path: str | int) -> Any:
    def mutate(pod: dict[str, Any]) -> None:
        del _at(pod, path[:-1])[path[-1]]
    return mutate


@pytest.mark.parametrize("field,mutate", [
    ("runAsNonRoot", _without("securityContext", "runAsNonRoot")),
    ("seccompProfile.type", _without("securityContext", "seccompProfile")),
    ("allowPrivilegeEscalation", _without("containers", 0, "securityContext", "allowPrivilegeEscalation")),
    ("capabilities.drop", _without("containers", 0, "securityContext", "capabilities", "drop")),
])
def test_the_profile_judges_the_built_pod_whatever_merged_it(field: str, mutate: Any) -> None:
    """A pod that lacks what restricted requires is refused however it came to lack it (not only when a
    template field says so): the check reads the merged pod, positively."""
    pod = desired_worker_pod(parse_job(job_manifest("plain")), 0, 0)["spec"]
    assert policy._built_pod(pod, PROFILE, None) == []
    mutate(pod)
    problems = policy._built_pod(pod, PROFILE, None)
    assert [p.split(": ")[0] for p in problems] == [
        f"spec.podTemplate.spec.containers[name=trainer].securityContext.{field}"], problems
    assert policy._built_pod(pod, PodProfile(level="baseline"), None) == []


# ------------------------------------------------------------------ on the real control plane
