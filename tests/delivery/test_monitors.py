"""The chart's PodMonitor and ServiceMonitor as the plain scrape configuration ``make e2e``'s Prometheus uses.

``tests/cluster/prometheus.py`` translates the monitors as the Prometheus Operator does; here the result of
the chart's own monitors is checked by ``promtool check config`` (the server's own config loader), and the
selectors it keeps on are the labels and port the operator gives worker 0's pod (and worker 1's lacks).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.prometheus import label_name, prometheus_config, scrape_configs
from tests.delivery.test_alerts import ALERTS
from tests.delivery.test_chart import bin_dir, helm_template, run

MONITORS = ("--set", "podMonitor.enabled=true", "--set", "serviceMonitor.enabled=true",
            "--show-only", "templates/podmonitor.yaml", "--show-only", "templates/servicemonitor.yaml")


def chart_monitors(*values: str) -> list[dict[str, Any]]:
    return helm_template(*MONITORS, *values)


def pod_targets(pod: dict[str, Any]) -> list[dict[str, str]]:
    """The kubernetes_sd meta labels (role pod) of each container port of ``pod``, as Prometheus makes them."""
    labels = {}
    for key, value in pod["metadata"]["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{label_name(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{label_name(key)}"] = "true"
    labels["__meta_kubernetes_pod_phase"] = pod["status"]["phase"]
    return [{**labels, "__meta_kubernetes_pod_container_port_name": port.get("name", "")}
            for c in pod["spec"]["containers"] for port in c.get("ports") or []]


def kept(job: dict[str, Any], target: dict[str, str]) -> bool:
    """Whether the job's keep and drop rules let ``target`` through (Prometheus' fullmatch on joined values)."""
    for rule in job["relabel_configs"]:
        if rule.get("action") not in ("keep", "drop"):
            continue
        value = ";".join(target.get(name, "") for name in rule["source_labels"])
        if bool(re.fullmatch(rule["regex"], value)) != (rule["action"] == "keep"):
            return False
    return True


def test_the_chart_monitors_translate_to_a_config_promtool_accepts(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    (tmp_path / "alerts.yaml").write_text(ALERTS.read_text())
    jobs = scrape_configs(chart_monitors("--set", "podMonitor.interval=2s"), kubeconfig)
    (tmp_path / "prometheus.yml").write_text(prometheus_config(jobs, [tmp_path / "alerts.yaml"]))
    out = run([str(bin_dir() / "promtool"), "check", "config", str(tmp_path / "prometheus.yml")])
    assert "SUCCESS" in out.stdout, out.stdout
    pods, operator = jobs
    assert pods["job_name"] == "podMonitor/rljob-system/rljob-trainers/0" and pods["scrape_interval"] == "2s"
    assert operator["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["rljob-system"]}
    # The trainers' label rljob_job, which the alerts and the dashboard group by, comes from the pod's label.
    assert {"source_labels": ["__meta_kubernetes_pod_label_rljob_dev_job"], "target_label": "rljob_job"} in \
        pods["relabel_configs"]


@pytest.fixture
def worker_pods() -> list[dict[str, Any]]:
    """Worker 0's and worker 1's pods as the operator builds them for a 2-worker job."""
    from tests.support.jobs import make_job, pod_json

    job = make_job(replicas=2)
    return [pod_json(job, 0), pod_json(job, 1)]


def test_the_pod_monitor_scrapes_worker_zeros_metrics_port_only(worker_pods: list[dict[str, Any]]) -> None:
    """Of the ports of the pods the operator builds, the PodMonitor's rules keep worker 0's ``metrics`` alone
    (only global rank 0 serves metrics), and none of a pod that has ended."""
    pods_job = scrape_configs(chart_monitors(), Path("/dev/null"))[0]
    scraped = [(pod["metadata"]["labels"]["rljob.dev/worker-index"], target["__meta_kubernetes_pod_container_port_name"])
               for pod in worker_pods for target in pod_targets(pod) if kept(pods_job, target)]
    assert scraped == [("0", "metrics")]
    ended = {**worker_pods[0], "status": {"phase": "Succeeded"}}
    assert not any(kept(pods_job, target) for target in pod_targets(ended))


def test_a_monitor_without_a_selector_is_refused_rather_than_scraping_everything() -> None:
    monitor = yaml.safe_load(yaml.safe_dump(chart_monitors()[0]))
    monitor["spec"]["selector"] = {"matchLabels": {}}
    with pytest.raises(ValueError, match="without selector.matchLabels"):
        scrape_configs([monitor], Path("/dev/null"))
