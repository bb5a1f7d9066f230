"""YAML we write or ship reads the same to kubectl, Helm and the API server (go-yaml v2) as to PyYAML; YAML
from users is read without aliases (``yamltext.load``).

A CRD once said ``n:`` for the property ``n``: Go read the key ``"false"``, so a CRD installed with Helm or
``kubectl apply -f crds/`` had no property ``n`` and the API server pruned ``status.arms[].n`` of every
RLExperiment (tests/support/yaml_go.py says how the two readers differ).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from rljob_contract import yamltext

from tests.cluster.binaries import REPO_ROOT
from tests.support.trainer import run_rljob
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


def alias_bomb(levels: int = 6) -> str:
    """An RLExperiment under 1 KB whose arm's overrides expand to 10**(levels + 1) strings through aliases
    (issue #43 point 7: ``rljob validate`` took 1.8 s and 190 MB on this one before aliases were refused)."""
    lines = ["apiVersion: rljob.dev/v1alpha1", "kind: RLExperiment", "metadata:", "  name: bomb",
             "  annotations: {x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]}", "  labels:"]
    lines += [f"    x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    lines += ["spec:", "  template: {image: x}", "  arms:", "  - name: a",
              f"    overrides: {{training: {{trl: {{x: *a{levels}}}}}}}"]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_by_rljob_validate_naming_the_file_and_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert len(bomb.read_bytes()) < 1024
    assert len(str(yaml.safe_load(bomb.read_text()))) > 10**6  # what PyYAML alone makes of it: a million strings
    result = run_rljob("validate", str(bomb), timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"{bomb}: invalid YAML: the alias *a0 is not accepted: write the value out "
                                     "(aliases let a file of a few hundred bytes expand to millions of values) "
                                     "(line 7, column 14)")


def test_every_reader_of_user_yaml_refuses_aliases_merge_keys_and_deep_nesting(tmp_path: Path) -> None:
    """Manifests (``read_documents``: validate, train, experiment) and trainer configs (``load_config``)."""
    from rljob_contract.job import ManifestError, read_documents
    from rljob_contract.pod import ConfigError, load_config

    cases = {"alias": "a: &x [1]\nb: *x\n", "merge key": "base: &b {k: 1}\nderived:\n  <<: *b\n",
             "nesting": "a: " + "[" * (yamltext.MAX_DEPTH + 1) + "]" * (yamltext.MAX_DEPTH + 1) + "\n"}
    for case, text in cases.items():
        path = tmp_path / f"{case.replace(' ', '-')}.yaml"
        path.write_text(text)
        expected = "nested more than 100 levels deep" if case == "nesting" else "is not accepted: write the value out"
        with pytest.raises(ManifestError, match=expected) as refused:
            read_documents(path)
        assert refused.value.source == str(path)
        with pytest.raises(ConfigError, match=expected):
            load_config(path)
    # An anchor no alias uses changes nothing, and is read; so is nesting to the bound.
    assert yamltext.load("a: &x [1]\n") == {"a": [1]}
    deep = "[" * yamltext.MAX_DEPTH + "]" * yamltext.MAX_DEPTH
    assert yamltext.load(deep) == yaml.safe_load(deep)


def test_the_safe_reader_reads_every_shipped_manifest_as_pyyaml_does() -> None:
    for path in shipped_yaml():
        text = (REPO_ROOT / path).read_text()
        assert yamltext.load_all(text) == list(yaml.safe_load_all(text)), path
