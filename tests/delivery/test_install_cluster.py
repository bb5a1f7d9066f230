"""The chart and the kustomize overlays on the real control plane (tests/cluster).

* ``helm install`` (cluster-wide, and with ``watchNamespaces``) into a namespace that enforces
  the "restricted" Pod Security Standard: the operator's pods are admitted.
* The operator, run here as a process with the chart's ServiceAccount identity (a TokenRequest
  token) and the Deployment's own settings, reconciles a job: pods, ConfigMap, Service,
  NetworkPolicy, status, Events, a heartbeat checked by TokenReview, a status read checked by
  SubjectAccessReview, its Lease and its TLS Secret; no API call of it is refused. That proves
  the RBAC is sufficient.
* ``kubectl auth can-i --list`` for that ServiceAccount equals the reviewed snapshot in
  tests/delivery/snapshots/ (``RLJOB_UPDATE_SNAPSHOTS=1`` rewrites it after a deliberate change).
* ``helm install`` creates the runtimes "default" (marked as the default) and "cpu"; a job that names no
  runtime runs on the default one; ``helm uninstall`` keeps the CRDs and the jobs, not the runtimes.
* ``kubectl apply -k`` of each overlay works (after the CRDs, as manifests/README.md says), with the same
  runtimes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.waiting import wait_for
from tests.delivery.test_chart import CHART, MANIFESTS, PROMETHEUS, REPO, operator_env, run
from tests.support.operator_process import (
    FAST_ENV,
    TEST_IMAGE,
    create_job,
    free_port,
    job_manifest,
    token_for,
    wait_for_events,
    wait_phase,
)

pytestmark = pytest.mark.cluster
SNAPSHOTS = REPO / "tests" / "delivery" / "snapshots"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rltrainingjobs.rljob.dev"
EXPERIMENT_CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rlexperiments.rljob.dev"
RUNTIME_CRD_PATHS = tuple(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.rljob.dev"
                          for plural in ("clusterrltrainingruntimes", "rltrainingruntimes"))
CLUSTER_RUNTIMES = "/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes"
DEFAULT_MARKER = "rljob.dev/is-default-runtime"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}


# ----------------------------------------------------------------------------- plumbing


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Any:
    from rljob_operator.cluster.kube import Kube

    return Kube(api_client)


def policy_names(fullname: str) -> dict[str, str]:
    """The admission policies the operator may read, named after the release's full name (kustomize: rljob)."""
    return {f"{fullname}-job-references": "<references-policy>", f"{fullname}-queues": "<queues-policy>",
            f"{fullname}-runtime-use": "<runtime-use-policy>",
            f"{fullname}-runtime-references": "<runtime-references-policy>",
            f"{fullname}-worker-pods": "<worker-pods-policy>"}


def kubectl(control_plane: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig), *args],
               check=check)


def helm_cli(control_plane: Any, home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    return run([str(control_plane.bin / "helm"), "--kubeconfig", str(control_plane.admin_kubeconfig), *args],
               check=check, env=env)


def make_namespace(kube: Any, name: str, labels: dict[str, str] | None = None) -> str:
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": {
        "rljob.dev/test": "true", **(labels or {})}}})
    wait_for(lambda: kube.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default"), 60,
             message=f"{name}/default service account", ignore=(Exception,))
    return name


def delete_namespace(kube: Any, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        kube.request("DELETE", f"/api/v1/namespaces/{name}/pods", query={"gracePeriodSeconds": 0})
        kube.request("DELETE", f"/api/v1/namespaces/{name}")
    except ApiException as e:
        if e.status != 404:
            raise


def hand_crd_to_release(kube: Any, release: str, namespace: str) -> None:
    """Let ``release`` adopt an existing CRD (Helm's documented adoption labels/annotations).

    The session's CRD may come from other tests or an earlier release; a real cluster moving
    from ``kubectl apply -f crds/`` to the chart does the same once.
    """
    from kubernetes.client.exceptions import ApiException

    patch = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {
        "meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}}}
    for path in (CRD_PATH, EXPERIMENT_CRD_PATH, *RUNTIME_CRD_PATHS):
        try:
            kube.request("PATCH", path, patch, content_type="application/merge-patch+json")
        except ApiException as e:
            if e.status != 404:
                raise


def property_paths(schema: dict[str, Any], at: str = "") -> set[str]:
    """Every property of a JSON schema, as a path (``status.arms[].n``)."""
    out = set()
    for name, sub in (schema.get("properties") or {}).items():
        out |= {f"{at}{name}"} | property_paths(sub, f"{at}{name}.")
    if "items" in schema:
        out |= property_paths(schema["items"], f"{at[:-1]}[]." if at else "[].")
    return out


def assert_crds_as_generated(kube: Any) -> None:
    """The CRDs on the cluster have every property the models generate, and no other (a key Go's YAML reads
    otherwise than ours, as a plain ``n`` once was, would be a property ``false`` here)."""
    from rljob_operator.crd import RUNTIME_NAMES, crd_manifest, experiment_crd_manifest, runtime_crd_manifest

    runtimes = [(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{m['metadata']['name']}", m)
                for m in map(runtime_crd_manifest, RUNTIME_NAMES)]
    for path, generated in ((CRD_PATH, crd_manifest()), *runtimes, (EXPERIMENT_CRD_PATH, experiment_crd_manifest())):
        installed = kube.request("GET", path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        want = property_paths(generated["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        got = property_paths(installed)
        assert got == want, f"{path}: missing {sorted(want - got)}, unexpected {sorted(got - want)}"
    assert "status.arms[].n" in want


@contextlib.contextmanager
def chart_installed(control_plane: Any, kube: Any, home: Path, release: str, operator_ns: str, jobs_ns: str,
                    *values: str) -> Iterator[None]:
    """``helm install`` of the chart as ``release`` into a new restricted namespace (the CRD handed to the
    release), its trainers' ServiceAccount in the new namespace ``jobs_ns``; uninstalled, both deleted after."""
    make_namespace(kube, operator_ns, RESTRICTED)
    make_namespace(kube, jobs_ns)
    hand_crd_to_release(kube, release, operator_ns)
    try:
        helm_cli(control_plane, home, "install", release, str(CHART), "--namespace", operator_ns,
                 "--set", f"trainerServiceAccount.namespaces={{{jobs_ns}}}", *values)
        yield
    finally:
        helm_cli(control_plane, home, "uninstall", release, "--namespace", operator_ns, check=False)
        for ns in (jobs_ns, operator_ns):
            delete_namespace(kube, ns)


def can_i_list(control_plane: Any, service_account: str, namespace: str) -> list[list[str]]:
    """Rows (resources, non-resource URLs, resource names, verbs) of ``kubectl auth can-i --list``."""
    out = kubectl(control_plane, "auth", "can-i", "--list", f"--as=system:serviceaccount:{service_account}",
                  "-n", namespace).stdout
    header, *lines = out.splitlines()
    starts = [header.index(title) for title in ("Resources", "Non-Resource URLs", "Resource Names", "Verbs")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    rows = [[line[a:b].strip() for a, b in bounds] for line in lines if line.strip()]
    # kubectl merges the rules of several roles in no fixed order: sort rows and the verbs in each.
    for row in rows:
        row[3] = "[" + " ".join(sorted(row[3].strip("[]").split())) + "]"
    return sorted(rows)


HEADER = ["RESOURCES", "NON-RESOURCE URLS", "RESOURCE NAMES", "VERBS"]


def rbac_by_namespace(control_plane: Any, service_account: str, sections: dict[str, str],
                      names: dict[str, str]) -> dict[str, list[list[str]]]:
    """can-i --list rows in each namespace of ``sections`` (title → namespace), names made generic."""
    return {title: [[_generic(c, names) for c in row] for row in can_i_list(control_plane, service_account, ns)]
            for title, ns in sections.items()}


def snapshot_text(who: str, rbac: dict[str, list[list[str]]]) -> str:
    out = [f"# kubectl auth can-i --list --as=system:serviceaccount:{who} -n <namespace>",
           "# Reviewed: regenerate with RLJOB_UPDATE_SNAPSHOTS=1 only after a deliberate RBAC change.", ""]
    for title, rows in rbac.items():
        widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(3)]
        out.append(f"## -n {title}")
        for row in [HEADER, *rows]:
            out.append("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3])
        out.append("")
    return "\n".join(out)


def _generic(text: str, names: dict[str, str]) -> str:
    """Replace installation-specific names (longest first, whole names only: "rljob" the
    namespace, not the "rljob" of "rltrainingjobs.rljob.dev")."""
    for actual, generic in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w.]){re.escape(actual)}(?![\w.])", generic, text)
    return text


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("RLJOB_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: review the RBAC and run with RLJOB_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"RBAC changed: compare with {path.relative_to(REPO)}\n{text}"


def assert_least_privilege(rbac: dict[str, list[list[str]]], operator_namespace: str) -> None:
    """No wildcard resource or verb; Secrets only by name, only in the operator's namespace.

    (Non-resource URLs such as /api/* are what every authenticated user may read: discovery.)
    """
    for title, rows in rbac.items():
        for resources, urls, resource_names, verbs in rows:
            if not resources:
                assert urls and verbs == "[get]", (title, urls, verbs)
                continue
            assert "*" not in resources and "*" not in verbs and "*" not in resource_names, (title, resources)
            if resources == "secrets":
                assert title == operator_namespace, f"Secrets readable in {title}"
                assert verbs == "[create]" or (verbs == "[get]" and resource_names == "[<operator>-status-tls]")


# ---------------------------------------------------------------------- helm install


@dataclass
class Release:
    mode: str
    name: str
    namespace: str
    jobs_namespace: str
    other_namespace: str
    helm_home: Path
    install_output: str
    manifest: list[dict[str, Any]] = field(default_factory=list)

    @property
    def operator(self) -> str:
        return f"{self.name}-operator"

    @property
    def service_account(self) -> str:
        return f"{self.namespace}:{self.operator}"

    def names(self) -> dict[str, str]:
        return {self.operator: "<operator>", self.namespace: "<operator-namespace>",
                self.jobs_namespace: "<jobs-namespace>", self.other_namespace: "<other-namespace>",
                **policy_names(self.name)}

    def deployment(self) -> dict[str, Any]:
        return next(d for d in self.manifest if d["kind"] == "Deployment")


@pytest.fixture(scope="module", params=["cluster-wide", "namespaced"])
def release(request: pytest.FixtureRequest, control_plane: Any, kube: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    mode = request.param
    suffix = uuid.uuid4().hex[:5]
    namespace = make_namespace(kube, f"rljob-op-{suffix}", RESTRICTED)
    jobs = make_namespace(kube, f"rljob-jobs-{suffix}")
    other = make_namespace(kube, f"rljob-other-{suffix}")
    name, home = "rljob-test", tmp_path_factory.mktemp(f"helm-{mode}")
    values = ["--set", f"trainerServiceAccount.namespaces={{{jobs}}}"]
    if mode == "namespaced":
        values = ["--set", f"watchNamespaces={{{jobs}}}"]
    hand_crd_to_release(kube, name, namespace)
    try:
        out = helm_cli(control_plane, home, "install", name, str(CHART), "--namespace", namespace, *values)
        manifest = helm_cli(control_plane, home, "get", "manifest", name, "--namespace", namespace).stdout
        yield Release(mode, name, namespace, jobs, other, home, out.stdout,
                      [d for d in yaml.safe_load_all(manifest) if d])
    finally:
        helm_cli(control_plane, home, "uninstall", name, "--namespace", namespace, check=False)
        for ns in (jobs, other, namespace):
            delete_namespace(kube, ns)


def test_helm_install_deploys_and_explains_itself(release: Release, control_plane: Any, kube: Any) -> None:
    status = json.loads(helm_cli(control_plane, release.helm_home, "status", release.name, "-n", release.namespace,
                                 "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    notes = release.install_output.split("NOTES:", 1)[1]
    assert f"kubectl -n {release.namespace} rollout status deployment/{release.operator}" in notes
    assert f'ServiceAccount "rljob-trainer" (no API permissions) in: {release.jobs_namespace}' in notes
    if release.mode == "namespaced":
        assert f"RLTrainingJobs in: {release.jobs_namespace}." in notes
    else:
        assert "RLTrainingJobs in every namespace." in notes
    crd = kube.request("GET", CRD_PATH)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert_crds_as_generated(kube)
    assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == release.name
    trainer_sa = kube.request("GET", f"/api/v1/namespaces/{release.jobs_namespace}/serviceaccounts/rljob-trainer")
    assert trainer_sa["automountServiceAccountToken"] is False
    # The runtimes, "default" marked as the default; their CRDs from the chart's crds/ folder.
    assert 'A job that sets no spec.runtimeRef runs on "default"' in notes
    runtimes = {r["metadata"]["name"]: r for r in kube.request("GET", CLUSTER_RUNTIMES, query={
        "labelSelector": f"app.kubernetes.io/instance={release.name}"})["items"]}
    assert sorted(runtimes) == ["cpu", "default"]
    assert [n for n, r in runtimes.items() if (r["metadata"].get("annotations") or {}).get(DEFAULT_MARKER) == "true"] \
        == ["default"]
    assert runtimes["cpu"]["spec"]["limits"]["gpusPerWorker"]["max"] == 0
    for path in RUNTIME_CRD_PATHS:
        assert kube.request("GET", path)["status"]["acceptedNames"]["kind"].endswith("RLTrainingRuntime")


def test_operator_pods_are_admitted_in_a_restricted_namespace(release: Release, kube: Any) -> None:
    """The namespace enforces Pod Security "restricted": the ReplicaSet could create both pods."""
    selector = f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=operator"

    def pods() -> list[dict[str, Any]]:
        items = kube.list_pods(release.namespace, selector)
        return items if len(items) == 2 else []

    created = wait_for(pods, 60, message="two operator pods")
    for pod in created:
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_operator_rbac_matches_the_reviewed_snapshot(release: Release, control_plane: Any) -> None:
    sections = {"<operator-namespace>": release.namespace, "<jobs-namespace>": release.jobs_namespace,
                "<other-namespace>": release.other_namespace}
    rbac = rbac_by_namespace(control_plane, release.service_account, sections, release.names())
    assert_least_privilege(rbac, "<operator-namespace>")
    check_snapshot(f"operator-rbac-helm-{release.mode}.txt", snapshot_text("<operator-namespace>:<operator>", rbac))


class LocalOperator:
    """``rljob operator`` run here with the chart Deployment's settings and a kubeconfig."""

    def __init__(self, release: Release, kubeconfig: Path, log: Path) -> None:
        self.status_port, self.metrics_port = free_port(), free_port()
        self.identity = f"local-{release.mode}"
        env = {}
        for key, value in operator_env(release.deployment()).items():
            if isinstance(value, str):
                env[key] = value
            elif value == {"fieldRef": {"fieldPath": "metadata.namespace"}}:
                env[key] = release.namespace
            elif value == {"fieldRef": {"fieldPath": "metadata.name"}}:
                env[key] = self.identity
            else:
                raise AssertionError(f"{key}: cannot run {value} locally")
        # Fast intervals; the pod profile stays the chart's (its runtimes' image allowed).
        env.update({k: v for k, v in FAST_ENV.items() if k != "RLJOB_OPERATOR_ALLOWED_IMAGES"})
        env.update({"RLJOB_OPERATOR_STATUS_PORT": str(self.status_port),
                    "RLJOB_OPERATOR_METRICS_PORT": str(self.metrics_port),
                    "RLJOB_OPERATOR_STATUS_URL": f"https://127.0.0.1:{self.status_port}"})
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rljob", "operator", "--kubeconfig", str(kubeconfig)],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=REPO)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.status_port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            return str(r.read().decode())

    def wait_leader(self) -> None:
        def leading() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited:\n{self.log.read_text()[-4000:]}")
            try:
                return "rljob_operator_leader 1.0" in self.metrics()
            except OSError:
                return False

        wait_for(leading, 60, message="the local operator leading")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def _https(url: str, token: str, ca: str, body: dict[str, Any] | None = None) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     method="POST" if body is not None else "GET",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=ssl.create_default_context(cadata=ca), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_operator_with_the_charts_identity_reconciles_a_job(release: Release, control_plane: Any, kube: Any,
                                                            tmp_path: Path) -> None:
    kubeconfig = control_plane.service_account_kubeconfig(release.namespace, release.operator, create=False)
    operator = LocalOperator(release, kubeconfig, tmp_path / "operator.log")
    try:
        operator.wait_leader()
        jobs = release.jobs_namespace
        # No runtimeRef: the runtime the install marked as the default gives the pods their image,
        # ServiceAccount and security context.
        create_job(kube, jobs, job_manifest("helm-gang", replicas=2))
        if release.mode == "namespaced":  # a job outside watchNamespaces is none of its business
            create_job(kube, release.other_namespace, job_manifest("unwatched", replicas=1))
        job = wait_phase(kube, jobs, "helm-gang", "Running", timeout=90)

        pods = sorted(kube.list_pods(jobs, "rljob.dev/job=helm-gang"), key=lambda p: p["metadata"]["name"])
        assert [p["metadata"]["name"] for p in pods] == ["helm-gang-worker-0", "helm-gang-worker-1"]
        assert all(p["spec"]["serviceAccountName"] == "rljob-trainer" for p in pods)
        # The chart's runtime, not the tests' own default (an older one, another image): the newest marked wins.
        assert {p["spec"]["containers"][0]["image"] for p in pods} == {
            kube.request("GET", f"{CLUSTER_RUNTIMES}/default")["spec"]["image"]} != {TEST_IMAGE}
        cm = kube.request("GET", kube.core_path(jobs, "configmaps", "helm-gang-config"))
        assert kube.request("GET", kube.core_path(jobs, "services", "helm-gang"))["spec"]["clusterIP"] == "None"
        # The job's NetworkPolicy, with the chart's Prometheus as the only scraper besides the job.
        policy = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{jobs}/networkpolicies/helm-gang-workers")
        assert policy["spec"]["ingress"][1]["from"] == [PROMETHEUS]
        assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Ready"] == "True"
        wait_for_events(kube, jobs, "helm-gang", "Running")

        # A heartbeat with worker 0's audience-bound token (TokenReview, then a pod lookup).
        token = token_for(kube, jobs, "rljob-trainer", "rljob-status", pod=pods[0])
        env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
        assert env["RLJOB_STATUS_URL"].startswith(operator.url)
        assert _https(env["RLJOB_STATUS_URL"], token, cm["data"]["status-ca.crt"], {"step": 3, "reward": 0.5}) == 202
        wait_for(lambda: (kube.get_job(jobs, "helm-gang")["status"].get("progress") or {}).get("step") == 3, 20,
                 message="progress.step from the heartbeat")

        # Reading a job's status through the status API (SubjectAccessReview decides).
        kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{jobs}/roles", {
            "metadata": {"name": "job-reader"},
            "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["get"]}]})
        kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{jobs}/rolebindings", {
            "metadata": {"name": "job-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "job-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": jobs}]})
        status_url = f"{operator.url}/api/v1/namespaces/{jobs}/rltrainingjobs/helm-gang/status"
        ca = cm["data"]["status-ca.crt"]
        wait_for(lambda: _https(status_url, token_for(kube, jobs, "reader"), ca) == 200, 20,
                 message="a reader's GET of the status")
        assert _https(status_url, token_for(kube, jobs, "stranger"), ca) == 403

        # Its own Lease and serving-certificate Secret, in its namespace.
        lease = kube.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{release.namespace}/leases/"
                                    f"{release.operator}")
        assert lease["spec"]["holderIdentity"] == operator.identity
        secret = kube.request("GET", kube.core_path(release.namespace, "secrets", f"{release.operator}-status-tls"))
        assert secret["type"] == "kubernetes.io/tls"

        if release.mode == "namespaced":
            assert not (kube.get_job(release.other_namespace, "unwatched") or {}).get("status")
        # Not one API call of the operator was refused.
        refused = [line for line in operator.metrics().splitlines()
                   if line.startswith("rljob_operator_api_errors_total") and 'code="403"' in line]
        assert not refused, refused
        log = operator.log.read_text()
        assert "Forbidden" not in log
        # The chart's identity may watch Nodes (rbac.capacityAutoscaling): deleted nodes are acted on at once.
        assert "Nodes watched" in log and "cannot list and watch nodes" not in log
    finally:
        operator.stop()


def test_trainer_pods_meet_the_restricted_pod_security_standard(namespace: str, kube: Any) -> None:
    """A worker pod as the operator builds it, dry-run into a namespace enforcing "restricted"."""
    from kubernetes.client.exceptions import ApiException
    from rljob_contract.job import parse_job
    from rljob_operator.decisions.children import desired_worker_pod
    from rljob_operator.names import StatusEndpoint

    kube.request("PATCH", f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": RESTRICTED}},
                 content_type="application/merge-patch+json")
    doc = job_manifest("psa", replicas=1, namespace=namespace)
    doc["metadata"].update(uid="00000000-0000-0000-0000-000000000000", generation=1)
    pod = desired_worker_pod(parse_job(doc, "psa"), 0, 1, StatusEndpoint("https://status.invalid:8443", "CA"))
    del pod["metadata"]["ownerReferences"]
    try:
        kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, query={"dryRun": "All"})
    except ApiException as e:
        message = json.loads(e.body or "{}").get("message") or str(e)
        pytest.fail(f"the worker pod was refused ({e.status}): {message}")


def test_helm_uninstall_keeps_the_crd_and_the_jobs(release: Release, control_plane: Any, kube: Any) -> None:
    create_job(kube, release.jobs_namespace, job_manifest("survivor", replicas=1))
    helm_cli(control_plane, release.helm_home, "uninstall", release.name, "--namespace", release.namespace)
    assert kube.request("GET", CRD_PATH)["metadata"]["name"] == "rltrainingjobs.rljob.dev"
    assert kube.request("GET", EXPERIMENT_CRD_PATH)["metadata"]["name"] == "rlexperiments.rljob.dev"
    assert kube.get_job(release.jobs_namespace, "survivor") is not None
    for path in RUNTIME_CRD_PATHS:  # Helm never deletes what the chart's crds/ folder installed
        assert kube.request("GET", path)
    selector = {"labelSelector": f"app.kubernetes.io/instance={release.name}"}
    assert kube.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles", query=selector)["items"] == []
    # The runtimes go with the release (a running job keeps the snapshot it started with).
    assert kube.request("GET", CLUSTER_RUNTIMES, query=selector)["items"] == []


# ----------------------------------------------------------------------- kustomize


@pytest.mark.parametrize("overlay,namespace", [("cluster-wide", "rljob-system"), ("single-namespace", "rljob")])
def test_kubectl_apply_k_installs_each_overlay(overlay: str, namespace: str, control_plane: Any, kube: Any) -> None:
    path = str(MANIFESTS / "overlays" / overlay)
    try:
        # As manifests/README.md says: the CRDs first (kubectl maps the runtimes before it creates anything).
        kubectl(control_plane, "apply", "--server-side", "--force-conflicts", "-f", str(MANIFESTS / "base" / "crds"))
        kubectl(control_plane, "wait", "--for", "condition=Established", "crd", "--all", "--timeout=60s")
        kubectl(control_plane, "apply", "-k", path)
        kubectl(control_plane, "apply", "-k", path)  # GitOps tools re-apply all the time
        assert_crds_as_generated(kube)
        runtimes = kube.request("GET", CLUSTER_RUNTIMES, query={
            "labelSelector": "app.kubernetes.io/managed-by=kustomize,app.kubernetes.io/part-of=rljob"})["items"]
        assert sorted(r["metadata"]["name"] for r in runtimes) == ["cpu", "default"]
        assert (next(r for r in runtimes if r["metadata"]["name"] == "default")["metadata"]["annotations"]
                [DEFAULT_MARKER] == "true")

        def pods() -> list[dict[str, Any]]:
            items = kube.list_pods(namespace, "app.kubernetes.io/component=operator")
            return items if len(items) == 2 else []

        wait_for(pods, 60, message=f"operator pods in {namespace} (Pod Security restricted)")
        ns = kube.request("GET", f"/api/v1/namespaces/{namespace}")
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        service_account = f"{namespace}:rljob-operator"
        names = {"rljob-operator": "<operator>", namespace: "<operator-namespace>", **policy_names("rljob")}
        if overlay == "cluster-wide":
            # The same rights as the chart's cluster-wide install (the same snapshot).
            rbac = rbac_by_namespace(control_plane, service_account, {
                "<operator-namespace>": namespace, "<jobs-namespace>": "default", "<other-namespace>": "kube-public",
            }, names)
            text = snapshot_text("<operator-namespace>:<operator>", rbac)
            assert text == (SNAPSHOTS / "operator-rbac-helm-cluster-wide.txt").read_text()
        else:
            rbac = rbac_by_namespace(control_plane, service_account, {
                "<operator-namespace>": namespace, "<other-namespace>": "default"}, names)
            assert_least_privilege(rbac, "<operator-namespace>")
            check_snapshot("operator-rbac-kustomize-single-namespace.txt",
                           snapshot_text("<operator-namespace>:<operator>", rbac))
        trainer = kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/rljob-trainer") \
            if overlay == "single-namespace" else None
        assert trainer is None or trainer["automountServiceAccountToken"] is False
    finally:
        # Everything but the CRD (other tests' jobs live in it).
        for kind in ("clusterrolebinding", "clusterrole", "validatingadmissionpolicybinding",
                     "validatingadmissionpolicy", "clusterrltrainingruntime"):
            kubectl(control_plane, "delete", kind, "-l",
                    "app.kubernetes.io/managed-by=kustomize,app.kubernetes.io/part-of=rljob", check=False)
        delete_namespace(kube, namespace)
