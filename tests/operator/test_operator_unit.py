"""The operator's pure parts: the CRD generator, the builders, phases and plans, the work queue."""

from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from rljob_contract.job import ManifestError, RLTrainingJob, RLTrainingJobSpec, parse_job
from rljob_contract.spec import TrainerConfig
from rljob_operator import crd
from rljob_operator.cluster import runner
from rljob_operator.cluster.workqueue import JobKey, WorkQueue
from rljob_operator.decisions.children import (
    desired_configmap,
    desired_rendezvous,
    desired_service,
    desired_worker_pod,
    desired_worker_pods,
    merge_pod_template,
    spec_hash,
)
from rljob_operator.decisions.conditions import make_conditions
from rljob_operator.decisions.createdpods import created
from rljob_operator.decisions.failure.observe import first_failure
from rljob_operator.decisions.lifecycle import plan_invalid, plan_reconcile
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.names import (
    CONTAINER,
    LABEL_GANG_GENERATION,
    LABEL_JOB,
    LABEL_WORKER_INDEX,
    StatusEndpoint,
    rendezvous_endpoint,
)
from rljob_operator.settings import OperatorSettings
from rljob_operator.times import rfc3339

from tests.support.operator_process import (
    INVALID_MANIFESTS,
    REPO,
    TEST_IMAGE,
    deep_update,
    invalid_manifest,
    job_manifest,
    on_runtime,
)

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "0123456789abcdef-uid"
ENDPOINT = StatusEndpoint("https://rljob-operator.rljob-system.svc:8443", "-----BEGIN CERTIFICATE-----\nx\n")


def make_job(replicas: int = 2, spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
             generation: int = 1) -> RLTrainingJob:
    doc = job_manifest("train", replicas, spec, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": generation})
    if status is not None:
        doc["status"] = status
    return parse_job(doc)


def pod_json(job: RLTrainingJob, index: int, phase: str = "Running", ready: bool = True, generation: int = 0,
             exit_code: int | None = None, message: str | None = None, node: str | None = "gpu-node-0",
             deleting: bool = False, uid: str = UID, unschedulable: str | None = None) -> dict[str, Any]:
    pod = desired_worker_pod(job, index, generation, ENDPOINT)
    pod["metadata"]["ownerReferences"][0]["uid"] = uid
    pod["metadata"]["uid"] = f"pod-{index}-{generation}"
    if deleting:
        pod["metadata"]["deletionTimestamp"] = rfc3339(NOW)
    if node:
        pod["spec"]["nodeName"] = node
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if unschedulable:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                      "finishedAt": rfc3339(NOW)}
        if message:
            terminated["message"] = message
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    pod["status"] = status
    return pod


def observe(job: RLTrainingJob, *pods: dict[str, Any]) -> list[ObservedPod]:
    """``pods`` as the operator sees pods it created itself: each recorded under its name (a test may show two
    generations' pods under one name, which a cluster never holds at once)."""
    return [ObservedPod.from_pod(p, UID, created([p])) for p in pods]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


# --------------------------------------------------------------------------- CRD


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


# ---------------------------------------------------------------------- builders


def test_worker_pods_follow_the_trainer_contract() -> None:
    job = make_job(replicas=3, spec={"workers": {"procsPerWorker": 2}, "training": {"batchSize": 4}})
    pods = desired_worker_pods(job, generation=5, endpoint=ENDPOINT)
    assert [p["metadata"]["name"] for p in pods] == ["train-worker-0", "train-worker-1", "train-worker-2"]
    pod = pods[1]
    env = env_of(pod)
    assert env["RLJOB_NNODES"] == "3" and env["RLJOB_NODE_RANK"] == "1" and env["RLJOB_NPROC_PER_NODE"] == "2"
    assert env["RLJOB_RDZV_ENDPOINT"] == "train-worker-0.train.team-a.svc:29500"
    assert env["RLJOB_RUN_ID"] == "train-01234567-g5"
    assert env["RLJOB_OUTPUT_DIR"] == "/workspace/output" and env["RLJOB_METRICS_PORT"] == "9400"
    assert env["RLJOB_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["RLJOB_STATUS_URL"] == (
        "https://rljob-operator.rljob-system.svc:8443/api/v1/namespaces/team-a/rltrainingjobs/train/heartbeat"
    )
    assert env["RLJOB_TOKEN_FILE"] == "/var/run/secrets/rljob.dev/status/token"
    assert env["RLJOB_STATUS_CA_FILE"] == "/etc/rljob/status-ca.crt"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "rljob_trainer.launch", "--config", "/etc/rljob/trainer.yaml"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert (spec["hostname"], spec["subdomain"]) == ("train-worker-1", "train")
    labels = pod["metadata"]["labels"]
    assert labels[LABEL_JOB] == "train" and labels[LABEL_WORKER_INDEX] == "1" and labels[LABEL_GANG_GENERATION] == "5"
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["uid"] == UID and owner["controller"] and owner["kind"] == "RLTrainingJob"


def test_gpus_are_requested_and_limited_and_their_taint_tolerated() -> None:
    job = make_job(spec={"workers": {"procsPerWorker": 2, "resources": {"requests": {"cpu": 8, "memory": "64Gi"}}},
                         "training": {"batchSize": 2}})
    container = desired_worker_pod(job, 0, 0)["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    tolerations = desired_worker_pod(job, 0, 0)["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    cpu_job = make_job(spec={"workers": {"gpusPerWorker": 0}})
    assert "nvidia.com/gpu" not in str(desired_worker_pod(cpu_job, 0, 0)["spec"]["containers"][0]["resources"])
    amd = make_job(spec={"workers": {"gpusPerWorker": 4}})
    pod = desired_worker_pod(amd, 0, 0, runtime=on_runtime(amd, {"gpuResource": "amd.com/gpu"}))
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "4"}
    assert pod["spec"]["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_a_cpu_runtime_gives_a_job_no_gpus_and_defaults_fill_its_sizes() -> None:
    """The quickstart's procsPerWorker: 2 asks for 2 GPUs on a GPU runtime and none on a CPU one (max 0)."""
    job = make_job(spec={"workers": {"procsPerWorker": 2}, "training": {"batchSize": 2}})
    cpu = on_runtime(job, {"limits": {"gpusPerWorker": {"max": 0}, "cpuPerWorker": {"default": "2"},
                                      "memoryPerWorker": {"default": "4Gi"},
                                      "terminationGracePeriodSeconds": {"default": 30}}})
    pod = desired_worker_pod(job, 0, 0, runtime=cpu)
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30 and env_of(pod)["RLJOB_SHUTDOWN_TIMEOUT"] == "20"
    gpu = desired_worker_pod(job, 0, 0, runtime=on_runtime(job))["spec"]["containers"][0]["resources"]
    assert gpu["limits"] == {"nvidia.com/gpu": "2"}


def test_health_probes_are_on_worker_zero_only() -> None:
    job = make_job()
    zero, one = (desired_worker_pod(job, i, 0)["spec"]["containers"][0] for i in (0, 1))
    assert zero["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9400}
    assert zero["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9400}
    assert zero["startupProbe"]["failureThreshold"] * zero["startupProbe"]["periodSeconds"] >= 1800
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(one)


def test_heartbeat_token_is_projected_with_the_status_audience() -> None:
    pod = desired_worker_pod(make_job(), 0, 0, ENDPOINT)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "rljob-status-token")
    token = volume["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "rljob-status" and token["path"] == "token"
    no_api = desired_worker_pod(make_job(), 0, 0, None)
    assert "RLJOB_STATUS_URL" not in env_of(no_api)
    assert all(v["name"] != "rljob-status-token" for v in no_api["spec"]["volumes"])


def test_configmap_holds_the_trainer_config_and_the_status_ca() -> None:
    cm = desired_configmap(make_job(replicas=2), ENDPOINT)
    assert cm["metadata"]["name"] == "train-config"
    cfg = TrainerConfig.model_validate(yaml.safe_load(cm["data"]["trainer.yaml"]))
    assert cfg.world_size == 2 and cfg.output_dir == "/workspace/output" and cfg.job_name == "train"
    assert cfg.training.max_steps == 3
    assert cm["data"]["status-ca.crt"] == ENDPOINT.ca_pem


def test_service_is_headless_with_no_selector_and_its_slice_names_the_operators_worker_0_only() -> None:
    """Labels route nothing (anyone who may create a pod can copy them): the operator writes the Service's one
    EndpointSlice itself, with the address of the worker 0 it created, under the rendezvous hostname."""
    job = make_job()
    svc = desired_service(job)
    assert svc["metadata"]["name"] == "train"
    assert svc["spec"]["clusterIP"] == "None" and "selector" not in svc["spec"]
    worker0 = pod_json(job, 0)
    worker0["status"]["podIP"] = "10.1.2.3"
    [seen] = observe(job, worker0)
    rendezvous = desired_rendezvous(job, seen)
    assert rendezvous["metadata"]["name"] == "train-rendezvous"
    assert rendezvous["metadata"]["labels"]["kubernetes.io/service-name"] == "train"
    assert rendezvous["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "rljob-operator"
    assert rendezvous["metadata"]["ownerReferences"] == svc["metadata"]["ownerReferences"]  # the job's
    assert rendezvous["addressType"] == "IPv4" and rendezvous["endpoints"] == [{
        "addresses": ["10.1.2.3"], "hostname": "train-worker-0", "conditions": {"ready": True}, "nodeName": "gpu-node-0",
        "targetRef": {"kind": "Pod", "namespace": "team-a", "name": "train-worker-0", "uid": seen.uid}}]
    assert desired_rendezvous(job, None)["endpoints"] == []
    # ... whose hostname, through this Service, is the rendezvous endpoint every worker is given.
    endpoint = rendezvous_endpoint("train", "default")
    assert endpoint.startswith(f"{desired_worker_pod(job, 0, 0)['spec']['hostname']}.{svc['metadata']['name']}.")
    assert {p["port"] for p in svc["spec"]["ports"]} == {p["port"] for p in rendezvous["ports"]} == {29500, 9400}


def test_the_jobs_env_and_the_runtimes_pod_fields_reach_the_pod() -> None:
    job = make_job(spec={"workers": {
        "env": [{"name": "HF_HOME", "value": "/cache"}, {"name": "RLJOB_NODE_RANK", "value": "7"},
                {"name": "HF_TOKEN", "value": "mine"}],
    }})
    runtime = on_runtime(job, {"imagePullSecrets": [{"name": "regcred"}], "podTemplate": {"spec": {
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "prompts"}}],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}]}],
        "nodeSelector": {"pool": "h100"},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "priorityClassName": "training", "serviceAccountName": "s3-reader",
        "affinity": {"nodeAffinity": {}},
    }}})
    pod = desired_worker_pod(job, 1, 0, runtime=runtime)
    env = env_of(pod)
    assert env["HF_HOME"] == "/cache" and env["RLJOB_NODE_RANK"] == "1"  # the contract wins
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "t"}}  # and so does the runtime
    assert [e["name"] for e in pod["spec"]["containers"][0]["env"]].count("RLJOB_NODE_RANK") == 1
    assert [e["name"] for e in pod["spec"]["containers"][0]["env"]].count("HF_TOKEN") == 1
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    forbidden = on_runtime(job, {"jobEnv": "Forbidden"})
    assert "HF_HOME" not in env_of(desired_worker_pod(job, 1, 0, runtime=forbidden))
    assert {"name": "data", "mountPath": "/data"} in pod["spec"]["containers"][0]["volumeMounts"]
    assert any(v["name"] == "data" for v in pod["spec"]["volumes"])
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "h100"} and spec["priorityClassName"] == "training"
    assert spec["serviceAccountName"] == "s3-reader" and spec["affinity"] == {"nodeAffinity": {}}
    assert {"key": "spot", "operator": "Exists"} in spec["tolerations"] and len(spec["tolerations"]) == 2


def test_pod_template_merges_but_operator_fields_win() -> None:
    job = make_job()
    runtime = on_runtime(job, {"podTemplate": {
        "metadata": {"labels": {"team": "rl", LABEL_JOB: "other"}, "annotations": {"a": "b"}},
        "spec": {
            "restartPolicy": "Always",
            "schedulerName": "volcano",
            "containers": [
                {"name": "trainer", "command": ["sh"], "securityContext": {"runAsUser": 1000}},
                {"name": "sidecar", "image": "busybox"},
            ],
            "tolerations": [{"key": "x", "operator": "Exists"}],
        },
    }})
    pod = desired_worker_pod(job, 0, 0, runtime=runtime)
    assert pod["metadata"]["labels"]["team"] == "rl" and pod["metadata"]["labels"][LABEL_JOB] == "train"
    assert pod["metadata"]["annotations"]["a"] == "b"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["schedulerName"] == "volcano"
    trainer, sidecar = pod["spec"]["containers"]
    assert trainer["command"][:3] == ["python", "-m", "rljob_trainer.launch"]
    # The template's fields merge into ours (so the pod still meets Pod Security "restricted").
    assert trainer["securityContext"]["runAsUser"] == 1000 and trainer["image"] == runtime.image == TEST_IMAGE
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert len(pod["spec"]["tolerations"]) == 2


def test_merge_pod_template_rules() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "volumes": [{"name": "v", "emptyDir": {}}]}
    merged = merge_pod_template(base, {"a": {"c": [3]}, "volumes": [{"name": "v", "emptyDir": {"medium": "Memory"}},
                                                                    {"name": "w"}]})
    assert merged == {"a": {"b": 1, "c": [3]},
                      "volumes": [{"name": "v", "emptyDir": {"medium": "Memory"}}, {"name": "w"}]}
    assert base["a"]["c"] == [1, 2]  # inputs untouched


def test_spec_hash_changes_with_the_gang_spec_but_not_run_policy_or_size() -> None:
    job = make_job()
    assert spec_hash(job) == spec_hash(make_job(spec={"runPolicy": {"suspend": True, "ttlSecondsAfterFinished": 5}}))
    # The size is the operator's decision (status.scaling): a resize restarts the gang itself.
    assert spec_hash(job) == spec_hash(make_job(replicas=4, spec={"workers": {"maxReplicas": 8}}))
    assert spec_hash(job) != spec_hash(make_job(spec={"workers": {"procsPerWorker": 2}}))
    assert spec_hash(job) != spec_hash(make_job(spec={"training": {"seed": 5}}))


# ---------------------------------------------------------------------- plans


def test_new_job_creates_every_worker_and_records_its_start() -> None:
    job = make_job(replicas=3)
    plan = plan_reconcile(job, [], NOW, ENDPOINT)
    assert [p["metadata"]["name"] for p in plan.create_pods] == [f"train-worker-{i}" for i in range(3)]
    assert plan.configmap is not None and plan.service is not None and not plan.delete_pods
    s = plan.status
    assert (s["phase"], s["reason"], s["startTime"], s["gangGeneration"]) == ("Pending", "CreatingWorkers",
                                                                            rfc3339(NOW), 0)
    assert s["workers"] == {"desired": 3, "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "summary": "0/3",
                            "current": 0}
    assert s["selector"] == "rljob.dev/job=train" and s["observedGeneration"] == 1
    assert [e.reason for e in plan.events] == ["CreatingWorkers", "EphemeralCheckpoints"]  # no spec.checkpoint.storage


def test_a_partly_created_gang_is_completed_and_never_duplicated() -> None:
    job = make_job(replicas=3, status={"phase": "Pending", "startTime": rfc3339(NOW), "gangGeneration": 0})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, "Pending", False, node=None)), NOW)
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-1", "train-worker-2"]
    full = observe(job, *(pod_json(job, i) for i in range(3)))
    assert plan_reconcile(job, full, NOW).create_pods == []


def test_phases_follow_the_pods() -> None:
    job = make_job(status={"phase": "Pending", "startTime": rfc3339(NOW)})
    pending = plan_reconcile(job, observe(job, pod_json(job, 0, "Pending", False, node=None),
                                          pod_json(job, 1, "Pending", False, node=None,
                                                   unschedulable="0/4 nodes: Insufficient nvidia.com/gpu")), NOW)
    assert pending.status["phase"] == "Pending" and pending.status["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in pending.status["message"]
    starting = plan_reconcile(job, observe(job, pod_json(job, 0, "Running", False), pod_json(job, 1, "Pending", False)),
                              NOW)
    assert starting.status["phase"] == "Starting"
    running = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1)), NOW)
    assert running.status["phase"] == "Running" and running.status["workers"]["summary"] == "2/2"
    assert {c["type"]: c["status"] for c in running.status["conditions"]} == {
        "Ready": "True", "Reconciling": "False", "Stalled": "False", "Succeeded": "False", "Failed": "False",
        "Suspended": "False", "CheckpointsDurable": "False"}
    # The stored status has no CheckpointsDurable yet (a job from before it): warned once, with the phase change.
    assert [(e.type, e.reason) for e in running.events] == [("Normal", "Running"), ("Warning", "EphemeralCheckpoints")]


def test_a_running_job_that_loses_readiness_stays_running_but_not_ready() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, ready=False), pod_json(job, 1)), NOW)
    assert plan.status["phase"] == "Running" and plan.status["reason"] == "WorkersNotReady"
    assert next(c for c in plan.status["conditions"] if c["type"] == "Ready")["status"] == "False"
    # No phase change, no Event; only the once-per-job warning a job from before CheckpointsDurable gets.
    assert [e.reason for e in plan.events] == ["EphemeralCheckpoints"]


def test_worker_zero_exiting_0_means_succeeded_and_the_rest_of_the_gang_is_deleted() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW)})
    early = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1, "Succeeded", False, exit_code=0)), NOW)
    assert early.status["phase"] == "Running"
    done = plan_reconcile(job, observe(job, pod_json(job, 0, "Succeeded", False, exit_code=0), pod_json(job, 1)), NOW)
    assert done.status["phase"] == "Succeeded" and done.status["completionTime"] == rfc3339(NOW)
    # Worker 1 outlived worker 0 (its code sleeps, say): it would keep its GPUs. Deleted, and looked after.
    assert done.delete_pods == ["train-worker-1"] and done.create_pods == []
    assert done.requeue_after is not None
    assert next(c for c in done.status["conditions"] if c["type"] == "Succeeded")["status"] == "True"
    # The next reconcile (the finished step) deletes whatever still runs, orphans with the job's label too.
    succeeded = make_job(status={"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW)})
    orphan = pod_json(succeeded, 2)
    orphan["metadata"]["ownerReferences"] = []
    later = plan_reconcile(succeeded, observe(succeeded, pod_json(succeeded, 0, "Succeeded", False, exit_code=0),
                                              pod_json(succeeded, 1), orphan), NOW)
    assert later.status["phase"] == "Succeeded" and sorted(later.delete_pods) == ["train-worker-1", "train-worker-2"]
    finished = plan_reconcile(succeeded, observe(succeeded, pod_json(succeeded, 0, "Succeeded", False, exit_code=0)),
                              NOW)
    assert finished.delete_pods == [] and finished.requeue_after is None


def test_a_permanent_exit_fails_the_job_with_the_termination_message() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(
        job, pod_json(job, 0),
        pod_json(job, 1, "Failed", False, exit_code=78, message="spec.training.rewards[0]: cannot import x\nmore"),
    ), NOW)
    s = plan.status
    assert (s["phase"], s["reason"]) == ("Failed", "PermanentError")
    assert s["message"] == "train-worker-1 exited with code 78: spec.training.rewards[0]: cannot import x"
    assert plan.delete_pods == ["train-worker-0"]  # the rest of the gang would hang: free the GPUs
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "PermanentError")]
    conditions = {c["type"]: c["status"] for c in s["conditions"]}
    assert conditions["Failed"] == conditions["Stalled"] == "True" and conditions["Ready"] == "False"


def test_the_most_telling_failure_is_reported() -> None:
    job = make_job()
    crash, config = observe(job, pod_json(job, 0, "Failed", False, exit_code=1),
                            pod_json(job, 1, "Failed", False, exit_code=78))
    assert first_failure([crash, config]) is config


def test_a_worker_disappearing_under_restart_policy_never_fails_the_job() -> None:
    job = make_job(spec={"runPolicy": {"restartPolicy": "Never"}}, status={"phase": "Running", "startTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0)), NOW)
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "WorkerLost"
    assert "train-worker-1" in plan.status["message"] and plan.create_pods == []


def test_a_worker_on_a_deleted_node_restarts_the_gang_as_a_disruption_and_is_force_deleted() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW), "gangGeneration": 0})
    pods = [pod_json(job, 0, node="node-a"), pod_json(job, 1, node="node-b")]
    # Unknown (no Node watch): both pods look healthy, nothing happens.
    unknown = plan_reconcile(job, observe(job, *pods), NOW)
    assert unknown.status.get("phase", "Running") == "Running" and not unknown.delete_pods
    observed = [ObservedPod.from_pod(p, UID, created([p]), node_gone=lambda node: node == "node-b") for p in pods]
    assert [p.node_lost for p in observed] == [False, True]
    plan = plan_reconcile(job, observed, NOW)
    s = plan.status
    assert (s["phase"], s["reason"], s["gangGeneration"], s["disruptions"], s["restarts"]) == (
        "Restarting", "WorkerLost", 1, 1, 0)
    assert s["lastFailure"]["worker"] == "train-worker-1" and s["lastFailure"]["disruption"] is True
    # No kubelet will confirm worker 1's end: it is force-deleted (and only that); worker 0 goes gracefully.
    assert (plan.force_delete_pods, plan.delete_pods) == (["train-worker-1"], ["train-worker-0"])


def test_a_pod_of_a_deleted_namesake_job_blocks_its_name() -> None:
    job = make_job()
    plan = plan_reconcile(job, observe(job, pod_json(job, 0, uid="old-job-uid", deleting=True)), NOW)
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-1"]
    assert plan.delete_pods == []  # not ours to delete
    assert plan.requeue_after is not None


def test_suspend_deletes_pods_and_resume_starts_a_new_gang() -> None:
    running = {"phase": "Running", "startTime": rfc3339(NOW - timedelta(hours=1)), "gangGeneration": 2}
    job = make_job(spec={"runPolicy": {"suspend": True}}, status=running)
    pods = observe(job, pod_json(job, 0, generation=2), pod_json(job, 1, generation=2))
    plan = plan_reconcile(job, pods, NOW)
    assert plan.status["phase"] == "Suspended" and sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"]
    assert plan.status["startTime"] is None and plan.create_pods == []
    done = plan_reconcile(make_job(spec={"runPolicy": {"suspend": True}}, status=plan.status), [], NOW)
    assert done.status["phase"] == "Suspended" and done.requeue_after is None
    assert next(c for c in done.status["conditions"] if c["type"] == "Suspended")["status"] == "True"
    resumed = plan_reconcile(make_job(status=done.status), [], NOW + timedelta(minutes=5))
    assert resumed.status["gangGeneration"] == 3 and resumed.gang_restart == "Resumed"
    assert {p["metadata"]["labels"][LABEL_GANG_GENERATION] for p in resumed.create_pods} == {"3"}
    assert resumed.status["startTime"] == rfc3339(NOW + timedelta(minutes=5))  # the deadline clock restarts


def test_the_deadline_fails_the_job_and_is_requeued_before() -> None:
    start = NOW - timedelta(seconds=50)
    job = make_job(spec={"runPolicy": {"activeDeadlineSeconds": 60}},
                   status={"phase": "Running", "startTime": rfc3339(start)})
    pods = observe(job, pod_json(job, 0), pod_json(job, 1))
    before = plan_reconcile(job, pods, NOW)
    assert before.status["phase"] == "Running" and before.requeue_after == pytest.approx(10)
    after = plan_reconcile(job, pods, NOW + timedelta(seconds=11))
    assert (after.status["phase"], after.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert sorted(after.delete_pods) == ["train-worker-0", "train-worker-1"]


def test_ttl_deletes_a_finished_job_when_due() -> None:
    status = {"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW), "startTime": rfc3339(NOW)}
    job = make_job(spec={"runPolicy": {"ttlSecondsAfterFinished": 30}}, status=status)
    waiting = plan_reconcile(job, [], NOW + timedelta(seconds=10))
    assert not waiting.delete_job and waiting.requeue_after == pytest.approx(20)
    assert plan_reconcile(job, [], NOW + timedelta(seconds=30)).delete_job
    assert not plan_reconcile(make_job(status=status), [], NOW + timedelta(days=9)).delete_job


def test_ttl_deletes_a_finished_job_only_once_its_pods_are_gone() -> None:
    """Deleting the job would let the garbage collector take its Kueue Workload (its quota) while a pod runs."""
    status = {"phase": "Succeeded", "reason": "Completed", "completionTime": rfc3339(NOW), "startTime": rfc3339(NOW)}
    job = make_job(spec={"runPolicy": {"ttlSecondsAfterFinished": 30}}, status=status)
    terminating = observe(job, pod_json(job, 1, deleting=True))
    due = plan_reconcile(job, terminating, NOW + timedelta(seconds=30))
    assert not due.delete_job and due.requeue_after is not None
    exited = observe(job, pod_json(job, 1, "Succeeded", False, exit_code=0))
    assert plan_reconcile(job, exited, NOW + timedelta(seconds=30)).delete_job


def test_a_finished_job_creates_nothing() -> None:
    job = make_job(status={"phase": "Failed", "reason": "PermanentError", "completionTime": rfc3339(NOW)})
    plan = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1, "Failed", False, exit_code=78)), NOW)
    assert plan.create_pods == [] and plan.delete_pods == ["train-worker-0"] and plan.events == []
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PermanentError"


def test_a_spec_change_restarts_the_gang() -> None:
    old = make_job(replicas=3)
    pods = [pod_json(old, 0), pod_json(old, 1), pod_json(old, 2)]
    job = make_job(replicas=3, spec={"training": {"seed": 5}},
                   status={"phase": "Running", "startTime": rfc3339(NOW), "gangGeneration": 0}, generation=2)
    plan = plan_reconcile(job, observe(job, *pods), NOW)
    assert plan.status["gangGeneration"] == 1 and plan.gang_restart == "SpecChanged"
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1", "train-worker-2"]
    assert plan.create_pods == []  # the names are taken until the old pods are gone
    assert plan.status["phase"] == "Pending" and plan.status["observedGeneration"] == 2
    assert "SpecChanged" in [e.reason for e in plan.events]


def test_an_invalid_spec_fails_until_it_is_edited() -> None:
    raw = {"metadata": {"name": "x", "generation": 3}, "status": {}}
    plan = plan_invalid(raw, ["spec.training.trl: max_steps are set by rljob"], NOW)
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec"
    assert "spec.training.trl" in plan.status["message"] and plan.events[0].type == "Warning"
    again = plan_invalid({**raw, "status": plan.status}, ["spec.training.trl: max_steps are set by rljob"], NOW)
    assert again.events == []
    fixed = make_job(status={**plan.status, "observedGeneration": 3}, generation=4)
    assert len(plan_reconcile(fixed, [], NOW).create_pods) == 2


def test_a_running_job_edited_into_an_invalid_spec_stops_its_pods() -> None:
    """An edit the CRD lets through and the models refuse fails the job (InvalidSpec): a finished job keeps no
    pod running, whichever way it ended; a stuck one is force-deleted in its time."""
    job = make_job()
    raw = {"metadata": {"name": "train", "generation": 3, "uid": UID}, "status": {"phase": "Running"}}
    pods = observe(job, pod_json(job, 0), pod_json(job, 1, "Succeeded", False, exit_code=0))
    plan = plan_invalid(raw, ["spec.training.trl: bad"], NOW, pods)
    assert plan.status["phase"] == "Failed" and plan.delete_pods == ["train-worker-0"]
    assert plan.requeue_after is not None
    stuck = observe(job, pod_json(job, 0, deleting=True))
    later = plan_invalid({**raw, "status": plan.status}, ["spec.training.trl: bad"], NOW + timedelta(seconds=60),
                         stuck, force_delete_after=60)
    assert later.force_delete_pods == ["train-worker-0"] and later.delete_pods == []
    assert plan_invalid({**raw, "status": plan.status}, ["spec.training.trl: bad"], NOW).requeue_after is None


def test_conditions_keep_their_transition_time_until_they_flip() -> None:
    first = make_conditions("Running", "Running", "m", ready=True, reconciling=False, generation=1, previous=[],
                            now=NOW)
    later = NOW + timedelta(minutes=1)
    second = make_conditions("Failed", "X", "m", ready=False, reconciling=False, generation=2,
                             previous=[c.model_dump(by_alias=True) for c in first], now=later)
    times = {c.type: c.last_transition_time for c in second}
    assert times["Ready"] == times["Failed"] == times["Stalled"] == rfc3339(later)
    assert times["Succeeded"] == times["Suspended"] == rfc3339(NOW)
    assert {c.observed_generation for c in second} == {2}


def test_observed_pod_reads_the_container_termination() -> None:
    job = make_job()
    pod = pod_json(job, 1, "Failed", False, exit_code=200, message="CUDA out of memory")
    observed = ObservedPod.from_pod(pod, UID, created([pod]))
    assert (observed.index, observed.generation, observed.exit_code) == (1, 0, 200)
    assert observed.owned and observed.finished and not observed.active
    assert observed.spec_hash == spec_hash(job)
    assert not ObservedPod.from_pod(copy.deepcopy(pod), "other", created([pod])).owned


# ------------------------------------------------------------------ work queue


def test_work_queue_runs_each_key_serially_once_per_burst() -> None:
    async def scenario() -> tuple[list[str], int]:
        calls: list[str] = []
        active: set[str] = set()
        overlap = 0

        async def handler(key: Any) -> float | None:
            nonlocal overlap
            if key in active:
                overlap += 1
            active.add(key)
            calls.append(key)
            await asyncio.sleep(0.05)
            active.discard(key)
            return None

        queue = WorkQueue(handler, workers=4)
        queue.start()
        for _ in range(5):
            queue.add("a")
        await asyncio.sleep(0.01)
        for _ in range(5):
            queue.add("a")  # while "a" runs: one more run afterwards
        queue.add("b")
        await asyncio.sleep(0.3)
        await queue.stop()
        return calls, overlap

    calls, overlap = asyncio.run(scenario())
    assert calls.count("a") == 2 and calls.count("b") == 1 and overlap == 0


def test_a_job_and_an_experiment_of_one_name_are_two_keys_and_each_reaches_its_own_reconcile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_operator.cluster.workqueue import ExperimentKey

    assert JobKey("a", "x") != ExperimentKey("a", "x") and len({JobKey("a", "x"), ExperimentKey("a", "x")}) == 2
    ran: list[tuple[str, str, str]] = []
    monkeypatch.setattr(runner.Reconciler, "reconcile", lambda self, ns, name: ran.append(("job", ns, name)))
    monkeypatch.setattr(runner.ExperimentReconciler, "reconcile", lambda self, ns, name: ran.append(("exp", ns, name)))

    async def scenario() -> None:
        leading = runner._reconciling(OperatorSettings(workers=2, kueue=False, watch_nodes=False),
                                      SimpleNamespace(configuration=None), SimpleNamespace(), None, None,
                                      SimpleNamespace(in_force=True))  # type: ignore[arg-type]
        try:
            leading.work.queue.add(JobKey("a", "x"))
            leading.work.queue.add(ExperimentKey("a", "x"))
            for _ in range(200):
                if len(ran) == 2:
                    break
                await asyncio.sleep(0.02)
        finally:
            await leading.work.queue.stop()
            leading.threads.shutdown(wait=False)

    asyncio.run(scenario())
    assert sorted(ran) == [("exp", "a", "x"), ("job", "a", "x")]


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


def test_reconciles_run_as_many_at_once_as_workers_says_whatever_the_default_executor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``workers`` reconciles run at once in the operator's own threads: asyncio's default executor
    has min(32, CPUs + 4) threads (6 on a 2-core node) and is kept at 2 here, so a reconcile sent
    there could never meet the 8 others at the barrier."""
    workers = 8
    barrier = threading.Barrier(workers, timeout=10)
    met: list[str] = []

    def reconcile(self: Any, namespace: str, name: str) -> float | None:
        barrier.wait()  # BrokenBarrierError unless all `workers` reconciles run at once
        met.append(name)
        return None

    monkeypatch.setattr(runner.Reconciler, "reconcile", reconcile)
    settings = OperatorSettings(workers=workers, kueue=False, watch_nodes=False)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        leading = runner._reconciling(settings, SimpleNamespace(configuration=None), SimpleNamespace(), None, None,
                                      SimpleNamespace(in_force=True))  # type: ignore[arg-type]
        try:
            for i in range(workers):
                leading.work.queue.add(JobKey("team-a", f"job-{i}"))
            deadline = loop.time() + 15
            while len(met) < workers and loop.time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await leading.work.queue.stop()
            leading.threads.shutdown(wait=False)

    asyncio.run(scenario())
    assert sorted(met) == sorted(f"job-{i}" for i in range(workers))


def test_work_queue_requeues_after_a_delay_and_backs_off_errors() -> None:
    async def scenario() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        seen: list[tuple[str, float]] = []

        async def handler(key: Any) -> float | None:
            seen.append((key, loop.time() - start))
            if key == "later" and len(seen) == 1:
                return 0.2
            if key == "boom" and sum(1 for k, _ in seen if k == "boom") < 3:
                raise RuntimeError("transient")
            return None

        queue = WorkQueue(handler, workers=2, backoff_base=0.05)
        queue.start()
        queue.add("later")
        await asyncio.sleep(0.35)
        queue.add("boom")
        await asyncio.sleep(0.5)
        await queue.stop()
        return seen

    seen = asyncio.run(scenario())
    later = [t for k, t in seen if k == "later"]
    assert len(later) == 2 and later[1] - later[0] >= 0.19
    boom = [t for k, t in seen if k == "boom"]
    assert len(boom) == 3 and boom[2] - boom[1] > boom[1] - boom[0]


def test_work_queue_coalesces_delayed_events_and_fires_them_as_events() -> None:
    async def scenario() -> tuple[list[tuple[str, float]], list[str]]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        seen: list[tuple[str, float]] = []
        gate = asyncio.Event()

        async def handler(key: Any) -> float | None:
            if key == "busy":
                await gate.wait()
            seen.append((key, round(loop.time() - start, 2)))
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        for _ in range(3):  # three pods of one gang coming up: one reconcile, a moment after the first
            queue.add("gang", delay=0.2)
            await asyncio.sleep(0.05)
        queue.add("queued")  # already queued as an event: a delayed event adds nothing
        queue.add("queued", delay=0.05)
        queue.add("superseded", delay=0.3)
        queue.add("superseded")  # it runs now: the pending delay is dropped
        await asyncio.sleep(0.5)
        # A delayed event fires as an event, ahead of the routine looks queued meanwhile.
        queue.add("busy")
        await asyncio.sleep(0.01)
        queue.add("news", delay=0.05)
        for key in ("resync-1", "resync-2"):
            queue.add(key, low=True)
        await asyncio.sleep(0.1)
        gate.set()
        await asyncio.sleep(0.1)
        await queue.stop()
        return seen, [k for k, _ in seen][-4:]

    seen, tail = asyncio.run(scenario())
    assert [k for k, _ in seen].count("gang") == 1
    assert next(t for k, t in seen if k == "gang") >= 0.19  # the first add's delay: the others wait with it
    assert [k for k, _ in seen].count("queued") == 1 and [k for k, _ in seen].count("superseded") == 1
    assert tail == ["busy", "news", "resync-1", "resync-2"]


def test_work_queue_serves_events_before_routine_looks() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        gate = asyncio.Event()

        async def handler(key: Any) -> float | None:
            if key == "busy":
                await gate.wait()
            order.append(key)
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        queue.add("busy")
        await asyncio.sleep(0.01)  # the only worker is busy: everything below waits
        for key in ("resync-1", "resync-2", "raised"):
            queue.add(key, low=True)
        queue.add("failed-worker")  # an event
        queue.add("raised")  # an event for a key already waiting behind the routine looks
        gate.set()
        await asyncio.sleep(0.1)
        await queue.stop()
        return order

    order = asyncio.run(scenario())
    assert order == ["busy", "failed-worker", "raised", "resync-1", "resync-2"]  # each key once


def test_work_queue_serves_urgent_events_first_and_a_key_keeps_its_tier_while_it_runs() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        gate, running = asyncio.Event(), asyncio.Event()

        async def handler(key: Any) -> float | None:
            order.append(key)
            if key == "busy" and order.count("busy") == 1:
                running.set()
                await gate.wait()
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        queue.add("busy")
        await running.wait()  # the only worker is busy: everything below waits
        queue.add("resync", low=True)
        for key in ("ready-1", "ready-2", "raised"):
            queue.add(key)  # pods turning ready: status changes
        queue.add("failed-worker", urgent=True)
        queue.add("raised", urgent=True)  # already waiting as an event: moved up, runs once
        queue.add("busy", urgent=True)  # its pod failed while it ran: runs again, urgently
        queue.add("busy")  # a later plain event does not demote it
        gate.set()
        await asyncio.sleep(0.1)
        await queue.stop()
        return order

    order = asyncio.run(scenario())
    assert order == ["busy", "failed-worker", "raised", "busy", "ready-1", "ready-2", "resync"]


def test_a_pod_event_is_urgent_when_a_worker_ended_its_gangs_last_terminating_pod_is_gone_or_all_are_ready(
) -> None:
    from rljob_operator.cluster.handlers import urgent_pod_event

    job = make_job()
    running = pod_json(job, 0)
    running["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

    def variant(status: dict[str, Any] | None = None, deleting: bool = False) -> dict[str, Any]:
        pod = copy.deepcopy(running)
        if status is not None:
            pod["status"] = status
        if deleting:
            pod["metadata"]["deletionTimestamp"] = rfc3339(NOW)
        return pod

    exited = {"phase": "Running", "containerStatuses": [
        {"name": CONTAINER, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    unready = variant({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]})
    assert not urgent_pod_event("MODIFIED", running, [running, unready])  # ready before its gang: status only
    assert not urgent_pod_event("MODIFIED", running, [running, variant(deleting=True)])
    assert urgent_pod_event("MODIFIED", running, [running, running])  # the last of its gang: Running
    assert not urgent_pod_event("ADDED", variant({"phase": "Pending"}), [])
    assert not urgent_pod_event("MODIFIED", variant(deleting=True), [variant(deleting=True)])
    assert urgent_pod_event("MODIFIED", variant({"phase": "Failed"}), [])
    assert urgent_pod_event("MODIFIED", variant({"phase": "Succeeded"}), [])
    assert urgent_pod_event("MODIFIED", variant(exited), [])  # the trainer exited, the phase not yet
    assert urgent_pod_event("MODIFIED", variant({"phase": "Running", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}), [])
    assert urgent_pod_event(None, variant({"phase": "Failed"}), [])  # listed at start
    # Deleted: urgent once no other pod of the job is still terminating (its replacements can be created).
    assert not urgent_pod_event("DELETED", variant(deleting=True), [running, variant(deleting=True)])
    assert urgent_pod_event("DELETED", variant(deleting=True), [running])
    assert urgent_pod_event("DELETED", running, [])  # gone without a word: a worker lost


def test_work_queue_reports_how_long_keys_waited_and_how_many_wait() -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {by: (sample("rljob_operator_queue_wait_seconds_count", queued_by=by),
                   sample("rljob_operator_queue_wait_seconds_sum", queued_by=by)) for by in ("event", "routine")}
    depths: list[float] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def handler(key: Any) -> float | None:
            if key == "busy":
                await gate.wait()
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        queue.add("busy")
        await asyncio.sleep(0.01)
        queue.add("event")
        queue.add("routine", low=True)
        depths.append(sample("rljob_operator_queue_depth"))
        await asyncio.sleep(0.2)  # both wait behind "busy" this long
        gate.set()
        await asyncio.sleep(0.05)
        depths.append(sample("rljob_operator_queue_depth"))
        await queue.stop()

    asyncio.run(scenario())
    assert depths == [2, 0]
    event_count, event_sum = (sample(f"rljob_operator_queue_wait_seconds_{k}", queued_by="event") for k in ("count", "sum"))
    assert event_count - before["event"][0] == 2  # "busy" (at once) and "event" (after the 0.2 s)
    assert 0.2 <= event_sum - before["event"][1] < 2
    assert sample("rljob_operator_queue_wait_seconds_count", queued_by="routine") - before["routine"][0] == 1
    assert sample("rljob_operator_queue_wait_seconds_sum", queued_by="routine") - before["routine"][1] >= 0.2


# --------------------------------------------------------------------- settings


def test_settings_come_from_env_then_flags() -> None:
    env = {"RLJOB_OPERATOR_RESYNC_SECONDS": "2.5", "RLJOB_OPERATOR_NAMESPACES": "a, b",
           "RLJOB_OPERATOR_LEADER_ELECT": "false", "RLJOB_OPERATOR_STATUS_PORT": "9443"}
    s = OperatorSettings.from_env(env, status_port=10443, kubeconfig=None)
    assert s.resync_seconds == 2.5 and s.namespaces == ["a", "b"] and s.leader_elect is False
    assert s.status_port == 10443
    assert s.effective_status_url == f"https://rljob-operator.{s.operator_namespace}.svc:10443"
    assert OperatorSettings.from_env({}, namespaces=["team"]).operator_namespace == "team"


def test_deep_update_helper_does_not_mutate() -> None:
    base = {"a": {"b": 1}}
    assert deep_update(base, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}} and base == {"a": {"b": 1}}


def test_an_operator_upgrade_alone_does_not_restart_running_gangs() -> None:
    job = make_job(status={"phase": "Running", "startTime": rfc3339(NOW), "gangGeneration": 0})
    pods = [pod_json(job, 0), pod_json(job, 1)]
    for pod in pods:  # built by an older operator whose spec rendering differed
        pod["metadata"]["annotations"]["rljob.dev/spec-hash"] = "older-rendering"
    plan = plan_reconcile(job, observe(job, *pods), NOW)
    assert plan.status["phase"] == "Running" and plan.delete_pods == [] and plan.gang_restart is None


def test_the_operator_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'trl', 'datasets'): sys.modules[name] = None\n"
        "import rljob_operator.cluster.runner, rljob.cli, rljob_operator.crd\n"
        "rljob_operator.crd.crd_yaml()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_starting_says_why_a_container_does_not_start() -> None:
    job = make_job(status={"phase": "Starting", "startTime": rfc3339(NOW)})
    stuck = pod_json(job, 1, "Pending", False)
    stuck["status"]["containerStatuses"] = [{"name": "trainer", "state": {"waiting": {
        "reason": "ErrImagePull", "message": "pull access denied for registry.invalid/rljob"}}}]
    plan = plan_reconcile(job, observe(job, pod_json(job, 0), stuck), NOW)
    assert plan.status["phase"] == "Starting"
    assert plan.status["message"].endswith("train-worker-1: ErrImagePull: pull access denied for registry.invalid/rljob")


def test_in_a_cluster_replicas_share_one_certificate_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_operator import settings as settings_module

    monkeypatch.setattr(settings_module, "_own_namespace", lambda: "rljob-system")
    s = OperatorSettings.from_env({})
    assert s.operator_namespace == "rljob-system" and s.tls_secret == "rljob-system/rljob-operator-tls"
    assert s.effective_status_url == "https://rljob-operator.rljob-system.svc:8443"
    assert OperatorSettings.from_env({}, tls_cert_file="/c", tls_key_file="/k").tls_secret is None


def test_storage_credentials_come_from_secrets_mounted_as_files_never_environment() -> None:
    from rljob_contract import pod as contract

    job = make_job()
    pod = desired_worker_pod(job, 0, 0, runtime=on_runtime(job, {"checkpoint": {
        "storage": "s3://bucket/run", "credentialsSecret": "s3-creds",
        "mirrors": [{"location": "s3://backup/run"}, {"location": "s3://other/run", "credentialsSecret": "other"}]}}))
    container = pod["spec"]["containers"][0]
    assert "envFrom" not in container
    assert not [e for e in container["env"] if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]]
    assert {"name": contract.CREDENTIALS_DIR_ENV, "value": contract.CREDENTIALS_DIR} in container["env"]
    secrets = {v["name"]: v["secret"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert secrets == {"rljob-credentials-checkpoint": {"secretName": "s3-creds", "defaultMode": 0o440},
                       "rljob-credentials-mirror-1": {"secretName": "other", "defaultMode": 0o440}}
    mounts = {m["name"]: m for m in container["volumeMounts"] if m["name"] in secrets}
    assert mounts["rljob-credentials-checkpoint"]["mountPath"] == f"{contract.CREDENTIALS_DIR}/checkpoint"
    assert mounts["rljob-credentials-mirror-1"]["mountPath"] == f"{contract.CREDENTIALS_DIR}/mirror-1"
    assert all(m["readOnly"] is True for m in mounts.values())
    assert pod["spec"]["securityContext"]["fsGroup"] == 1000  # the group that may read them (0440)
    plain = desired_worker_pod(make_job(), 0, 0)
    assert not [v for v in plain["spec"]["volumes"] if "secret" in v]


def test_progress_writes_are_coalesced_and_never_reordered() -> None:
    import threading
    import time as time_module

    from rljob_operator.server.statusapi import ProgressWriter

    class SlowStatus:  # records status writes; the first one is slow
        def __init__(self) -> None:
            self.writes: list[dict[str, Any]] = []
            self.lock = threading.Lock()

        def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            if not self.writes:
                time_module.sleep(0.2)
            with self.lock:
                self.writes.append(status["progress"])

    async def scenario(sink: SlowStatus) -> None:
        writer = ProgressWriter(sink, flush_seconds=0.05)  # type: ignore[arg-type]
        first = asyncio.create_task(writer.submit("ns", "job", {"step": 1}, final=False))
        await asyncio.sleep(0.01)
        for step in (2, 3, 4):
            await writer.submit("ns", "job", {"step": step, "reward": step / 10}, final=False)
        await writer.submit("ns", "job", {"step": 5}, final=True)
        await first
        await asyncio.sleep(0.2)

    sink = SlowStatus()
    asyncio.run(scenario(sink))
    steps = [w["step"] for w in sink.writes]
    assert steps == sorted(steps) and steps[-1] == 5 and len(steps) < 5
    assert sink.writes[-1]["reward"] == 0.4  # fields of coalesced heartbeats are kept


def test_orphaned_pods_of_a_namesake_are_cleared_away() -> None:
    job = make_job()
    orphan = pod_json(job, 0)
    orphan["metadata"]["ownerReferences"] = []
    plan = plan_reconcile(job, observe(job, orphan), NOW)
    assert plan.delete_pods == ["train-worker-0"]
    assert [p["metadata"]["name"] for p in plan.create_pods] == ["train-worker-1"]
    assert plan.status["reason"] == "CreatingWorkers"


def test_the_watch_cache_keeps_everything_the_reconciler_reads_of_a_pod() -> None:
    from rljob_operator.decisions.observed import slim_pod

    job = make_job()
    pods = [pod_json(job, 0), pod_json(job, 1, "Failed", False, exit_code=137, message="OOM"),
            pod_json(job, 0, "Pending", False, node=None, unschedulable="0/4 nodes"),
            pod_json(job, 1, deleting=True, generation=3)]
    for pod in pods:
        slim = slim_pod(pod)
        assert ObservedPod.from_pod(slim, UID, created([pod])) == ObservedPod.from_pod(pod, UID, created([pod]))
        assert slim["metadata"]["uid"] == pod["metadata"]["uid"]
        assert len(repr(slim)) < len(repr(pod)) / 2  # no container specs, volumes or env


def test_the_job_cache_serves_the_watchs_job_unless_the_operators_own_write_is_not_shown_yet() -> None:
    from rljob_operator.cluster.jobcache import JobCache

    def body(version: str, status: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
        return {"metadata": {"name": "j", "resourceVersion": version, "generation": 1, "labels": labels or {},
                             "managedFields": [{"manager": "x"}]}, "spec": {}, "status": {"phase": status}}

    jobs, key = JobCache(), ("ns", "j")
    assert jobs.get(key) is None  # never shown
    assert jobs.seen(key, body("1")) is False
    served = jobs.get(key)
    assert served == {**body("1"), "metadata": {k: v for k, v in body("1")["metadata"].items() if k != "managedFields"}}
    served["status"]["phase"] = "mutated"
    assert jobs.get(key)["status"]["phase"] == ""  # a copy each time
    # Our write (answer: version 2) is not shown yet: no cached job until it is; then its event is ours alone.
    jobs.wrote(key, body("1"), body("2", "Running"))
    assert jobs.get(key) is None
    assert jobs.seen(key, body("1")) is False and jobs.get(key) is None  # an older event does not count
    assert jobs.seen(key, body("2", "Running")) is True
    assert jobs.get(key)["status"]["phase"] == "Running"
    assert jobs.seen(key, body("2", "Running")) is False  # once only
    # Someone labelled the job between our read and our write: the write's event is not ours alone.
    jobs.wrote(key, body("2"), body("3", "Running", {"team": "a"}))
    assert jobs.seen(key, body("3", "Running", {"team": "a"})) is False and jobs.get(key) is not None
    # While a reconcile runs its job's events are held, and at its end only someone else's asks for another:
    # the watch may show our write before the reconcile's thread has read the answer.
    jobs.begin(key)
    assert jobs.seen(key, body("4", "Pending")) is True
    jobs.wrote(key, body("3"), body("4", "Pending"))
    assert jobs.get(key) is not None  # the watch was quicker: nothing pending
    assert jobs.end(key) is False
    jobs.begin(key)
    assert jobs.seen(key, body("5", "Pending")) is True  # a heartbeat's write, say
    jobs.wrote(key, body("5"), body("6", "Running"))
    assert jobs.seen(key, body("6", "Running")) is True
    assert jobs.end(key) is True
    assert jobs.seen(key, body("7")) is False  # no reconcile running: not held
    # A write the watch skipped (it restarted and showed a later version): a GET that matches the watch
    # shows the watch has caught up.
    jobs.wrote(key, body("7"), body("8"))
    assert jobs.seen(key, body("9")) is False and jobs.get(key) is None
    jobs.got(key, body("10"))
    assert jobs.get(key) is None  # the watch is behind the GET: still not served
    jobs.got(key, body("9"))
    assert jobs.get(key)["metadata"]["resourceVersion"] == "9"
    jobs.wrote(key, body("9"), body("11"))
    assert jobs.seen(key, None) is False and jobs.get(key) is None  # deleted: forgotten
    assert jobs.seen(key, body("11")) is False and jobs.get(key) is not None
