"""Checkpoints that outlive the gang (issue #31, point 1): pvc:// storage, and a loud warning otherwise.

Pure decisions only: the pvc:// form and its errors, the claim mounted in every worker, the trainer
config naming the mounted folder, whether a job's checkpoints are durable, the CheckpointsDurable
condition and its once-per-transition Warning Event. The cluster test is
``tests/operator/test_checkpoints_durable_cluster.py``; the trainer's resume from a folder standing for the claim
is in ``tests/trainer/test_run_training.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from rljob_contract.job import ManifestError, RLTrainingJob, parse_job
from rljob_contract.plugins.storage.pvc import parse_claim
from rljob_contract.runtime import Resolved, parse_runtime
from rljob_contract.spec import TrainerConfig
from rljob_operator import crd
from rljob_operator.decisions.checkpoints import CONDITION, EVENT_REASON, durability, mounted_location
from rljob_operator.decisions.children import desired_configmap, desired_worker_pod, desired_worker_pods
from rljob_operator.decisions.lifecycle import plan_invalid, plan_reconcile
from rljob_operator.decisions.plan import Plan
from rljob_operator.names import CONFIG_KEY, CONTAINER
from rljob_trainer.checkpoints.backends import location_for
from rljob_trainer.checkpoints.plan import storage_plan
from rljob_trainer.errors import PermanentError

from tests.support.operator_process import job_manifest, on_runtime, runtime_manifest

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def make_job(status: dict[str, Any] | None = None, generation: int = 1, sub_path: str | None = None) -> RLTrainingJob:
    doc = job_manifest("train", 2, namespace="team-a")
    doc["metadata"].update({"uid": "uid-1", "generation": generation})
    if sub_path:
        doc["spec"]["checkpoint"]["subPath"] = sub_path
    if status is not None:
        doc["status"] = status
    return parse_job(doc)


def runtime(job: RLTrainingJob, checkpoint: dict[str, Any] | None = None,
            template: dict[str, Any] | None = None) -> Resolved:
    """``job`` on a runtime with this checkpoint storage and pod template."""
    return on_runtime(job, {"checkpoint": checkpoint or {}, **({"podTemplate": template} if template else {})})


#: Where a runtime's storage prefix puts job team-a/train.
OWN = "team-a/train"


def condition(plan: Plan) -> dict[str, Any]:
    return next(c for c in plan.status["conditions"] if c["type"] == CONDITION)


def warnings(plan: Plan) -> list[str]:
    return [e.message for e in plan.events if e.reason == EVENT_REASON and e.type == "Warning"]


def trainer(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == CONTAINER)


# ------------------------------------------------------------------------ the pvc:// form


def test_a_pvc_location_names_a_claim_and_an_optional_prefix() -> None:
    assert parse_claim("pvc://ckpt/team-a/run1") == ("ckpt", "team-a/run1")
    assert parse_claim("pvc://ckpt.fast/") == ("ckpt.fast", "")
    assert parse_claim("s3://ckpt/run1") is None
    resolved = runtime(make_job(), {"storage": "pvc://ckpt/run1", "mirrors": [{"location": "pvc://backup"}]})
    assert resolved.checkpoint.storage == f"pvc://ckpt/run1/{OWN}"
    assert [m.location for m in resolved.checkpoint.mirrors] == [f"pvc://backup/{OWN}"]
    assert runtime(make_job(sub_path="ablation/lr"), {"storage": "pvc://ckpt"}).checkpoint.storage == \
        f"pvc://ckpt/{OWN}/ablation/lr"


@pytest.mark.parametrize(("checkpoint", "field", "says"), [
    ({"storage": "pvc://"}, "spec.checkpoint.storage", "PersistentVolumeClaim name"),
    ({"storage": "pvc://ckpt/run1//x"}, "spec.checkpoint.storage", "without empty"),
    ({"storage": "pvc://ckpt/./x"}, "spec.checkpoint.storage", "'..' parts"),
    ({"mirrors": [{"location": "pvc://Backup/x"}]}, "spec.checkpoint.mirrors.0.location", "PersistentVolumeClaim"),
    ({"storage": "nfs://server/x"}, "spec.checkpoint.storage", "pvc://claim/prefix"),
])
def test_a_malformed_pvc_location_is_refused_naming_the_field(checkpoint: dict[str, Any], field: str,
                                                              says: str) -> None:
    with pytest.raises(ManifestError) as error:
        parse_runtime(runtime_manifest(spec={"checkpoint": checkpoint}))
    problems = [p.replace("[", ".").replace("]", "") for p in error.value.problems]
    assert any(p.startswith(field) and says in p for p in problems), error.value.problems


def test_the_crd_refuses_malformed_pvc_locations_with_the_models_rule() -> None:
    root = crd.runtime_openapi_schema("ClusterRLTrainingRuntime")["properties"]["spec"]["properties"]["checkpoint"]
    storage_rules = [r for r in root["x-kubernetes-validations"] if "pvc://" in r["rule"]]
    mirror_rules = root["properties"]["mirrors"]["items"]["x-kubernetes-validations"]
    assert [r["fieldPath"] for r in storage_rules] == [".storage"]
    assert [r["fieldPath"] for r in mirror_rules] == [".location"]
    assert root["properties"]["mirrors"]["maxItems"] == 8  # bounds the rule's cost for the API server


def test_the_printer_column_shows_whether_checkpoints_are_durable() -> None:
    columns = crd.crd_manifest()["spec"]["versions"][0]["additionalPrinterColumns"]
    column = next(c for c in columns if c["name"] == "Checkpoints")
    assert column["jsonPath"] == '.status.conditions[?(@.type=="CheckpointsDurable")].reason'
    assert not column.get("priority")  # in plain `kubectl get`, not only -o wide


# ---------------------------------------------------------------- the claim in the pods


def test_every_worker_mounts_each_named_claim_once_read_write() -> None:
    job = make_job()
    on = runtime(job, {"storage": "pvc://ckpt/runs/a", "mirrors": [
        {"location": "pvc://backup.disk/a"}, {"location": "pvc://ckpt/copy"}, {"location": "s3://b/a"}]})
    for pod in desired_worker_pods(job, 0, runtime=on):
        claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [
            {"name": "rljob-checkpoints-0", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": False}},
            {"name": "rljob-checkpoints-1", "persistentVolumeClaim": {"claimName": "backup.disk", "readOnly": False}},
        ]
        mounts = [m for m in trainer(pod)["volumeMounts"] if m["name"].startswith("rljob-checkpoints-")]
        assert mounts == [
            {"name": "rljob-checkpoints-0", "mountPath": "/var/lib/rljob/checkpoints/ckpt", "readOnly": False},
            {"name": "rljob-checkpoints-1", "mountPath": "/var/lib/rljob/checkpoints/backup.disk", "readOnly": False},
        ]


def test_a_job_without_a_pvc_location_mounts_no_claim() -> None:
    job = make_job()
    pod = desired_worker_pod(job, 0, 0, runtime=runtime(job, {"storage": "s3://b/run"}))
    assert not [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert not [m for m in trainer(pod)["volumeMounts"] if m["mountPath"].startswith("/var/lib/rljob")]


def test_the_trainer_config_names_the_mounted_folder_not_the_claim() -> None:
    job = make_job()
    on = runtime(job, {"storage": "pvc://ckpt/runs/a", "mirrors": [{"location": "pvc://backup"},
                                                                   {"location": "s3://b/a", "region": "eu-west-1"}]})
    config = TrainerConfig.model_validate(yaml.safe_load(desired_configmap(job, runtime=on)["data"][CONFIG_KEY]))
    assert config.checkpoint.storage == f"/var/lib/rljob/checkpoints/ckpt/runs/a/{OWN}"
    assert [m.location for m in config.checkpoint.mirrors] == [f"/var/lib/rljob/checkpoints/backup/{OWN}",
                                                               f"s3://b/a/{OWN}"]
    assert config.checkpoint.mirrors[1].region == "eu-west-1"
    assert on.checkpoint.storage == f"pvc://ckpt/runs/a/{OWN}"  # the resolved runtime itself is not rewritten
    # Every mounted folder the trainer is told about is inside a mount the pod has.
    mounts = [m["mountPath"] for m in trainer(desired_worker_pod(job, 0, 0, runtime=on))["volumeMounts"]]
    for folder in (config.checkpoint.storage, config.checkpoint.mirrors[0].location):
        assert any(folder == m or folder.startswith(m + "/") for m in mounts), (folder, mounts)


def test_mounted_location_leaves_other_locations_alone() -> None:
    assert mounted_location("s3://b/p") == "s3://b/p"
    assert mounted_location("/data/ckpt") == "/data/ckpt"
    assert mounted_location("pvc://c/") == "/var/lib/rljob/checkpoints/c"


def test_outside_a_cluster_a_pvc_location_is_a_permanent_error_naming_the_field(tmp_path) -> None:
    with pytest.raises(PermanentError, match=r"^spec\.checkpoint\.storage: pvc://ckpt/run1 names a "
                                             r"PersistentVolumeClaim, which exists only on a cluster"):
        location_for("pvc://ckpt/run1")
    cfg = TrainerConfig(job_name="j", output_dir=str(tmp_path),
                        checkpoint={"storage": str(tmp_path / "c"), "mirrors": [{"location": "pvc://b/x"}]})
    with pytest.raises(PermanentError, match=r"^spec\.checkpoint\.mirrors\[0\]\.location: pvc://b/x"):
        storage_plan(cfg)


def test_rljob_checkpoints_on_a_pvc_location_says_why_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from rljob.cli import main

    assert main(["checkpoints", "list", "pvc://ckpt/run1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names a PersistentVolumeClaim" in err[0] and err[0].startswith("rljob: error:")


# ------------------------------------------------------------------------- durability


def _mounted(volume: dict[str, Any], path: str) -> dict[str, Any]:
    """A runtime pod template mounting ``volume`` into the trainer at ``path``."""
    return {"spec": {"volumes": [volume],
                     "containers": [{"name": "trainer", "volumeMounts": [{"name": volume["name"], "mountPath": path}]}]}}


@pytest.mark.parametrize(("checkpoint", "template", "durable", "says"), [
    ({}, None, False, "/workspace/output/checkpoints (the runtime's spec.checkpoint.storage is not set) on the pod's "
                      "emptyDir volume rljob-workspace: every gang restart deletes them"),
    ({"storage": "s3://b/run"}, None, True, f"s3://b/run/{OWN}"),
    ({"storage": "pvc://ckpt/run"}, None, True, f"pvc://ckpt/run/{OWN}"),
    ({"storage": "/workspace/ckpt"}, None, False, "emptyDir volume rljob-workspace"),
    ({"storage": "ckpt"}, None, False, "the container's own filesystem"),
    ({"mirrors": [{"location": "pvc://backup/run"}]}, None, True, f"pvc://backup/run/{OWN}"),
    ({"storage": "/data/run"}, _mounted({"name": "data", "persistentVolumeClaim": {"claimName": "d"}}, "/data"),
     True, "on volume data (persistentVolumeClaim)"),
    ({"storage": "/data/run"}, _mounted({"name": "data", "emptyDir": {}}, "/data/"), False, "emptyDir volume data"),
    ({"storage": "/data/run"}, _mounted({"name": "nfs", "nfs": {"server": "nfs.local", "path": "/export"}}, "/data"),
     True, "on volume nfs (nfs)"),
])
def test_checkpoints_are_durable_only_where_they_outlive_the_pod(
    checkpoint: dict[str, Any], template: dict[str, Any] | None, durable: bool, says: str
) -> None:
    job = make_job()
    on = runtime(job, checkpoint, template)
    found = durability(on.checkpoint, lambda: desired_worker_pod(job, 0, 0, runtime=on))
    assert (found.durable, found.status, found.reason) == (durable, str(durable), "Durable" if durable else "Ephemeral")
    assert says in found.message
    if not durable:  # the message says what to set
        assert "spec.checkpoint.storage is pvc://<claim>/<prefix>" in found.message


def test_a_remote_location_is_judged_without_building_a_pod() -> None:
    on = runtime(make_job(), {"storage": "/workspace/x", "mirrors": [{"location": "s3://b/x"}]})

    def no_pod() -> dict[str, Any]:
        raise AssertionError("a pod was built")

    assert durability(on.checkpoint, no_pod).durable


# ------------------------------------------------------------- the condition and the Event


def test_a_new_job_without_storage_gets_the_condition_and_one_warning() -> None:
    plan = plan_reconcile(make_job(), [], NOW)
    assert plan.status["phase"] == "Pending" and len(plan.create_pods) == 2
    got = condition(plan)
    assert (got["status"], got["reason"], got["observedGeneration"]) == ("False", "Ephemeral", 1)
    assert "every gang restart deletes them" in got["message"] and "pvc://<claim>/<prefix>" in got["message"]
    assert warnings(plan) == [got["message"]]


def test_the_warning_is_not_repeated_at_later_reconciles() -> None:
    first = plan_reconcile(make_job(), [], NOW)
    later = make_job(status=first.status)
    for minutes in (1, 5, 60):
        plan = plan_reconcile(later, [], NOW + timedelta(minutes=minutes))
        assert warnings(plan) == []
        assert condition(plan)["lastTransitionTime"] == condition(first)["lastTransitionTime"]


def test_a_runtime_with_durable_storage_clears_it_and_one_without_warns_again() -> None:
    first = plan_reconcile(make_job(), [], NOW)
    edited = make_job(status=first.status, generation=2)
    fixed = plan_reconcile(edited, [], NOW + timedelta(minutes=1),
                           runtime=runtime(edited, {"storage": "pvc://ckpt/run"}))
    assert (condition(fixed)["status"], condition(fixed)["reason"]) == ("True", "Durable")
    assert warnings(fixed) == [] and condition(fixed)["observedGeneration"] == 2
    again = plan_reconcile(make_job(status=fixed.status, generation=3), [], NOW + timedelta(minutes=2))
    assert condition(again)["reason"] == "Ephemeral" and len(warnings(again)) == 1


def test_a_job_with_durable_storage_is_never_warned() -> None:
    job = make_job()
    plan = plan_reconcile(job, [], NOW, runtime=runtime(job, {"storage": "s3://b/run"}))
    assert condition(plan)["status"] == "True" and warnings(plan) == []


def test_a_status_written_without_the_spec_keeps_the_condition() -> None:
    first = plan_reconcile(make_job(), [], NOW)
    raw = {"metadata": {"name": "train", "generation": 2}, "status": first.status}
    invalid = plan_invalid(raw, ["spec.training.model: nope"], NOW + timedelta(minutes=1))
    assert condition(invalid) == condition(first)


def test_a_job_failing_its_policy_check_is_not_also_warned() -> None:
    from rljob_operator.decisions.policy import PodProfile

    job = make_job()
    plan = plan_reconcile(job, [], NOW, profile=PodProfile(allowed_images=("*",)),
                          runtime=runtime(job, template={"spec": {"serviceAccountName": "admin"}}))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "PolicyViolation"
    assert warnings(plan) == []


def test_a_shared_claim_folder_checked_by_every_pod_at_once_leaves_the_others_probes_alone(tmp_path) -> None:
    """Every worker pod's pre-flight checks access to a ReadWriteMany claim at the same moment: one
    pod's check must not delete the probe another pod is about to remove (its check would then fail)."""
    from rljob_trainer.checkpoints.locations import ACCESS_PROBE, LocalLocation

    folder = tmp_path / "claim" / "run1"
    folder.mkdir(parents=True)
    others = [folder / ACCESS_PROBE, folder / f"{ACCESS_PROBE}-worker-1-7"]  # another pod, mid-check
    for probe in others:
        probe.write_text("rljob\n")
    LocalLocation(folder).check_access()
    assert all(p.read_text() == "rljob\n" for p in others)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in others)  # its own probe is gone
