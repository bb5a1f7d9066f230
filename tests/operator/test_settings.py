"""The operator's settings are declared once (``rljob_operator.settings``): the ``rljob operator`` flags
and the table of docs/reference/operator-settings.md come from the declarations; one spelling, ``-o/--output``, for every output flag."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rljob_operator import settings_table
from rljob_operator.settings import BY_CHART, ENV_PREFIX, OperatorSettings, env_name, env_text, setting_infos

from rljob.cli import build_parser, operator_settings

REPO = Path(__file__).resolve().parents[2]


def _operator_parser() -> Any:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["operator"]


def test_every_setting_is_declared_with_a_description_and_its_own_variable() -> None:
    infos = setting_infos()
    assert list(infos) == [f.name for f in dataclasses.fields(OperatorSettings)]
    for name, info in infos.items():
        assert len(info.help) > 20 and info.help.endswith((".", ")")), f"{name}: describe the setting"
        assert env_name(name) == ENV_PREFIX + name.upper()
        assert info.chart is None or info.chart == BY_CHART or re.fullmatch(r"[a-zA-Z.]+", info.chart), name


def test_operator_flags_are_exactly_the_declared_ones_and_their_defaults_are_the_settings() -> None:
    declared = {info.flag.name: name for name, info in setting_infos().items() if info.flag}
    parser = _operator_parser()
    flags = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    booleans = {flag for flag, name in declared.items() if isinstance(getattr(OperatorSettings(), name), bool)}
    assert booleans == {"--leader-elect", "--without-admission-policies"}
    assert flags == set(declared) | {f"--no-{flag[2:]}" for flag in booleans}
    defaults = OperatorSettings()
    for flag, name in declared.items():
        said = re.search(r"\(default ([^):;,]+)\)", setting_infos()[name].flag.help)  # type: ignore[union-attr]
        if said:  # a help that names a default names the setting's
            assert said.group(1) == env_text(getattr(defaults, name)), flag


def test_operator_flags_override_variables_which_override_defaults() -> None:
    parser = _operator_parser()
    env = {"RLJOB_OPERATOR_STATUS_PORT": "9443", "RLJOB_OPERATOR_METRICS_PORT": "9090",
           "RLJOB_OPERATOR_NAMESPACES": "x", "RLJOB_OPERATOR_LOG_LEVEL": "DEBUG"}
    args = parser.parse_args(["--status-port", "10443", "--namespace", "a", "--namespace", "b",
                              "--no-leader-elect", "--operator-namespace", "ops", "--identity", "me"])
    s = operator_settings(args, env)
    assert (s.status_port, s.metrics_port, s.namespaces, s.leader_elect) == (10443, 9090, ["a", "b"], False)
    assert (s.operator_namespace, s.identity, s.log_level) == ("ops", "me", "DEBUG")
    with pytest.raises(SystemExit):
        parser.parse_args(["--status-port", "https"])  # typed like the setting


@pytest.mark.parametrize("command", [["train", "job.yaml"], ["experiment", "exp.yaml"], ["crd"]])
def test_every_output_flag_is_spelled_o_or_output(command: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args([*command, "-o", "here"]).output == "here"
    assert parser.parse_args([*command, "--output", "there"]).output == "there"
    assert parser.parse_args(command).output is None


def test_experiment_out_still_works_with_a_deprecation_warning(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["experiment", "exp.yaml", "--out", "old"])
    assert args.output == "old"
    assert "rljob: warning: --out is deprecated; use --output" in capsys.readouterr().err
    help_text = subprocess.run([sys.executable, "-m", "rljob", "experiment", "--help"], capture_output=True,
                               text=True, check=True, cwd=REPO).stdout
    assert re.search(r"--out OUTPUT\s+deprecated spelling of --output", help_text)


def test_the_settings_page_shows_every_declaration() -> None:
    """docs/reference/operator-settings.md holds the table (that it is current: tests/delivery/test_docs.py)."""
    table = settings_table.table()
    assert table in (REPO / "docs/reference/operator-settings.md").read_text()
    for name, info in setting_infos().items():
        assert f"| `{env_name(name)}` |" in table
        assert info.flag is None or f"`{info.flag.name}`" in table
    assert "| `RLJOB_OPERATOR_STATUS_PORT` | `--status-port` | `statusAPI.port` | `8443` |" in table


def test_a_table_cell_keeps_code_and_escapes_pipes_and_placeholders() -> None:
    cell = settings_table.markdown_cell("https://<service>.<ns>  |  ``a|b`` and `<x>`")
    assert cell == "https://&lt;service&gt;.&lt;ns&gt; \\| `a\\|b` and `<x>`"


def test_settings_come_from_env_then_flags() -> None:
    env = {"RLJOB_OPERATOR_RESYNC_SECONDS": "2.5", "RLJOB_OPERATOR_NAMESPACES": "a, b",
           "RLJOB_OPERATOR_LEADER_ELECT": "false", "RLJOB_OPERATOR_STATUS_PORT": "9443"}
    s = OperatorSettings.from_env(env, status_port=10443, kubeconfig=None)
    assert s.resync_seconds == 2.5 and s.namespaces == ["a", "b"] and s.leader_elect is False
    assert s.status_port == 10443
    assert s.effective_status_url == f"https://rljob-operator.{s.operator_namespace}.svc:10443"
    assert OperatorSettings.from_env({}, namespaces=["team"]).operator_namespace == "team"


def test_in_a_cluster_replicas_share_one_certificate_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_operator import settings as settings_module

    monkeypatch.setattr(settings_module, "_own_namespace", lambda: "rljob-system")
    s = OperatorSettings.from_env({})
    assert s.operator_namespace == "rljob-system" and s.tls_secret == "rljob-system/rljob-operator-tls"
    assert s.effective_status_url == "https://rljob-operator.rljob-system.svc:8443"
    assert OperatorSettings.from_env({}, tls_cert_file="/c", tls_key_file="/k").tls_secret is None
