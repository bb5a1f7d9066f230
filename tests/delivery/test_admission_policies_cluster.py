"""Nothing a job or a namespace's runtime names grants more than its writer's own rights, and a job runs only
on a runtime its creator may use (issue #14 point 1, issue #42: the admission side).

The ValidatingAdmissionPolicies of ``manifests/base/admission-policies.yaml`` (the same as the chart's
``templates/admission-policies.yaml``: a test compares them) are installed on the real control plane, and
ordinary users, ServiceAccount tokens with narrow Roles, run ``kubectl apply``:

* a runtime writer (may write RLTrainingRuntimes in its namespace, as a namespace's admins do) with runtimes
  naming a ServiceAccount or a Secret: each refused, naming the field, until the writer is granted the
  right to use that object directly;
* a job creator with jobs and experiments naming a reward module's ConfigMap, or a runtime it may not
  ``use`` (named, or the default): refused naming the field until granted;
* a namespace admin (the built-in ``admin`` role, the base's roles aggregated into it) writes its
  namespace's runtimes and never a ClusterRLTrainingRuntime; the queue labels are kept;
* a user who may create and update pods, and only read jobs: a pod claiming to be a job's worker (an
  ownerReference to the RLTrainingJob) is refused, on create and when the reference is added, until the
  user may patch that job's status (the operator's right); other pods and edits pass.
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
from tests.support.operator_process import create_job, deep_update, job_claim, runtime_manifest

POLICY_FILE = MANIFESTS / "base" / "admission-policies.yaml"
POLICY = "rljob-job-references"
QUEUES = "rljob-queues"
RUNTIME_USE = "rljob-runtime-use"
RUNTIME_REFERENCES = "rljob-runtime-references"
WORKER_PODS = "rljob-worker-pods"
POLICIES = (POLICY, QUEUES, RUNTIME_USE, RUNTIME_REFERENCES, WORKER_PODS)
VAP_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDING_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
PROBE = "rljob-policy-probe"  # a user who may only create jobs in "default"
USER = "alice"  # the ordinary user: a ServiceAccount of the test's namespace

#: (case, patch of an RLTrainingRuntime's spec, the field the refusal names, kind, the name granted).
REFERENCES: list[tuple[str, dict[str, Any], str, str, str]] = [
    ("service-account", {"podTemplate": {"spec": {"serviceAccountName": "powerful"}}},
     "spec.podTemplate.spec.serviceAccountName", "ServiceAccount", "powerful"),
    ("checkpoint-secret", {"checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "s3-keys"}},
     "spec.checkpoint.credentialsSecret", "Secret", "s3-keys"),
    ("mirror-secret", {"checkpoint": {"storage": "s3://bucket/ckpt", "mirrors": [
        {"location": "s3://backup/ckpt", "credentialsSecret": "backup-keys"}]}},
     "spec.checkpoint.mirrors[location=s3://backup/ckpt].credentialsSecret", "Secret", "backup-keys"),
    ("image-pull-secret", {"imagePullSecrets": [{"name": "registry"}]},
     "spec.imagePullSecrets[name=registry].name", "Secret", "registry"),
    ("env-secret-key-ref", {"podTemplate": {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}]}]}}},
     "spec.podTemplate.spec.containers[name=trainer].env[name=HF_TOKEN].valueFrom.secretKeyRef.name", "Secret", "hub"),
    ("secret-volume", {"podTemplate": {"spec": {"volumes": [{"name": "creds", "secret": {"secretName": "db"}}]}}},
     "spec.podTemplate.spec.volumes[name=creds].secret.secretName", "Secret", "db"),
    ("env-from", {"podTemplate": {"spec": {"containers": [
        {"name": "trainer", "envFrom": [{"secretRef": {"name": "db"}}]}]}}},
     "spec.podTemplate.spec.containers[name=trainer].envFrom[].secretRef.name", "Secret", "db"),
    ("init-container-env", {"podTemplate": {"spec": {"initContainers": [
        {"name": "fetch", "image": "busybox", "env": [
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}]}}},
     "spec.podTemplate.spec.initContainers[name=fetch].env[name=KEY].valueFrom.secretKeyRef.name", "Secret", "db"),
    ("projected-volume", {"podTemplate": {"spec": {"volumes": [
        {"name": "all", "projected": {"sources": [{"secret": {"name": "db"}}]}}]}}},
     "spec.podTemplate.spec.volumes[name=all].projected.sources[].secret.name", "Secret", "db"),
    ("csi-secret", {"podTemplate": {"spec": {"volumes": [
        {"name": "csi", "csi": {"driver": "x.example.com", "nodePublishSecretRef": {"name": "db"}}}]}}},
     "spec.podTemplate.spec.volumes[name=csi].csi.nodePublishSecretRef.name", "Secret", "db"),
    ("pod-template-image-pull-secret", {"podTemplate": {"spec": {"imagePullSecrets": [{"name": "registry"}]}}},
     "spec.podTemplate.spec.imagePullSecrets[name=registry].name", "Secret", "registry"),
]


def _sourced(*names: str) -> dict[str, Any]:
    """A job spec patch: one custom reward per ConfigMap of ``names`` (module ``m_<name>``, a Python name)."""
    return {"training": {"rewards": [{"name": f"m_{n.replace('-', '_')}:score",
                                      "source": {"configMap": {"name": n, "key": "r.py"}}} for n in names]}}


#: (case, patch of the quickstart's spec, the field the refusal names, kind, the name granted): what a job names.
JOB_CASES: list[tuple[str, dict[str, Any], str, str, str]] = [
    ("reward-configmap", _sourced("team-rewards"),
     "spec.training.rewards[name=m_team_rewards:score].source.configMap.name", "ConfigMap", "team-rewards"),
]

# ----------------------------------------------------------------------------- plumbing


def _quickstart(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"]["name"] = name
    return deep_update(doc, {"spec": spec}) if spec else doc


def _pod(name: str, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A bare pod (never scheduled here: only its admission matters), owned by ``owners``."""
    meta: dict[str, Any] = {"name": name, **({"ownerReferences": owners} if owners else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/pause:1"}]}}


def _runtime(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """An RLTrainingRuntime of the test's namespace, as its admins would write one."""
    return runtime_manifest(name, spec, kind="RLTrainingRuntime")


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

    for path in [*(f"{BINDING_PATH}/{name}" for name in POLICIES), *(f"{VAP_PATH}/{name}" for name in POLICIES)]:
        try:
            kube.request("DELETE", path)
        except ApiException as e:
            if e.status != 404:
                raise


#: `use` of the runtime the base marks as the default, as the chart's roles grant every job creator.
USE_DEFAULT_RUNTIME = {"apiGroups": ["rljob.dev"], "resources": ["clusterrltrainingruntimes"],
                       "resourceNames": ["default"], "verbs": ["use"]}


@pytest.fixture(scope="module")
def policy(control_plane: Any, kube: Any, crd_installed: Any, runtime_crds: Any) -> Iterator[None]:
    """The kustomize base's policies and bindings, applied as they ship, and in force."""
    from rljob_contract.references import JOB_REFERENCES

    from tests.contract.test_references import reference_spec

    _kubectl_admin(control_plane, "apply", "-f", str(POLICY_FILE))
    # A probe user who may create jobs and pods (dry runs) in "default", on the default runtime, and read nothing.
    probe = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": PROBE, "namespace": "default"},
             "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs", "rltrainingruntimes"],
                        "verbs": ["create"]}, {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
                       USE_DEFAULT_RUNTIME]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": PROBE, "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROBE},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROBE}]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump_all([probe, binding]))
    canaries = {POLICY: _quickstart("canary", reference_spec(JOB_REFERENCES[0], "canary")[0]),
                RUNTIME_USE: _quickstart("canary", {"runtimeRef": {"name": "canary"}}),
                RUNTIME_REFERENCES: _runtime("canary", {"checkpoint": {"storage": "s3://b/c", "credentialsSecret": "c"}}),
                WORKER_PODS: _pod("canary", [job_claim("canary", "00000000-0000-0000-0000-000000000000")])}

    def refused(name: str) -> bool:
        # The API server picks a new policy up from a watch: wait until it bites (a dry run as a user).
        result = run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig),
                      "--as", PROBE, "--namespace", "default", "create", "--dry-run=server",
                      "-f", "-"], check=False, input=yaml.safe_dump(canaries[name]))
        return result.returncode != 0 and name in result.stderr

    try:
        for name in canaries:
            wait_for(lambda: refused(name), 30, message=f"the {name} policy in force")  # noqa: B023
        yield
    finally:
        _delete_policy(kube)
        _kubectl_admin(control_plane, "delete", "--namespace", "default", "--ignore-not-found",
                       f"rolebinding/{PROBE}", f"role/{PROBE}")


@pytest.fixture
def ordinary_user(control_plane: Any, namespace: str, service_account_kubeconfig: Any) -> Path:
    """A kubeconfig whose only rights are on RLTrainingJobs (and their status) in ``namespace``, on the
    default runtime."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "jobs-only", "namespace": namespace},
            "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs", "rltrainingjobs/status"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                      USE_DEFAULT_RUNTIME]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    kubeconfig = service_account_kubeconfig(USER)
    _kubectl_admin(control_plane, "create", "rolebinding", "jobs-only", "--namespace", namespace,
                   "--role", "jobs-only", f"--serviceaccount={namespace}:{USER}")
    return kubeconfig  # type: ignore[no-any-return]


@pytest.fixture
def runtime_writer(control_plane: Any, namespace: str, service_account_kubeconfig: Any, runtime_crds: Any) -> Path:
    """A kubeconfig whose only rights are to write RLTrainingRuntimes in ``namespace`` (a namespace admin's part)."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "runtimes-only", "namespace": namespace},
            "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingruntimes"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    kubeconfig = service_account_kubeconfig(USER)
    _kubectl_admin(control_plane, "create", "rolebinding", "runtimes-only", "--namespace", namespace,
                   "--role", "runtimes-only", f"--serviceaccount={namespace}:{USER}")
    return kubeconfig  # type: ignore[no-any-return]


def _grant(control_plane: Any, namespace: str, kind: str, name: str) -> None:
    """The right to use ``name`` directly: get a Secret or ConfigMap; create a token for a ServiceAccount."""
    if kind in ("Secret", "ConfigMap"):
        rule = {"apiGroups": [""], "resources": [f"{kind.lower()}s"], "resourceNames": [name], "verbs": ["get"]}
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

    wait_for(admitted, 30, message=f"{doc['kind']} {doc['metadata']['name']} admitted once the right was granted")


def _get(kube: Any, namespace: str, doc: dict[str, Any]) -> Any:
    """``doc`` as stored (an RLTrainingRuntime of ``namespace``), or None."""
    from kubernetes.client.exceptions import ApiException

    try:
        return kube.request("GET", f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rltrainingruntimes/"
                                   f"{doc['metadata']['name']}")
    except ApiException as e:
        if e.status == 404:
            return None
        raise


# ----------------------------------------------------------------------------- tests


@pytest.mark.cluster
@pytest.mark.parametrize("case,spec,field,kind,name", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_a_reference_the_runtime_writer_could_not_use_is_refused_naming_the_field(
        case: str, spec: dict[str, Any], field: str, kind: str, name: str, policy: None,
        runtime_writer: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    doc = _runtime(case, spec)
    result = _apply(control_plane, runtime_writer, namespace, doc)
    assert result.returncode != 0, f"a runtime naming {kind} {name!r} at {field} was admitted"
    assert "forbidden" in result.stderr.lower() and RUNTIME_REFERENCES in result.stderr, result.stderr
    assert f'{field} names {kind} "{name}"' in result.stderr, result.stderr
    assert f"system:serviceaccount:{namespace}:{USER}" in result.stderr, result.stderr
    assert _get(kube, namespace, doc) is None

    _grant(control_plane, namespace, kind, name)
    _admitted_after_grant(control_plane, runtime_writer, namespace, doc)
    assert _get(kube, namespace, doc) is not None


@pytest.mark.cluster
@pytest.mark.parametrize("case,spec,field,kind,name", JOB_CASES, ids=[r[0] for r in JOB_CASES])
def test_a_reference_the_job_creator_could_not_use_is_refused_naming_the_field(
        case: str, spec: dict[str, Any], field: str, kind: str, name: str, policy: None,
        ordinary_user: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    doc = _quickstart(case, spec)
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert result.returncode != 0, f"a job naming {kind} {name!r} at {field} was admitted"
    assert "forbidden" in result.stderr.lower() and POLICY in result.stderr, result.stderr
    assert f'{field} names {kind} "{name}"' in result.stderr, result.stderr
    assert f"system:serviceaccount:{namespace}:{USER}" in result.stderr, result.stderr
    assert kube.get_job(namespace, case) is None

    _grant(control_plane, namespace, kind, name)
    _admitted_after_grant(control_plane, ordinary_user, namespace, doc)
    assert kube.get_job(namespace, case) is not None


@pytest.mark.cluster
@pytest.mark.cluster
def test_a_refusal_lists_every_reward_configmap_of_a_job(
        policy: None, ordinary_user: Path, control_plane: Any, namespace: str) -> None:
    """The API server reports the first refused field (one validation per field of the table of references);
    its message lists each reference that field holds."""
    doc = _quickstart("many", _sourced("a", "b"))
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert result.returncode != 0
    assert ('spec.training.rewards[name=m_a:score].source.configMap.name names ConfigMap "a"; '
            'spec.training.rewards[name=m_b:score].source.configMap.name names ConfigMap "b": a job may name only '
            'objects its creator could use') in result.stderr, result.stderr
    # (every reference of the field is listed, the allowed ones too.) One of the two is not enough.
    _grant(control_plane, namespace, "ConfigMap", "a")
    result = _apply(control_plane, ordinary_user, namespace, doc)
    assert result.returncode != 0 and 'names ConfigMap "b"' in result.stderr, result.stderr
    _grant(control_plane, namespace, "ConfigMap", "b")
    _admitted_after_grant(control_plane, ordinary_user, namespace, doc)


@pytest.mark.cluster
def test_changing_the_spec_of_a_job_someone_else_created_needs_the_same_rights(
        policy: None, ordinary_user: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    """An admin's job names a ConfigMap; the ordinary user may change its status and labels, not its spec.

    Changing the spec (its training, say) would run the user's choices with the admin's reward module.
    Writes that leave the spec alone (the operator's status, labels) are not checked.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from rljob_operator.cluster.kube import Kube

    create_job(kube, namespace, _quickstart("admins", _sourced("admin-rewards")))
    changed = _quickstart("admins", deep_update(_sourced("admin-rewards"), {"training": {"learningRate": 0.5}}))
    result = _apply(control_plane, ordinary_user, namespace, changed)
    assert result.returncode != 0
    assert 'names ConfigMap "admin-rewards"' in result.stderr, result.stderr

    user = client.ApiClient(_client_configuration(ordinary_user))
    try:
        as_user = Kube(user)
        path = as_user.job_path(namespace, "admins")
        as_user.request("PATCH", path, {"metadata": {"labels": {"team": "a"}}},
                        content_type="application/merge-patch+json")
        as_user.request("PATCH", f"{path}/status", {"status": {"phase": "Pending"}},
                        content_type="application/merge-patch+json")
        with pytest.raises(ApiException) as refused:
            as_user.request("PATCH", path, {"spec": {"training": {"learningRate": 0.5}}},
                            content_type="application/merge-patch+json")
        assert refused.value.status == 403
    finally:
        user.close()
    assert kube.get_job(namespace, "admins")["spec"]["training"]["learningRate"] != 0.5


@pytest.mark.cluster
def test_the_ordinary_user_may_still_run_the_quickstart_and_a_writer_name_the_trainer_service_account(
        policy: None, ordinary_user: Path, runtime_writer: Path, control_plane: Any, namespace: str,
        kube: Any) -> None:
    result = _apply(control_plane, ordinary_user, namespace, _quickstart("quickstart"))
    assert result.returncode == 0, result.stderr
    assert kube.get_job(namespace, "quickstart") is not None
    trainer = _runtime("as-trainer", {"podTemplate": {"spec": {"serviceAccountName": "rljob-trainer"}}})
    result = _apply(control_plane, runtime_writer, namespace, trainer)
    assert result.returncode == 0, result.stderr


@pytest.mark.cluster
def test_impersonating_a_service_account_is_a_right_to_use_it(
        policy: None, runtime_writer: Path, control_plane: Any, namespace: str) -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "impersonate-ci", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["ci"],
                       "verbs": ["impersonate"]}]}
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(role))
    _kubectl_admin(control_plane, "create", "rolebinding", "impersonate-ci", "--namespace", namespace,
                   "--role", "impersonate-ci", f"--serviceaccount={namespace}:{USER}")
    _admitted_after_grant(control_plane, runtime_writer, namespace,
                          _runtime("as-ci", {"podTemplate": {"spec": {"serviceAccountName": "ci"}}}))


@pytest.mark.cluster
def test_a_refusal_lists_every_reference_of_its_field(
        policy: None, runtime_writer: Path, control_plane: Any, namespace: str) -> None:
    """The API server reports the first refused field (one validation per field of the table of references);
    its message lists each reference that field holds, nested ones too."""
    def secret(name: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": name, "key": "k"}}

    doc = _runtime("many", {
        "checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "a"},
        "podTemplate": {"spec": {
            "containers": [{"name": "trainer", "env": [{"name": "B", "valueFrom": secret("b")},
                                                       {"name": "PLAIN", "value": "1"},
                                                       {"name": "D", "valueFrom": secret("d")}]}],
            "initContainers": [{"name": "fetch", "image": "busybox",
                                "env": [{"name": "C", "valueFrom": secret("c")}]}]}}})
    result = _apply(control_plane, runtime_writer, namespace, doc)
    assert result.returncode != 0
    assert 'spec.checkpoint.credentialsSecret names Secret "a"' in result.stderr, result.stderr

    _grant(control_plane, namespace, "Secret", "a")
    wait_for(lambda: "credentialsSecret" not in _apply(control_plane, runtime_writer, namespace, doc).stderr, 30,
             message="the checkpoint Secret allowed")
    result = _apply(control_plane, runtime_writer, namespace, doc)
    assert result.returncode != 0
    assert ('spec.podTemplate.spec.containers[name=trainer].env[name=B].valueFrom.secretKeyRef.name names Secret "b"; '
            'spec.podTemplate.spec.containers[name=trainer].env[name=D].valueFrom.secretKeyRef.name names Secret "d": '
            'an RLTrainingRuntime may name only objects its writer could use') in result.stderr, result.stderr
    for name in ("b", "d"):
        _grant(control_plane, namespace, "Secret", name)
    wait_for(lambda: "containers[name=trainer]" not in _apply(control_plane, runtime_writer, namespace, doc).stderr,
             30, message="the env Secrets allowed")
    result = _apply(control_plane, runtime_writer, namespace, doc)
    assert ('spec.podTemplate.spec.initContainers[name=fetch].env[name=C].valueFrom.secretKeyRef.name '
            'names Secret "c"') in result.stderr, result.stderr


@pytest.mark.cluster
def test_changing_the_spec_of_a_runtime_someone_else_wrote_needs_the_same_rights(
        policy: None, runtime_writer: Path, control_plane: Any, namespace: str, kube: Any) -> None:
    """An admin's runtime names a Secret; the writer may change its labels, not its spec: changing the image
    would run the writer's code with the admin's Secret. Metadata writes are not checked."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from rljob_operator.cluster.kube import Kube

    from tests.support.operator_process import apply_runtime

    admins = _runtime("admins", {"checkpoint": {"storage": "s3://bucket/ckpt", "credentialsSecret": "s3-keys"}})
    apply_runtime(kube, deep_update(admins, {"metadata": {"namespace": namespace}}))
    changed = deep_update(admins, {"spec": {"image": "registry.invalid/mine:latest"}})
    result = _apply(control_plane, runtime_writer, namespace, changed)
    assert result.returncode != 0
    assert 'spec.checkpoint.credentialsSecret names Secret "s3-keys"' in result.stderr, result.stderr

    user = client.ApiClient(_client_configuration(runtime_writer))
    path = f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rltrainingruntimes/admins"
    try:
        as_user = Kube(user)
        as_user.request("PATCH", path, {"metadata": {"labels": {"team": "a"}}},
                        content_type="application/merge-patch+json")
        with pytest.raises(ApiException) as refused:
            as_user.request("PATCH", path, {"spec": {"image": "registry.invalid/mine:latest"}},
                            content_type="application/merge-patch+json")
        assert refused.value.status == 403
    finally:
        user.close()
    assert kube.request("GET", path)["spec"]["image"] != "registry.invalid/mine:latest"


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
    unlabelled = _quickstart("unqueued")

    def unlabelled_refused() -> bool:  # a dry run until the API server has the new policy
        result = run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(ordinary_user), "--namespace",
                      namespace, "create", "--dry-run=server", "-f", "-"], check=False,
                     input=yaml.safe_dump(unlabelled))
        return result.returncode != 0 and QUEUES in result.stderr

    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(strict[0]))
    try:
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
        # ... in force before the next test: the API server reads policies from a watch, seconds later.
        wait_for(lambda: not unlabelled_refused(), 30, message="requireQueue off again")


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
                                                      "resources": ["rltrainingjobs", "rlexperiments"]},
                                                     USE_DEFAULT_RUNTIME], TENANT)
    user = client.ApiClient(_client_configuration(kubeconfig))
    try:
        yield Kube(user)
    finally:
        user.close()


def _refusal(kube: Any, namespace: str, doc: dict[str, Any]) -> str | None:
    """What the API server says to a dry-run create of ``doc``; None when it would be admitted."""
    from kubernetes.client.exceptions import ApiException

    plural = {"RLExperiment": "rlexperiments", "RLTrainingRuntime": "rltrainingruntimes"}.get(doc["kind"],
                                                                                             "rltrainingjobs")
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
    """Each field of the job's table (rljob_contract.references.JOB_REFERENCES), in a job and in an experiment's
    template, naming an object of another team: refused for a user without the right, naming the field;
    admitted with it. An arm may neither set such a field nor change the runtime, in either spelling."""
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

    arms = [({key: {"name": "default"}}, key) for field in references.FIXED_FIELDS
            for key in sorted({field, to_snake(field)})]
    arms += [(reference_spec(ref)[0], ref.path) for ref in references.JOB_REFERENCES]
    for i, (overrides, what) in enumerate(arms):
        arm = _experiment_of(_quickstart(f"arm-{i}"), overrides)
        assert "spec.arms[].overrides may not set" in (_refusal(tenant, namespace, arm) or ""), what

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

    assert sorted(by_name(chart)) == sorted((kind, name) for name in POLICIES for kind in (
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"))
    assert by_name(chart) == by_name(base)
    assert [d["spec"]["validationActions"] for d in chart if d["kind"].endswith("Binding")] == [["Deny"]] * len(POLICIES)
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


# ------------------------------------------------------------------ runtimes (#42)

RUNNER = "carol"  # may create jobs and experiments, and use no runtime
#: A runtime of the platform's, as its admins write one (the base's "default" under another name).
CLUSTER_RUNTIME = {**next(d for d in yaml.safe_load_all((MANIFESTS / "base" / "runtimes.yaml").read_text())
                          if d["metadata"]["name"] == "default"), "metadata": {"name": "test-h100"}}


def _use(name: str, resource: str = "clusterrltrainingruntimes") -> dict[str, Any]:
    return {"apiGroups": ["rljob.dev"], "resources": [resource], "resourceNames": [name], "verbs": ["use"]}


@pytest.fixture
def runner(control_plane: Any, namespace: str, service_account_kubeconfig: Any, experiment_crd: Any) -> Iterator[Any]:
    """The operator's REST layer as a user who may create and update jobs and experiments in ``namespace``,
    and use no runtime."""
    from kubernetes import client
    from rljob_operator.cluster.kube import Kube

    kubeconfig = service_account_kubeconfig(RUNNER)
    _role(control_plane, namespace, "runner", [{"apiGroups": ["rljob.dev"], "verbs": ["create", "update", "patch"],
                                                "resources": ["rltrainingjobs", "rlexperiments"]}], RUNNER)
    user = client.ApiClient(_client_configuration(kubeconfig))
    try:
        yield Kube(user)
    finally:
        user.close()


@pytest.mark.cluster
def test_a_runtime_the_creator_may_not_use_is_refused_naming_the_field_until_use_is_granted(
        policy: None, runner: Any, control_plane: Any, namespace: str) -> None:
    """Named or by default, in a job or an experiment's template: refused with the field and the rule to ask
    for; admitted once a RoleBinding of the namespace grants `use` of that runtime (as PodSecurityPolicy's)."""
    user = f"system:serviceaccount:{namespace}:{RUNNER}"
    h100 = _quickstart("on-h100", {"runtimeRef": {"kind": "ClusterRLTrainingRuntime", "name": "h100"}})
    team = _quickstart("on-team", {"runtimeRef": {"kind": "RLTrainingRuntime", "name": "team"}})
    default = _quickstart("on-default")
    cases = [
        (h100, 'spec.runtimeRef names ClusterRLTrainingRuntime "h100", which', "clusterrltrainingruntimes", "h100"),
        (_experiment_of(h100), 'spec.template.runtimeRef names ClusterRLTrainingRuntime "h100"',
         "clusterrltrainingruntimes", "h100"),
        (team, 'spec.runtimeRef names RLTrainingRuntime "team"', "rltrainingruntimes", "team"),
        (default, 'spec.runtimeRef is not set, so the job would run on the default runtime ClusterRLTrainingRuntime '
                  '"default"', "clusterrltrainingruntimes", "default"),
    ]
    for doc, named, resource, name in cases:
        refusal = _refusal(runner, namespace, doc) or ""
        assert RUNTIME_USE in refusal and named in refusal and user in refusal, (named, refusal)
        assert f"Ask for use on {resource} (API group rljob.dev, resourceNames: {name}) in namespace {namespace}" \
            in refusal, refusal

    _role(control_plane, namespace, "use-some", [_use("h100"), _use("team", "rltrainingruntimes")], RUNNER)
    wait_for(lambda: _refusal(runner, namespace, h100) is None, 30, message="use of h100 granted")
    assert _refusal(runner, namespace, _experiment_of(h100)) is None
    assert _refusal(runner, namespace, team) is None
    assert "is not set" in (_refusal(runner, namespace, default) or "")  # h100 is not the default
    _role(control_plane, namespace, "use-default", [USE_DEFAULT_RUNTIME], RUNNER)
    wait_for(lambda: _refusal(runner, namespace, default) is None, 30, message="use of the default granted")


@pytest.mark.cluster
def test_changing_the_spec_of_a_job_on_a_runtime_the_user_may_not_use_is_refused(
        policy: None, runner: Any, control_plane: Any, namespace: str, kube: Any) -> None:
    """An admin's job runs on h100; the user, who may update jobs, may relabel it but not change its training
    (that would run the user's settings on a runtime the user may not use), nor move it to h100 from another."""
    from kubernetes.client.exceptions import ApiException

    create_job(kube, namespace, _quickstart("admins-h100", {"runtimeRef": {"name": "h100"}}))
    path = runner.job_path(namespace, "admins-h100")
    runner.request("PATCH", path, {"metadata": {"labels": {"team": "a"}}}, content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as refused:
        runner.request("PATCH", path, {"spec": {"training": {"maxSteps": 7}}},
                       content_type="application/merge-patch+json")
    assert refused.value.status == 403
    assert 'spec.runtimeRef names ClusterRLTrainingRuntime "h100"' in json.loads(refused.value.body)["message"]
    _role(control_plane, namespace, "use-default", [USE_DEFAULT_RUNTIME], RUNNER)
    wait_for(lambda: _refusal(runner, namespace, _quickstart("probe")) is None, 30, message="use of the default")
    create_job(kube, namespace, _quickstart("mine"))
    with pytest.raises(ApiException) as moved:
        runner.request("PATCH", runner.job_path(namespace, "mine"), {"spec": {"runtimeRef": {"name": "h100"}}},
                       content_type="application/merge-patch+json")
    assert moved.value.status == 403 and "h100" in moved.value.body


@pytest.mark.cluster
def test_namespace_admins_write_their_runtimes_but_nobody_of_theirs_a_cluster_runtime(
        control_plane: Any, namespace: str, service_account_kubeconfig: Any, runtime_crds: Any) -> None:
    """The base's user roles, aggregated into the built-in admin role: a namespace admin may write and use the
    namespace's RLTrainingRuntimes and use the chart's runtimes, and may neither create nor edit a
    ClusterRLTrainingRuntime; an ordinary job creator may do neither."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from rljob_operator.cluster.kube import Kube

    _kubectl_admin(control_plane, "apply", "-f", str(MANIFESTS / "base" / "rbac-user-roles.yaml"))
    _kubectl_admin(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(CLUSTER_RUNTIME))
    _kubectl_admin(control_plane, "create", "rolebinding", "admins", "--namespace", namespace, "--clusterrole",
                   "admin", f"--serviceaccount={namespace}:dana")
    admin = client.ApiClient(_client_configuration(service_account_kubeconfig("dana")))
    kubectl = [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig)]
    try:
        as_admin = Kube(admin)

        def may(verb: str, resource: str, name: str = "") -> bool:
            target = f"{resource}.rljob.dev" + (f"/{name}" if name else "")
            result = run([*kubectl, "auth", "can-i", verb, target, "--namespace", namespace,
                          f"--as=system:serviceaccount:{namespace}:dana"], check=False)
            return result.stdout.strip() == "yes"

        # The aggregation controller folds rljob-admin and rljob-edit into admin: wait for it.
        wait_for(lambda: may("create", "rltrainingruntimes"), 60, message="rljob-admin aggregated into admin")
        assert may("use", "clusterrltrainingruntimes", "default") and may("use", "clusterrltrainingruntimes", "cpu")
        assert may("use", "rltrainingruntimes", "anything-of-theirs")
        assert not may("use", "clusterrltrainingruntimes", "test-h100")
        runtimes = "/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes"
        for verb, path, body in (("POST", runtimes, {**CLUSTER_RUNTIME, "metadata": {"name": "mine"}}),
                                 ("PATCH", f"{runtimes}/{CLUSTER_RUNTIME['metadata']['name']}",
                                  {"spec": {"image": "registry.invalid/mine:latest"}})):
            with pytest.raises(ApiException) as refused:
                as_admin.request(verb, path, body, content_type="application/merge-patch+json"
                                 if verb == "PATCH" else "application/json")
            assert refused.value.status == 403, (verb, refused.value.body)
    finally:
        admin.close()
        _kubectl_admin(control_plane, "delete", "--ignore-not-found", "clusterrltrainingruntime",
                       CLUSTER_RUNTIME["metadata"]["name"])


WRITER = "frank"  # may write RLTrainingRuntimes in the namespace, and use nothing a runtime could name


@pytest.mark.cluster
def test_every_reference_field_of_a_namespaced_runtime_needs_its_writers_right_to_use_what_it_names(
        policy: None, control_plane: Any, namespace: str, service_account_kubeconfig: Any, runtime_crds: Any) -> None:
    """Each field of RUNTIME_REFERENCES in an RLTrainingRuntime naming an object of another team: refused for a
    writer without the right, naming the field (every job on the runtime would get the object); admitted with it."""
    from kubernetes import client
    from rljob_contract import references
    from rljob_operator.cluster.kube import Kube

    from tests.contract.test_references import OTHER, reference_spec
    from tests.support.operator_process import runtime_manifest

    _role(control_plane, namespace, "write-runtimes", [{"apiGroups": ["rljob.dev"], "verbs": ["create"],
                                                         "resources": ["rltrainingruntimes"]}], WRITER)
    writer = client.ApiClient(_client_configuration(service_account_kubeconfig(WRITER)))
    user = f"system:serviceaccount:{namespace}:{WRITER}"
    try:
        as_writer = Kube(writer)
        cases = []
        for i, ref in enumerate(references.RUNTIME_REFERENCES):
            spec, field = reference_spec(ref)
            kind = "the data source" if ref.kind == references.TYPED else ref.kind
            cases.append((runtime_manifest(f"rt-{i}", spec, kind="RLTrainingRuntime"), f'{field} names {kind} "{OTHER}"'))
        for doc, named in cases:
            refusal = _refusal(as_writer, namespace, doc)
            assert refusal is not None and RUNTIME_REFERENCES in refusal, (named, refusal)
            assert named in refusal and user in refusal and "its writer could use" in refusal, (named, refusal)
        # The trainers' ServiceAccount is anyone's to name.
        trainer = runtime_manifest("rt-trainer", {"podTemplate": {"spec": {"serviceAccountName": "rljob-trainer"}}},
                                   kind="RLTrainingRuntime")
        assert _refusal(as_writer, namespace, trainer) is None
        _role(control_plane, namespace, "writer-uses-everything", ALL_RIGHTS, WRITER)
        wait_for(lambda: _refusal(as_writer, namespace, cases[0][0]) is None, 30, message="the rights in force")
        admitted_now = {doc["metadata"]["name"]: _refusal(as_writer, namespace, doc) for doc, _ in cases}
        assert {k: v for k, v in admitted_now.items() if v is not None} == {}
    finally:
        writer.close()


def test_the_operator_is_told_the_charts_policies_and_may_read_exactly_those() -> None:
    """Issue #43 point 6: the operator checks the policies the chart made (their names follow the release)."""
    from rljob_operator.admission import enforcement_problems

    docs = helm_template(release="ml")
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    env = operator_env(one(docs, "Deployment"))
    assert env["RLJOB_OPERATOR_ADMISSION_POLICIES"].split(",") == [
        "ml-rljob-job-references", "ml-rljob-queues", "ml-rljob-runtime-use", "ml-rljob-runtime-references",
        "ml-rljob-worker-pods"]
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


# ------------------------------------------------------------------ worker pods

POD_MAKER = "erin"  # may create and change pods, and only read jobs and their status (the rljob-edit role's part)


@pytest.fixture
def pod_maker(control_plane: Any, namespace: str, service_account_kubeconfig: Any, crd_installed: Any
              ) -> Iterator[Any]:
    """The operator's REST layer as a user who may create, update and delete pods in ``namespace``, and get
    RLTrainingJobs and their status there (as everyone with the edit role, or a notebook's ServiceAccount)."""
    from kubernetes import client
    from rljob_operator.cluster.kube import Kube

    kubeconfig = service_account_kubeconfig(POD_MAKER)
    _role(control_plane, namespace, "pods", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "update", "patch", "delete"]},
        {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs", "rltrainingjobs/status"],
         "verbs": ["get", "list", "watch"]}], POD_MAKER)
    user = client.ApiClient(_client_configuration(kubeconfig))
    try:
        yield Kube(user)
    finally:
        user.close()


def _pod_refusal(kube: Any, namespace: str, pod: dict[str, Any], patch: dict[str, Any] | None = None, *,
                 put: bool = False, dry_run: bool = False) -> str | None:
    """What the API server says to creating ``pod`` (``patch``: to that merge patch of the stored pod; ``put``: to
    ``pod`` as its full update); None: done."""
    from kubernetes.client.exceptions import ApiException

    query = {"dryRun": "All"} if dry_run else None
    path = kube.core_path(namespace, "pods", pod["metadata"]["name"])
    try:
        if put:
            kube.request("PUT", path, pod, query=query)
        elif patch is not None:
            kube.request("PATCH", path, patch, query=query, content_type="application/merge-patch+json")
        else:
            kube.request("POST", kube.core_path(namespace, "pods"), pod, query=query)
    except ApiException as e:
        assert e.status in (403, 422), (e.status, e.body)
        return str(json.loads(e.body)["message"])
    return None


def _claimed(name: str) -> str:
    """What a refusal says of the claim on RLTrainingJob ``name``."""
    return (f"metadata.ownerReferences[kind=RLTrainingJob,name={name}]: only the rljob operator (who may patch "
            f"rltrainingjobs/status of {name}) may create a pod that claims to be a worker of RLTrainingJob {name}")


@pytest.mark.cluster
def test_only_who_may_patch_a_jobs_status_may_create_a_pod_that_claims_to_be_its_worker(
        policy: None, pod_maker: Any, kube: Any, control_plane: Any, namespace: str) -> None:
    """The operator counts a job's workers by their ownerReference, and a job's UID is no secret: a user who may
    create pods (and only read jobs) writing that reference is refused, naming the field and the job, in any
    version of the API group; until granted patch on that job's status, the operator's right, for that job only.
    Pods that claim no job, or that another kind of object owns, are anyone's to create."""
    job = create_job(kube, namespace, _quickstart("owner"))
    uid = job["metadata"]["uid"]
    user = f"system:serviceaccount:{namespace}:{POD_MAKER}"
    forged = _pod("forged", [job_claim("owner", uid)])
    refusal = _pod_refusal(pod_maker, namespace, forged)
    assert refusal is not None and WORKER_PODS in refusal, refusal
    assert _claimed("owner") in refusal and refusal.endswith(f"{user} may not"), refusal
    assert kube.get_pod(namespace, "forged") is None
    # Not controller, another version of the group, beside an owner of another kind: a claim all the same.
    for i, owners in enumerate([[{**job_claim("owner", uid), "controller": False}],
                                [job_claim("owner", uid, api_version="rljob.dev/v1")],
                                [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": uid},
                                 job_claim("owner", uid)]]):
        refusal = _pod_refusal(pod_maker, namespace, _pod(f"forged-{i}", owners))
        assert refusal is not None and _claimed("owner") in refusal, (owners, refusal)

    # Pods that claim no job: as before (a real create, and one owned by a ConfigMap, which keeps it alive).
    owner = kube.request("POST", kube.core_path(namespace, "configmaps"), {"metadata": {"name": "owner"}})
    assert _pod_refusal(pod_maker, namespace, _pod("plain")) is None
    by_configmap = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
                    "controller": True}
    assert _pod_refusal(pod_maker, namespace, _pod("configmaps", [by_configmap])) is None
    # Another group's kind of the same name is no claim on an rljob job (the operator trusts only rljob.dev's).
    lookalike = {**job_claim("owner", uid), "apiVersion": "example.com/v1"}
    assert _pod_refusal(pod_maker, namespace, _pod("lookalike", [lookalike]), dry_run=True) is None

    # The operator's right, on this job: its workers may be created (for real: the job exists, the pod stays).
    _role(control_plane, namespace, "patch-owner-status", [
        {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs/status"], "resourceNames": ["owner"],
         "verbs": ["patch"]}], POD_MAKER)
    wait_for(lambda: _pod_refusal(pod_maker, namespace, forged, dry_run=True) is None, 30,
             message="the right to patch the job's status in force")
    assert _pod_refusal(pod_maker, namespace, forged) is None
    assert kube.get_pod(namespace, "forged")["metadata"]["ownerReferences"][0]["uid"] == uid
    # ... and no other job's.
    other = create_job(kube, namespace, _quickstart("other"))
    refusal = _pod_refusal(pod_maker, namespace, _pod("other-worker", [job_claim("other", other["metadata"]["uid"])]))
    assert refusal is not None and _claimed("other") in refusal, refusal


@pytest.mark.cluster
def test_adding_a_claim_to_a_pod_is_refused_and_removing_one_or_other_edits_are_not(
        policy: None, pod_maker: Any, kube: Any, control_plane: Any, namespace: str) -> None:
    """On update only what the request adds is a claim: a user who may update pods cannot make a pod a job's
    worker by adding the reference (nor move a worker to another job), while labelling a worker, removing its
    reference, and the garbage collector orphaning it (deleting the job with propagationPolicy Orphan) pass."""
    job = create_job(kube, namespace, _quickstart("owner"))
    claim = job_claim("owner", job["metadata"]["uid"])
    for pod in (_pod("plain"), _pod("worker", [claim]), _pod("orphan", [claim])):
        kube.request("POST", kube.core_path(namespace, "pods"), pod)  # as the admin, who may (the operator's part)

    refusal = _pod_refusal(pod_maker, namespace, _pod("plain"), {"metadata": {"ownerReferences": [claim]}})
    assert refusal is not None and WORKER_PODS in refusal and _claimed("owner") in refusal, refusal
    # A full update (a GET, the reference added, a PUT) too.
    stored = pod_maker.request("GET", pod_maker.core_path(namespace, "pods", "plain"))
    stored["metadata"]["ownerReferences"] = [claim]
    refusal = _pod_refusal(pod_maker, namespace, stored, put=True)
    assert refusal is not None and _claimed("owner") in refusal, refusal
    assert not kube.get_pod(namespace, "plain")["metadata"].get("ownerReferences")
    # Moving a worker to another job is a new claim.
    other = create_job(kube, namespace, _quickstart("other"))
    moved = {"metadata": {"ownerReferences": [job_claim("other", other["metadata"]["uid"])]}}
    refusal = _pod_refusal(pod_maker, namespace, _pod("worker"), moved)
    assert refusal is not None and _claimed("other") in refusal, refusal

    # What the pod already claimed is not claimed again: a label on a worker, and removing its reference.
    assert _pod_refusal(pod_maker, namespace, _pod("worker"), {"metadata": {"labels": {"team": "a"}}}) is None
    assert _pod_refusal(pod_maker, namespace, _pod("worker"), {"metadata": {"ownerReferences": None}}) is None
    assert not kube.get_pod(namespace, "worker")["metadata"].get("ownerReferences")
    # The garbage collector orphaning a job's pods removes their references (and the pods stay).
    kube.request("DELETE", kube.job_path(namespace, "owner"), query={"propagationPolicy": "Orphan"})

    def orphaned() -> bool:
        pod = kube.get_pod(namespace, "orphan")
        assert pod is not None, "the orphaned pod was deleted"
        return not pod["metadata"].get("ownerReferences")

    wait_for(orphaned, 60, message="the orphaned pod's reference removed by the garbage collector")


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
    from tests.support.operator_process import job_manifest, job_pods, wait_phase

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
