"""YAML we write or ship reads the same to kubectl, Helm and the API server (go-yaml v2) as to PyYAML.

A CRD once said ``n:`` for the property ``n``: Go read the key ``"false"``, so a CRD installed with Helm or
``kubectl apply -f crds/`` had no property ``n`` and the API server pruned ``status.arms[].n`` of every
RLExperiment (tests/support/yaml_go.py says how the two readers differ).
"""

from __future__ import annotations

import subprocess

import yaml
from rljob_contract import yamltext

from tests.cluster.binaries import REPO_ROOT
from tests.support.yaml_go import go_differences


def shipped_yaml() -> list[str]:
    """Every tracked YAML file but the Helm templates (test_delivery_chart reads them rendered)."""
    listed = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return [p for p in listed if not (p.startswith("charts/") and "/templates/" in p)]


def test_every_shipped_yaml_file_reads_the_same_in_go() -> None:
    files = shipped_yaml()
    assert "crds/rljob.dev_rlexperiments.yaml" in files and any(p.startswith("examples/") for p in files)
    problems = [f"{path}: {d}" for path in files for d in go_differences((REPO_ROOT / path).read_text())]
    assert not problems, "quote these (go-yaml v2 reads y/Y/n/N as booleans):\n" + "\n".join(problems)


def test_the_generated_crds_read_the_same_in_go() -> None:
    from rljob_operator.crd import crd_yaml, experiment_crd_yaml

    for text in (crd_yaml(), experiment_crd_yaml()):
        assert go_differences(text) == []
    assert "'n':" in experiment_crd_yaml()  # the property that was lost


def test_dump_quotes_what_go_reads_as_booleans_and_nothing_else_changes() -> None:
    data = {"n": 1, "Y": ["y", "N", "no", "yes", "name", "on"], "nested": {"y": "n", "ny": "yn"}}
    text = yamltext.dump(data, sort_keys=False)
    assert go_differences(text) == [] and yaml.safe_load(text) == data
    assert go_differences(yaml.safe_dump(data, sort_keys=False))  # what PyYAML alone writes does not
    assert "ny: yn" in text  # only the four scalars themselves are quoted
