"""Multi-tenant safety (#14, points 1 and 4): the platform's pod profile, PolicyViolation, PodRejected.

Whoever may create an RLTrainingJob gets no pod beyond what the platform's pod profile allows:
``decisions.policy.violations`` names every field at fault, the operator fails such a job with
reason ``PolicyViolation`` before it builds any pod, a pod admission refuses ends the job with
``PodRejected`` after one attempt, and credentials never reach the job's ConfigMap.

Unit tests here; the ``cluster`` tests (``tests/operator/test_policy_cluster.py``) run the operator on the real control plane, whose
kube-apiserver runs the PodSecurity admission plugin (on by default) and ResourceQuota.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rljob_contract.job import DEFAULT_IMAGE, ManifestError, parse_job
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.plan import Plan
from rljob_operator.decisions.policy import PodProfile, violations
from rljob_operator.decisions.refusals import Refusal, plan_for_refusal
from rljob_operator.settings import OperatorSettings

from tests.support.jobs import NOW, make_job, observe, pod_json
from tests.support.operator_process import TEST_RUNTIME, job_manifest, on_runtime

TEST_IMAGES = ("registry.invalid/rljob-trainer:*",)
#: The default profile, with the tests' image allowed (as FAST_ENV does for the operator process).
PROFILE = PodProfile(allowed_images=TEST_IMAGES)
FOREIGN_IMAGE = "docker.io/library/busybox:latest"
TEMPLATE = "spec.podTemplate.spec"
#: How a refusal names the tests' runtime before its field.
RUNTIME = f"ClusterRLTrainingRuntime/{TEST_RUNTIME}: "


def _template(spec: dict[str, Any]) -> dict[str, Any]:
    """A runtime spec patch: its pod template's spec."""
    return {"podTemplate": {"spec": spec}}


def _trainer(security_context: dict[str, Any]) -> dict[str, Any]:
    return _template({"containers": [{"name": "trainer", "securityContext": security_context}]})


def _checked(job_patch: dict[str, Any] | None = None, runtime: dict[str, Any] | None = None,
             profile: PodProfile = PROFILE) -> list[str]:
    """The violations of a job (``job_patch``) on the tests' runtime (``runtime`` merged into its spec)."""
    job = make_job(spec=job_patch)
    return violations(job, profile, on_runtime(job, runtime))


#: (case, runtime spec patch, the runtime's field the PolicyViolation must name) under the default (restricted)
#: profile: a runtime gets no more than a job did (a namespace's admins write RLTrainingRuntimes).
ESCALATIONS: list[tuple[str, dict[str, Any], str]] = [
    ("privileged", _trainer({"privileged": True}), f"{TEMPLATE}.containers[0].securityContext.privileged"),
    ("root-pod", _template({"securityContext": {"runAsUser": 0}}), f"{TEMPLATE}.securityContext.runAsUser"),
    ("root-container", _trainer({"runAsUser": 0}), f"{TEMPLATE}.containers[0].securityContext.runAsUser"),
    ("root-allowed", _template({"securityContext": {"runAsNonRoot": False}}),
     f"{TEMPLATE}.securityContext.runAsNonRoot"),
    ("escalation", _trainer({"allowPrivilegeEscalation": True}),
     f"{TEMPLATE}.containers[0].securityContext.allowPrivilegeEscalation"),
    ("host-network", _template({"hostNetwork": True}), f"{TEMPLATE}.hostNetwork"),
    ("host-pid", _template({"hostPID": True}), f"{TEMPLATE}.hostPID"),
    ("host-ipc", _template({"hostIPC": True}), f"{TEMPLATE}.hostIPC"),
    ("host-path", _template({"volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}]}),
     f"{TEMPLATE}.volumes[0].hostPath"),
    ("node-name", _template({"nodeName": "some-gpu-node"}), f"{TEMPLATE}.nodeName"),
    ("capabilities", _trainer({"capabilities": {"add": ["SYS_ADMIN"]}}),
     f"{TEMPLATE}.containers[0].securityContext.capabilities.add"),
    ("seccomp-unconfined", _template({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
     f"{TEMPLATE}.securityContext.seccompProfile.type"),
    ("host-port", _template({"containers": [{"name": "trainer", "ports": [{"containerPort": 29500,
                                                                           "hostPort": 29500}]}]}),
     f"{TEMPLATE}.containers[0].ports[0].hostPort"),
    ("sidecar", _template({"containers": [{"name": "sidecar", "image": "registry.invalid/rljob-trainer:test"}]}),
     f"{TEMPLATE}.containers[0]"),
    ("init-container", _template({"initContainers": [{"name": "init", "image": "registry.invalid/rljob-trainer:x"}]}),
     f"{TEMPLATE}.initContainers[0]"),
    ("foreign-image", {"image": FOREIGN_IMAGE}, "spec.image"),
    ("foreign-image-template", _template({"containers": [{"name": "trainer", "image": FOREIGN_IMAGE}]}),
     f"{TEMPLATE}.containers[0].image"),
    ("foreign-service-account", _template({"serviceAccountName": "cluster-admin-sa"}), f"{TEMPLATE}.serviceAccountName"),
    ("token-mounted", _template({"automountServiceAccountToken": True}), f"{TEMPLATE}.automountServiceAccountToken"),
    ("token-volume", _template({"volumes": [{"name": "tok", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]}),
     f"{TEMPLATE}.volumes[0].projected.sources[0].serviceAccountToken"),
    ("control-plane-toleration", _template({"tolerations": [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}),
     f"{TEMPLATE}.tolerations[0].key"),
    # gpuResource becomes a toleration: named after a control-plane taint, it would seat the workers next to etcd.
    ("control-plane-gpu-resource", {"gpuResource": "node-role.kubernetes.io/control-plane"}, "spec.gpuResource"),
]
#: (case, job spec patch, field): what the job itself may still ask for that the profile refuses.
JOB_ESCALATIONS: list[tuple[str, dict[str, Any], str]] = [
    ("trust-remote-code", {"training": {"trl": {"trust_remote_code": True}}}, "spec.training.trl.trust_remote_code"),
    ("trust-remote-code-kwargs", {"training": {"trl": {"model_init_kwargs": {"trust_remote_code": True}}}},
     "spec.training.trl.model_init_kwargs.trust_remote_code"),
]

#: (case, runtime spec patch, field): Secret references, refused when allowSecretReferences is false.
SECRET_REFERENCES: list[tuple[str, dict[str, Any], str]] = [
    ("secret-env", _template({"containers": [{"name": "trainer", "env": [{"name": "HF_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "hf", "key": "token"}}}]}]}), f"{TEMPLATE}.containers[0].env[0].valueFrom.secretKeyRef.name"),
    ("secret-credentials", {"checkpoint": {"storage": "s3://bucket/run", "credentialsSecret": "s3-keys"}},
     "spec.checkpoint.credentialsSecret"),
    ("secret-volume", _template({"volumes": [{"name": "keys", "secret": {"secretName": "keys"}}]}),
     f"{TEMPLATE}.volumes[0].secret.secretName"),
    ("secret-env-from", _template({"containers": [{"name": "trainer", "envFrom": [{"secretRef": {"name": "k"}}]}]}),
     f"{TEMPLATE}.containers[0].envFrom[0].secretRef.name"),
    ("secret-pull", {"imagePullSecrets": [{"name": "regcred"}]}, "spec.imagePullSecrets[0].name"),
]


def _named(problems: list[str], field: str, level: str = "restricted") -> bool:
    """A problem names ``field`` (the runtime's, after the runtime; or the job's) with the profile's refusal."""
    return any(p.removeprefix(RUNTIME).startswith(f"{field}: ") and f'not allowed by the platform profile "{level}"' in p
               for p in problems)


# ------------------------------------------------------------------------ unit tests


@pytest.mark.parametrize("case,patch,field", ESCALATIONS, ids=[c for c, _, _ in ESCALATIONS])
def test_each_escalation_of_a_runtime_is_named_by_the_runtime_and_its_field(case: str, patch: dict[str, Any],
                                                                            field: str) -> None:
    problems = _checked(runtime=patch)
    assert _named(problems, field), problems
    assert all(p.startswith(RUNTIME) for p in problems), problems


@pytest.mark.parametrize("case,patch,field", JOB_ESCALATIONS, ids=[c for c, _, _ in JOB_ESCALATIONS])
def test_each_escalation_of_a_job_is_named_by_its_field(case: str, patch: dict[str, Any], field: str) -> None:
    assert _named(_checked(patch), field)


def test_the_quickstart_job_and_the_default_image_need_nothing_beyond_the_default_profile() -> None:
    assert _checked() == []
    assert _checked(runtime={"image": DEFAULT_IMAGE}, profile=PodProfile()) == []
    assert violations(make_job(), PodProfile()) == []  # on no runtime: rljob's own image
    # Harmless pod template fields and volumes stay allowed.
    tame = _template({"terminationGracePeriodSeconds": 1,
                      "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                      "containers": [{"name": "trainer", "securityContext": {"runAsUser": 1000},
                                      "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]})
    assert _checked(runtime=tame) == []
    # The namespace's default ServiceAccount, and one the platform allowed (with its token: workload identity).
    assert _checked(runtime=_template({"serviceAccountName": "default"})) == []
    allowed = PodProfile(allowed_images=TEST_IMAGES, allowed_service_accounts=("s3-writer",))
    identity = _template({"serviceAccountName": "s3-writer", "automountServiceAccountToken": True})
    assert _checked(runtime=identity, profile=allowed) == []


@pytest.mark.parametrize("case,patch,field", SECRET_REFERENCES, ids=[c for c, _, _ in SECRET_REFERENCES])
def test_secret_references_are_refused_only_where_the_profile_says_so(case: str, patch: dict[str, Any],
                                                                     field: str) -> None:
    assert _checked(runtime=patch) == []
    no_secrets = PodProfile(allowed_images=TEST_IMAGES, allow_secret_references=False)
    assert _named(_checked(runtime=patch, profile=no_secrets), field)


def test_baseline_allows_root_but_nothing_host_level_and_privileged_only_checks_references() -> None:
    baseline = PodProfile(level="baseline", allowed_images=TEST_IMAGES)
    privileged = PodProfile(level="privileged", allowed_images=TEST_IMAGES)
    root = _trainer({"runAsUser": 0, "capabilities": {"add": ["CHOWN"]}})
    assert _checked(runtime=root, profile=baseline) == []
    assert _named(_checked(runtime=root), f"{TEMPLATE}.containers[0].securityContext.runAsUser")
    host = _template({"hostNetwork": True, "containers": [{"name": "trainer", "securityContext": {"privileged": True}}]})
    assert _named(_checked(runtime=host, profile=baseline), f"{TEMPLATE}.hostNetwork", "baseline")
    assert _named(_checked(runtime=host, profile=baseline), f"{TEMPLATE}.containers[0].securityContext.privileged",
                  "baseline")
    assert _checked(runtime=host, profile=privileged) == []
    # Images, ServiceAccounts and trust_remote_code are checked at every level.
    remote = {"training": {"trl": {"trust_remote_code": True}}}
    foreign = {"image": FOREIGN_IMAGE, **_template({"serviceAccountName": "x"})}
    assert {p.removeprefix(RUNTIME).split(":")[0] for p in _checked(remote, foreign, privileged)} == {
        "spec.image", f"{TEMPLATE}.serviceAccountName", "spec.training.trl.trust_remote_code"}
    assert _checked(remote, foreign, PodProfile(level="privileged", allowed_images=("*",),
                                                allowed_service_accounts=("x",), allow_trust_remote_code=True)) == []


def test_a_job_outside_its_runtimes_bounds_is_refused_naming_the_field_and_the_bound() -> None:
    problems = _checked({"workers": {"gpusPerWorker": 4}}, {"limits": {"gpusPerWorker": {"max": 2}}})
    assert problems == [f"spec.workers.gpusPerWorker: 4 GPUs per worker (runtime ClusterRLTrainingRuntime/"
                        f"{TEST_RUNTIME} allows at most 2)"]


def test_a_verdict_is_remembered_for_an_unchanged_job_and_made_again_when_its_input_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``policy.checked``: reconciles of an unchanged job check nothing again; a new spec (even one that
    kept its generation, as tests build them), new labels, another runtime or another profile get a verdict of
    their own."""
    from rljob_operator.decisions import policy

    calls: list[str] = []
    real = policy.violations
    monkeypatch.setattr(policy, "violations",
                        lambda job, profile, runtime: calls.append(job.metadata.name) or real(job, profile, runtime))
    monkeypatch.setattr(policy, "_checked", policy.VerdictCache(policy.CHECKED_BYTES))
    job = make_job()
    on = on_runtime(job)
    assert policy.checked(make_job(), PROFILE, on) == [] and policy.checked(make_job(), PROFILE, on) == []
    assert len(calls) == 1  # the second reconcile parsed the job again: same input, same verdict
    case, patch, field = JOB_ESCALATIONS[0]
    escalated = make_job(spec=patch)  # same uid, same generation: only the spec differs
    assert any(v.startswith(field) for v in policy.checked(escalated, PROFILE, on)), case
    relabelled = make_job()
    relabelled.metadata.labels["team"] = "b"
    foreign = PodProfile(allowed_images=("registry.invalid/nothing-else:*",))
    assert policy.checked(relabelled, PROFILE, on) == []
    assert any(v.startswith(RUNTIME + "spec.image") for v in policy.checked(make_job(), foreign, on))
    assert len(calls) == 4
    edited = on_runtime(job, _template({"hostNetwork": True}))  # the runtime was edited: a verdict of its own
    assert policy.checked(make_job(), PROFILE, edited) != [] and len(calls) == 5
    assert len(policy._checked) == 5  # five inputs, five verdicts (the bound: the test below)


def test_verdicts_are_kept_by_digest_within_a_bound_of_bytes_whatever_size_the_job() -> None:
    """Issue #43 point 4: a job of ~1 MB annotated 500 times kept 500 copies of its spec (a 512 Mi operator went
    down). Now each edit costs a digest and its verdict; the memory bound holds whatever the input size."""
    from rljob_operator.decisions import policy

    cache = policy.VerdictCache(64 * 1024)
    big = make_job(spec={"training": {"rewards": [{"name": "pkg.mod:reward", "kwargs": {"blob": "x" * 1_000_000}}]}})
    verdicts = []
    for i in range(500):
        big.metadata.annotations["round"] = str(i)
        key = policy.verdict_key(big, PROFILE)
        assert len(key) == 32
        cache.put(key, tuple(policy.violations(big, PROFILE)) if i == 0 else verdicts[0])
        verdicts.append(cache.get(key))
    assert cache.bytes <= 64 * 1024 and 0 < len(cache) < 500
    assert cache.get(policy.verdict_key(big, PROFILE)) == verdicts[0]  # the newest is kept
    big.metadata.annotations["round"] = "0"
    assert cache.get(policy.verdict_key(big, PROFILE)) is None  # the oldest went
    # A verdict larger than a tenth of the bound is not kept (it would evict every other job's).
    cache.put(b"k" * 32, tuple("spec.x: " + "y" * 1000 for _ in range(10)))
    assert cache.get(b"k" * 32) is None


def test_the_pod_schema_check_imports_no_client_model() -> None:
    """The check of a runtime's pod fields reads the generated table (``podschema_fields``), not the client's
    models: a fresh interpreter checks a pod that walks most of the schema and imports no module of the
    client (the models held about 8 MiB of every replica, and the first reconcile paid their imports)."""
    import subprocess
    import sys

    script = """
import sys
from rljob_operator.decisions import podschema
runtime = {"podTemplate": {"metadata": {"labels": {"a": "b"}}, "spec": {
    "containers": [{"name": "trainer", "securityContext": {"capabilities": {"drop": ["ALL"]}},
                    "readinessProbe": {"exec": {"command": ["true"]}},
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                    "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "k", "whenUnsatisfiable": "DoNotSchedule"}],
    "volumes": [{"name": "v", "csi": {"driver": "d", "volumeAttributes": {"a": "b"}}}],
    "tolerations": [{"key": "k", "operator": "Exists"}]}}}
assert podschema.unknown_fields(runtime) == []
assert podschema.unknown_fields({"podTemplate": {"spec": {"nodeSelectr": {}}}}) == [
    "spec.podTemplate.spec.nodeSelectr: unknown field (a PodSpec has no such field)"]
assert podschema.unknown_fields({"podTemplate": {"spec": {"containers": [{"image_pull_policy": "Always"}]}}}) == [
    "spec.podTemplate.spec.containers[0].image_pull_policy: unknown field (field names are camelCase: write "
    "'imagePullPolicy')"]
from rljob_operator.kubeimport import PACKAGES  # in sys.modules, empty until a name of theirs is read
print(sorted(m for m in sys.modules if m.startswith("kubernetes") and m not in PACKAGES))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_pod_schema_table_matches_the_installed_client() -> None:
    """``podschema_fields.py`` is what ``operator/hack/gen_pod_schema.py`` writes from the installed client."""
    import subprocess
    import sys

    from tests.support.trainer import REPO

    result = subprocess.run([sys.executable, str(REPO / "operator/hack/gen_pod_schema.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_the_profile_comes_from_the_operator_settings_and_refuses_an_unknown_level() -> None:
    settings = OperatorSettings.from_env({
        "RLJOB_OPERATOR_POD_PROFILE": "baseline", "RLJOB_OPERATOR_ALLOWED_IMAGES": "a/*, b:1",
        "RLJOB_OPERATOR_ALLOWED_SERVICE_ACCOUNTS": "s3-writer", "RLJOB_OPERATOR_ALLOW_SECRET_REFERENCES": "false",
        "RLJOB_OPERATOR_ALLOW_TRUST_REMOTE_CODE": "true"})
    assert PodProfile.from_settings(settings) == PodProfile("baseline", ("a/*", "b:1"), ("s3-writer",), False, True)
    assert PodProfile.from_settings(OperatorSettings.from_env({})) == PodProfile()  # restricted, rljob's image
    with pytest.raises(ValueError, match="RLJOB_OPERATOR_POD_PROFILE.*restricted, baseline, privileged"):
        PodProfile.from_settings(OperatorSettings.from_env({"RLJOB_OPERATOR_POD_PROFILE": "Restricted"}))


def test_a_violating_job_fails_before_any_pod_and_is_checked_again_once_edited() -> None:
    job = make_job()
    hostnet = on_runtime(job, _template({"hostNetwork": True}))
    plan = plan_reconcile(job, [], NOW, profile=PROFILE, runtime=hostnet)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "PolicyViolation")
    assert plan.status["message"].startswith(f"{RUNTIME}{TEMPLATE}.hostNetwork: host networking is not allowed")
    assert not plan.create_pods and plan.children is None and plan.requeue_after is None
    assert [e.reason for e in plan.events] == ["PolicyViolation"]
    # A running gang now on a violating runtime is stopped.
    running = make_job(status={"phase": "Running", "gangGeneration": 0})
    plan = plan_reconcile(running, observe(running, pod_json(running, 0), pod_json(running, 1)), NOW, profile=PROFILE,
                          runtime=hostnet)
    assert plan.status["reason"] == "PolicyViolation" and sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"]
    # Failed stays Failed (no retry loop) until the spec is edited; an edit onto an allowed runtime runs the job.
    failed = {"phase": "Failed", "reason": "PolicyViolation", "message": "x", "observedGeneration": 1}
    same = make_job(status=failed)
    assert plan_reconcile(same, [], NOW, profile=PROFILE, runtime=hostnet).create_pods == []
    fixed = make_job(status=failed, generation=2)
    assert len(plan_reconcile(fixed, [], NOW, profile=PROFILE, runtime=on_runtime(fixed)).create_pods) == 2


def test_an_admission_refusal_fails_the_job_but_the_operators_own_rbac_is_retried() -> None:
    raw = {"metadata": {"name": "train", "namespace": "team-a", "generation": 1}, "status": {}}
    interrupted = Plan(status={"phase": "Pending", "reason": "CreatingWorkers"})
    for message in [
        'pods "train-worker-0" is forbidden: violates PodSecurity "restricted:latest": host namespaces '
        '(hostNetwork=true)',
        'pods "train-worker-0" is forbidden: ValidatingAdmissionPolicy \'no-gpu\' with binding \'b\' denied request',
        'admission webhook "policy.example.com" denied the request: not today',
    ]:
        plan = plan_for_refusal(raw, interrupted, Refusal(403, json.dumps({"message": message}), "Forbidden"), NOW)
        assert plan is not None
        assert (plan.status["phase"], plan.status["reason"], plan.status["message"]) == ("Failed", "PodRejected",
                                                                                         message)
        assert not plan.create_pods and plan.requeue_after is None
    rbac = 'pods is forbidden: User "system:serviceaccount:rljob-system:rljob-operator" cannot create resource ' \
           '"pods" in API group "" in the namespace "team-a"'
    assert plan_for_refusal(raw, interrupted, Refusal(403, json.dumps({"message": rbac}), "Forbidden"), NOW) is None


@pytest.mark.parametrize("trl,field", [
    ({"hub_token": "hf_secret"}, "spec.training.trl.hub_token"),
    ({"push_to_hub_token": "hf_secret"}, "spec.training.trl.push_to_hub_token"),
    ({"model_init_kwargs": {"token": "hf_secret"}}, "spec.training.trl.model_init_kwargs.token"),
    ({"model_init_kwargs": '{"use_auth_token": "hf_secret"}'}, "spec.training.trl.model_init_kwargs.use_auth_token"),
])
def test_credential_like_trl_fields_are_refused_pointing_to_secrets(trl: dict[str, Any], field: str) -> None:
    doc = job_manifest("train", 2, {"training": {"trl": trl}}, namespace="team-a")
    with pytest.raises(ManifestError) as e:
        parse_job(doc)
    problem = next(p for p in e.value.problems if p.startswith(field + ":"))
    assert "Secret" in problem and "workload identity" in problem
    # Not credentials: TRL fields that merely mention tokens stay allowed.
    parse_job(job_manifest("train", 2, {"training": {"trl": {"average_tokens_across_devices": True}}},
                           namespace="team-a"))


# --------------------------------------------------------------------- cluster tests
