"""The chart and the kustomize base set the operator's settings as ``rljob_operator.settings`` declares them.

Each setting names the chart value that sets it (or that the chart sets it by itself); these tests render
the chart (``helm template``) and fail when a declared setting is missing from the deployment, the
deployment sets a variable nobody declared, a declared value does not reach its variable, or a chart
default differs from the operator's own without a reason written here.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import pytest
import yaml
from rljob_operator.settings import BY_CHART, OperatorSettings, env_name, env_text, setting_infos

from tests.delivery.test_chart import (
    CHART,
    VARIANTS,
    _lookup,
    _schema,
    _schema_paths,
    helm_template,
    kustomize_build,
    one,
    operator_env,
)

#: Settings whose chart default differs from the operator's own default, and why.
CHART_DEFAULT_DIFFERS = {
    "tls_secret": "one Secret for every replica, <operator>-status-tls, whatever the pod's namespace",
    "allowed_images": "the trainer image's patterns spelled out (what the operator's empty default means)",
    "allowed_service_accounts": "the trainer ServiceAccount the chart creates",
    "trainer_metrics_from": "the monitoring selectors that also scrape the operator",
}
#: Chart values that a changed value needs beside it, and values whose new form the type cannot give.
COMPANIONS = {"leaderElection.enabled": {"replicaCount": 1},
              "admissionPolicies.acknowledgeDisabled": {"admissionPolicies.enabled": False},
              "podProfile.allowedServiceAccounts": {"trainerServiceAccount": {"create": False}}}
NEW_VALUES: dict[str, Any] = {
    "operator.logLevel": "DEBUG", "podProfile.profile": "baseline", "statusAPI.url": "https://status.example.com",
    "statusAPI.tls.secretName": "shared-tls", "watchNamespaces": ["ml-a", "ml-b"],
    "networkPolicy.monitoring": {  # the same keys: Helm merges maps into the defaults
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmagent"}}},
    "networkPolicy.trainerEgress.dns": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
    "networkPolicy.trainerEgress.to": [{"podSelector": {"matchLabels": {"app": "minio"}}}],
    "networkPolicy.trainerEgress.ports": [9000], "networkPolicy.trainerEgress.exceptCIDRs": ["10.96.0.0/12"],
    "networkPolicy.trainerEgress.metadataCIDRs": ["169.254.169.254/32"],
}


def _valued() -> dict[str, str]:
    """Setting name → the chart value that sets it."""
    return {name: info.chart for name, info in setting_infos().items() if info.chart not in (None, BY_CHART)}


def _changed(name: str, path: str) -> Any:
    """A value for ``path`` other than its default, of the setting's type (numbers: unlike any other setting's)."""
    if path in NEW_VALUES:
        return NEW_VALUES[path]
    defaults = OperatorSettings()
    default = getattr(defaults, name)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return _new_numbers()[name]
    if isinstance(default, list):
        return ["10.0.0.0/8"] if "cidr" in name else ["registry.example.com/*"] if "image" in name else ["sa-a"]
    raise AssertionError(f"{name}: give NEW_VALUES[{path!r}] a value other than the default")


@cache
def _new_numbers() -> dict[str, int]:
    """Each numeric setting's new value: the next whole number above its default that no setting has or gets,
    so a value wired to the wrong variable shows even when they are all changed at once."""
    defaults = OperatorSettings()
    numeric = [n for n in _valued() if type(getattr(defaults, n)) in (int, float)]
    taken, out = {getattr(defaults, n) for n in numeric}, {}
    for name in numeric:
        new = int(getattr(defaults, name)) + 1
        while new in taken:
            new += 1
        taken.add(new)
        out[name] = new
    return out


def _changed_values(name: str) -> dict[str, Any]:
    """What to render for ``name``'s check: a boolean alone (turning one off may drop other variables), every
    other setting's new value at once (one ``helm template`` for them all)."""
    if isinstance(getattr(OperatorSettings(), name), bool):
        names = [name]
    else:
        names = [n for n in _valued() if not isinstance(getattr(OperatorSettings(), n), bool)]
    out: dict[str, Any] = {}
    for n in names:
        path = _valued()[n]
        out |= {path: _changed(n, path), **COMPANIONS.get(path, {})}
    return out


@cache
def _env(values_json: str) -> dict[str, Any]:
    args = [a for k, v in json.loads(values_json).items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    return operator_env(one(helm_template(*args), "Deployment"))


def _render(**values: Any) -> dict[str, Any]:
    return _env(json.dumps(values, sort_keys=True))


#: The schema types a setting's chart value may have, by the setting's type.
SCHEMA_TYPES = {"int": {"integer"}, "float": {"number", "integer"}, "bool": {"boolean"}, "str": {"string"},
                "str | None": {"string"}, "list[str]": {"array"}, "list[dict[str, Any]]": {"array"}}


def test_each_chart_value_of_a_setting_exists_in_values_yaml_and_the_schema_with_its_type() -> None:
    values, schema = yaml.safe_load((CHART / "values.yaml").read_text()), _schema()
    in_schema = _schema_paths(schema)
    kinds = {f.name: str(f.type) for f in dataclasses.fields(OperatorSettings)}
    for name, path in _valued().items():
        try:
            _lookup(values, path)
        except KeyError:
            raise AssertionError(f"{name}: {path} is not in values.yaml") from None
        assert path in in_schema, f"{name}: {path} is not in values.schema.json"
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
        # networkPolicy.monitoring: the selectors the chart turns into one NetworkPolicyPeer
        expected = {"object"} if path == "networkPolicy.monitoring" else SCHEMA_TYPES[kinds[name]]
        assert node["type"] in expected, f"{name} is {kinds[name]}, values.schema.json's {path} {node['type']}"


@pytest.mark.parametrize("name", sorted(_valued()))
def test_each_chart_value_reaches_its_settings_variable(name: str) -> None:
    path = _valued()[name]
    new = _changed(name, path)
    env = _render(**_changed_values(name))
    expected = [new] if path == "networkPolicy.monitoring" else new
    variable = env_name(name)
    assert variable in env, f"{path}={new!r}: the chart sets no {variable}"
    parsed = getattr(OperatorSettings.from_env({variable: env[variable]}), name)
    assert parsed == getattr(OperatorSettings.from_env({variable: env_text(expected)}), name), \
        f"{path}={new!r} did not reach {variable}: {env[variable]!r}"
    assert parsed != getattr(OperatorSettings(), name)


def test_chart_defaults_are_the_operators_own_but_for_the_listed_ones() -> None:
    env = _render()
    parsed = OperatorSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    defaults = OperatorSettings()
    differ = {name for name in _valued() if getattr(parsed, name) != getattr(defaults, name)}
    assert differ == set(CHART_DEFAULT_DIFFERS), "a chart default differs from settings.py (or no longer does)"


def test_the_chart_sets_exactly_the_settings_that_name_it() -> None:
    rendered: set[str] = set()
    for _, args in VARIANTS:
        rendered |= set(operator_env(one(helm_template(*args), "Deployment")))
    rendered |= set(_render(**{"statusAPI.url": "https://status.example.com"}))
    declared = {env_name(name) for name, info in setting_infos().items() if info.chart}
    rendered -= {"PYTHONDONTWRITEBYTECODE"}
    assert not declared - rendered, f"declared with chart=, not set by templates/deployment.yaml: {declared - rendered}"
    assert not rendered - declared, f"set by the chart, not declared (chart=) in settings.py: {rendered - declared}"


def test_the_kustomize_base_sets_only_declared_settings_with_the_charts_values() -> None:
    env = operator_env(one(kustomize_build("cluster-wide"), "Deployment"))
    declared = {env_name(name) for name, info in setting_infos().items() if info.chart}
    assert set(env) - {"PYTHONDONTWRITEBYTECODE"} <= declared
    chart = _render()
    differ = sorted(k for k in set(env) | set(chart) if env.get(k) != chart.get(k))
    assert not differ, f"manifests/base/deployment.yaml differs from the chart's defaults in {differ}"
