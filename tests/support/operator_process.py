"""Helpers and fixtures for the operator's tests: manifests, the CRD, the operator as a process.

A pytest plugin (``tests/conftest.py``): every test module gets these fixtures by name.

* ``job_manifest(name, ...)``: a small valid RLTrainingJob (2 workers × 1 GPU by default).
* ``runtime_manifest(name, ...)``, ``test_runtime(...)``: a runtime like the one the tests' control plane has
  as its default (``TEST_RUNTIME``: the tests' image, GPUs as ``nvidia.com/gpu``, no bounds), as a manifest or
  parsed; ``on_runtime(job, ...)`` resolves a job on one.
* ``INVALID_MANIFESTS``: (case, spec patch, field) — each must be rejected naming ``field``,
  by the models (unit tests) and by the API server (schema and CEL, cluster tests); ``INVALID_RUNTIMES`` alike.
* ``crd_installed``, ``experiment_crd`` (session): the generated CRDs applied to the test control plane, with
  the default ClusterRLTrainingRuntime ``TEST_RUNTIME`` every job without a runtimeRef runs on.
* ``operator`` (function): ``start(**opts) -> OperatorProcess`` running ``rljob operator``
  against the test's namespace, with short intervals; every process is stopped afterwards.
* ``tenant`` (function): an ordinary user's client who may create RLTrainingJobs in the test's namespace and
  nothing else.
* ``wait_gang(kube, namespace, name, generation)``: the job once that gang generation runs
  complete and Ready, with no pod of another generation left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.trainer import deep_update  # noqa: F401 - re-exported for the operator tests

REPO = Path(__file__).resolve().parents[2]
MAX_NAME = "x" * 51

#: Intervals short enough for tests (seconds).
FAST_ENV = {
    "RLJOB_OPERATOR_RESYNC_SECONDS": "3",
    "RLJOB_OPERATOR_LEASE_SECONDS": "4",
    "RLJOB_OPERATOR_RENEW_SECONDS": "1",
    "RLJOB_OPERATOR_RETRY_SECONDS": "0.5",
    "RLJOB_OPERATOR_HEARTBEAT_FLUSH_SECONDS": "0.2",
    # The tests' trainer image (kwok never pulls it); every other setting of the pod profile is the default.
    "RLJOB_OPERATOR_ALLOWED_IMAGES": "registry.invalid/rljob-trainer:*",
}
#: The test control plane has no admission policies but where a test installs them (they are cluster-wide):
#: an operator process run by a test says it runs without them, as a developer's must (docs/security-policies.md).
#: Not in FAST_ENV: the chart's install test runs the operator with the chart's settings, policies checked.
WITHOUT_POLICIES_ENV = {"RLJOB_OPERATOR_WITHOUT_ADMISSION_POLICIES": "true"}


#: The tests' trainer image (kwok never pulls it).
TEST_IMAGE = "registry.invalid/rljob-trainer:test"
#: The default ClusterRLTrainingRuntime of the tests' control plane (``crd_installed``): what every job ran with
#: before runtimes (the tests' image, nvidia.com/gpu, no bounds, checkpoints in the pods).
TEST_RUNTIME = "rljob-tests"
#: A ClusterRLTrainingRuntime of the tests' control plane whose pods go within a second once deleted (kwok confirms
#: at once: a 1 s grace period spares tests the default's wait); ``QUICK_EXIT`` runs a job on it.
QUICK_RUNTIME = "rljob-tests-quick"
QUICK = {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 1}}}
QUICK_EXIT: dict[str, Any] = {"runtimeRef": {"name": QUICK_RUNTIME}}


def runtime_manifest(name: str = TEST_RUNTIME, spec: dict[str, Any] | None = None, *,
                     kind: str = "ClusterRLTrainingRuntime", default: bool = False,
                     namespace: str | None = None) -> dict[str, Any]:
    """A runtime: the tests' image, ``spec`` merged over it; ``default``: marked as the default runtime."""
    doc: dict[str, Any] = {"apiVersion": "rljob.dev/v1alpha1", "kind": kind, "metadata": {"name": name},
                           "spec": {"image": TEST_IMAGE}}
    if default:
        doc["metadata"]["annotations"] = {"rljob.dev/is-default-runtime": "true"}
    if namespace:
        doc["metadata"]["namespace"] = namespace
    return deep_update(doc, {"spec": spec}) if spec else doc


def test_runtime(spec: dict[str, Any] | None = None, **kw: Any) -> Any:
    """``runtime_manifest(...)`` parsed (a ``TrainingRuntime``)."""
    from rljob_contract.runtime import parse_runtime

    return parse_runtime(runtime_manifest(spec=spec, **kw))


test_runtime.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def on_runtime(job: Any, spec: dict[str, Any] | None = None, **kw: Any) -> Any:
    """``job`` resolved on ``test_runtime(spec)`` (a ``Resolved``: what the operator builds its pods from)."""
    from rljob_contract.runtime import resolve

    return resolve(job, test_runtime(spec, **kw))


def runtime_store(*docs: dict[str, Any]) -> Any:
    """A reconciler's runtimes as their watches would show them, listed: the tests' default runtime and ``docs``."""
    from rljob_operator.cluster.runtimes import RuntimeStore

    store = RuntimeStore()
    for doc in (runtime_manifest(default=True), *docs):
        store.put(doc["kind"], None, doc)
    store.listed |= store.scopes
    return store


def job_manifest(name: str, replicas: int = 2, spec: dict[str, Any] | None = None,
                 namespace: str | None = None) -> dict[str, Any]:
    """A small valid job: ``replicas`` workers × 1 process × 1 GPU, the built-in tiny task, on the default runtime."""
    doc: dict[str, Any] = {
        "apiVersion": "rljob.dev/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": {"replicas": replicas, "procsPerWorker": 1},
            "training": {
                "model": "builtin:tiny",
                "dataset": {"name": "builtin:repeat-char", "size": 64},
                "rewards": [{"name": "repeat_char", "kwargs": {"length": 4}}],
                "batchSize": 4,
                "numGenerations": 4,
                "maxCompletionLength": 4,
                "maxSteps": 3,
                "learningRate": 0.003,
            },
            "checkpoint": {"everySteps": 100, "keepLast": 1},
        },
    }
    if namespace:
        doc["metadata"]["namespace"] = namespace
    return deep_update(doc, {"spec": spec}) if spec else doc


#: (case, patch of the manifest, the field the error must name).
INVALID_MANIFESTS: list[tuple[str, dict[str, Any], str]] = [
    ("replicas-zero", {"spec": {"workers": {"replicas": 0}}}, "spec.workers.replicas"),
    ("replicas-not-a-number", {"spec": {"workers": {"replicas": "two"}}}, "spec.workers.replicas"),
    ("procs-per-worker-too-many", {"spec": {"workers": {"procsPerWorker": 65}}}, "spec.workers.procsPerWorker"),
    ("max-replicas-below-min", {"spec": {"workers": {"minReplicas": 3, "maxReplicas": 2}}},
     "spec.workers.maxReplicas"),
    ("capacity-without-bounds", {"spec": {"autoscaling": {"policy": "Capacity"}, "workers": {"maxReplicas": 4}}},
     "spec.workers"),
    ("unknown-scaling-policy", {"spec": {"autoscaling": {"policy": "Always"}}}, "spec.autoscaling.policy"),
    ("grace-period-too-short", {"spec": {"workers": {"terminationGracePeriodSeconds": 1}}},
     "spec.workers.terminationGracePeriodSeconds"),
    ("gpu-in-resources", {"spec": {"workers": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}},
     "spec.workers.resources.limits"),
    ("resources-not-a-quantity", {"spec": {"workers": {"resources": {"requests": {"memory": "lots"}}}}},
     "spec.workers.resources.requests"),
    ("env-without-name", {"spec": {"workers": {"env": [{"value": "x"}]}}}, "spec.workers.env[0].name"),
    ("unknown-field", {"spec": {"workers": {"replica": 2}}}, "spec.workers.replica"),
    ("runtime-ref-without-name", {"spec": {"runtimeRef": {"kind": "RLTrainingRuntime"}}}, "spec.runtimeRef.name"),
    ("runtime-ref-unknown-kind", {"spec": {"runtimeRef": {"kind": "Runtime", "name": "x"}}},
     "spec.runtimeRef.kind"),
    ("sub-path-leaves-the-job", {"spec": {"checkpoint": {"subPath": "../other-job"}}}, "spec.checkpoint.subPath"),
    ("reward-source-on-a-built-in", {"spec": {"training": {"rewards": [
        {"name": "repeat_char", "source": {"uri": "s3://b/m.py"}}]}}}, "spec.training.rewards[0].source"),
    ("reward-source-both", {"spec": {"training": {"rewards": [
        {"name": "m:f", "source": {"uri": "s3://b/m.py", "configMap": {"name": "c", "key": "m.py"}}}]}}},
     "spec.training.rewards[0].source"),
    ("reward-source-uri-not-s3", {"spec": {"training": {"rewards": [
        {"name": "m:f", "source": {"uri": "https://x/m.py"}}]}}}, "spec.training.rewards[0].source.uri"),
    ("unknown-algorithm", {"spec": {"training": {"algorithm": "ppo"}}}, "spec.training.algorithm"),
    ("unknown-strategy", {"spec": {"training": {"strategy": "ppo"}}}, "spec.training.strategy"),
    ("strategy-of-another-algorithm", {"spec": {"training": {"algorithm": "rloo", "strategy": "dapo"}}},
     "spec.training.strategy"),
    ("strategy-and-its-trl-field", {"spec": {"training": {"strategy": "gspo", "trl": {"epsilon": 0.1}}}},
     "spec.training.trl"),
    ("learning-rate-zero", {"spec": {"training": {"learningRate": 0}}}, "spec.training.learningRate"),
    ("learning-rate-above-one", {"spec": {"training": {"learningRate": 2}}}, "spec.training.learningRate"),
    ("group-of-one", {"spec": {"training": {"numGenerations": 1}}}, "spec.training.numGenerations"),
    ("generation-batch-indivisible", {"spec": {"training": {"batchSize": 3}}}, "spec.training.numGenerations"),
    ("no-rewards", {"spec": {"training": {"rewards": []}}}, "spec.training.rewards"),
    ("reward-without-name", {"spec": {"training": {"rewards": [{"weight": 1}]}}},
     "spec.training.rewards[0].name"),
    ("unknown-reward", {"spec": {"training": {"rewards": [{"name": "not a reward"}]}}},
     "spec.training.rewards[0].name"),
    ("unknown-builtin-model", {"spec": {"training": {"model": "builtin:huge"}}}, "spec.training.model"),
    ("unknown-builtin-dataset", {"spec": {"training": {"dataset": {"name": "builtin:nope"}}}},
     "spec.training.dataset.name"),
    ("dataset-size-zero", {"spec": {"training": {"dataset": {"size": 0}}}}, "spec.training.dataset.size"),
    ("deadline-zero", {"spec": {"runPolicy": {"activeDeadlineSeconds": 0}}},
     "spec.runPolicy.activeDeadlineSeconds"),
    ("ttl-negative", {"spec": {"runPolicy": {"ttlSecondsAfterFinished": -1}}},
     "spec.runPolicy.ttlSecondsAfterFinished"),
    ("name-too-long", {"metadata": {"name": MAX_NAME}}, "metadata.name"),
    ("generation-batch-not-whole-steps", {"spec": {"training": {"generationBatchSize": 12}}},
     "spec.training.generationBatchSize"),
    ("generation-batch-and-steps-per-generation",
     {"spec": {"training": {"generationBatchSize": 16, "stepsPerGeneration": 2}}}, "spec.training.generationBatchSize"),
    ("generation-batch-with-elastic-workers",
     {"spec": {"workers": {"minReplicas": 1, "maxReplicas": 4}, "training": {"generationBatchSize": 16}}},
     "spec.training.generationBatchSize"),
    ("steps-per-generation-indivisible",
     {"spec": {"training": {"batchSize": 3, "numGenerations": 8, "stepsPerGeneration": 2}}},
     "spec.training.stepsPerGeneration"),
    ("lora-rank-zero", {"spec": {"training": {"lora": {"r": 0}}}}, "spec.training.lora.r"),
    ("lora-dropout-one", {"spec": {"training": {"lora": {"dropout": 1}}}}, "spec.training.lora.dropout"),
    ("lora-all-linear-and-names", {"spec": {"training": {"lora": {"targetModules": ["all-linear", "q_proj"]}}}},
     "spec.training.lora.targetModules"),
]


def invalid_manifest(case: str, patch: dict[str, Any]) -> dict[str, Any]:
    return deep_update(job_manifest("bad-" + case[:40]), patch)


#: (case, patch of a runtime manifest, the field the error must name): each refused by the models and the CRD.
INVALID_RUNTIMES: list[tuple[str, dict[str, Any], str]] = [
    ("no-image", {"spec": {"image": None}}, "spec.image"),
    ("empty-image", {"spec": {"image": ""}}, "spec.image"),
    ("unknown-pull-policy", {"spec": {"imagePullPolicy": "Sometimes"}}, "spec.imagePullPolicy"),
    ("s3-without-bucket", {"spec": {"checkpoint": {"storage": "s3://"}}}, "spec.checkpoint.storage"),
    ("pvc-without-claim", {"spec": {"checkpoint": {"storage": "pvc:///run1"}}}, "spec.checkpoint.storage"),
    ("pvc-claim-not-a-name", {"spec": {"checkpoint": {"storage": "pvc://Team_Ckpt/run1"}}},
     "spec.checkpoint.storage"),
    ("pvc-prefix-leaves-the-claim", {"spec": {"checkpoint": {"storage": "pvc://ckpt/../other"}}},
     "spec.checkpoint.storage"),
    ("pvc-mirror-prefix-leaves-the-claim", {"spec": {"checkpoint": {"mirrors": [{"location": "pvc://ckpt/a/../.."}]}}},
     "spec.checkpoint.mirrors[0].location"),
    ("gpu-default-above-max", {"spec": {"limits": {"gpusPerWorker": {"default": 4, "max": 2}}}},
     "spec.limits.gpusPerWorker.default"),
    ("grace-default-above-max", {"spec": {"limits": {"terminationGracePeriodSeconds": {"default": 600, "max": 60}}}},
     "spec.limits.terminationGracePeriodSeconds.default"),
    ("cpu-not-a-quantity", {"spec": {"limits": {"cpuPerWorker": {"max": "many"}}}}, "spec.limits.cpuPerWorker.max"),
    ("memory-default-above-max", {"spec": {"limits": {"memoryPerWorker": {"default": "2Gi", "max": "1Gi"}}}},
     "spec.limits.memoryPerWorker.default"),
    ("grace-max-above-the-api", {"spec": {"limits": {"terminationGracePeriodSeconds": {"max": 31536000}}}},
     "spec.limits.terminationGracePeriodSeconds.max"),
    ("unknown-job-env", {"spec": {"jobEnv": "Sometimes"}}, "spec.jobEnv"),
    ("queue-not-a-name", {"spec": {"queue": {"name": "Team A"}}}, "spec.queue.name"),
    ("unknown-field", {"spec": {"imagePullSecret": [{"name": "x"}]}}, "spec.imagePullSecret"),
]


def invalid_runtime(case: str, patch: dict[str, Any]) -> dict[str, Any]:
    return deep_update(runtime_manifest("bad-" + case[:40]), patch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------- cluster


def _kube(api_client: Any) -> Any:
    from rljob_operator.cluster.kube import Kube

    return Kube(api_client)


#: A Role's rules for a user who may do everything with RLTrainingJobs of a namespace and nothing else.
JOBS_ONLY = [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"],
              "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]


def service_account_kube(kube: Any, namespace: str, account: str, kubeconfig: Path,
                         roles: dict[str, list[dict[str, Any]]], cluster_roles: tuple[str, ...] = ()) -> Any:
    """The operator's REST layer acting as ServiceAccount ``account`` of ``namespace`` (its ``kubeconfig``), bound to
    the Roles ``roles`` (name -> rules, made here) and to the existing ClusterRoles ``cluster_roles``; returned once
    RBAC is in force (the authorizer learns bindings from an informer): it may create RLTrainingJobs."""
    from kubernetes import client, config

    from tests.cluster.waiting import wait_for

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    subjects = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    bindings = [(name, "Role", name) for name in roles] + [(f"{account}-{r}", "ClusterRole", r) for r in cluster_roles]
    for name, rules in roles.items():
        kube.request("POST", f"{rbac}/roles", {"metadata": {"name": name}, "rules": rules})
    for name, kind, role in bindings:
        kube.request("POST", f"{rbac}/rolebindings", {"metadata": {"name": name}, "subjects": subjects,
                                                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                   "kind": kind, "name": role}})
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    user = _kube(client.ApiClient(configuration))

    def in_force() -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"namespace": namespace, "verb": "create", "group": "rljob.dev",
                                                  "resource": "rltrainingjobs"}}}
        answer = user.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        return bool((answer.get("status") or {}).get("allowed"))

    wait_for(in_force, 30, message=f"the rights of {account} in force")
    return user


@pytest.fixture(scope="session")
def kube(api_client: Any) -> Any:
    """The operator's JSON REST layer on the admin client."""
    return _kube(api_client)


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def install_crd(kube: Any, crd: dict[str, Any], plural: str) -> dict[str, Any]:
    """Create (or replace) ``crd`` and wait until it is Established and its ``plural`` can be listed
    (discovery, which kubectl resolves resources through, has caught up)."""
    from kubernetes.client.exceptions import ApiException

    from tests.cluster.waiting import wait_for

    name = crd["metadata"]["name"]
    try:
        kube.request("POST", CRDS, crd)
    except ApiException as e:
        if e.status != 409:
            raise
        crd["metadata"]["resourceVersion"] = kube.request("GET", f"{CRDS}/{name}")["metadata"]["resourceVersion"]
        kube.request("PUT", f"{CRDS}/{name}", crd)

    def established() -> bool:
        conditions = (kube.request("GET", f"{CRDS}/{name}").get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    def served() -> bool:
        try:
            kube.request("GET", f"/apis/{crd['spec']['group']}/v1alpha1/{plural}")
            return True
        except ApiException:
            return False

    wait_for(established, 60, message=f"CRD {name} Established")
    wait_for(served, 30, message=f"{plural} served")
    return crd


RUNTIMES = "/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes"


def apply_runtime(kube: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """Create (or replace) a runtime; RLTrainingRuntimes in their ``metadata.namespace``."""
    from kubernetes.client.exceptions import ApiException

    namespace = doc["metadata"].get("namespace")
    base = f"/apis/rljob.dev/v1alpha1/namespaces/{namespace}/rltrainingruntimes" if namespace else RUNTIMES
    try:
        return kube.request("POST", base, doc, query={"fieldValidation": "Strict"})  # type: ignore[no-any-return]
    except ApiException as e:
        if e.status != 409:
            raise
    current = kube.request("GET", f"{base}/{doc['metadata']['name']}")
    doc = deep_update(doc, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}})
    return kube.request("PUT", f"{base}/{doc['metadata']['name']}", doc)  # type: ignore[no-any-return]


def on_namespaced_runtime(kube: Any, namespace: str, name: str, spec: dict[str, Any],
                          quick: bool = True) -> dict[str, Any]:
    """A job spec patch running the job on a new RLTrainingRuntime ``name`` of ``namespace``: the tests' runtime with
    ``spec`` merged over it (and, ``quick``, the 1 s grace period of ``QUICK_RUNTIME``)."""
    apply_runtime(kube, runtime_manifest(name, deep_update(QUICK, spec) if quick else spec, kind="RLTrainingRuntime",
                                         namespace=namespace))
    return {"runtimeRef": {"kind": "RLTrainingRuntime", "name": name}}


@pytest.fixture(scope="session")
def runtime_crds(kube: Any) -> None:
    """The generated ClusterRLTrainingRuntime and RLTrainingRuntime CRDs, created (or replaced) and Established."""
    from rljob_contract.runtime import CLUSTER_KIND, CLUSTER_PLURAL, NAMESPACED_KIND, NAMESPACED_PLURAL
    from rljob_operator.crd import runtime_crd_manifest

    install_crd(kube, runtime_crd_manifest(CLUSTER_KIND), CLUSTER_PLURAL)
    install_crd(kube, runtime_crd_manifest(NAMESPACED_KIND), NAMESPACED_PLURAL)


@pytest.fixture(scope="session")
def crd_installed(kube: Any, runtime_crds: None) -> dict[str, Any]:
    """The generated RLTrainingJob CRD, created (or replaced) and Established, and the runtimes' CRDs with the
    default ClusterRLTrainingRuntime ``TEST_RUNTIME`` (what a job without a runtimeRef runs on)."""
    from rljob_operator.crd import crd_manifest

    crd = install_crd(kube, crd_manifest(), "rltrainingjobs")
    apply_runtime(kube, runtime_manifest(default=True))
    apply_runtime(kube, runtime_manifest(QUICK_RUNTIME, QUICK))
    time.sleep(1)  # discovery catches up
    return crd


@pytest.fixture(scope="session")
def experiment_crd(kube: Any, crd_installed: Any) -> dict[str, Any]:
    """The generated RLExperiment CRD, created (or replaced) and Established. An operator watching
    every namespace serves both kinds, so it needs both CRDs."""
    from rljob_operator.crd import experiment_crd_manifest

    return install_crd(kube, experiment_crd_manifest(), "rlexperiments")


class OperatorProcess:
    """``rljob operator`` as a child process watching one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, identity: str | None = None,
                 env: dict[str, str] | None = None, leader_elect: bool = True, status_host: str = "127.0.0.1") -> None:
        self.namespace = namespace
        self.status_host = status_host  # where pods reach the status API (the real node's: its gateway)
        self.status_port = free_port()
        self.metrics_port = free_port()
        self.identity = identity or f"test-{uuid.uuid4().hex[:6]}"
        self.log = log
        self.args = [
            sys.executable, "-m", "rljob", "operator",
            "--kubeconfig", str(kubeconfig),
            "--namespace", namespace,
            "--status-port", str(self.status_port),
            "--status-url", f"https://{status_host}:{self.status_port}",
            "--metrics-port", str(self.metrics_port),
            "--identity", self.identity,
            "--leader-elect" if leader_elect else "--no-leader-elect",
        ]
        self.env = {**os.environ, **FAST_ENV, **WITHOUT_POLICIES_ENV, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def status_url(self) -> str:
        return f"https://{self.status_host}:{self.status_port}"

    def start(self) -> OperatorProcess:
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(self.args, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def metrics_text(self, timeout: float = 2, names: tuple[str, ...] = ()) -> str:
        """The operator's ``/metrics``; ``names``: only those series (``name[]``)."""
        import urllib.parse
        import urllib.request

        query = f"?{urllib.parse.urlencode([('name[]', n) for n in names])}" if names else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics{query}", timeout=timeout) as r:
            return str(r.read().decode())

    def is_leader(self) -> bool:
        try:
            return "rljob_operator_leader 1.0" in self.metrics_text()
        except OSError:
            return False

    def wait_leader(self, timeout: float = 60) -> None:
        from tests.cluster.waiting import wait_for

        def leading() -> bool:
            if not self.alive():
                raise AssertionError(f"operator exited:\n{self.log_tail()}")
            return self.is_leader()

        wait_for(leading, timeout, interval=0.1, message=f"operator {self.identity} leading")

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@pytest.fixture
def operator(admin_kubeconfig: Path, namespace: str, crd_installed: Any, tmp_path: Path):
    """``start(wait=True, **kw) -> OperatorProcess``; all are stopped after the test."""
    started: list[OperatorProcess] = []

    def start(wait: bool = True, **kw: Any) -> OperatorProcess:
        log = tmp_path / f"operator-{len(started)}.log"
        proc = OperatorProcess(admin_kubeconfig, namespace, log, **kw).start()
        started.append(proc)
        if wait:
            proc.wait_leader()
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def tenant(kube: Any, namespace: str, service_account_kubeconfig: Any) -> Iterator[Any]:
    """The operator's REST layer acting as an ordinary tenant: RLTrainingJobs in ``namespace`` and nothing else
    (no pods, no Workloads, no runtimes, no job status; its pods' code is played by the test's annotations)."""
    as_tenant = service_account_kube(kube, namespace, "tenant", service_account_kubeconfig("tenant"),
                                     {"jobs-only": JOBS_ONLY})
    try:
        yield as_tenant
    finally:
        as_tenant.api_client.close()


# ------------------------------------------------------------------ an ordinary tenant

#: What an ordinary tenant of a namespace may do with rljob's kinds: the chart's ``rbac-user-roles`` (aggregated
#: into ``edit``): everything on jobs and experiments but writing their status.
TENANT_RLJOB_RULES = [
    {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs", "rltrainingjobs/scale", "rlexperiments"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs/status", "rlexperiments/status"], "verbs": ["get"]},
]


@pytest.fixture
def tenant_kube(kube: Any, namespace: str, service_account_kubeconfig: Any, crd_installed: Any) -> Any:
    """The operator's REST layer acting as an ordinary tenant of ``namespace``: service account ``tenant`` bound to
    Kubernetes' built-in ``edit`` role (pods, Services, ConfigMaps, ...) and to the chart's rights on rljob's
    kinds (``TENANT_RLJOB_RULES``). It may create pods (a notebook's), jobs and experiments, never write their
    status, and, with the admission policy ``WORKER_PODS_POLICY`` in force on the control plane (as every
    install has it), never give a pod an ownerReference to an RLTrainingJob."""
    tenant = service_account_kube(kube, namespace, "tenant", service_account_kubeconfig("tenant"),
                                  {"tenant-rljob": TENANT_RLJOB_RULES}, cluster_roles=("edit",))
    ensure_worker_pods_policy(kube, tenant, namespace)
    yield tenant
    tenant.api_client.close()


#: The admission policy that lets only whoever may patch a job's status give a pod an ownerReference to it.
WORKER_PODS_POLICY = "rljob-worker-pods"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def job_claim(name: str, uid: str, api_version: str = "rljob.dev/v1alpha1") -> dict[str, Any]:
    """The controller ownerReference the operator writes on RLTrainingJob ``name``'s worker pods (``api_version``:
    another group's look-alike). Anyone may write it (a job's UID is public); the ``rljob-worker-pods`` policy
    admits it only from who may patch the job's status."""
    return {"apiVersion": api_version, "kind": "RLTrainingJob", "name": name, "uid": uid, "controller": True,
            "blockOwnerDeletion": False}


def claiming_pod(namespace: str, name: str, job: dict[str, Any]) -> dict[str, Any]:
    """A pod that never runs, controlled by ``job`` (its kind, name and UID)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "ownerReferences": [
        job_claim(job["metadata"]["name"], job["metadata"]["uid"])]},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe:1"}],
                 "nodeSelector": {"rljob.test/no-such-node": "x"}}}


def ensure_worker_pods_policy(kube: Any, user: Any, namespace: str) -> None:
    """Install ``WORKER_PODS_POLICY`` and its binding (``manifests/base/admission-policies.yaml``) on the control
    plane unless present, and wait until it refuses ``user`` a pod claiming a job (a dry run, which admission
    checks as a create). Left installed: it refuses only those who may not patch a job's status."""
    from kubernetes.client.exceptions import ApiException

    from tests.cluster.waiting import wait_for

    docs = [d for d in yaml.safe_load_all((REPO / "manifests/base/admission-policies.yaml").read_text())
            if d and d["metadata"]["name"] == WORKER_PODS_POLICY]
    for doc in docs:
        plural = "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else \
            "validatingadmissionpolicybindings"
        try:
            kube.request("POST", f"{ADMISSION}/{plural}", doc)
        except ApiException as e:
            if e.status != 409:
                raise
    probe = claiming_pod(namespace, "rljob-policy-probe", {"metadata": {"name": "probe", "uid": str(uuid.uuid4())}})

    def refused() -> bool:
        try:
            user.request("POST", kube.core_path(namespace, "pods"), probe, query={"dryRun": "All"})
        except ApiException as e:
            return e.status == 403 and WORKER_PODS_POLICY in (e.body or "")
        return False

    wait_for(refused, 30, interval=0.2, message=f"the admission policy {WORKER_PODS_POLICY} in force")


# ------------------------------------------------------------------ job helpers


def create_job(kube: Any, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    doc = deep_update(doc, {"metadata": {"namespace": namespace}})
    return kube.request("POST", kube.job_path(namespace), doc, query={"fieldValidation": "Strict"})  # type: ignore[no-any-return]


def get_job(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    return kube.request("GET", kube.job_path(namespace, name))  # type: ignore[no-any-return]


def patch_spec(kube: Any, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return kube.request("PATCH", kube.job_path(namespace, name), {"spec": spec},  # type: ignore[no-any-return]
                        content_type="application/merge-patch+json")


def job_pods(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return kube.list_pods(namespace, f"rljob.dev/job={name}")  # type: ignore[no-any-return]


def wait_phase(kube: Any, namespace: str, name: str, phase: str, timeout: float = 60,
               reason: str | None = None) -> dict[str, Any]:
    from tests.cluster.waiting import wait_for

    def reached() -> dict[str, Any] | None:
        job = get_job(kube, namespace, name)
        status = job.get("status") or {}
        if status.get("phase") == phase and (reason is None or status.get("reason") == reason):
            return job
        return None

    try:
        return wait_for(reached, timeout, interval=0.2, message=f"{namespace}/{name} phase {phase}")
    except TimeoutError as e:
        status = (get_job(kube, namespace, name).get("status") or {})
        raise AssertionError(f"{e}\nstatus: {yaml.safe_dump(status)}") from None


def _gang_running(kube: Any, namespace: str, name: str, generation: int, replicas: int = 2) -> dict[str, Any] | None:
    """The job once gang ``generation`` runs complete and Ready (and no older pod is left)."""
    job = get_job(kube, namespace, name)
    status = job.get("status") or {}
    pods = job_pods(kube, namespace, name)
    gens = [p["metadata"]["labels"]["rljob.dev/gang-generation"] for p in pods]
    if status.get("phase") == "Running" and status.get("gangGeneration") == generation \
            and gens == [str(generation)] * replicas:
        return job
    return None


def wait_gang(kube: Any, namespace: str, name: str, generation: int, timeout: float = 60) -> dict[str, Any]:
    from tests.cluster.waiting import wait_for

    try:
        return wait_for(lambda: _gang_running(kube, namespace, name, generation), timeout, interval=0.2,
                        message=f"{name} gang generation {generation} running")
    except TimeoutError as e:
        status = {k: v for k, v in (get_job(kube, namespace, name).get("status") or {}).items() if k != "conditions"}
        raise AssertionError(f"{e}\nstatus: {yaml.safe_dump(status)}") from None


def events_for(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kube.request("GET", kube.core_path(namespace, "events"),
                       query={"fieldSelector": f"involvedObject.name={name}"})
    return list(out.get("items") or [])


def wait_for_events(kube: Any, namespace: str, name: str, *reasons: str, timeout: float = 30) -> list[dict[str, Any]]:
    """``name``'s Events once they include one of each of ``reasons``. A reconcile posts its Events last, after
    its status write and its pod writes (the reconciler's order), so a test that has seen the status may not see
    them yet."""
    from tests.cluster.waiting import wait_for

    seen: list[dict[str, Any]] = []

    def check() -> bool:
        seen[:] = events_for(kube, namespace, name)
        return set(reasons) <= {e["reason"] for e in seen}

    wait_for(check, timeout, message=f"Events {', '.join(reasons)} of {namespace}/{name}")
    return seen


def annotate_pod(kube: Any, namespace: str, pod: str, annotations: dict[str, str]) -> None:
    kube.request("PATCH", kube.core_path(namespace, "pods", pod), {"metadata": {"annotations": annotations}},
                 content_type="application/merge-patch+json")


def token_for(kube: Any, namespace: str, service_account: str, audience: str | None = None,
              pod: dict[str, Any] | None = None, seconds: int = 3600) -> str:
    """A TokenRequest token (optionally audience- and pod-bound, as a kubelet projects it)."""
    spec: dict[str, Any] = {"expirationSeconds": seconds, "audiences": [audience] if audience else []}
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}
    with contextlib.suppress(Exception):
        kube.request("POST", kube.core_path(namespace, "serviceaccounts"),
                     {"metadata": {"name": service_account, "namespace": namespace}})
    out = kube.request(
        "POST", kube.core_path(namespace, "serviceaccounts", service_account) + "/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(out["status"]["token"])
