"""Runtimes (issue #42): what the platform sets and what a job sets, resolved and bounded, offline.

* Every field that moved off the job is refused in either spelling, naming the runtime field to use
  (``MOVED_TO_RUNTIME``: the models here, the API server's CEL in ``tests/contract/test_rules_cluster.py``).
* ``resolve``: the values a job gets on a runtime (image, GPUs, sizes, grace, deadline, its own checkpoint path,
  env, queue); ``problems``: where a job asks for more than the runtime allows, each naming the job's field and
  the runtime's bound.
* The CLI: ``rljob validate`` checks runtimes, and jobs against a runtime (``--runtime``); ``rljob train`` needs no
  runtime, and with one trains within its bounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_snake
from rljob_contract.job import MOVED_TO_RUNTIME, ManifestError, parse_job
from rljob_contract.runtime import (
    DEFAULT_IMAGE,
    QUEUE_LABEL,
    RuntimeKind,
    TrainingRuntime,
    default_runtime,
    load_runtimes,
    parse_runtime,
    problems,
    resolve,
    source_allowed,
)
from rljob_contract.spec import TrainerConfig

from rljob import cli
from tests.support.operator_process import TEST_IMAGE, job_manifest, runtime_manifest, test_runtime
from tests.support.trainer import deep_update, quickstart_doc, write_manifest

RT = "ClusterRLTrainingRuntime/rljob-tests"


def job(spec: dict[str, Any] | None = None, **meta: Any) -> Any:
    doc = job_manifest("train", 2, spec, namespace="team-a")
    doc["metadata"].update(meta)
    return parse_job(doc)


# ------------------------------------------------------------------------------ moved fields

#: A value of each moved field's type (what a manifest for the old API held there).
MOVED_VALUES: dict[str, Any] = {
    "image": "x:1", "imagePullPolicy": "Always", "gpuResource": "amd.com/gpu", "nodeSelector": {"a": "b"},
    "tolerations": [], "affinity": {}, "priorityClassName": "high", "serviceAccountName": "sa", "volumes": [],
    "volumeMounts": [], "podTemplate": {"spec": {}}, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
    "storage": "s3://b/p", "endpointUrl": "http://s3:9000", "region": "eu-west-1", "credentialsSecret": "keys",
    "mirrors": [],
}


def moved_patch(path: str, key: str) -> dict[str, Any]:
    """A job spec patch setting the moved field ``path`` under the name ``key``."""
    parts = path.removeprefix("spec.").split(".")
    value: Any = MOVED_VALUES[parts[-1]]
    value = {key: value}
    for part in reversed(parts[:-1]):
        value = {part.removesuffix("[]"): [{"name": "E", **value}] if part.endswith("[]") else value}
    return value


MOVED_CASES = [pytest.param(path, key, id=f"{path}-{'snake' if key != path.rsplit('.', 1)[1] else 'camel'}")
               for path in MOVED_TO_RUNTIME for key in dict.fromkeys((path.rsplit(".", 1)[1],
                                                                      to_snake(path.rsplit(".", 1)[1])))]


@pytest.mark.parametrize("path,key", MOVED_CASES)
def test_every_moved_field_is_refused_in_either_spelling_naming_the_runtime_field(path: str, key: str) -> None:
    with pytest.raises(ManifestError) as error:
        parse_job(job_manifest("moved", spec=moved_patch(path, key)))
    where = path.rsplit(".", 1)[0].replace("[]", "[0]") + f".{key}"
    assert error.value.problems == [f"{where}: moved to the runtime: set {MOVED_TO_RUNTIME[path]} of the "
                                    "ClusterRLTrainingRuntime or RLTrainingRuntime the job runs on (spec.runtimeRef, "
                                    "else the default runtime); a job sets only what is the researcher's"]


def test_every_moved_field_of_one_manifest_is_told_at_once() -> None:
    old = {"image": "x:1", "workers": {"nodeSelector": {}, "env": [{"name": "A", "valueFrom": {}}]},
           "checkpoint": {"storage": "s3://b/p", "credentialsSecret": "k"}}
    with pytest.raises(ManifestError) as error:
        parse_job(job_manifest("old", spec=old))
    assert sorted(p.split(":")[0] for p in error.value.problems) == sorted([
        "spec.image", "spec.workers.nodeSelector", "spec.workers.env[0].valueFrom", "spec.checkpoint.storage",
        "spec.checkpoint.credentialsSecret"])


def test_the_moved_fields_are_what_the_runtime_has() -> None:
    """Each moved field's runtime path names a field of the runtime (the pod template's by its Pod name)."""
    from rljob_operator.crd import POD_FIELD_TYPES, runtime_spec_schema

    schema = runtime_spec_schema()
    for runtime_path in MOVED_TO_RUNTIME.values():
        parts = runtime_path.removeprefix("spec.").split(".")
        if parts[0] == "podTemplate" and len(parts) > 1:
            assert parts[-1] in POD_FIELD_TYPES, runtime_path
            continue
        node = schema
        for part in parts:
            node = node["properties"][part]


# ----------------------------------------------------------------------------------- resolve


def test_a_job_on_no_runtime_gets_rljobs_image_gpus_per_process_and_the_output_folder() -> None:
    r = resolve(job({"workers": {"procsPerWorker": 2}, "training": {"batchSize": 2}}), None)
    assert (r.image, r.gpu_resource, r.gpus_per_worker, r.termination_grace_period_seconds) == (
        DEFAULT_IMAGE, "nvidia.com/gpu", 2, 120)
    assert r.checkpoint.storage is None and r.sources is None and r.runtime is None and r.ref == "(no runtime)"


def test_a_job_gets_the_runtimes_image_defaults_and_its_own_checkpoint_path() -> None:
    runtime = test_runtime({"imagePullPolicy": "IfNotPresent", "gpuResource": "amd.com/gpu",
                            "limits": {"cpuPerWorker": {"default": "4"}, "memoryPerWorker": {"default": "16Gi"},
                                       "terminationGracePeriodSeconds": {"default": 300},
                                       "activeDeadlineSeconds": {"default": 3600, "max": 7200}},
                            "checkpoint": {"storage": "s3://ckpt/rljob", "region": "eu-west-1",
                                           "mirrors": [{"location": "pvc://backup"}]},
                            "queue": {"name": "team-a"}})
    r = resolve(job({"checkpoint": {"subPath": "lr-3e-4"}}), runtime)
    assert (r.image, r.image_pull_policy, r.gpu_resource, r.gpus_per_worker) == (TEST_IMAGE, "IfNotPresent",
                                                                                  "amd.com/gpu", 1)
    assert r.resources == {"requests": {"cpu": "4", "memory": "16Gi"}}
    assert (r.termination_grace_period_seconds, r.active_deadline_seconds) == (300, 3600)
    assert r.checkpoint.storage == "s3://ckpt/rljob/team-a/train/lr-3e-4" and r.checkpoint.region == "eu-west-1"
    assert [m.location for m in r.checkpoint.mirrors] == ["pvc://backup/team-a/train/lr-3e-4"]
    assert r.checkpoint.every_steps == 100 and r.queue == "team-a"
    # The job's own values win within the bounds; a deadline bounded without a default gets the bound.
    mine = resolve(job({"workers": {"gpusPerWorker": 0, "terminationGracePeriodSeconds": 60,
                                    "resources": {"limits": {"cpu": 2}}}}, labels={QUEUE_LABEL: "mine"}), runtime)
    assert (mine.gpus_per_worker, mine.termination_grace_period_seconds, mine.queue) == (0, 60, "mine")
    assert mine.resources == {"requests": {"memory": "16Gi"}, "limits": {"cpu": "2"}}  # cpu: the job's own
    bounded = resolve(job(), test_runtime({"limits": {"activeDeadlineSeconds": {"max": 600}}}))
    assert bounded.active_deadline_seconds == 600


def test_a_cpu_runtime_gives_no_gpus_unless_the_job_asks_which_it_may_not() -> None:
    cpu = test_runtime({"limits": {"gpusPerWorker": {"max": 0}}})
    quickstart = parse_job(quickstart_doc())
    assert resolve(quickstart, cpu).gpus_per_worker == 0 and problems(quickstart, cpu) == []
    assert resolve(quickstart, test_runtime()).gpus_per_worker == 2  # procsPerWorker on a GPU runtime
    asks = job({"workers": {"gpusPerWorker": 1}})
    assert problems(asks, cpu) == [f"spec.workers.gpusPerWorker: 1 GPUs per worker (runtime {RT} allows at most 0)"]


def test_the_job_env_applies_unless_forbidden_and_never_over_the_operators_or_the_runtimes() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "RLJOB_NNODES", "value": "9"}, {"name": "HF_TOKEN", "value": "x"}]
    runtime = {"podTemplate": {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}]}]}}}
    j = job({"workers": {"env": env}})
    assert resolve(j, test_runtime(runtime)).env == ({"name": "A", "value": "1"},)
    forbidden = test_runtime({"jobEnv": "Forbidden"})
    assert resolve(j, forbidden).env == ()
    assert problems(j, forbidden) == [f"spec.workers.env: runtime {RT} does not let a job set env (its spec.jobEnv "
                                      "is Forbidden)"]


def test_a_fingerprint_changes_with_the_runtime_not_with_the_object() -> None:
    j = job()
    assert resolve(j, test_runtime()).fingerprint() == resolve(j, test_runtime()).fingerprint()
    assert resolve(j, test_runtime()).fingerprint() != resolve(j, test_runtime({"image": "other:2"})).fingerprint()


# ---------------------------------------------------------------------------------- problems

#: (case, job spec patch, runtime spec patch, the one problem: the job's field and the runtime's bound).
BOUNDS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("gpus", {"workers": {"gpusPerWorker": 4}}, {"limits": {"gpusPerWorker": {"max": 2}}},
     f"spec.workers.gpusPerWorker: 4 GPUs per worker (runtime {RT} allows at most 2)"),
    ("gpus-from-procs", {"workers": {"procsPerWorker": 4}, "training": {"batchSize": 2}},
     {"limits": {"gpusPerWorker": {"max": 2}}},
     f"spec.workers.gpusPerWorker: unset, so 4 GPUs per worker (procsPerWorker); runtime {RT} allows at most 2: "
     "set gpusPerWorker"),
    ("procs", {"workers": {"procsPerWorker": 4}, "training": {"batchSize": 2}}, {"limits": {"procsPerWorker": {"max": 2}}},
     f"spec.workers.procsPerWorker: 4 processes per worker (runtime {RT} allows at most 2)"),
    ("replicas", {"workers": {"replicas": 4}}, {"limits": {"replicas": {"max": 3}}},
     f"spec.workers.replicas: 4 workers (runtime {RT} allows at most 3)"),
    ("max-replicas", {"workers": {"minReplicas": 1, "maxReplicas": 8}}, {"limits": {"replicas": {"max": 3}}},
     f"spec.workers.maxReplicas: 8 workers (runtime {RT} allows at most 3)"),
    ("cpu", {"workers": {"resources": {"requests": {"cpu": "33"}}}}, {"limits": {"cpuPerWorker": {"max": "32"}}},
     f"spec.workers.resources.requests.cpu: 33 per worker (runtime {RT} allows at most 32)"),
    ("memory-units", {"workers": {"resources": {"limits": {"memory": "300G"}}}},
     {"limits": {"memoryPerWorker": {"max": "256Gi"}}},
     f"spec.workers.resources.limits.memory: 300G per worker (runtime {RT} allows at most 256Gi)"),
    ("grace", {"workers": {"terminationGracePeriodSeconds": 3600}},
     {"limits": {"terminationGracePeriodSeconds": {"max": 600}}},
     f"spec.workers.terminationGracePeriodSeconds: 3600 seconds (runtime {RT} allows at most 600)"),
    ("deadline", {"runPolicy": {"activeDeadlineSeconds": 999999}}, {"limits": {"activeDeadlineSeconds": {"max": 604800}}},
     f"spec.runPolicy.activeDeadlineSeconds: 999999 seconds (runtime {RT} allows at most 604800)"),
    ("model-source", {"training": {"model": "s3://other/model"}}, {"sources": {"allowed": ["s3://models/"]}},
     f"spec.training.model: 's3://other/model' is not under the sources runtime {RT} allows (s3://models/; "
     "spec.sources.allowed)"),
    ("hub-model", {"training": {"model": "Qwen/Qwen2.5-0.5B"}}, {},
     f"spec.training.model: 'Qwen/Qwen2.5-0.5B' is not under the sources runtime {RT} allows (built-ins only; "
     "spec.sources.allowed)"),
    ("reward-module", {"training": {"rewards": [{"name": "m:f", "source": {"uri": "s3://x/m.py"}}]}},
     {"sources": {"allowed": ["s3://modules/"]}},
     f"spec.training.rewards[0].source.uri: 's3://x/m.py' is not under the sources runtime {RT} allows "
     "(s3://modules/; spec.sources.allowed)"),
    ("queue-required", {}, {"queue": {"required": True}},
     f"metadata.labels[{QUEUE_LABEL}]: runtime {RT} requires a Kueue LocalQueue; label the job with one"),
]


@pytest.mark.parametrize("case,job_patch,runtime_patch,problem", BOUNDS, ids=[c[0] for c in BOUNDS])
def test_a_job_outside_a_bound_is_one_problem_naming_its_field_and_the_bound(
        case: str, job_patch: dict[str, Any], runtime_patch: dict[str, Any], problem: str) -> None:
    runtime = test_runtime(runtime_patch)
    assert problems(job(job_patch), runtime) == [problem]
    assert problems(job(), runtime) == ([problem] if case == "queue-required" else [])  # the plain job fits


def test_sources_allow_builtins_always_hub_ids_only_when_listed_and_prefixes_as_given() -> None:
    assert source_allowed("builtin:tiny", []) and not source_allowed("gsm8k", ["s3://"])
    assert source_allowed("openai/gsm8k", ["hf://"]) and source_allowed("Qwen/Qwen2.5-0.5B", ["hub:"])
    assert source_allowed("s3://data/team/x.jsonl", ["s3://data/team/"])
    assert not source_allowed("s3://data/team-b/x.jsonl", ["s3://data/team/"])
    assert source_allowed("/models/qwen", ["/models/"]) and not source_allowed("/etc/passwd", ["/models/", "hf://"])


# ------------------------------------------------------------------------------ the runtime


def test_the_default_runtime_is_the_marked_one_the_newest_of_several() -> None:
    def rt(name: str, created: str, marked: bool = True) -> TrainingRuntime:
        doc = runtime_manifest(name, default=marked)
        doc["metadata"]["creationTimestamp"] = created
        return parse_runtime(doc)

    runtimes = [rt("old", "2030-01-01T00:00:00Z"), rt("new", "2030-02-01T00:00:00Z"),
                rt("newest-unmarked", "2030-03-01T00:00:00Z", marked=False)]
    assert default_runtime(runtimes, RuntimeKind.cluster).metadata.name == "new"  # type: ignore[union-attr]
    assert default_runtime(runtimes, RuntimeKind.namespaced) is None


def runtime_outcome(path: str, value: Any) -> str:
    """``test_types.outcome`` for a runtime: ``accepted``, ``type`` or ``other``."""
    from tests.contract.test_types import TYPE_REFUSAL

    doc = runtime_manifest("types")
    node = doc
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    try:
        parse_runtime(doc)
    except ManifestError as e:
        return "type" if any(TYPE_REFUSAL.match(p.removeprefix(f"{path}: ")) for p in e.problems
                             if p.startswith(f"{path}: ")) else "other"
    return "accepted"


def test_every_scalar_field_of_a_runtime_refuses_the_other_types_and_takes_its_own() -> None:
    """Strict numbers (``tests/contract/test_types.py``) on the runtime's fields too."""
    from rljob_operator.crd import runtime_crd_manifest

    from tests.contract.test_types import SPELLINGS, TAKES, scalar_fields

    schema = runtime_crd_manifest(RuntimeKind.cluster.value)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = sorted(scalar_fields(schema["properties"]["spec"], "spec"))
    assert ("spec.limits.gpusPerWorker.max", "integer") in fields and ("spec.queue.required", "boolean") in fields
    wrong = {}
    for path, kind in fields:
        outcomes = {spelling: runtime_outcome(path, value) for spelling, value in SPELLINGS.items()}
        if [s for s, o in outcomes.items() if (s not in TAKES[kind] and o == "accepted")
                                              or (s in TAKES[kind] and o == "type")]:
            wrong[path] = outcomes
    assert wrong == {}


def test_a_namespaced_runtime_has_no_namespace_selector() -> None:
    parse_runtime(runtime_manifest(spec={"namespaceSelector": {"matchLabels": {"team": "a"}}}))
    with pytest.raises(ManifestError, match="spec.namespaceSelector: only a ClusterRLTrainingRuntime has one"):
        parse_runtime(runtime_manifest(spec={"namespaceSelector": {}}, kind="RLTrainingRuntime"))


def test_a_namespace_selector_matches_as_kubernetes_does() -> None:
    selector = test_runtime({"namespaceSelector": {"matchLabels": {"team": "a"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["gold", "silver"]}, {"key": "frozen", "operator": "DoesNotExist"}]}
    }).spec.namespace_selector
    assert selector is not None
    assert selector.matches({"team": "a", "tier": "gold"})
    assert not selector.matches({"team": "a", "tier": "bronze"}) and not selector.matches({"team": "b", "tier": "gold"})
    assert not selector.matches({"team": "a", "tier": "gold", "frozen": "yes"})
    assert selector.describe() == "team=a,tier in (gold,silver),!frozen"


# ------------------------------------------------------------------------------------- the CLI


def _files(tmp_path: Path, job_patch: dict[str, Any] | None = None,
           runtimes: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    jobs = write_manifest(tmp_path / "job.yaml", deep_update(quickstart_doc(), {"spec": job_patch or {}}))
    docs = runtimes if runtimes is not None else [runtime_manifest("cpu", {"limits": {"gpusPerWorker": {"max": 0}}})]
    (tmp_path / "runtimes.yaml").write_text(yaml.safe_dump_all(docs))
    return str(jobs), str(tmp_path / "runtimes.yaml")


def test_rljob_validate_checks_runtimes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, runtimes = _files(tmp_path, runtimes=[runtime_manifest("gpu"), runtime_manifest("ns", kind="RLTrainingRuntime")])
    assert cli.main(["validate", runtimes]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{runtimes}: ClusterRLTrainingRuntime/gpu: ok",
                                                    f"{runtimes}: RLTrainingRuntime/ns: ok"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(runtime_manifest("bad", {"limits": {"gpusPerWorker": {"default": 2, "max": 1}}})))
    assert cli.main(["validate", str(bad)]) == 1
    assert "spec.limits.gpusPerWorker.default: must be at most max (2 > 1)" in capsys.readouterr().err


def test_rljob_validate_checks_a_job_against_the_runtime_it_would_run_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job_file, runtimes = _files(tmp_path)
    assert cli.main(["validate", job_file, "--runtime", runtimes]) == 0  # the quickstart on a CPU runtime
    assert "RLTrainingJob/quickstart: ok" in capsys.readouterr().out
    job_file, runtimes = _files(tmp_path, {"workers": {"gpusPerWorker": 2}})
    assert cli.main(["validate", job_file, "--runtime", runtimes]) == 1
    err = capsys.readouterr().err
    assert "RLTrainingJob/quickstart on ClusterRLTrainingRuntime/cpu: spec.workers.gpusPerWorker: 2 GPUs per worker " \
           "(runtime ClusterRLTrainingRuntime/cpu allows at most 0)" in err
    # The runtime the job names, else the default; a name the file lacks is said.
    two = [runtime_manifest("a"), runtime_manifest("b", default=True, spec={"limits": {"replicas": {"max": 1}}})]
    job_file, runtimes = _files(tmp_path, {"workers": {"replicas": 2, "procsPerWorker": 1}}, two)
    assert cli.main(["validate", job_file, "--runtime", runtimes]) == 1
    assert "on ClusterRLTrainingRuntime/b: spec.workers.replicas: 2 workers" in capsys.readouterr().err
    job_file, runtimes = _files(tmp_path, {"runtimeRef": {"name": "a"}, "workers": {"replicas": 2}}, two)
    assert cli.main(["validate", job_file, "--runtime", runtimes]) == 0
    job_file, runtimes = _files(tmp_path, {"runtimeRef": {"name": "c"}}, two)
    assert cli.main(["validate", job_file, "--runtime", runtimes]) == 1
    assert "spec.runtimeRef: names ClusterRLTrainingRuntime/c, which --runtime does not hold" in capsys.readouterr().err


def test_the_examples_validate_on_the_runtimes_rljob_ships(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The quickstart runs unchanged on a CPU runtime and on a GPU one (issue #42 point 6)."""
    from tests.support.trainer import QUICKSTART

    for limits in ({"gpusPerWorker": {"max": 0}}, {"gpusPerWorker": {"max": 8}}):
        (tmp_path / "rt.yaml").write_text(yaml.safe_dump(runtime_manifest("default", {"limits": limits})))
        assert cli.main(["validate", str(QUICKSTART), "--runtime", str(tmp_path / "rt.yaml")]) == 0, \
            capsys.readouterr().err


def test_rljob_train_on_a_runtime_uses_its_storage_and_refuses_a_job_outside_it(tmp_path: Path) -> None:
    """``_trainer_config_on``: the trainer config ``rljob train`` runs (its launch is the trainer tests')."""
    doc = quickstart_doc()
    j = parse_job(doc)
    assert cli._trainer_config_on(j, None, "job.yaml")("out").checkpoint.storage is None  # the output folder
    runtimes = [parse_runtime(runtime_manifest("local", {"checkpoint": {"storage": str(tmp_path / "ckpt")},
                                                         "sources": {"allowed": ["s3://data/"]}}))]
    cfg: TrainerConfig = cli._trainer_config_on(j, runtimes, "job.yaml")("out")
    assert cfg.checkpoint.storage == str(tmp_path / "ckpt" / "default" / "quickstart")
    assert cfg.checkpoint_location() == cfg.checkpoint.storage and cfg.sources == ["s3://data/"]
    cpu = [parse_runtime(runtime_manifest("cpu", {"limits": {"gpusPerWorker": {"max": 1}}}))]
    with pytest.raises(ManifestError, match=r"on ClusterRLTrainingRuntime/cpu: spec.workers.gpusPerWorker: unset, so 2"):
        cli._trainer_config_on(j, cpu, "job.yaml")


def test_rljob_train_refuses_a_job_outside_its_runtime_with_exit_78(tmp_path: Path) -> None:
    from tests.support.trainer import run_rljob

    job_file, runtimes = _files(tmp_path, {"workers": {"gpusPerWorker": 2}})
    result = run_rljob("train", job_file, "--runtime", runtimes, "--output", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 78, result.stderr[-2000:]
    assert "spec.workers.gpusPerWorker: 2 GPUs per worker (runtime ClusterRLTrainingRuntime/cpu allows at most 0)" \
        in result.stderr
    assert not (tmp_path / "out").exists()


def test_load_runtimes_names_the_file_when_it_holds_none(tmp_path: Path) -> None:
    path = tmp_path / "none.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match="none.yaml: no ClusterRLTrainingRuntime or RLTrainingRuntime document"):
        load_runtimes(path)
