"""Prometheus rules (charts/rljob/files/alerts.yaml) and the Grafana dashboard.

``promtool check rules`` and ``promtool test rules`` (charts/rljob/tests/alerts_test.yaml),
a firing and a silent case for every alert, and every metric the rules and the dashboard
use exported by the operator or the trainer: names are read from the code (the
``Gauge("rljob_...")`` calls), so renaming a metric there fails here.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.delivery.test_chart import CHART, REPO, bin_dir, run

ALERTS = CHART / "files" / "alerts.yaml"
ALERT_TESTS = CHART / "tests" / "alerts_test.yaml"
DASHBOARD = CHART / "files" / "dashboards" / "rljob.json"
METRIC_CALL = re.compile(
    r"\b(Gauge|Counter|Histogram|Summary|Info|GaugeMetricFamily|CounterMetricFamily)\(\s*[\"'](rljob_[a-z0-9_]+)[\"']"
)
#: A metric name in PromQL: an identifier that starts with rljob and is not a label or function.
PROMQL_NAME = re.compile(r"(?<![\w:\"'])(rljob[a-zA-Z0-9_:]*)(?![\w:\"'])")
#: Grafana's variables in the dashboard's queries, and values to check them with.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "6h", "$namespace": ".*", "$job": ".*"}
#: Recording rules and label names that look like metric names but are not.
LABELS = {"rljob_job"}


@cache
def exported_metrics() -> frozenset[str]:
    """Every series name the operator and the trainer can expose, read from their source."""
    names: set[str] = set()
    for path in [*(REPO / "operator").rglob("*.py"), *(REPO / "trainer").rglob("*.py")]:
        for kind, name in METRIC_CALL.findall(path.read_text(encoding="utf-8")):
            if kind.startswith("Counter"):
                base = name.removesuffix("_total")
                names |= {base + "_total", base + "_created"}
            elif kind in ("Histogram", "Summary"):
                names |= {name + "_bucket", name + "_count", name + "_sum", name + "_created"}
            else:
                names.add(name)
    return frozenset(names)


def rule_groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(ALERTS.read_text())["groups"])


def recorded() -> set[str]:
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def metric_names(expr: str) -> set[str]:
    return {n for n in PROMQL_NAME.findall(expr) if n not in LABELS}


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


# ---------------------------------------------------------------------------------- tests


def test_promtool_check_rules_passes() -> None:
    out = run([str(bin_dir() / "promtool"), "check", "rules", str(ALERTS)])
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    out = run([str(bin_dir() / "promtool"), "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent)
    assert "SUCCESS" in out.stdout, out.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fires, silent = set(), set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fires == set(), "alerts never shown to fire"
    assert names - silent == set(), "alerts never shown to stay silent"
    assert (fires | silent) - names == set(), "tests for alerts that do not exist"


def test_the_issue_s_alerts_exist_with_severity_and_explanations() -> None:
    names = {a["alert"] for a in alerts()}
    assert {
        "RLTrainingJobFailed",  # job failed
        "RLTrainingJobRestartingRepeatedly",  # restarting repeatedly
        "RLTrainingJobStalled",  # stalled
        "RLTrainingJobRewardDropped",  # reward dropped sharply against its recent average
        "RLTrainingJobGPUUnderutilized",  # GPU utilisation < 70 % sustained
        "RLTrainingJobCheckpointUploadFailing",  # checkpoint upload failing
    } <= names
    for alert in alerts():
        assert alert["labels"]["severity"] in ("info", "warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    gpu = next(a for a in alerts() if a["alert"] == "RLTrainingJobGPUUnderutilized")
    assert "< 0.7" in gpu["expr"] and gpu["for"] == "30m"


def test_metric_names_are_read_from_the_code() -> None:
    """The grep finds what the operator's registry really holds (the trainer's needs torch)."""
    import rljob_operator.metrics  # noqa: F401  (registers the operator's metrics)
    from prometheus_client import REGISTRY

    suffix = {"counter": "_total", "histogram": "_bucket", "summary": "_count"}
    registered = {f.name + suffix.get(f.type, "") for f in REGISTRY.collect() if f.name.startswith("rljob_operator_")}
    grepped = {n for n in exported_metrics() if n.startswith("rljob_operator_") and not n.endswith(
        ("_created", "_count", "_sum"))}
    assert registered == grepped
    assert {"rljob_trainer_step", "rljob_trainer_gpu_utilization_ratio",
            "rljob_trainer_checkpoint_upload_failures_total"} <= exported_metrics()


def test_rules_use_only_metrics_that_are_exported() -> None:
    known = exported_metrics() | recorded()
    for group in rule_groups():
        for rule in group["rules"]:
            used = metric_names(rule["expr"])
            assert used, f"{rule.get('alert') or rule.get('record')} uses no rljob metric"
            assert used <= known, f"{rule.get('alert') or rule.get('record')}: unknown {used - known}"
    for name in recorded():
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z_]+", name), f"{name}: not level:metric:operations"


def test_dashboard_parses_and_uses_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= variables
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for expr in exprs:
        used = metric_names(expr)
        assert used and used <= exported_metrics(), f"{expr}: unknown {used - exported_metrics()}"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert metric_names(variable["definition"]) <= exported_metrics()
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("topic,pattern", [
    ("steps per second", r"rate\(rljob_trainer_step\{"),
    ("reward", r"rljob_trainer_reward\{"),
    ("loss", r"rljob_trainer_loss\{"),
    ("GPU utilisation", r"rljob_trainer_gpu_utilization_ratio\{"),
    ("restarts", r"rljob_operator_gang_restarts_total"),
    ("checkpoint age", r"time\(\) - .*rljob_trainer_last_checkpoint_upload_timestamp_seconds"),
    ("held-out evaluation, latest", r"^max by \(namespace, rljob_job, metric\) \(rljob_trainer_eval\{"),
    ("held-out evaluation, best", r"max_over_time\(rljob_trainer_eval\{.*\}\[\$__range\]\)"),
])
def test_dashboard_shows_what_the_issue_asks_for(topic: str, pattern: str) -> None:
    assert any(re.search(pattern, e) for e in dashboard_exprs()), topic


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Each query (Grafana variables filled in) as a recording rule, checked by promtool."""
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        promql = expr
        for variable, value in GRAFANA_VARIABLES.items():
            promql = promql.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}:check", "expr": promql})
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run([str(bin_dir() / "promtool"), "check", "rules", "--lint=none", str(path)])
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout


def test_each_health_signal_has_its_alert_on_its_gauge() -> None:
    """Issue #47: an alert per RL health signal, named by rljob_contract.health.ALERTS, on the trainer's
    rljob_trainer_health_tripped series of that signal (the promtool cases show each firing and silent)."""
    from rljob_contract.health import ALERTS

    by_name = {a["alert"]: a for a in alerts()}
    for signal, name in ALERTS.items():
        assert name in by_name, name
        assert f'rljob_trainer_health_tripped{{signal="{signal.value}"}}' in by_name[name]["expr"]
        assert "docs/guides/health.md" in by_name[name]["annotations"]["description"]
