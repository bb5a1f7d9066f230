"""Jobs on the real node watched through a real Prometheus, as the chart's monitors and rules say.

The chart is installed with the operator in a real pod (its Service, as the ServiceMonitor selects it), and
a Prometheus server (built from promtool's module) scrapes through the test API server as the chart's
PodMonitor and ServiceMonitor would have the Prometheus Operator do (``tests/cluster/prometheus.py``), with
the chart's rules (``charts/rljob/files/alerts.yaml``) evaluated every second. Two jobs train side by side:

* "steady" (GRPO on the held-out task, a reference model, checkpoints in the S3 test server): every query of
  the shipped Grafana dashboard returns series for it, but those of GPUs, which this node has not; the
  dashboard's key panels are drawn from the same series (``rljob/dashboard.py``), as ``rljob train`` draws
  them from its log;
* "collapsing" (the DAPO setting of issue #47: every completion runs to maxCompletionLength, so DAPO masks
  the whole batch out of the loss): its health alert fires, never the steady job's, and resolves once the
  run is gone.

Run by ``make e2e`` (``pytest -m realnode``), never by ``make test``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob.dashboard import KEY_PANELS, plot_dashboard
from tests.cluster.prometheus import PrometheusServer, prometheus_config, scrape_configs
from tests.cluster.realnode import real_node_bin_dir
from tests.cluster.waiting import wait_for
from tests.delivery.test_alerts import ALERTS, DASHBOARD
from tests.delivery.test_chart import CHART, KUBE_VERSION, helm
from tests.e2e.conftest import image_values
from tests.e2e.test_real_node_jobs_cluster import E2E_VALUES, real_job, s3_secret
from tests.support.operator_process import create_job, job_pods
from tests.support.s3_server import MotoServer

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

RELEASE = "rljob"
#: Scrapes every 2 s (the chart's values; its defaults are 15 s and 30 s): a test need not wait minutes.
FAST_MONITORS = ("--set", "podMonitor.enabled=true", "--set", "serviceMonitor.enabled=true",
                 "--set", "podMonitor.interval=2s", "--set", "serviceMonitor.interval=2s",
                 "--set", "serviceMonitor.scrapeTimeout=1s")
#: The dashboard's panels with no series on a node without GPUs (the trainer exports them only with one).
GPU_ONLY = ("rljob_trainer_gpu_utilization_ratio", "rljob_trainer_gpu_memory_bytes")
#: The health alert the collapsing run trips first (window 3 steps), and the other the DAPO collapse trips.
MASKED, COLLAPSE = "RLTrainingJobMaskedBatch", "RLTrainingJobEntropyCollapse"

HELD_OUT_TASK = {
    "dataset": {"name": "builtin:first-char", "size": 2048},
    "evaluation": {"heldOutFraction": 0.2, "everySteps": 10, "maxPrompts": 32,
                   "metrics": [{"name": "exact_match", "kwargs": {"prefix": True}}]},
}


def steady_job() -> dict[str, Any]:
    """GRPO on the held-out task with a reference model (beta: the KL panel) and S3 checkpoints every 10 steps
    (the checkpoint panels), slow enough to outlast the test (deleted at its end)."""
    training = dict(HELD_OUT_TASK)
    training.update(maxSteps=5000, learningRate=0.001, beta=0.04)
    return real_job("steady", {"workers": {"replicas": 1}, "training": training,
                               "checkpoint": {"everySteps": 10, "keepLast": 1}})


def collapsing_job() -> dict[str, Any]:
    """The DAPO arm of the old strategies example: six-character answers in six tokens, so every completion is
    truncated and masked out of DAPO's loss."""
    training = {k: v for k, v in HELD_OUT_TASK.items() if k != "evaluation"}
    training.update(strategy="dapo", maxSteps=5000, maxCompletionLength=6)
    return real_job("collapsing", {"workers": {"replicas": 1}, "training": training,
                                   "checkpoint": {"everySteps": 100000, "keepLast": 1}})


def monitors(operator_ns: str, jobs_ns: str) -> list[dict[str, Any]]:
    """The chart's PodMonitor and ServiceMonitor, rendered as the release was installed."""
    out = helm("template", RELEASE, str(CHART), "--namespace", operator_ns, "--kube-version", KUBE_VERSION,
               "-f", str(E2E_VALUES), "--set", f"trainerServiceAccount.namespaces={{{jobs_ns}}}", *FAST_MONITORS,
               "--show-only", "templates/podmonitor.yaml", "--show-only", "templates/servicemonitor.yaml").stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture
def installed(real_node: Any, kube: Any, tmp_path: Path, bucket: tuple[MotoServer, str],
              dev_images: dict[str, str]) -> Iterator[tuple[str, str]]:
    """The chart installed with the operator image in a pod on the real node, its runtime "cpu" checkpointing to
    the S3 test server, both images pulled by digest from the session's registry; yields (the operator's
    namespace, the jobs' namespace) once the operator is Ready."""
    from tests.delivery.test_install_cluster import chart_installed

    server, bucket_name = bucket
    storage = {"storage": f"s3://{bucket_name}/rljob", "endpointUrl": server.endpoint, "credentialsSecret": "s3-keys"}
    suffix = tmp_path.name[-6:].lower().replace("_", "")
    operator_ns, jobs_ns = f"rljob-mon-{suffix}", f"rljob-watched-{suffix}"
    with chart_installed(real_node, kube, tmp_path / "helm", RELEASE, operator_ns, jobs_ns, "-f", str(E2E_VALUES),
                         *image_values(dev_images["trainer"], dev_images["operator"]), "--set", "replicaCount=1",
                         "--set-string", "nodeSelector.rljob\\.dev/real-node=true",
                         "--set-json", f"runtimes.checkpoint={json.dumps(storage)}"):
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
        wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                             for p in kube.list_pods(operator_ns, selector)
                             for c in p["status"].get("conditions") or []), 300, message="the operator pod Ready")
        yield operator_ns, jobs_ns


@pytest.fixture
def prometheus(real_node: Any, installed: tuple[str, str], tmp_path: Path) -> Iterator[PrometheusServer]:
    jobs = scrape_configs(monitors(*installed), real_node.admin_kubeconfig)
    server = PrometheusServer(Path(real_node_bin_dir(build=False)["prometheus"]), tmp_path / "prometheus")
    server.start(prometheus_config(jobs, [server.directory / ALERTS.name]), [ALERTS])
    try:
        yield server
    finally:
        server.stop()


def dashboard_queries(namespace: str, job: str) -> list[tuple[str, str]]:
    """(panel title, query) of every target of the shipped dashboard, Grafana's variables set for ``job``."""
    values = {"$__rate_interval": "1m", "$__range": "30m", "$namespace": namespace, "$job": job}
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in values.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


def health_alerts(prometheus: PrometheusServer, namespace: str) -> dict[tuple[str, str], str]:
    """(alert, job) → state of the health alerts of ``namespace``'s jobs pending or firing now."""
    return {(a["labels"]["alertname"], a["labels"].get("rljob_job", "")): a["state"] for a in prometheus.alerts()
            if a["labels"].get("namespace") == namespace and a["labels"]["alertname"].startswith("RLTrainingJob")}


def test_prometheus_scrapes_the_jobs_as_the_chart_monitors_say_and_the_health_alert_fires_and_resolves(
        real_node: Any, kube: Any, installed: tuple[str, str], prometheus: PrometheusServer,
        tmp_path: Path) -> None:
    operator_ns, jobs_ns = installed
    s3_secret(kube, jobs_ns)
    create_job(kube, jobs_ns, steady_job())
    create_job(kube, jobs_ns, collapsing_job())
    seen: dict[tuple[str, str], str] = {}

    def every_query_answers() -> list[tuple[str, str]] | None:
        seen.update(health_alerts(prometheus, jobs_ns))
        empty = [(title, q) for title, q in dashboard_queries(jobs_ns, "steady") if not prometheus.query(q)]
        return None if [q for _, q in empty if not any(m in q for m in GPU_ONLY)] else empty

    try:
        empty = wait_for(every_query_answers, 600, interval=3, message="every dashboard query answering for steady")
    except TimeoutError as error:
        targets = [(t["scrapePool"], t["labels"].get("pod"), t["health"], t["lastError"]) for t in prometheus.targets()]
        raise AssertionError(f"{error}; Prometheus's targets: {targets}") from None
    assert {title for title, _ in empty} == {"GPU utilisation", "GPU memory allocated"}, empty
    # Scraped as the monitors say: worker 0 of each job (rank 0 serves the metrics), and the operator's Service.
    pools = {(t["scrapePool"], t["labels"].get("pod", "")) for t in prometheus.targets() if t["health"] == "up"}
    assert pools >= {
        (f"podMonitor/{operator_ns}/{RELEASE}-trainers/0", "steady-worker-0"),
        (f"podMonitor/{operator_ns}/{RELEASE}-trainers/0", "collapsing-worker-0")}, pools
    assert any(pool == f"serviceMonitor/{operator_ns}/{RELEASE}-operator/0" for pool, _ in pools), pools
    # The dashboard's key panels drawn from the same series (what rljob train draws from its log).
    drawn = plot_dashboard(live_panels(prometheus, jobs_ns), tmp_path / "dashboard.png", xlabel="seconds ago")
    assert drawn is not None and drawn.stat().st_size > 10_000

    def alert_fired() -> bool:
        seen.update(health_alerts(prometheus, jobs_ns))
        return seen.get((MASKED, "collapsing")) == "firing"

    wait_for(alert_fired, 300, interval=2, message=f"{MASKED} firing for the collapsing run")
    # The collapsing run's alert resolves once it is gone (its target ends: Prometheus marks its series stale).
    kube.request("DELETE", kube.job_path(jobs_ns, "collapsing"))
    wait_for(lambda: not job_pods(kube, jobs_ns, "collapsing"), 300, message="the collapsing run's pods gone")
    wait_for(lambda: (MASKED, "collapsing") not in health_alerts(prometheus, jobs_ns), 120,
             message=f"{MASKED} resolved for the collapsing run")
    seen.update(health_alerts(prometheus, jobs_ns))
    # The steady job trained through all of it without a collapse or masking alert.
    assert not {(name, job) for name, job in seen if job == "steady" and name in (MASKED, COLLAPSE)}, seen


def live_panels(prometheus: PrometheusServer, namespace: str) -> list[tuple[str, dict[str, list[tuple[float, float]]]]]:
    """The key panels' series of the steady job over the last 10 minutes, by the dashboard's own queries."""
    queries: dict[str, list[str]] = {}
    for title, expr in dashboard_queries(namespace, "steady"):
        queries.setdefault(title, []).append(expr)
    now, panels = time.time(), []
    for panel in KEY_PANELS:
        series: dict[str, list[tuple[float, float]]] = {}
        for expr in queries[panel.title]:
            for result in prometheus.query_range(expr, 600):
                labels = {k: v for k, v in result["metric"].items() if k not in ("namespace", "rljob_job")}
                legend = ",".join(labels.values()) or expr.split("(")[-1].split("{")[0]
                series[legend] = [(float(t) - now, float(v)) for t, v in result["values"]]
        panels.append((panel.title, series))
    return panels
