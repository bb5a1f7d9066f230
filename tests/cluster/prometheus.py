"""A real Prometheus server for ``make e2e``: it scrapes the real node's pods as the chart's monitors say.

The chart ships a PodMonitor (the trainers) and a ServiceMonitor (the operator) for the Prometheus
Operator, which the test control plane does not run. :func:`scrape_configs` translates them into the
plain scrape configuration the Prometheus Operator generates from them (kubernetes_sd against the test
API server, the monitors' selectors and port names as keep rules, their relabelings after, the same
``namespace``/``pod``/``job`` labels), so a selector or port the pods do not carry, or a relabeling that
loses ``rljob_job``, shows as no series here, as it would on a cluster. :class:`PrometheusServer` runs
the server built from promtool's module (``tools/build-binaries.sh --real-node``, beside kubelet) with
the chart's rules, evaluated every second, and answers PromQL through the HTTP API.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.processes import ProcessRecord, free_port, start_process, stop_component

#: The Prometheus Operator's spelling of a monitor's camelCase fields in a scrape config.
_ENDPOINT_FIELDS = {"interval": "scrape_interval", "scrapeTimeout": "scrape_timeout", "path": "metrics_path"}
_LIMITS = {"sampleLimit": "sample_limit", "labelLimit": "label_limit",
           "labelNameLengthLimit": "label_name_length_limit", "labelValueLengthLimit": "label_value_length_limit"}
_RELABEL_FIELDS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
                   "replacement": "replacement", "action": "action", "separator": "separator", "modulus": "modulus"}


def label_name(key: str) -> str:
    """A Kubernetes label key as kubernetes_sd's meta labels spell it (``rljob.dev/job`` → ``rljob_dev_job``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _selector_keeps(kind: str, match_labels: dict[str, str]) -> list[dict[str, Any]]:
    """One keep rule per label of a monitor's ``selector.matchLabels`` (``kind``: pod or service)."""
    if not match_labels:
        raise ValueError(f"a {kind} monitor without selector.matchLabels would scrape every {kind}")
    return [{"action": "keep", "regex": f"({re.escape(value)});true",
             "source_labels": [f"__meta_kubernetes_{kind}_label_{label_name(key)}",
                               f"__meta_kubernetes_{kind}_labelpresent_{label_name(key)}"]}
            for key, value in sorted(match_labels.items())]


def _relabelings(endpoint: dict[str, Any]) -> list[dict[str, Any]]:
    return [{_RELABEL_FIELDS[k]: v for k, v in rule.items()} for rule in endpoint.get("relabelings") or []]


def _namespaces(monitor: dict[str, Any]) -> dict[str, Any]:
    """kubernetes_sd's ``namespaces`` from a monitor's namespaceSelector (absent: the monitor's own namespace)."""
    selector = monitor["spec"].get("namespaceSelector")
    if selector is None:
        return {"names": [monitor["metadata"]["namespace"]]}
    if selector.get("any"):
        return {}
    return {"names": list(selector["matchNames"])}


def _job(monitor: dict[str, Any], endpoint: dict[str, Any], index: int, role: str, kubeconfig: Path) -> dict[str, Any]:
    """The parts of a scrape job every monitor's endpoint shares."""
    kind = "podMonitor" if monitor["kind"] == "PodMonitor" else "serviceMonitor"
    meta = monitor["metadata"]
    config: dict[str, Any] = {"job_name": f"{kind}/{meta['namespace']}/{meta['name']}/{index}", "honor_labels": False,
                              "kubernetes_sd_configs": [{"role": role, "kubeconfig_file": str(kubeconfig),
                                                         **({"namespaces": ns} if (ns := _namespaces(monitor)) else {})}]}
    config.update({_ENDPOINT_FIELDS[k]: v for k, v in endpoint.items() if k in _ENDPOINT_FIELDS})
    config.update({_LIMITS[k]: v for k, v in monitor["spec"].items() if k in _LIMITS})
    return config


def pod_monitor_jobs(monitor: dict[str, Any], kubeconfig: Path) -> list[dict[str, Any]]:
    """A PodMonitor's scrape jobs: its pods (by label, running) on their named container port."""
    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        config = _job(monitor, endpoint, index, "pod", kubeconfig)
        config["relabel_configs"] = [
            *_selector_keeps("pod", monitor["spec"]["selector"]["matchLabels"]),
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
             "regex": re.escape(endpoint["port"])},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *_relabelings(endpoint),
        ]
        jobs.append(config)
    return jobs


def service_monitor_jobs(monitor: dict[str, Any], kubeconfig: Path) -> list[dict[str, Any]]:
    """A ServiceMonitor's scrape jobs: the endpoints of its Services (by label) on the named Service port."""
    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["endpoints"]):
        config = _job(monitor, endpoint, index, "endpointslice", kubeconfig)
        config["relabel_configs"] = [
            *_selector_keeps("service", monitor["spec"]["selector"]["matchLabels"]),
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
             "regex": re.escape(endpoint["port"])},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *_relabelings(endpoint),
        ]
        jobs.append(config)
    return jobs


def scrape_configs(monitors: list[dict[str, Any]], kubeconfig: Path) -> list[dict[str, Any]]:
    """The scrape jobs of the chart's PodMonitors and ServiceMonitors, discovering through ``kubeconfig``."""
    translate = {"PodMonitor": pod_monitor_jobs, "ServiceMonitor": service_monitor_jobs}
    unknown = sorted({m.get("kind", "?") for m in monitors} - set(translate))
    if unknown:
        raise ValueError(f"cannot translate {unknown}: only PodMonitor and ServiceMonitor")
    return [job for monitor in monitors for job in translate[monitor["kind"]](monitor, kubeconfig)]


def prometheus_config(jobs: list[dict[str, Any]], rule_files: list[Path], evaluation_interval: str = "1s") -> str:
    """prometheus.yml: the scrape jobs and the rules, evaluated every ``evaluation_interval``."""
    return yaml.safe_dump({"global": {"evaluation_interval": evaluation_interval},
                           "rule_files": [str(p) for p in rule_files], "scrape_configs": jobs}, sort_keys=False)


class PrometheusServer:
    """``prometheus`` on a free loopback port, its data and log in ``directory``; :meth:`stop` ends it."""

    def __init__(self, binary: Path, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.record: ProcessRecord | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "prometheus.log"

    def start(self, config: str, rule_files: list[Path], timeout: float = 60.0) -> PrometheusServer:
        """Write the config (and a copy of each rule file beside it), start the server, wait until it is ready."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in rule_files:
            shutil.copy(path, self.directory / path.name)
        (self.directory / "prometheus.yml").write_text(config)
        argv = [str(self.binary), f"--config.file={self.directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=info"]
        _, self.record = start_process("prometheus", argv, self.log, die_with_parent=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout}s; its log:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.record is not None:
            stop_component(self.record, timeout=10.0)
            self.record = None

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a GET on ``/api/v1/<path>``."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus /api/v1/{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series an instant query returns now (``[{"metric": {...}, "value": [t, "v"]}, …]``)."""
        return list(self.api("query", query=expr)["result"])

    def query_range(self, expr: str, seconds: float, step: float = 2.0) -> list[dict[str, Any]]:
        """The series of a range query over the last ``seconds`` (``[{"metric": {...}, "values": [[t, "v"], …]}]``)."""
        end = time.time()
        return list(self.api("query_range", query=expr, start=f"{end - seconds:.3f}", end=f"{end:.3f}",
                             step=f"{step}")["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now, each with its ``labels`` and ``state``."""
        return list(self.api("alerts")["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        """The active targets: ``scrapePool`` (the job), ``labels``, ``health`` and ``lastError``."""
        return list(self.api("targets", state="active")["activeTargets"])
