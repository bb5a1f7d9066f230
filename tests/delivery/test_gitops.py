"""GitOps examples (manifests/gitops): the Argo CD health check for RLTrainingJob, run on
gopher-lua exactly as Argo CD runs it, and the Argo CD / Flux objects pointing at real paths
with values the chart accepts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.delivery.test_chart import CHART, KUBE_VERSION, MANIFESTS, REPO, helm, run

ARGOCD = MANIFESTS / "gitops" / "argocd"
HEALTH = ARGOCD / "health" / "rljob.dev" / "RLTrainingJob"
HARNESS = ARGOCD / "luahealth"


def _luahealth() -> Path:
    """The gopher-lua harness, built once per source version into rljob's cache."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is needed to build the Lua health-check harness (it also builds the cluster binaries)")
    digest = hashlib.sha256(b"".join((HARNESS / f).read_bytes() for f in ("main.go", "go.mod", "go.sum")))
    cache = Path(os.environ.get("RLJOB_CACHE", Path.home() / ".cache" / "rljob")) / "bin"
    binary = cache / f"luahealth-{digest.hexdigest()[:12]}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0"}
        run([go, "build", "-o", f"{binary}.tmp", "."], cwd=HARNESS, env=env)
        os.replace(f"{binary}.tmp", binary)
    return binary


def health_of(objects: list[dict[str, Any]], script: Path = HEALTH / "health.lua") -> list[dict[str, str]]:
    out = run([str(_luahealth()), str(script)], input=json.dumps(objects))
    return list(json.loads(out.stdout))


def test_health_check_gives_each_phase_its_argo_cd_health() -> None:
    cases = yaml.safe_load((HEALTH / "health_test.yaml").read_text())["tests"]
    objects = [yaml.safe_load((HEALTH / c["inputPath"]).read_text()) for c in cases]
    assert {o["status"]["phase"] for o in objects if "status" in o} == {
        "Starting", "Running", "Succeeded", "Failed", "Suspended"}
    for case, got in zip(cases, health_of(objects), strict=True):
        assert got == case["healthStatus"], case["inputPath"]


def test_health_check_follows_the_operators_conditions_over_a_stale_phase() -> None:
    running = yaml.safe_load((HEALTH / "testdata" / "running.yaml").read_text())
    stalled = json.loads(json.dumps(running))
    for condition in stalled["status"]["conditions"]:
        if condition["type"] == "Stalled":
            condition["status"] = "True"
    not_ready = json.loads(json.dumps(running))
    for condition in not_ready["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "False"
    no_conditions = json.loads(json.dumps(running))
    del no_conditions["status"]["conditions"]
    got = [h["status"] for h in health_of([stalled, not_ready, no_conditions])]
    assert got == ["Degraded", "Progressing", "Progressing"]


def test_argocd_cm_patch_embeds_the_tested_script() -> None:
    cm = yaml.safe_load((ARGOCD / "argocd-cm-rltrainingjob-health.yaml").read_text())
    assert cm["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}
    assert cm["data"]["resource.customizations.health.rljob.dev_RLTrainingJob"] == (HEALTH / "health.lua").read_text()


def _values_accepted(values: dict[str, Any], folder: Path) -> None:
    """The chart renders with these values (schema and templates)."""
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm("template", "rljob", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(path))


def test_argocd_applications_point_at_the_chart_and_the_overlay(tmp_path: Path) -> None:
    helm_app = yaml.safe_load((ARGOCD / "application-helm.yaml").read_text())
    source = helm_app["spec"]["source"]
    assert (REPO / source["path"] / "Chart.yaml").exists()
    _values_accepted(source["helm"]["valuesObject"], tmp_path)
    assert "ServerSideApply=true" in helm_app["spec"]["syncPolicy"]["syncOptions"]
    kustomize_app = yaml.safe_load((ARGOCD / "application-kustomize.yaml").read_text())
    assert (REPO / kustomize_app["spec"]["source"]["path"] / "kustomization.yaml").exists()
    for path in ARGOCD.glob("application-*.yaml"):
        app = yaml.safe_load(path.read_text())
        assert app["apiVersion"] == "argoproj.io/v1alpha1" and app["kind"] == "Application", path.name
    # The runtimes come with their CRDs: the first sync's dry run would refuse them.
    for app in (helm_app, kustomize_app):
        assert "SkipDryRunOnMissingResource=true" in app["spec"]["syncPolicy"]["syncOptions"]


def test_flux_helmrelease_values_are_accepted_by_the_chart(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((MANIFESTS / "gitops" / "flux" / "helmrelease.yaml").read_text()))
    release = next(d for d in docs if d["kind"] == "HelmRelease")
    assert (REPO / release["spec"]["chart"]["spec"]["chart"] / "Chart.yaml").exists()
    _values_accepted(release["spec"]["values"], tmp_path)
    # The runtime kinds' CRDs are in the chart's crds/ folder: created on install, replaced on upgrade.
    assert (release["spec"]["install"]["crds"], release["spec"]["upgrade"]["crds"]) == ("Create", "CreateReplace")
    jobs = yaml.safe_load((MANIFESTS / "gitops" / "flux" / "kustomization-jobs.yaml").read_text())
    assert jobs["spec"]["wait"] is True  # kstatus on the jobs' conditions, no custom check needed
