"""The Helm chart (charts/rljob) and the kustomize manifests, rendered offline.

``helm lint``/``helm template`` for default and non-default values, the values schema (typos
and wrong types are rejected, every value documented), standard labels on every object, least
privilege in the rendered RBAC, the restricted pod security of the operator, and the CRD
copies against ``rljob crd``. The helpers at the top are shared by the other delivery tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.scripts import load_script
from tests.support.trainer import deep_update
from tests.support.yaml_go import go_differences

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rljob"
MANIFESTS = REPO / "manifests"
KUBE_VERSION = "1.37.2"
STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                   "app.kubernetes.io/managed-by")
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRLTrainingRuntime"}
#: Non-default values worth rendering: (name, helm arguments).
VARIANTS: list[tuple[str, list[str]]] = [
    ("default", []),
    ("watch-namespaces", ["--set", "watchNamespaces={ml-a,ml-b}"]),
    ("no-crds", ["--set", "crds.enabled=false"]),
    ("crds-not-kept", ["--set", "crds.keep=false"]),
    ("monitoring", ["--set", "serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true"]),
    ("existing-secret", ["--set", "statusAPI.tls.source=existingSecret,statusAPI.tls.secretName=my-tls"]),
    ("cert-manager", ["--set", "statusAPI.tls.source=certManager"]),
    ("single-replica", ["--set", "replicaCount=1,leaderElection.enabled=false"]),
    ("no-network-policy", ["--set", "networkPolicy.enabled=false"]),
    ("cpu-default-runtime", ["--set", "runtimes.defaultName=cpu"]),
    ("no-runtimes", ["--set", "runtimes.default.enabled=false,runtimes.cpu.enabled=false,runtimes.defaultName="]),
    *[(f"ci/{p.name}", ["-f", str(p)]) for p in sorted((CHART / "ci").glob("*-values.yaml"))],
]


def bin_dir() -> Path:
    """The pinned helm, kubectl and promtool (tools/build-binaries.sh; `make binaries`).

    Missing binaries skip these tests on a developer's machine (`make test-fast` builds
    nothing) and fail them in CI, where `make test` builds them first.
    """
    from tests.cluster.binaries import BinariesUnavailable

    try:
        return _pinned_bin_dir()
    except BinariesUnavailable as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"helm/kubectl/promtool not built: {e} (`make binaries`)")


@cache
def _pinned_bin_dir() -> Path:
    from tests.cluster.binaries import bin_dir as pinned

    return pinned(build=False)


def run(args: list[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, check=False, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([str(bin_dir() / "helm"), *args], check=check)


def helm_template(*args: str, namespace: str = "rljob-system", release: str = "rljob") -> list[dict[str, Any]]:
    """The objects ``helm template`` renders (the CRD is a template, so it is among them)."""
    out = helm("template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kustomize_build(overlay: str) -> list[dict[str, Any]]:
    out = run([str(bin_dir() / "kubectl"), "kustomize", str(MANIFESTS / "overlays" / overlay)])
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def rbac_rules(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """(kind, namespace, name) of every Role/ClusterRole bound to a subject → its rules."""
    out = {}
    for d in docs:
        if d["kind"] in ("Role", "ClusterRole"):
            out[(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])] = d.get("rules") or []
    return out


def operator_rbac(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Roles and ClusterRoles bound to the operator's ServiceAccount (not the users' aggregated ones)."""
    bound = {
        (b["roleRef"]["kind"], b["metadata"].get("namespace", "") if b["roleRef"]["kind"] == "Role" else "",
         b["roleRef"]["name"])
        for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        if any(s["kind"] == "ServiceAccount" and s["name"].endswith("-operator") for s in b["subjects"])
    }
    return {key: rules for key, rules in rbac_rules(docs).items() if key in bound}


def operator_env(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ----------------------------------------------------------------------------- helm lint


@pytest.mark.parametrize("name,args", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_helm_lint_is_clean(name: str, args: list[str]) -> None:
    out = helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


@pytest.mark.parametrize("name,args", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_rendered_object_has_the_standard_labels(name: str, args: list[str]) -> None:
    docs = helm_template(*args)
    assert docs
    for d in docs:
        labels = d["metadata"].get("labels") or {}
        missing = [k for k in STANDARD_LABELS if k not in labels]
        assert not missing, f"{d['kind']}/{d['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace"), f"{d['kind']}/{d['metadata']['name']} has no namespace"


@pytest.mark.parametrize("name,args", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_what_helm_renders_reads_the_same_to_helm_as_to_these_tests(name: str, args: list[str]) -> None:
    """Helm parses its output with go-yaml v2, which reads a plain ``n`` or ``y`` as a boolean: such a key in
    a CRD is a property ``"false"`` on the cluster (tests/contract/test_yaml_text.py); the kustomize builds too."""
    out = helm("template", "rljob", str(CHART), "--namespace", "rljob-system", "--kube-version", KUBE_VERSION, *args)
    assert go_differences(out.stdout) == []
    if name == "default":
        for overlay in ("cluster-wide", "single-namespace"):
            built = run([str(bin_dir() / "kubectl"), "kustomize", str(MANIFESTS / "overlays" / overlay)])
            assert go_differences(built.stdout) == [], overlay


@pytest.mark.parametrize("name,args", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_rendered_rbac_has_no_wildcards_and_reads_no_secret_but_its_own(name: str, args: list[str]) -> None:
    docs = helm_template(*args)
    for (kind, namespace, role), rules in rbac_rules(docs).items():
        for rule in rules:
            for key in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in rule.get(key, []), f"{kind} {role}: wildcard in {key}"
            if "secrets" in rule.get("resources", []):
                # Only the operator's own serving-certificate Secret, by name, in its namespace.
                assert kind == "Role" and namespace == "rljob-system", f"{kind} {role} touches Secrets"
                assert rule["verbs"] == ["create"] or (rule["verbs"] == ["get"] and rule["resourceNames"] == [
                    "rljob-operator-status-tls"]), rule


# ------------------------------------------------------------------------ values schema


@pytest.mark.parametrize(
    "args,message",
    [
        (["--set", "watchNamespace={ml-a}"], "additional properties 'watchNamespace' not allowed"),
        (["--set", "crds.enable=false"], "additional properties 'enable' not allowed"),
        (["--set", "replicaCount=two"], "/replicaCount"),
        (["--set", "replicaCount=0"], "/replicaCount"),
        (["--set-json", 'watchNamespaces="ml-a"'], "/watchNamespaces"),
        (["--set", "statusAPI.tls.source=selfSigned"], "/statusAPI/tls/source"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "operator.logLevel=LOUD"], "/operator/logLevel"),
        (["--set", "serviceMonitor.interval=30"], "/serviceMonitor/interval"),
        (["--set-json", 'imagePullSecrets=["regcred"]'], "/imagePullSecrets/0"),
        (["--set", "networkPolicy.enable=false"], "additional properties 'enable' not allowed"),
        (["--set-json", 'networkPolicy.monitoring.podSelector={"app":"prometheus"}'],
         "invalid propertyName 'app'"),
        (["--set-json", 'networkPolicy.statusAPIFrom=[{"podselector":{}}]'], "invalid propertyName 'podselector'"),
    ],
    ids=["typo-top-level", "typo-nested", "replicas-not-a-number", "replicas-zero", "namespaces-not-a-list",
         "unknown-tls-source", "unknown-pull-policy", "unknown-log-level", "interval-without-unit",
         "pull-secret-by-value", "network-policy-typo", "selector-without-matchlabels", "peer-typo"],
)
def test_values_breaking_the_schema_are_rejected(args: list[str], message: str) -> None:
    result = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0, f"accepted {args}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--set", "statusAPI.tls.source=existingSecret"], "statusAPI.tls.secretName is required"),
        (["--set", "leaderElection.enabled=false"], "leaderElection.enabled=false needs replicaCount: 1"),
        (["--set", "serviceAccount.create=false"], "serviceAccount.name is required"),
    ],
)
def test_inconsistent_values_fail_with_a_message(args: list[str], message: str) -> None:
    result = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def _closed(schema: dict[str, Any], path: str) -> bool:
    """Whether the schema spells out the keys at ``path`` ("" is the top level)."""
    node = schema
    for part in filter(None, path.split(".")):
        node = (node.get("properties") or {}).get(part) or {}
    return node.get("additionalProperties") is False


def _value_paths(node: Any, schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of values.yaml down to where the schema stops spelling keys out."""
    out = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.add(path)
        if isinstance(value, dict) and _closed(schema, path):
            out |= _value_paths(value, schema, path + ".")
    return out


def _lookup(values: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def _schema_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, sub in (node.get("properties") or {}).items():
        out.add(f"{prefix}{key}")
        if sub.get("additionalProperties") is False:
            out |= _schema_paths(sub, f"{prefix}{key}.")
    return out


def test_values_schema_closes_every_object_and_matches_values_yaml() -> None:
    schema = _schema()

    def check_closed(node: dict[str, Any], where: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{where or 'the top level'} accepts unknown keys"
            for key, sub in node["properties"].items():
                check_closed(sub, f"{where}.{key}".lstrip("."))

    check_closed(schema, "")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    in_values = _value_paths(values, schema)
    # `global` is Helm's (for parent charts); keys of an optional object that defaults to {}
    # (certManager.issuerRef) are documented by its example.
    optional = {p for p in in_values if _lookup(values, p) == {}}
    in_schema = {p for p in _schema_paths(schema) - {"global"} if "." not in p or p.rsplit(".", 1)[0] not in optional}
    assert in_values - in_schema == set(), "in values.yaml but not in values.schema.json"
    assert in_schema - in_values == set(), "in values.schema.json but without a default in values.yaml"


def test_every_value_is_documented_in_values_yaml() -> None:
    """Each value has a comment right above it, as in cert-manager's values.yaml.

    Section headers whose keys the schema spells out (``crds:``) need none: their keys have one.
    """
    schema = _schema()
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    undocumented = []
    for i, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):(.*)$", line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        path = f"{parent}.{key}".lstrip(".")
        stack.append((indent, path))
        if not _closed(schema, parent):
            continue  # inside a Kubernetes-typed default (securityContext, resources, ...)
        if not rest and _closed(schema, path):
            continue  # a section of our own: its keys carry the comments
        before = next((p for p in reversed(lines[:i]) if p.strip()), "")
        if not before.strip().startswith("#"):
            undocumented.append(path)
    assert not undocumented, f"values without a comment above them: {undocumented}"


# ------------------------------------------------------------------------------- the CRD


def _crd_text() -> str:
    from rljob_operator.crd import crd_yaml

    return crd_yaml()


def _generator() -> Any:
    return load_script(CHART / "hack" / "gen_crds.py")


def test_chart_and_kustomize_crds_are_generated_from_rljob_crd() -> None:
    """Fails when the models changed and `make chart-crds` was not run."""
    generator = _generator()
    for path, content in generator.outputs(_crd_text()).items():
        assert path.read_text() == content, f"{path.relative_to(REPO)} drifted from `rljob crd`: run `make chart-crds`"


def test_generator_check_mode_reports_drift(tmp_path: Path) -> None:
    script = CHART / "hack" / "gen_crds.py"
    ok = run([str(REPO / ".venv/bin/python"), str(script), "--check"], check=False, input=_crd_text())
    assert ok.returncode == 0, ok.stderr
    edited = _crd_text().replace("shortNames:\n    - rltj", "shortNames:\n    - rlj")
    drift = run([str(REPO / ".venv/bin/python"), str(script), "--check"], check=False, input=edited)
    assert drift.returncode == 1 and "make chart-crds" in drift.stderr


def test_rendered_crd_equals_the_generated_one_and_is_kept_on_uninstall() -> None:
    from rljob_operator.crd import RUNTIME_NAMES, crd_manifest, experiment_crd_manifest, runtime_crd_manifest

    for expected in map(runtime_crd_manifest, RUNTIME_NAMES):  # the chart's crds/ folder: kustomize's alone here
        kustomized = one(kustomize_build("cluster-wide"), "CustomResourceDefinition", expected["metadata"]["name"])
        assert _yaml12_numbers(kustomized["spec"]) == _yaml12_numbers(expected["spec"])
    for expected in (crd_manifest(), experiment_crd_manifest()):
        name = expected["metadata"]["name"]
        crd = one(helm_template(), "CustomResourceDefinition", name)
        assert crd["spec"] == expected["spec"]
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert "helm.sh/resource-policy" not in one(helm_template("--set", "crds.keep=false"),
                                                    "CustomResourceDefinition", name)["metadata"]["annotations"]
        kustomized = one(kustomize_build("cluster-wide"), "CustomResourceDefinition", name)
        assert _yaml12_numbers(kustomized["spec"]) == _yaml12_numbers(expected["spec"])
    assert not by_kind(helm_template("--set", "crds.enabled=false"), "CustomResourceDefinition")


def test_the_runtime_kinds_crds_are_in_the_charts_crds_folder_as_generated() -> None:
    """Helm installs crds/ before it maps the chart's runtimes (a CRD template would not yet be served): the
    folder holds exactly the runtime kinds' CRDs, verbatim, and no template renders them."""
    from rljob_contract.runtime import CLUSTER_KIND, NAMESPACED_KIND
    from rljob_operator.crd import runtime_crd_yaml

    generator = _generator()
    expected = {}
    for kind in (CLUSTER_KIND, NAMESPACED_KIND):
        for path, content in generator.outputs(runtime_crd_yaml(kind)).items():
            assert path.read_text() == content, f"{path.relative_to(REPO)} drifted: run `make chart-crds`"
            expected[path.relative_to(REPO)] = content
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted(
        p.name for p in expected if p.parts[:3] == ("charts", "rljob", "crds"))
    assert {d["metadata"]["name"] for d in by_kind(helm_template(), "CustomResourceDefinition")} == {
        "rltrainingjobs.rljob.dev", "rlexperiments.rljob.dev"}
    assert {d["spec"]["scope"] for d in (yaml.safe_load(c) for c in expected.values())} == {"Cluster", "Namespaced"}


def _yaml12_numbers(node: Any) -> Any:
    """Numbers as Go's YAML reads them: kustomize prints 1e-05 (a float to Go, a string to
    PyYAML) and 0 for 0.0; compare values, not spellings."""
    if isinstance(node, dict):
        return {k: _yaml12_numbers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_yaml12_numbers(v) for v in node]
    if isinstance(node, str) and re.fullmatch(r"-?\d+(\.\d+)?[eE][-+]?\d+", node):
        node = float(node)
    if isinstance(node, float) and node.is_integer():
        return int(node)
    return node


# ---------------------------------------------------------------- operator Deployment


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("name,args", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_operator_pod_meets_the_restricted_pod_security_standard(name: str, args: list[str]) -> None:
    spec = _pod_spec(helm_template(*args))
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        assert {"/tmp"} <= {m["mountPath"] for m in container["volumeMounts"]}
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["port"] == "http-metrics"
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    # Secrets only by reference: no credential values anywhere in the environment.
    env = operator_env(one(helm_template(*args), "Deployment"))
    assert not any(re.search(r"(?i)password|token|secret_key|access_key", k) for k in env)


def test_deployment_passes_settings_the_operator_reads() -> None:
    from rljob_operator.settings import ENV_PREFIX, OperatorSettings

    fields = {ENV_PREFIX + f.upper() for f in OperatorSettings.__dataclass_fields__}
    env = operator_env(one(helm_template("--set", "watchNamespaces={ml-a,ml-b}"), "Deployment"))
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k not in fields]
    assert not unknown, f"the operator does not read {unknown}"
    assert env["RLJOB_OPERATOR_NAMESPACES"] == "ml-a,ml-b"
    assert env["RLJOB_OPERATOR_SERVICE_NAME"] == env["RLJOB_OPERATOR_LEASE_NAME"] == "rljob-operator"
    assert env["RLJOB_OPERATOR_TLS_SECRET"] == "rljob-operator-status-tls"
    settings = OperatorSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.namespaces == ["ml-a", "ml-b"] and settings.leader_elect is True
    assert settings.status_port == 8443 and settings.metrics_port == 8080
    svc = one(helm_template(), "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"https-status": 8443, "http-metrics": 8080}


def test_tls_from_a_mounted_secret_needs_no_secret_permissions() -> None:
    for source in (["--set", "statusAPI.tls.source=existingSecret,statusAPI.tls.secretName=my-tls"],
                   ["--set", "statusAPI.tls.source=certManager"]):
        docs = helm_template(*source)
        assert not any("secrets" in r.get("resources", []) for rules in rbac_rules(docs).values() for r in rules)
        spec = _pod_spec(docs)
        volume = next(v for v in spec["volumes"] if v["name"] == "status-tls")
        env = operator_env(one(docs, "Deployment"))
        assert env["RLJOB_OPERATOR_TLS_CERT_FILE"] == "/etc/rljob/tls/tls.crt"
        assert "RLJOB_OPERATOR_TLS_SECRET" not in env
        if "certManager" in source[1]:
            cert = one(docs, "Certificate", "rljob-operator-status")
            assert cert["spec"]["secretName"] == volume["secret"]["secretName"]
            assert "rljob-operator.rljob-system.svc" in cert["spec"]["dnsNames"]
        else:
            assert volume["secret"]["secretName"] == "my-tls"


def test_status_api_limits_reach_the_operator_and_bad_ones_are_refused() -> None:
    from rljob_operator.server.guard import StatusLimits
    from rljob_operator.settings import OperatorSettings

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["statusAPI"]["limits"]
    env = operator_env(one(helm_template("--set-json", "statusAPI.limits.ratePerClient=2.5"), "Deployment"))
    settings = OperatorSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.status_rate_per_client == 2.5
    assert (settings.status_max_in_flight, settings.status_burst_per_client, settings.status_review_threads,
            settings.status_negative_cache_seconds, settings.status_rate_per_job, settings.status_burst_per_job) == (
        defaults["maxInFlight"], defaults["burstPerClient"], defaults["reviewThreads"],
        defaults["negativeCacheSeconds"], defaults["ratePerJob"], defaults["burstPerJob"])
    # The chart's defaults are the operator's own.
    assert StatusLimits() == StatusLimits(defaults["maxInFlight"], defaults["ratePerClient"],
                                          defaults["burstPerClient"], defaults["reviewThreads"],
                                          defaults["negativeCacheSeconds"], defaults["ratePerJob"],
                                          defaults["burstPerJob"])
    for bad, where in (("maxInFlight=0", "/statusAPI/limits/maxInFlight"),
                       ("ratePerClient=0", "/statusAPI/limits/ratePerClient"),
                       ("ratePerJob=0", "/statusAPI/limits/ratePerJob"),
                       ("burstPerJob=0", "/statusAPI/limits/burstPerJob"),
                       ("negativeCacheSeconds=-1", "/statusAPI/limits/negativeCacheSeconds")):
        result = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION,
                      "--set", f"statusAPI.limits.{bad}", check=False)
        assert result.returncode != 0 and where in result.stderr, result.stderr


# ---------------------------------------------------------------------------- runtimes

DEFAULT_MARKER = "rljob.dev/is-default-runtime"
#: The restricted profile's securityContexts the chart's runtimes give the trainer pods (values runtimes.*).
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def runtimes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ClusterRLTrainingRuntimes among ``docs``, by name."""
    return {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRLTrainingRuntime")}


def default_runtimes(docs: list[dict[str, Any]]) -> list[str]:
    """Names of the runtimes marked as the default."""
    return sorted(name for name, d in runtimes(docs).items()
                  if (d["metadata"].get("annotations") or {}).get(DEFAULT_MARKER) == "true")


def test_the_chart_ships_a_default_gpu_runtime_and_a_cpu_one_built_from_its_values() -> None:
    docs = helm_template()
    shipped = runtimes(docs)
    assert sorted(shipped) == ["cpu", "default"] and default_runtimes(docs) == ["default"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for runtime in shipped.values():
        spec = runtime["spec"]
        assert spec["image"] == f"ghcr.io/rljob/trainer:{app_version}" and spec["imagePullPolicy"] == "IfNotPresent"
        assert spec["podTemplate"]["spec"] == {
            "serviceAccountName": "rljob-trainer", "securityContext": RESTRICTED_POD,
            "containers": [{"name": "trainer", "securityContext": RESTRICTED_CONTAINER}]}
        assert "checkpoint" not in spec and "imagePullSecrets" not in spec
        assert "metadata" not in spec["podTemplate"]
    assert shipped["default"]["spec"]["gpuResource"] == "nvidia.com/gpu"
    assert shipped["default"]["spec"]["limits"] == {"gpusPerWorker": {"max": 8}}
    assert shipped["cpu"]["spec"]["limits"] == {"gpusPerWorker": {"max": 0}}
    assert "gpuResource" not in shipped["cpu"]["spec"]
    # A CPU-only cluster marks "cpu" instead; "" marks none.
    assert default_runtimes(helm_template("--set", "runtimes.defaultName=cpu")) == ["cpu"]
    assert default_runtimes(helm_template("--set", "runtimes.defaultName=")) == []
    assert not runtimes(helm_template("--set", "runtimes.default.enabled=false,runtimes.cpu.enabled=false",
                                      "--set", "runtimes.defaultName="))


def test_runtime_values_reach_every_runtime_and_a_runtimes_spec_is_merged_over_them() -> None:
    docs = helm_template("-f", str(CHART / "ci" / "cpu-runtimes-values.yaml"),
                         "--set", "trainerServiceAccount.name=trainer",
                         "--set-json", 'runtimes.cpu.spec.podTemplate={"spec": {"securityContext": {"runAsUser": 2000},'
                                       ' "tolerations": [{"key": "cpu-pool", "operator": "Exists"}]}}')
    shipped = runtimes(docs)
    assert sorted(shipped) == ["big-cpu", "cpu"] and default_runtimes(docs) == ["cpu"]
    checkpoint = {"storage": "s3://ml-checkpoints/rljob", "endpointUrl": "https://s3.example.com",
                  "credentialsSecret": "s3-keys"}
    for spec in (r["spec"] for r in shipped.values()):
        assert spec["image"] == "registry.example.com/mirror/rljob-trainer:0.1.0" and spec["imagePullPolicy"] == "Always"
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["checkpoint"] == checkpoint
        assert spec["podTemplate"]["spec"]["serviceAccountName"] == "trainer"
    cpu = shipped["cpu"]["spec"]
    # Maps merge key by key (the values' securityContext keeps its other keys); a list replaces.
    assert cpu["podTemplate"]["spec"]["securityContext"] == {**RESTRICTED_POD, "runAsUser": 2000}
    assert cpu["podTemplate"]["spec"]["tolerations"] == [{"key": "cpu-pool", "operator": "Exists"}]
    assert cpu["limits"] == {"gpusPerWorker": {"max": 0}, "memoryPerWorker": {"default": "8Gi", "max": "32Gi"}}
    assert shipped["big-cpu"]["spec"]["podTemplate"]["spec"]["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "m7i.48xlarge"}
    # A zero or a false replaces the chart's value (Sprig's merge would keep the 8).
    zero = runtimes(helm_template("--set", "runtimes.default.spec.limits.gpusPerWorker.max=0"))
    assert zero["default"]["spec"]["limits"]["gpusPerWorker"]["max"] == 0
    # The trainers' ServiceAccount is named only while the chart makes it, or when named outright.
    no_account = runtimes(helm_template("--set", "trainerServiceAccount.create=false"))
    assert "serviceAccountName" not in no_account["cpu"]["spec"]["podTemplate"]["spec"]
    named = runtimes(helm_template("--set", "trainerServiceAccount.create=false,runtimes.serviceAccountName=s3-writer"))
    assert named["cpu"]["spec"]["podTemplate"]["spec"]["serviceAccountName"] == "s3-writer"
    digest = "sha256:" + "0" * 64
    pinned = runtimes(helm_template("--set", f"runtimes.image.digest={digest}"))
    assert pinned["default"]["spec"]["image"] == f"ghcr.io/rljob/trainer@{digest}"


@pytest.mark.parametrize("args,message", [
    (["--set", "runtimes.defaultName=gpu"],
     'runtimes.defaultName "gpu" names none of the chart\'s runtimes (cpu, default)'),
    (["--set", "runtimes.cpu.enabled=false,runtimes.defaultName=cpu"],
     'runtimes.defaultName "cpu" names none of the chart\'s runtimes (default)'),
    (["--set-json", 'runtimes.extra={"cpu": {"spec": {}}}'],
     'runtimes.extra.cpu: the chart already makes a runtime "cpu"'),
    (["--set", "runtimes.image.repository=registry.example.com/rljob-trainer"],
     'its image registry.example.com/rljob-trainer:0.1.0 matches none of podProfile.allowedImages'),
    (["--set-json", 'runtimes.extra={"mine": {"spec": {"image": "docker.io/someone/trainer:latest"}}}'],
     'runtime "mine": its image docker.io/someone/trainer:latest matches none of podProfile.allowedImages'),
], ids=["default-name-unknown", "default-name-disabled", "extra-collides", "image-not-allowed", "extra-image-not-allowed"])
def test_inconsistent_runtime_values_fail_with_a_message(args: list[str], message: str) -> None:
    result = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize("args,message", [
    (["--set", "runtimes.default.enable=false"], "additional properties 'enable' not allowed"),
    (["--set", "runtimes.defaultName=GPU_Nodes"], "/runtimes/defaultName"),
    (["--set", "runtimes.image.pullPolicy=Sometimes"], "/runtimes/image/pullPolicy"),
    (["--set-json", 'runtimes.extra={"Big_CPU": {"spec": {}}}'], "invalid propertyName 'Big_CPU'"),
    (["--set-json", 'runtimes.extra={"big": {"spec": {}, "open": true}}'], "additional properties 'open' not allowed"),
], ids=["typo", "default-name-not-a-name", "pull-policy", "extra-name", "extra-typo"])
def test_runtime_values_breaking_the_schema_are_rejected(args: list[str], message: str) -> None:
    result = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def _use_rules(rules: list[dict[str, Any]]) -> list[list[str]]:
    """resourceNames of each rule granting `use` (an empty list would grant every runtime)."""
    return [rule.get("resourceNames", []) for rule in rules if "use" in rule["verbs"]]


def test_job_creators_may_use_the_open_runtimes_by_name_and_namespace_admins_write_their_own() -> None:
    roles = {key[2]: rules for key, rules in rbac_rules(helm_template()).items()}
    assert _use_rules(roles["rljob-runtime-user"]) == [["cpu", "default"]]
    edit = roles["rljob-edit"]
    assert _use_rules(edit) == [["cpu", "default"]]
    assert {"apiGroups": ["rljob.dev"], "resources": ["rltrainingruntimes", "clusterrltrainingruntimes"],
            "verbs": ["get", "list", "watch"]} in edit
    assert not any("create" in r["verbs"] for r in edit if {"rltrainingruntimes", "clusterrltrainingruntimes"}
                   & set(r["resources"]))
    assert roles["rljob-admin"] == [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingruntimes"],
                                     "verbs": ["create", "update", "patch", "delete", "deletecollection", "use"]}]
    labels = {d["metadata"]["name"]: d["metadata"]["labels"] for d in helm_template() if d["kind"] == "ClusterRole"}
    assert labels["rljob-admin"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in labels["rljob-admin"]
    assert not any(k.startswith("rbac.authorization.k8s.io/aggregate") for k in labels["rljob-runtime-user"])
    # No ClusterRole of the chart can write a ClusterRLTrainingRuntime: the platform's own admins do.
    assert not any("clusterrltrainingruntimes" in r["resources"] and set(r["verbs"]) - {"get", "list", "watch", "use"}
                   for rules in roles.values() for r in rules)
    # A runtime closed to job creators is named by no role; with none open, no rule at all.
    ci = {key[2]: rules for key, rules in rbac_rules(helm_template(
        "-f", str(CHART / "ci" / "cpu-runtimes-values.yaml"))).items()}
    assert _use_rules(ci["rljob-runtime-user"]) == _use_rules(ci["rljob-edit"]) == [["cpu"]]
    closed = {key[2]: rules for key, rules in rbac_rules(helm_template(
        "--set", "runtimes.default.openToJobCreators=false,runtimes.cpu.openToJobCreators=false")).items()}
    assert "rljob-runtime-user" not in closed and _use_rules(closed["rljob-edit"]) == []


@pytest.mark.parametrize("name,args", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_runtime_the_chart_renders_validates_with_rljob_validate(name: str, args: list[str],
                                                                       tmp_path: Path) -> None:
    shipped = runtimes(helm_template(*args))
    for runtime_name, runtime in shipped.items():
        path = tmp_path / f"{runtime_name}.yaml"
        path.write_text(yaml.safe_dump(runtime))
        result = run([str(REPO / ".venv/bin/python"), "-m", "rljob", "validate", str(path)], check=False)
        assert result.returncode == 0, f"{runtime_name}: {result.stdout}{result.stderr}"


@pytest.mark.parametrize("default", ["default", "cpu"])
def test_the_quickstart_validates_unchanged_on_the_default_runtime_of_a_gpu_and_of_a_cpu_cluster(
        default: str, tmp_path: Path) -> None:
    """``rljob validate --runtime`` checks a job against the runtime it would run on (the one marked as the
    default): the quickstart, which names none, is within the bounds of either."""
    path = tmp_path / "runtimes.yaml"
    path.write_text(yaml.safe_dump_all(list(runtimes(helm_template("--set", f"runtimes.defaultName={default}")).values())))
    result = run([str(REPO / ".venv/bin/python"), "-m", "rljob", "validate", str(REPO / "examples" / "quickstart.yaml"),
                  "--runtime", str(path)], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # Asked for two GPUs (one per process) on the cpu runtime, it would not be.
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(yaml.safe_dump(deep_update(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()),
                                               {"spec": {"workers": {"gpusPerWorker": 2}}})))
    refused = run([str(REPO / ".venv/bin/python"), "-m", "rljob", "validate", str(gpus), "--runtime", str(path)],
                  check=False)
    assert (refused.returncode != 0) == (default == "cpu"), refused.stdout + refused.stderr
    if default == "cpu":
        assert "spec.workers.gpusPerWorker" in refused.stdout + refused.stderr


def _kustomized_runtimes(overlay_docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: {"spec": d["spec"], "default": (d["metadata"].get("annotations") or {}).get(DEFAULT_MARKER)}
            for name, d in runtimes(overlay_docs).items()}


def test_kustomize_ships_the_charts_runtimes_and_user_roles() -> None:
    validated = run([str(REPO / ".venv/bin/python"), "-m", "rljob", "validate", str(MANIFESTS / "base" / "runtimes.yaml")],
                    check=False)
    assert validated.returncode == 0 and validated.stdout.count(": ok") == 2, validated.stdout + validated.stderr
    chart = helm_template()
    for overlay in ("cluster-wide", "single-namespace"):
        docs = kustomize_build(overlay)
        assert _kustomized_runtimes(docs) == _kustomized_runtimes(chart), overlay
        users = {k[2]: v for k, v in rbac_rules(docs).items() if k[2] in ("rljob-runtime-user", "rljob-edit",
                                                                           "rljob-admin", "rljob-view")}
        assert users == {k[2]: v for k, v in rbac_rules(chart).items() if k[2] in users} and len(users) == 4
        for d in docs:
            if d["kind"] == "ClusterRole" and d["metadata"]["name"] in users:
                chart_labels = one(chart, "ClusterRole", d["metadata"]["name"])["metadata"]["labels"]
                aggregate = {k: v for k, v in chart_labels.items() if k.startswith("rbac.authorization.k8s.io/")}
                assert aggregate.items() <= d["metadata"]["labels"].items()


def test_the_cpu_default_component_is_the_charts_runtimes_default_name_cpu(tmp_path: Path) -> None:
    """The kustomize component for clusters without GPUs marks "cpu" and asks the admission policy for its `use`."""
    import shutil

    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    overlay = copy / "overlays" / "cpu-only"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../cluster-wide"], "components": ["../../components/cpu-default"]}))
    built = run([str(bin_dir() / "kubectl"), "kustomize", str(overlay)]).stdout
    assert go_differences(built) == []  # read by kubectl as by these tests
    docs = [d for d in yaml.safe_load_all(built) if d]
    chart = helm_template("--set", "runtimes.defaultName=cpu")
    assert _kustomized_runtimes(docs) == _kustomized_runtimes(chart)
    assert default_runtimes(docs) == ["cpu"]

    def policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
        # kustomize re-folds the `>-` scalars (the line breaks of CEL, not its tokens, differ).
        found = one(objects, "ValidatingAdmissionPolicy", "rljob-runtime-use")
        return {v["name"]: " ".join(v["expression"].split()) for v in found["spec"]["variables"]}

    assert policy(docs) == policy(chart) and policy(docs)["defaultRuntime"] == "'cpu'"


# ------------------------------------------------------------------------------- RBAC

#: The operator's rules on jobs and their children (charts/rljob/templates/_helpers.tpl).
JOB_RULES = [
    {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs/status"], "verbs": ["patch"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rlexperiments"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rlexperiments/status"], "verbs": ["patch"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rlexperiments/finalizers"], "verbs": ["update"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["create", "patch"]},
    {"apiGroups": ["rljob.dev"], "resources": ["rltrainingruntimes"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["delete"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["patch"]},
]

CAPACITY_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                  {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
#: Runtimes are cluster-scoped (and a ClusterRLTrainingRuntime's namespaceSelector reads Namespaces): read-only, in every mode.
RUNTIME_RULES = [{"apiGroups": ["rljob.dev"], "resources": ["clusterrltrainingruntimes"], "verbs": ["list", "watch"]},
                 {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]
KUEUE_RULES = [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors", "workloadpriorityclasses"],
                "verbs": ["get"]}]
ADMISSION_RULES = [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"],
                    "resourceNames": ["rljob-job-references", "rljob-queues", "rljob-runtime-use",
                                      "rljob-runtime-references", "rljob-worker-pods"], "verbs": ["get"]},
                   {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicybindings"],
                    "verbs": ["list"]}]


def test_cluster_wide_install_binds_job_rules_cluster_wide_and_the_rest_narrowly() -> None:
    rbac = operator_rbac(helm_template())
    assert rbac[("ClusterRole", "", "rljob-operator")] == JOB_RULES
    assert [r["resources"] for r in rbac[("ClusterRole", "", "rljob-operator-reviews")]] == [
        ["tokenreviews"], ["subjectaccessreviews"]]
    # Autoscaling policy Capacity reads nodes and bound pods (and nodes are watched for deletions), and
    # nothing else, and writes nothing.
    assert rbac[("ClusterRole", "", "rljob-operator-capacity")] == CAPACITY_RULES
    # Kueue: the flavors an admission assigns and the priority classes jobs name, read-only.
    assert rbac[("ClusterRole", "", "rljob-operator-kueue")] == KUEUE_RULES
    # Runtimes and the namespaces' labels, read-only.
    assert rbac[("ClusterRole", "", "rljob-operator-runtimes")] == RUNTIME_RULES
    # Are the admission policies in force? Its own five policies by name, and the bindings (issue #43 point 6).
    assert rbac[("ClusterRole", "", "rljob-operator-admission")] == ADMISSION_RULES
    assert set(rbac) == {("ClusterRole", "", "rljob-operator"), ("ClusterRole", "", "rljob-operator-reviews"),
                         ("ClusterRole", "", "rljob-operator-capacity"), ("ClusterRole", "", "rljob-operator-kueue"),
                         ("ClusterRole", "", "rljob-operator-runtimes"), ("ClusterRole", "", "rljob-operator-admission"),
                         ("Role", "rljob-system", "rljob-operator-lease"),
                         ("Role", "rljob-system", "rljob-operator-tls")}
    without = operator_rbac(helm_template("--set", "rbac.capacityAutoscaling=false"))
    assert ("ClusterRole", "", "rljob-operator-capacity") not in without
    no_kueue = operator_rbac(helm_template("--set", "kueue.enabled=false"))
    assert ("ClusterRole", "", "rljob-operator-kueue") not in no_kueue
    assert no_kueue[("ClusterRole", "", "rljob-operator")] == [r for r in JOB_RULES if r["apiGroups"] != ["kueue.x-k8s.io"]]


def test_watch_namespaces_install_grants_job_rules_only_in_those_namespaces() -> None:
    docs = helm_template("--set", "watchNamespaces={ml-a,ml-b}")
    rbac = operator_rbac(docs)
    assert rbac[("Role", "ml-a", "rljob-operator")] == rbac[("Role", "ml-b", "rljob-operator")] == JOB_RULES
    cluster_roles = {k for k in rbac if k[0] == "ClusterRole"}
    assert cluster_roles == {("ClusterRole", "", "rljob-operator-reviews"), ("ClusterRole", "", "rljob-operator-runtimes"),
                             ("ClusterRole", "", "rljob-operator-capacity"),
                             ("ClusterRole", "", "rljob-operator-kueue"), ("ClusterRole", "", "rljob-operator-admission")}
    assert rbac[("ClusterRole", "", "rljob-operator-runtimes")] == RUNTIME_RULES
    # Trainers get a ServiceAccount without any binding in each watched namespace.
    trainers = [d for d in by_kind(docs, "ServiceAccount") if d["metadata"]["name"] == "rljob-trainer"]
    assert sorted(d["metadata"]["namespace"] for d in trainers) == ["ml-a", "ml-b"]
    assert all(d["automountServiceAccountToken"] is False for d in trainers)
    bound = [s for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in b["subjects"]]
    assert not any(s["name"] == "rljob-trainer" for s in bound)


def test_kustomize_overlays_grant_exactly_what_the_chart_grants() -> None:
    helm_cluster = operator_rbac(helm_template())
    assert operator_rbac(kustomize_build("cluster-wide")) == helm_cluster
    helm_single = operator_rbac(helm_template("--set", "watchNamespaces={rljob}", namespace="rljob"))
    assert operator_rbac(kustomize_build("single-namespace")) == helm_single


@pytest.mark.parametrize("overlay,namespace,helm_args", [
    ("cluster-wide", "rljob-system", []),
    ("single-namespace", "rljob", ["--set", "watchNamespaces={rljob}"]),
])
def test_kustomize_deployment_matches_the_chart(overlay: str, namespace: str, helm_args: list[str]) -> None:
    docs = kustomize_build(overlay)
    chart = helm_template(*helm_args, namespace=namespace)
    deployment, chart_deployment = one(docs, "Deployment"), one(chart, "Deployment")
    env, chart_env = operator_env(deployment), operator_env(chart_deployment)
    if overlay == "single-namespace":  # the overlay watches its own namespace, whatever it is named
        assert env.pop("RLJOB_OPERATOR_NAMESPACES") == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert chart_env.pop("RLJOB_OPERATOR_NAMESPACES") == namespace
    assert env == chart_env
    container, chart_container = (d["spec"]["template"]["spec"]["containers"][0] for d in (deployment, chart_deployment))
    for key in ("image", "command", "ports", "securityContext", "resources", "startupProbe", "livenessProbe",
                "readinessProbe", "volumeMounts"):
        assert container[key] == chart_container[key], key
    spec, chart_spec = deployment["spec"]["template"]["spec"], chart_deployment["spec"]["template"]["spec"]
    for key in ("securityContext", "volumes", "serviceAccountName", "nodeSelector", "affinity"):
        assert spec[key] == chart_spec[key], key
    assert deployment["spec"]["selector"] == chart_deployment["spec"]["selector"]
    assert one(docs, "Service")["spec"] == one(chart, "Service")["spec"]
    # Every kustomized object carries the standard labels and lives in the overlay's namespace.
    for d in docs:
        labels = d["metadata"].get("labels") or {}
        assert all(k in labels for k in STANDARD_LABELS), f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"]["namespace"] == namespace
    assert one(docs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_monitoring_objects_render_with_the_rules_file_and_the_dashboard() -> None:
    docs = helm_template("--set", "serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true",
                         "--set", "prometheusRule.labels.release=kube-prometheus-stack")
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    limits = {k: monitor["spec"][k] for k in ("sampleLimit", "labelLimit", "labelNameLengthLimit",
                                              "labelValueLengthLimit")}
    assert limits == {"sampleLimit": 2000, "labelLimit": 30, "labelNameLengthLimit": 200, "labelValueLengthLimit": 2048}
    tighter = one(helm_template("--set", "podMonitor.enabled=true,podMonitor.sampleLimit=500"), "PodMonitor")
    assert tighter["spec"]["sampleLimit"] == 500
    assert monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["targetLabel"] == "rljob_job"
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "http-metrics"
    dashboard = one(docs, "ConfigMap", "rljob-dashboard")
    assert json.loads(dashboard["data"]["rljob.json"]) == json.loads(
        (CHART / "files" / "dashboards" / "rljob.json").read_text())
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & {d["kind"] for d in helm_template()}


# ------------------------------------------------------------------------- network


#: Prometheus as networkPolicy.monitoring says by default.
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
TRAINERS = {"matchLabels": {"app.kubernetes.io/managed-by": "rljob-operator"}}


def _ingress_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Each rule's port → its ``from`` peers (every rule of ours names exactly one TCP port)."""
    out = {}
    for rule in policy["spec"]["ingress"]:
        assert [p["protocol"] for p in rule["ports"]] == ["TCP"], rule
        out[rule["ports"][0]["port"]] = rule["from"]
    return out


def test_network_policies_are_on_by_default_and_admit_only_trainers_and_prometheus() -> None:
    from rljob_operator.settings import OperatorSettings

    docs = helm_template()
    policy = one(docs, "NetworkPolicy", "rljob-operator")
    assert policy["spec"]["podSelector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _ingress_by_port(policy) == {8443: [{"namespaceSelector": {}, "podSelector": TRAINERS}],
                                        8080: [PROMETHEUS]}
    # The operator gives every job its own policy, with Prometheus (the same selectors) as scraper.
    settings = OperatorSettings.from_env({k: v for k, v in operator_env(one(docs, "Deployment")).items()
                                          if isinstance(v, str)})
    assert settings.network_policy is True and settings.trainer_metrics_from == [PROMETHEUS]

    namespaced = one(helm_template("--set", "watchNamespaces={ml-a,ml-b}", "--set-json",
                                   'networkPolicy.statusAPIFrom=[{"podSelector":{"matchLabels":{"app":"ui"}}}]'),
                     "NetworkPolicy")
    assert _ingress_by_port(namespaced)[8443] == [
        {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml-a", "ml-b"]}]},
         "podSelector": TRAINERS},
        {"podSelector": {"matchLabels": {"app": "ui"}}}]


def _jobs_policy(*helm_args: str) -> dict[str, Any]:
    """The spec of the NetworkPolicy the chart's operator (its rendered settings) gives a job."""
    from rljob_contract.job import parse_job
    from rljob_operator.decisions.children import JobNetwork, desired_network_policy
    from rljob_operator.settings import OperatorSettings

    from tests.support.operator_process import job_manifest

    env = {k: v for k, v in operator_env(one(helm_template(*helm_args), "Deployment")).items() if isinstance(v, str)}
    settings = OperatorSettings.from_env(env)
    network = JobNetwork(tuple(settings.trainer_metrics_from), settings.egress())
    return desired_network_policy(parse_job(job_manifest("st"), "st"), network)["spec"]  # type: ignore[no-any-return]


def test_trainer_egress_is_restricted_by_default_and_never_reaches_the_metadata_endpoints() -> None:
    from tests.operator.test_egress import METADATA_ENDPOINTS, allowed

    spec = _jobs_policy()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert allowed(spec, "52.216.8.10", 443) and allowed(spec, "2600:1f18::1", 443)  # object storage
    for address in METADATA_ENDPOINTS:  # every cloud's, as docs/egress.md lists them
        assert not any(allowed(spec, address, port) for port in (80, 443, 53)), address
    assert not allowed(spec, "52.216.8.10", 22)
    # The chart's DNS peers, status API namespace and port.
    dns, status = spec["egress"][1], spec["egress"][2]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert status == {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rljob-system"}}}],
                      "ports": [{"protocol": "TCP", "port": 8443}]}
    # The platform cuts out its API server and Service range, and opens its own object store's port.
    tight = _jobs_policy("--set-json", 'networkPolicy.trainerEgress.exceptCIDRs=["10.96.0.0/12","172.20.0.10/32"]',
                         "--set-json", "networkPolicy.trainerEgress.ports=[443,9000]")
    assert not allowed(tight, "10.96.0.1", 443) and not allowed(tight, "172.20.0.10", 443)
    assert allowed(tight, "172.20.0.11", 9000) and not allowed(tight, "169.254.169.254", 9000)
    assert _jobs_policy("--set", "networkPolicy.trainerEgress.enabled=false")["policyTypes"] == ["Ingress"]


def test_an_empty_monitoring_namespace_selector_is_refused() -> None:
    """It would let any pod that carries Prometheus' labels, in any namespace, reach /metrics."""
    for empty in ("null", '{"matchLabels": {"kubernetes.io/metadata.name": null}}'):  # {} merges with the default
        result = helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION,
                      "--set-json", f"networkPolicy.monitoring.namespaceSelector={empty}", check=False)
        assert result.returncode != 0 and "networkPolicy.monitoring.namespaceSelector must select" in result.stderr


def test_network_policies_off_means_no_policy_and_no_rights_on_them() -> None:
    from rljob_operator.settings import OperatorSettings

    docs = helm_template("--set", "networkPolicy.enabled=false")
    assert not by_kind(docs, "NetworkPolicy")
    rules = operator_rbac(docs)[("ClusterRole", "", "rljob-operator")]
    assert rules == [r for r in JOB_RULES if r["resources"] != ["networkpolicies"]]
    env = {k: v for k, v in operator_env(one(docs, "Deployment")).items() if isinstance(v, str)}
    assert "RLJOB_OPERATOR_TRAINER_METRICS_FROM" not in env
    assert OperatorSettings.from_env(env).network_policy is False


def test_kustomize_network_policies_match_the_chart() -> None:
    chart = one(helm_template(), "NetworkPolicy")
    cluster_wide = one(kustomize_build("cluster-wide"), "NetworkPolicy")
    assert cluster_wide["spec"] == chart["spec"]
    # One namespace: trainers of that namespace only (a peer without namespaceSelector).
    single = one(kustomize_build("single-namespace"), "NetworkPolicy")
    assert _ingress_by_port(single) == {8443: [{"podSelector": TRAINERS}], 8080: [PROMETHEUS]}
