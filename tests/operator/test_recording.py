"""An experiment's verdict on its MLflow parent run: the record pod and its ConfigMap, decided (pure,
``decisions.recording``). The cluster test (``test_experiments_cluster.py``, ``…record_pod…``) creates them on
the real control plane; the real write is ``tests/trainer/test_tracking.py``'s ``record`` test."""

from __future__ import annotations

import copy
import json
from typing import Any

from rljob_contract.experiment import parse_experiment
from rljob_contract.job import RLTrainingJob
from rljob_contract.runtime import Resolved
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.decisions.recording import (
    RECORD_COMMAND,
    RECORD_DEADLINE_SECONDS,
    RecordPlan,
    plan_record,
)

from tests.support.operator_process import TEST_IMAGE, on_runtime

NOW = "2026-12-05T07:00:00Z"
PROFILE = PodProfile(allowed_images=("registry.invalid/rljob-trainer:*",), allowed_service_accounts=("tracker",))
MLFLOW = {"trackingUri": "http://mlflow.mlops.svc:5000", "experiment": "lr-study"}
EXPERIMENT: dict[str, Any] = {
    "apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment",
    "metadata": {"name": "lr-ab", "namespace": "team-a", "uid": "exp-uid", "generation": 2},
    "spec": {"template": {"training": {"learningRate": 0.001, "maxSteps": 20, "tracking": {"mlflow": MLFLOW}}},
             "arms": [{"name": "high", "overrides": {"training": {"learningRate": 0.003}}},
                      {"name": "low", "overrides": {"training": {"learningRate": 1e-5}}}]},
}
CONCLUDED = {"phase": "Succeeded", "winner": {"arm": "high", "message": "high beats low"}}
TOKEN = {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mlflow", "key": "token"}}}
#: A runtime whose template gives what a tracked trial needs, and what only training needs.
TEMPLATE = {"podTemplate": {"spec": {
    "serviceAccountName": "tracker",
    "nodeSelector": {"pool": "cpu"},
    "initContainers": [{"name": "warm", "image": TEST_IMAGE}],
    "containers": [
        {"name": "trainer", "env": [TOKEN], "args": ["--verbose"],
         "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
         "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {"name": "sidecar", "image": TEST_IMAGE}],
    "volumes": [{"name": "data", "emptyDir": {}}],
}}, "imagePullSecrets": [{"name": "registry"}]}


def experiment(**meta: Any) -> dict[str, Any]:
    doc = copy.deepcopy(EXPERIMENT)
    doc["metadata"].update(meta)
    return doc


def runtime(spec: dict[str, Any] | None = None) -> Resolved:
    doc = experiment()
    job = RLTrainingJob.model_validate({"metadata": {"name": "lr-ab", "namespace": "team-a"},
                                       "spec": doc["spec"]["template"]})
    return on_runtime(job, spec)  # type: ignore[no-any-return]


def decide(doc: dict[str, Any] | None = None, status: dict[str, Any] = CONCLUDED, pod: dict[str, Any] | None = None,
           on: Resolved | str | None = None, profile: PodProfile | None = PROFILE) -> RecordPlan:
    doc = doc or experiment()
    return plan_record(doc, parse_experiment(doc, "exp"), status, pod, on if on is not None else runtime(),
                       profile, NOW)


def record_pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "lr-ab-record-2", "ownerReferences": [{"uid": "exp-uid", "controller": True}]},
            "status": {"phase": phase, **status}}


def test_a_concluded_tracked_experiment_gets_its_status_in_a_configmap_and_a_one_shot_owned_pod() -> None:
    plan = decide()
    configmap, pod = plan.create
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["name"] == pod["metadata"]["name"] == \
        "lr-ab-record-2"
    assert json.loads(configmap["data"]["status.json"]) == CONCLUDED
    for obj in plan.create:
        assert obj["metadata"]["namespace"] == "team-a"
        assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment",
                                                      "name": "lr-ab", "uid": "exp-uid", "controller": True,
                                                      "blockOwnerDeletion": True}]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == RECORD_DEADLINE_SECONDS
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["image"] == TEST_IMAGE
    assert container["command"] == [*RECORD_COMMAND, "--name", "lr-ab", "--namespace", "team-a", "--status",
                                    "/etc/rljob-record/status.json", "--mlflow-experiment", "lr-study"]
    assert {"name": "MLFLOW_TRACKING_URI", "value": MLFLOW["trackingUri"]} in container["env"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    assert [v.get("configMap", {}).get("name") for v in spec["volumes"]] == ["lr-ab-record-2", None]
    assert plan.condition is not None and (plan.condition["status"], plan.condition["reason"]) == \
        ("False", "Recording")
    assert plan.condition["observedGeneration"] == 2 and plan.requeue_after is not None


def test_a_running_or_untracked_experiment_records_nothing() -> None:
    assert decide(status={"phase": "Running"}) == RecordPlan()
    untracked = experiment()
    del untracked["spec"]["template"]["training"]["tracking"]
    assert decide(untracked) == RecordPlan()
    wandb_only = experiment()
    wandb_only["spec"]["template"]["training"]["tracking"] = {"wandb": {"project": "p", "mode": "offline"}}
    assert decide(wandb_only) == RecordPlan()


def test_the_record_pod_takes_the_runtimes_identity_and_secrets_but_no_gpu_volume_or_sidecar() -> None:
    # Sidecars and init containers only the privileged profile allows a runtime; the record pod takes neither.
    privileged = PodProfile("privileged", PROFILE.allowed_images, PROFILE.allowed_service_accounts)
    pod = decide(on=runtime(TEMPLATE), profile=privileged).create[1]
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "tracker" and spec["nodeSelector"] == {"pool": "cpu"}
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    (container,) = spec["containers"]  # no sidecar, no init container
    assert "initContainers" not in spec and "args" not in container
    assert TOKEN in container["env"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert [v["name"] for v in spec["volumes"]] == ["rljob-record", "rljob-tmp"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/etc/rljob-record", "/tmp"]
    assert container["command"][:4] == list(RECORD_COMMAND)


def test_a_record_pod_the_profile_or_the_runtimes_bounds_refuse_is_never_created() -> None:
    host = decide(on=runtime({"podTemplate": {"spec": {"hostNetwork": True}}}))
    assert host.create == [] and host.condition is not None
    assert host.condition["reason"] == "PolicyViolation" and "hostNetwork" in host.condition["message"]
    tracker = {"podTemplate": {"spec": {"serviceAccountName": "tracker"}}}
    foreign = decide(on=runtime(tracker), profile=PodProfile(allowed_images=PROFILE.allowed_images))
    assert foreign.create == [] and "serviceAccountName" in (foreign.condition or {}).get("message", "")
    small = decide(on=runtime({"limits": {"cpuPerWorker": {"max": "500m"}}}), profile=None)
    assert small.create == [] and "cpuPerWorker" in (small.condition or {}).get("message", "")


def test_the_record_pods_end_says_recorded_or_why_not_and_the_verdict_stands() -> None:
    running = decide(pod=record_pod("Running"))
    assert running.create == [] and (running.condition or {})["reason"] == "Recording" and running.requeue_after
    done = decide(pod=record_pod("Succeeded"))
    assert (done.condition or {})["status"] == "True" and (done.condition or {})["reason"] == "Recorded"
    assert done.create == [] and done.requeue_after is None
    exit_1 = {"state": {"terminated": {"reason": "Error", "exitCode": 1, "message": "rljob: ConnectionError: down"}}}
    failed = decide(pod=record_pod("Failed", containerStatuses=[exit_1])).condition or {}
    assert (failed["status"], failed["reason"]) == ("False", "RecordFailed")
    assert "exit code 1" in failed["message"] and "ConnectionError" in failed["message"]
    assert "the verdict stands" in failed["message"]
    late = decide(pod=record_pod("Failed", reason="DeadlineExceeded")).condition or {}
    assert late["reason"] == "RecordFailed" and "DeadlineExceeded" in late["message"]


def test_a_final_word_is_kept_and_nothing_is_created_again_until_the_spec_changes() -> None:
    said = {"type": "Recorded", "status": "True", "reason": "Recorded", "message": "written",
            "lastTransitionTime": "2026-12-05T06:00:00Z", "observedGeneration": 2}
    again = decide(experiment() | {"status": {**CONCLUDED, "conditions": [said]}})
    assert again == RecordPlan(condition=said)
    changed = experiment(generation=3) | {"status": {**CONCLUDED, "conditions": [said]}}
    assert [o["metadata"]["name"] for o in decide(changed).create] == ["lr-ab-record-3"] * 2


def test_a_pod_of_the_records_name_that_the_experiment_did_not_create_is_not_its_record() -> None:
    forged = record_pod("Succeeded")
    forged["metadata"]["ownerReferences"] = [{"uid": "someone-else", "controller": True}]
    plan = decide(pod=forged)
    assert plan.create == [] and (plan.condition or {})["reason"] == "RecordFailed"
    assert "did not create it" in (plan.condition or {})["message"]


def test_no_runtime_for_the_trials_means_no_record_pod() -> None:
    plan = decide(on="spec.runtimeRef: ClusterRLTrainingRuntime 'gone' does not exist")
    assert plan.create == [] and (plan.condition or {})["reason"] == "RuntimeNotFound"


def test_a_record_pod_never_scheduled_is_given_up_on_not_waited_for_for_ever() -> None:
    recording = {"type": "Recorded", "status": "False", "reason": "Recording", "message": "writing",
                 "lastTransitionTime": "2026-12-05T06:40:00Z", "observedGeneration": 2}
    doc = experiment() | {"status": {**CONCLUDED, "conditions": [recording]}}
    plan = decide(doc, pod=record_pod("Pending"))
    assert (plan.condition or {})["reason"] == "RecordFailed" and "did not finish" in (plan.condition or {})["message"]
    assert plan.requeue_after is None
    recent = {**recording, "lastTransitionTime": "2026-12-05T06:58:00Z"}
    assert (decide(experiment() | {"status": {**CONCLUDED, "conditions": [recent]}}, pod=record_pod("Pending"))
            .condition or {})["reason"] == "Recording"


def test_where_jobs_get_network_policies_the_record_pod_gets_the_trainers_egress_and_no_ingress_before_it_runs() -> None:
    from rljob_operator.decisions.children import JobNetwork
    from rljob_operator.decisions.egress import Egress

    doc = experiment()
    on = runtime({"egress": {"to": [{"cidr": "10.9.0.0/16", "ports": [5000]}]}})
    plan = plan_record(doc, parse_experiment(doc, "exp"), CONCLUDED, None, on, PROFILE, NOW,
                       JobNetwork(egress=Egress(status_namespace="rljob-system")))
    assert [o["kind"] for o in plan.create] == ["ConfigMap", "NetworkPolicy", "Pod"]  # restricted before it runs
    policy, pod = plan.create[1:]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod["metadata"]["labels"].items() and "rljob.dev/experiment" in selected
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy["spec"]
    egress = json.dumps(policy["spec"]["egress"])
    assert "169.254.0.0/16" in egress  # the clouds' metadata endpoints cut out, as for trainers
    assert policy["spec"]["egress"][-1] == {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
                                            "ports": [{"protocol": "TCP", "port": 5000}]}  # the runtime's (MLflow)
    assert policy["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    ingress_only = plan_record(doc, parse_experiment(doc, "exp"), CONCLUDED, None, on, PROFILE, NOW, JobNetwork())
    assert ingress_only.create[1]["spec"] == {"podSelector": {"matchLabels": selected}, "policyTypes": ["Ingress"]}
