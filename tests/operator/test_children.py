"""What the operator builds for a job (``decisions.children``), pure: the worker pods under the trainer
contract, GPUs, probes, the heartbeat token, the ConfigMap, the headless Service and its rendezvous
EndpointSlice, the job's and the runtime's pod fields, storage credentials, and the spec hash."""

from __future__ import annotations

import yaml
from rljob_contract.spec import TrainerConfig
from rljob_operator.decisions.children import (
    desired_configmap,
    desired_rendezvous,
    desired_service,
    desired_worker_pod,
    desired_worker_pods,
    merge_pod_template,
    spec_hash,
)
from rljob_operator.names import LABEL_GANG_GENERATION, LABEL_JOB, LABEL_WORKER_INDEX, rendezvous_endpoint

from tests.support.jobs import ENDPOINT, UID, env_of, make_job, observe, pod_json
from tests.support.operator_process import TEST_IMAGE, on_runtime


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
