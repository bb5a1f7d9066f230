"""A job grants nothing beyond its creator's own rights (issue #14, point 1, admission side).

The ValidatingAdmissionPolicy of ``manifests/base/admission-policies.yaml`` (the same as the
chart's ``templates/admission-policies.yaml``) is installed on the real control plane; an
ordinary user — a ServiceAccount token whose only rights are on ``rltrainingjobs`` in its
namespace — runs ``kubectl apply`` with jobs that name a ServiceAccount or a Secret. Each is
refused, naming the field, until the user is granted the right to use that object directly.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_snake

from tests.cluster.waiting import wait_for
from tests.delivery.test_chart import (
    CHART,
    KUBE_VERSION,
    MANIFESTS,
    REPO,
    helm,
    helm_template,
    one,
    operator_env,
    run,
)
from tests.support.operator import create_job, deep_update

POLICY_FILE = MANIFESTS / "base" / "admission-policies.yaml"
POLICY = "rljob-job-references"
QUEUES = "rljob-queues"
VAP_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDING_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
PROBE = "rljob-policy-probe"  # a user who may only create jobs in "default"
USER = "alice"  # the ordinary user: a ServiceAccount of the test's namespace

#: (case, patch of the quickstart's spec, the field the refusal names, kind, the name granted).
REFERENCES: list[tuple[str, dict[str, Any], str, str, str]] = [
    ("service-account", {"workers": {"serviceAccountName": "powerful"}},
     "spec.workers.serviceAccountName", "ServiceAccount", "powerful"),
    ("pod-template-service-account", {"workers": {"podTemplate": {"spec": {"serviceAccountName": "powerful"}}}},
     "spec.workers.podTemplate.spec.serviceAccountName", "ServiceAccount", "powerful"),
    ("checkpoint-secret", {"checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "s3-keys"}},
     "spec.checkpoint.credentialsSecret", "Secret", "s3-keys"),
    ("mirror-secret", {"checkpoint": {"storage": "s3://bucket/ckpt", "mirrors": [
        {"location": "s3://backup/ckpt", "credentialsSecret": "backup-keys"}]}},
     "spec.checkpoint.mirrors[location=s3://backup/ckpt].credentialsSecret", "Secret", "backup-keys"),
    ("env-secret-key-ref", {"workers": {"env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}]}},
     "spec.workers.env[name=HF_TOKEN].valueFrom.secretKeyRef.name", "Secret", "hub"),
    ("secret-volume", {"workers": {"volumes": [{"name": "creds", "secret": {"secretName": "db"}}]}},
     "spec.workers.volumes[name=creds].secret.secretName", "Secret", "db"),
    ("pod-template-env-from", {"workers": {"podTemplate": {"spec": {"containers": [
        {"name": "trainer", "envFrom": [{"secretRef": {"name": "db"}}]}]}}}},
     "spec.workers.podTemplate.spec.containers[name=trainer].envFrom[].secretRef.name", "Secret", "db"),
    ("pod-template-init-container-env", {"workers": {"podTemplate": {"spec": {"initContainers": [
        {"name": "fetch", "image": "busybox", "env": [
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}]}}}},
     "spec.workers.podTemplate.spec.initContainers[name=fetch].env[name=KEY].valueFrom.secretKeyRef.name",
     "Secret", "db"),
    ("pod-template-projected-volume", {"workers": {"podTemplate": {"spec": {"volumes": [
        {"name": "all", "projected": {"sources": [{"secret": {"name": "db"}}]}}]}}}},
     "spec.workers.podTemplate.spec.volumes[name=all].projected.sources[].secret.name", "Secret", "db"),
    ("pod-template-csi-secret", {"workers": {"podTemplate": {"spec": {"volumes": [
        {"name": "csi", "csi": {"driver": "x.example.com", "nodePublishSecretRef": {"name": "db"}}}]}}}},
     "spec.workers.podTemplate.spec.volumes[name=csi].csi.nodePublishSecretRef.name", "Secret", "db"),
    ("image-pull-secret", {"workers": {"podTemplate": {"spec": {"imagePullSecrets": [{"name": "registry"}]}}}},
     "spec.workers.podTemplate.spec.imagePullSecrets[name=registry].name", "Secret", "registry"),
]

# ----------------------------------------------------------------------------- plumbing


def _quickstart(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"]["name"] = name
    return deep_update(doc, {"spec": spec}) if spec else doc


def _apply(control_plane: Any, kubeconfig: Path, namespace: str, doc: dict[str, Any]
           ) -> subprocess.CompletedProcess[str]:
    """``kubectl apply`` as the kubeconfig's user; the result, whether or not it was admitted."""
    return run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(kubeconfig), "--namespace", namespace,
                "apply", "-f", "-"], check=False, input=yaml.safe_dump(doc))


def _kubectl_admin(control_plane: Any, *args: str, stdin: str | None = None) -> None:
    run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig), *args],
        input=stdin)


def _delete_policy(kube: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    for path in (f"{BINDING_PATH}/{POLICY}", f"{VAP_PATH}/{POLICY}", f"{BINDING_PATH}/{QUEUES}", f"{VAP_PATH}/{QUEUES}"):
        try:
            kube.request("DELETE", path)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="module")
def policy(control_plane: Any, kube: Any, crd_installed: Any) -> Iterator[None]:
    """The kustomize base's policy and binding, applied as they ship, and in force."""
    _kubectl_admin(control_plane, "apply", "-f", str(POLICY_FILE))
    # A probe user who may create jobs (dry runs) in "default", and read no Secret.
    probe = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": PROBE, "namespace": "default"},
             "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["create"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": PROBE, "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROBE},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROBE}]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump_all([probe, binding]))
    canary = _quickstart("canary", {"checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "canary"}})

    def refused() -> bool:
        # The API server picks a new policy up from a watch: wait until it bites (a dry run as a user).
        result = run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig),
                      "--as", PROBE, "--namespace", "default", "create", "--dry-run=server",
                      "-f", "-"], check=False, input=yaml.safe_dump(canary))
        return result.returncode != 0 and POLICY in result.stderr

    try:
        wait_for(refused, 30, message=f"the {POLICY} policy in force")
        yield
    finally:
        _delete_policy(kube)
        _kubectl_admin(control_plane, "delete", "--namespace", "default", "--ignore-not-found",
                       f"rolebinding/{PROBE}", f"role/{PROBE}")


@pytest.fixture
def ordinary_user(control_plane: Any, namespace: str, service_account_kubeconfig: Any) -> Path:
    """A kubeconfig whose only rights are on RLTrainingJobs (and their status) in ``namespace``."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "jobs-only", "namespace": namespace},
            "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs", "rltrainingjobs/status"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    kubeconfig = service_account_kubeconfig(USER)
    _kubectl_admin(control_plane, "create", "rolebinding", "jobs-only", "--namespace", namespace,
                   "--role", "jobs-only", f"--serviceaccount={namespace}:{USER}")
    return kubeconfig  # type: ignore[no-any-return]


def _grant(control_plane: Any, namespace: str, kind: str, name: str) -> None:
    """The right to use ``name`` directly: get a Secret; create a token for a ServiceAccount."""
    if kind == "Secret":
        rule = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [name], "verbs": ["get"]}
    else:
        rule = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [name],
                "verbs": ["create"]}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": f"use-{name}", "namespace": namespace}, "rules": [rule]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    _kubectl_admin(control_plane, "create", "rolebinding", f"use-{name}", "--namespace", namespace,
                   "--role", f"use-{name}", f"--serviceaccount={namespace}:{USER}")


def _admitted_after_grant(control_plane: Any, kubeconfig: Path, namespace: str, doc: dict[str, Any]) -> None:
    # RBAC changes reach the authorizer through an informer: allow it a moment.
    def admitted() -> bool:
        return _apply(control_plane, kubeconfig, namespace, doc).returncode == 0

    wait_for(admitted, 30, message=f"job {doc['metadata']['name']} admitted once the right was granted")


# ----------------------------------------------------------------------------- tests


@pytest.mark.cluster
@pytest.mark.parametrize("case,spec,field,kind,name", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_a_reference_the_creator_could_not_use_is_refused_naming_the_field(
        case: str, spec: dict[str, Any], field: str, kind: str, name: str, policy: None,
        ordinary_user: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    doc = _quickstart(case, spec)
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert result.returncode != 0, f"a job naming {kind} {name!r} at {field} was admitted"
    assert "forbidden" in result.stderr.lower(), result.stderr
    assert f'{field} names {kind} "{name}"' in result.stderr, result.stderr
    assert f"system:serviceaccount:{namespace}:{USER}" in result.stderr, result.stderr
    assert kube.get_job(namespace, case) is None

    _grant(control_plane, namespace, kind, name)
    _admitted_after_grant(control_plane, ordinary_user, namespace, doc)
    assert kube.get_job(namespace, case) is not None


@pytest.mark.cluster
def test_the_ordinary_user_may_still_run_the_quickstart_and_the_trainer_service_account(
        policy: None, ordinary_user: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    for doc in (_quickstart("quickstart"),
                _quickstart("as-trainer", {"workers": {"serviceAccountName": "rljob-trainer"}})):
        result = _apply(control_plane, ordinary_user, namespace, doc)
        assert result.returncode == 0, result.stderr
        assert kube.get_job(namespace, doc["metadata"]["name"]) is not None


@pytest.mark.cluster
def test_impersonating_a_service_account_is_a_right_to_use_it(
        policy: None, ordinary_user: Path, control_plane: Any, namespace: str) -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "impersonate-ci", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["ci"],
                       "verbs": ["impersonate"]}]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    _kubectl_admin(control_plane, "create", "rolebinding", "impersonate-ci", "--namespace", namespace,
                   "--role", "impersonate-ci", f"--serviceaccount={namespace}:{USER}")
    _admitted_after_grant(control_plane, ordinary_user, namespace,
                          _quickstart("as-ci", {"workers": {"serviceAccountName": "ci"}}))


@pytest.mark.cluster
def test_a_refusal_lists_every_reference_of_its_field(
        policy: None, ordinary_user: Path, control_plane: Any, namespace: str) -> None:
    """The API server reports the first refused field (one validation per field of the table of references);
    its message lists each reference that field holds, nested ones too."""
    def secret(name: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": name, "key": "k"}}

    doc = _quickstart("many", {
        "checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "a"},
        "workers": {"env": [{"name": "B", "valueFrom": secret("b")}, {"name": "PLAIN", "value": "1"},
                            {"name": "D", "valueFrom": secret("d")}],
                    "podTemplate": {"spec": {"containers": [
                        {"name": "trainer", "env": [{"name": "C", "valueFrom": secret("c")}]}]}}}})
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert result.returncode != 0
    assert 'spec.checkpoint.credentialsSecret names Secret "a"' in result.stderr, result.stderr

    _grant(control_plane, namespace, "Secret", "a")
    wait_for(lambda: "credentialsSecret" not in _apply(control_plane, ordinary_user, namespace, doc).stderr, 30,
             message="the checkpoint Secret allowed")
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert result.returncode != 0
    assert ('spec.workers.env[name=B].valueFrom.secretKeyRef.name names Secret "b"; '
            'spec.workers.env[name=D].valueFrom.secretKeyRef.name names Secret "d": a job may name only objects '
            'its creator could use') in result.stderr, result.stderr
    for name in ("b", "d"):
        _grant(control_plane, namespace, "Secret", name)
    wait_for(lambda: "workers.env[" not in _apply(control_plane, ordinary_user, namespace, doc).stderr, 30,
             message="the env Secrets allowed")
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert ('spec.workers.podTemplate.spec.containers[name=trainer].env[name=C].valueFrom.secretKeyRef.name '
            'names Secret "c"') in result.stderr, result.stderr


@pytest.mark.cluster
def test_changing_the_spec_of_a_job_someone_else_created_needs_the_same_rights(
        policy: None, ordinary_user: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    """An admin's job names a Secret; the ordinary user may change its status and labels, not its spec.

    Changing the spec (the image, say) would run the user's code with the admin's Secret.
    Writes that leave the spec alone (the operator's status, labels) are not checked.
    """
    from kubernetes.client.exceptions import ApiException
    create_job(kube, namespace, _quickstart("admins", {"checkpoint": {"storage": "s3://bucket/ckpt",
                                                                      "credentialsSecret": "s3-keys"}}))
    changed = _quickstart("admins", {"image": "registry.invalid/mine:latest",
                                     "checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "s3-keys"}})
    result = _apply(control_plane, ordinary_user, namespace, changed)
    assert result.returncode != 0
    assert 'spec.checkpoint.credentialsSecret names Secret "s3-keys"' in result.stderr, result.stderr

    from kubernetes import client

    user = client.ApiClient(_client_configuration(ordinary_user))
    try:
        from rljob_operator.cluster.kube import Kube

        as_user = Kube(user)
        path = as_user.job_path(namespace, "admins")
        as_user.request("PATCH", path, {"metadata": {"labels": {"team": "a"}}},
                        content_type="application/merge-patch+json")
        as_user.request("PATCH", f"{path}/status", {"status": {"phase": "Pending"}},
                        content_type="application/merge-patch+json")
        with pytest.raises(ApiException) as refused:
            as_user.request("PATCH", path, {"spec": {"image": "registry.invalid/mine:latest"}},
                            content_type="application/merge-patch+json")
        assert refused.value.status == 403
    finally:
        user.close()
    assert kube.get_job(namespace, "admins")["spec"]["image"] != "registry.invalid/mine:latest"


def _client_configuration(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    return configuration


# ------------------------------------------------------------------------ queues

QUEUE_LABEL, PRIORITY_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"


def _queued(name: str, queue: str, priority: str) -> dict[str, Any]:
    doc = _quickstart(name)
    doc["metadata"]["labels"] = {QUEUE_LABEL: queue, PRIORITY_LABEL: priority}
    return doc


def _set_phase(kube: Any, namespace: str, name: str, phase: str) -> None:
    """What the operator's status writes say (it does not run here)."""
    kube.request("PATCH", kube.job_path(namespace, name, "status"), {"status": {"phase": phase}},
                 content_type="application/merge-patch+json")


def _kubectl_as(control_plane: Any, kubeconfig: Path, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(kubeconfig), "--namespace", namespace,
                *args], check=False)


@pytest.mark.cluster
def test_a_job_once_queued_keeps_its_queue_for_good_and_an_admitted_one_its_priority(
        control_plane: Any, kube: Any, namespace: str, ordinary_user: Path, policy: None) -> None:
    """Issue #30, point 6: without this, removing the label from an admitted job took its gang out of
    Kueue's quota (the operator stopped looking at its Workload) and a job that should preempt it waited.
    Issue #43, point 2: not even once it failed (a spec edit revives a job failed on its spec)."""
    def label(*changes: str) -> subprocess.CompletedProcess[str]:
        return _kubectl_as(control_plane, ordinary_user, namespace, "label", "--overwrite", "rltrainingjob/q", *changes)

    assert _apply(control_plane, ordinary_user, namespace, _queued("q", "team-a", "low")).returncode == 0
    _set_phase(kube, namespace, "q", "Queued")

    def removal_refused() -> subprocess.CompletedProcess[str] | None:
        # A dry run while the API server may still be picking the policy up: a real one would succeed.
        result = label("--dry-run=server", f"{QUEUE_LABEL}-")
        return result if result.returncode != 0 and QUEUES in result.stderr else None

    wait_for(removal_refused, 30, message=f"the {QUEUES} policy in force")
    refused = label(f"{QUEUE_LABEL}-")
    assert f"metadata.labels[{QUEUE_LABEL}]: the job is in LocalQueue team-a (phase Queued)" in refused.stderr
    # Not admitted yet: it may move to another queue, at another priority, as Kueue allows for a suspended Job.
    assert label(f"{QUEUE_LABEL}=team-b", f"{PRIORITY_LABEL}=high").returncode == 0

    _set_phase(kube, namespace, "q", "Running")  # admitted: its gang runs on team-b's quota
    for change, says in ((f"{QUEUE_LABEL}=team-c", "suspend it (spec.runPolicy.suspend: true) before moving it"),
                         (f"{PRIORITY_LABEL}=low", f"metadata.labels[{PRIORITY_LABEL}]"),
                         (f"{QUEUE_LABEL}-", "removing the label would take it out of the queue")):
        result = label(change)
        assert result.returncode != 0 and says in result.stderr, (change, result.stderr)
    # Other edits of a running job are not this policy's business.
    patched = _kubectl_as(control_plane, ordinary_user, namespace, "patch", "rltrainingjob/q", "--type", "merge",
                          "-p", '{"spec": {"runPolicy": {"suspend": true}}}')
    assert patched.returncode == 0, patched.stderr
    job = kube.request("GET", kube.job_path(namespace, "q"))
    assert job["metadata"]["labels"] == {QUEUE_LABEL: "team-b", PRIORITY_LABEL: "high"}
    # Failed on its spec: one patch that removes the label and fixes the spec would revive it outside the queue.
    _set_phase(kube, namespace, "q", "Failed")
    revive = {"metadata": {"labels": {QUEUE_LABEL: None}}, "spec": {"runPolicy": {"suspend": False}}}
    patched = _kubectl_as(control_plane, ordinary_user, namespace, "patch", "rltrainingjob/q", "--type", "merge",
                          "-p", json.dumps(revive))
    assert patched.returncode != 0 and "a job once queued keeps a queue while it exists" in patched.stderr, \
        patched.stderr
    for phase in ("Failed", "Succeeded"):
        _set_phase(kube, namespace, "q", phase)
        result = label(f"{QUEUE_LABEL}-")
        assert result.returncode != 0 and f"(phase {phase})" in result.stderr, (phase, result.stderr)
        assert label(f"{QUEUE_LABEL}=", "--overwrite").returncode != 0  # an empty value is no queue either
    assert kube.request("GET", kube.job_path(namespace, "q"))["metadata"]["labels"][QUEUE_LABEL] == "team-b"
    # The base leaves requireQueue off: a job without a queue is still welcome.
    assert _apply(control_plane, ordinary_user, namespace, _quickstart("free")).returncode == 0


@pytest.mark.cluster
def test_require_queue_refuses_a_job_without_one_on_create_and_on_every_update(
        control_plane: Any, kube: Any, namespace: str, ordinary_user: Path, policy: None) -> None:
    """Issue #43 point 2: on update too, so a job from before the requirement is edited only to name a queue."""
    assert _apply(control_plane, ordinary_user, namespace, _quickstart("before")).returncode == 0
    strict = [d for d in helm_template("--set", "kueue.requireQueue=true")
              if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == QUEUES]
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(strict[0]))
    try:
        unlabelled = _quickstart("unqueued")

        def unlabelled_refused() -> bool:  # a dry run until the API server has the new policy
            result = run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(ordinary_user), "--namespace",
                          namespace, "create", "--dry-run=server", "-f", "-"], check=False,
                         input=yaml.safe_dump(unlabelled))
            return result.returncode != 0 and QUEUES in result.stderr

        wait_for(unlabelled_refused, 30, message="requireQueue in force")
        result = _apply(control_plane, ordinary_user, namespace, unlabelled)
        assert result.returncode != 0
        assert f"metadata.labels[{QUEUE_LABEL}]: every job on this cluster runs through a Kueue" in result.stderr
        assert _apply(control_plane, ordinary_user, namespace, _queued("queued-ok", "team-a", "low")).returncode == 0
        edited = _kubectl_as(control_plane, ordinary_user, namespace, "patch", "rltrainingjob/before", "--type",
                             "merge", "-p", '{"spec": {"runPolicy": {"suspend": true}}}')
        assert edited.returncode != 0 and "every job on this cluster runs through a Kueue" in edited.stderr
        labelled = _kubectl_as(control_plane, ordinary_user, namespace, "label", "rltrainingjob/before",
                               f"{QUEUE_LABEL}=team-a")
        assert labelled.returncode == 0, labelled.stderr
    finally:
        _kubectl_admin(control_plane, "apply", "-f", str(POLICY_FILE))  # the base's again (requireQueue off)


# --------------------------------------------------- every field of the table of references (#30)

TENANT = "mallory"  # may create jobs and experiments, and use nothing a spec could name
#: The rights to use every kind of the table (what the edit role gives, and more).
ALL_RIGHTS = [{"apiGroups": [""], "resources": ["secrets", "configmaps", "persistentvolumeclaims"], "verbs": ["get"]},
              {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
              {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
               "verbs": ["get"]},
              {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups"], "verbs": ["get"]}]


def _role(control_plane: Any, namespace: str, name: str, rules: list[dict[str, Any]], subject: str) -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace}, "rules": rules}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    _kubectl_admin(control_plane, "create", "rolebinding", name, "--namespace", namespace, "--role", name,
                   f"--serviceaccount={namespace}:{subject}")


@pytest.fixture
def tenant(control_plane: Any, namespace: str, service_account_kubeconfig: Any, experiment_crd: Any) -> Iterator[Any]:
    """The operator's REST layer acting as a user who may create jobs and experiments in ``namespace``, only."""
    from kubernetes import client
    from rljob_operator.cluster.kube import Kube

    kubeconfig = service_account_kubeconfig(TENANT)
    _role(control_plane, namespace, "create-jobs", [{"apiGroups": ["rljob.dev"], "verbs": ["create"],
                                                      "resources": ["rltrainingjobs", "rlexperiments"]}], TENANT)
    user = client.ApiClient(_client_configuration(kubeconfig))
    try:
        yield Kube(user)
    finally:
        user.close()


def _refusal(kube: Any, namespace: str, doc: dict[str, Any]) -> str | None:
    """What the API server says to a dry-run create of ``doc``; None when it would be admitted."""
    from kubernetes.client.exceptions import ApiException

    plural = "rlexperiments" if doc["kind"] == "RLExperiment" else "rltrainingjobs"
    try:
        kube.request("POST", f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/{plural}", doc,
                     query={"dryRun": "All", "fieldValidation": "Strict"})
    except ApiException as e:
        return str(json.loads(e.body)["message"])
    return None


def _experiment_of(job: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": job["metadata"],
            "spec": {"template": job["spec"], "arms": [{"name": "a", "overrides": overrides or {}}]}}


@pytest.mark.cluster
def test_every_reference_field_of_the_table_needs_the_right_to_use_what_it_names(
        policy: None, tenant: Any, control_plane: Any, namespace: str) -> None:
    """Each field of the table (rljob_contract.references), in a job and in an experiment's template, naming an
    object of another team: refused for a user without the right, naming the field; admitted with it. An arm
    may not set a field holding references in either spelling."""
    from rljob_contract import references

    from tests.contract.test_references import OTHER, reference_spec

    user = f"system:serviceaccount:{namespace}:{TENANT}"
    cases = []
    for i, ref in enumerate(references.JOB_REFERENCES):
        spec, field = reference_spec(ref)
        job = _quickstart(f"ref-{i}", spec)
        kind = "the data source" if ref.kind == references.TYPED else ref.kind
        cases += [(job, f'{field} names {kind} "{OTHER}"'),
                  (_experiment_of(job), f'spec.template.{field.removeprefix("spec.")} names {kind} "{OTHER}"')]
    for doc, named in cases:
        refusal = _refusal(tenant, namespace, doc)
        assert refusal is not None and named in refusal and user in refusal, (named, refusal)

    for root in references.override_roots():
        section, field = root.split(".")
        for key in {field, to_snake(field)}:
            arm = _experiment_of(_quickstart(f"arm-{key.lower().replace('_', '-')}"), {section: {key: {}}})
            assert "spec.arms[].overrides may not set" in (_refusal(tenant, namespace, arm) or ""), (root, key)

    _role(control_plane, namespace, "use-everything", ALL_RIGHTS, TENANT)
    wait_for(lambda: _refusal(tenant, namespace, cases[0][0]) is None, 30, message="the rights granted in force")
    admitted_now = {doc["metadata"]["name"] + doc["kind"]: _refusal(tenant, namespace, doc) for doc, _ in cases}
    assert {k: v for k, v in admitted_now.items() if v is not None} == {}


# ------------------------------------------------------------------ chart = kustomize


def test_the_chart_renders_the_kustomize_bases_policy() -> None:
    """Same policy and binding from both (labels aside); the chart can turn it off or open more accounts."""
    base = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    chart = [d for d in helm_template() if d["kind"].startswith("ValidatingAdmissionPolicy")]
    for d in chart:
        assert d["metadata"].pop("labels")["app.kubernetes.io/component"] == "admission"

    def by_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(d["kind"], d["metadata"]["name"]): d for d in docs}

    assert sorted(by_name(chart)) == [("ValidatingAdmissionPolicy", POLICY), ("ValidatingAdmissionPolicy", QUEUES),
                                      ("ValidatingAdmissionPolicyBinding", POLICY),
                                      ("ValidatingAdmissionPolicyBinding", QUEUES)]
    assert by_name(chart) == by_name(base)
    assert [d["spec"]["validationActions"] for d in chart if d["kind"].endswith("Binding")] == [["Deny"]] * 2
    required = [d for d in helm_template("--set", "kueue.requireQueue=true")
                if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == QUEUES]
    assert {v["name"]: v["expression"] for v in required[0]["spec"]["variables"]}["requireQueue"] == "true"

    assert not [d for d in helm_template("--set", "admissionPolicies.enabled=false",
                                         "--set", "admissionPolicies.acknowledgeDisabled=true")
                if d["kind"].startswith("ValidatingAdmissionPolicy")]
    opened = helm_template("--set", "admissionPolicies.openTrainerServiceAccount=false",
                           "--set", "admissionPolicies.openServiceAccounts={s3-reader}")
    variables = {v["name"]: v["expression"] for d in opened if d["kind"] == "ValidatingAdmissionPolicy"
                 for v in d["spec"]["variables"]}
    assert variables["openServiceAccounts"] == '["s3-reader"]'


def test_the_operator_is_told_the_charts_policies_and_may_read_exactly_those() -> None:
    """Issue #43 point 6: the operator checks the policies the chart made (their names follow the release)."""
    from rljob_operator.admission import enforcement_problems

    docs = helm_template(release="ml")
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    env = operator_env(one(docs, "Deployment"))
    assert env["RLJOB_OPERATOR_ADMISSION_POLICIES"].split(",") == ["ml-rljob-job-references", "ml-rljob-queues"]
    assert sorted(policies) == sorted(env["RLJOB_OPERATOR_ADMISSION_POLICIES"].split(","))
    assert env["RLJOB_OPERATOR_WITHOUT_ADMISSION_POLICIES"] == "false"
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert enforcement_problems(policies, bindings) == []  # what the chart installs is what the operator wants
    [read] = [r for r in one(docs, "ClusterRole", "ml-rljob-operator-admission")["rules"]
              if r["resources"] == ["validatingadmissionpolicies"]]
    assert sorted(read["resourceNames"]) == sorted(policies) and read["verbs"] == ["get"]


def test_turning_the_policies_off_needs_an_acknowledgement_that_reaches_the_operator() -> None:
    refused = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION,
                   "--set", "admissionPolicies.enabled=false", check=False)
    assert refused.returncode != 0 and "admissionPolicies.acknowledgeDisabled=true" in refused.stderr
    both = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION,
                "--set", "admissionPolicies.acknowledgeDisabled=true", check=False)
    assert both.returncode != 0 and "goes with admissionPolicies.enabled=false" in both.stderr
    docs = helm_template("--set", "admissionPolicies.enabled=false", "--set", "admissionPolicies.acknowledgeDisabled=true")
    assert operator_env(one(docs, "Deployment"))["RLJOB_OPERATOR_WITHOUT_ADMISSION_POLICIES"] == "true"
    assert not [d for d in docs if d["metadata"]["name"].endswith("-admission") and d["kind"].startswith("ClusterRole")]


# ------------------------------------------- the operator without its policies (#43 point 6)

#: The operator as it runs in a cluster: its policies checked (the tests' processes run without them), often.
CHECKED = {"RLJOB_OPERATOR_WITHOUT_ADMISSION_POLICIES": "false", "RLJOB_OPERATOR_ADMISSION_RECHECK_SECONDS": "1"}


def _readyz(proc: Any) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _in_force_gauge(proc: Any) -> float:
    line = next(x for x in proc.metrics_text().splitlines() if x.startswith("rljob_operator_admission_policies_in_force"))
    return float(line.split()[-1])


@pytest.mark.cluster
def test_the_operator_refuses_to_start_without_its_policies_and_pauses_while_they_are_gone(
        policy: None, operator: Any, control_plane: Any, kube: Any, namespace: str) -> None:
    """With admissionPolicies.enabled=false nothing would check what a job's creator names: the operator, which
    cannot (it never sees who wrote a job), will not build anything unless the policies are in force."""
    from tests.support.operator import job_manifest, job_pods, wait_phase

    proc = operator(env=CHECKED)
    assert _readyz(proc) == 200 and _in_force_gauge(proc) == 1
    create_job(kube, namespace, job_manifest("checked", 1))
    wait_phase(kube, namespace, "checked", "Running")
    try:
        kube.request("DELETE", f"{BINDING_PATH}/{QUEUES}")  # a binding gone: the queue rule refuses nothing
        wait_for(lambda: _readyz(proc) == 503, 30, message="/readyz 503 once the binding is gone")
        assert _in_force_gauge(proc) == 0
        create_job(kube, namespace, job_manifest("unchecked", 1))  # written while nothing checked it
        time.sleep(4)  # more than a resync (3 s) and a recheck (1 s): it would have been reconciled
        assert not (kube.get_job(namespace, "unchecked") or {}).get("status") and not job_pods(
            kube, namespace, "unchecked")
        assert "ValidatingAdmissionPolicy rljob-queues: no ValidatingAdmissionPolicyBinding enforces it" in \
            proc.log.read_text()
        _kubectl_admin(control_plane, "apply", "-f", str(POLICY_FILE))
        wait_for(lambda: _readyz(proc) == 200, 30, message="ready once the policies are back")
        wait_phase(kube, namespace, "unchecked", "Running")
        proc.stop()

        kube.request("DELETE", f"{VAP_PATH}/{QUEUES}")
        refused = operator(wait=False, env=CHECKED)
        assert refused.wait_exit(60) == 2
        log = refused.log.read_text()
        assert "refusing to start" in log and "ValidatingAdmissionPolicy rljob-queues: not found" in log, log[-2000:]
        assert "--without-admission-policies" in log
        # Knowingly without them: it runs, and says so.
        unchecked = operator(env={**CHECKED, "RLJOB_OPERATOR_WITHOUT_ADMISSION_POLICIES": "true"})
        assert _readyz(unchecked) == 200 and _in_force_gauge(unchecked) == 0
        assert "ERROR" in unchecked.log.read_text() and "WITHOUT admission policies" in unchecked.log.read_text()
    finally:
        _kubectl_admin(control_plane, "apply", "-f", str(POLICY_FILE))  # the module's other tests need them
