"""One version number: pyproject.toml's ``[project] version`` names the package, the chart, the images'
default tags, the CRDs' label and the manifests (``tools/gen_version.py``, run by ``make generate``); a
file stating another fails here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
gen_version = load_script(REPO / "tools" / "gen_version.py")


def test_every_file_states_pyprojects_version() -> None:
    assert gen_version.drift(gen_version.project_version(), write=False) == []


def test_the_code_the_chart_and_the_crds_carry_the_same_version() -> None:
    import rljob_operator
    import rljob_trainer
    from rljob_contract.job import DEFAULT_IMAGE
    from rljob_operator import crd

    version = gen_version.project_version()
    assert rljob_operator.__version__ == rljob_trainer.__version__ == version
    assert DEFAULT_IMAGE.endswith(f"/trainer:{version}")
    chart = yaml.safe_load((REPO / "charts/rljob/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    for manifest in (crd.crd_manifest(), crd.experiment_crd_manifest(),
                     crd.runtime_crd_manifest("ClusterRLTrainingRuntime")):
        assert manifest["metadata"]["labels"]["app.kubernetes.io/version"] == version
    for path in sorted((REPO / "crds").glob("*.yaml")):
        assert yaml.safe_load(path.read_text())["metadata"]["labels"]["app.kubernetes.io/version"] == version, path


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files of the sweep and pyproject.toml, copied; the generator pointed at the copy."""
    for relative in {place for place, _ in gen_version.PLACES} | {"pyproject.toml"}:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / relative, tmp_path / relative)
    monkeypatch.setattr(gen_version, "REPO", tmp_path)
    return tmp_path


def test_a_bump_in_pyproject_reaches_every_place_and_a_stale_one_is_named(copy: Path, capsys) -> None:
    old = gen_version.project_version(copy / "pyproject.toml")
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{old}"', 'version = "7.8.9"', 1))
    assert gen_version.main(["--check"]) == 1
    assert "charts/rljob/Chart.yaml: states version" in capsys.readouterr().err
    assert gen_version.main([]) == 0
    assert gen_version.main(["--check"]) == 0
    chart = yaml.safe_load((copy / "charts/rljob/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == "7.8.9"
    assert 'VERSION = "7.8.9"' in (copy / "contract/rljob_contract/version.py").read_text()
    assert "image: ghcr.io/rljob/trainer:7.8.9" in (copy / "manifests/base/runtimes.yaml").read_text()
    # One file edited by hand afterwards: the check names it and what it says.
    kustomization = copy / "manifests/trainer/kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace('"7.8.9"', '"7.8.8"'))
    assert gen_version.main(["--check"]) == 1
    assert "manifests/trainer/kustomization.yaml: states version 7.8.8, pyproject.toml says 7.8.9" in \
        capsys.readouterr().err


def test_a_place_whose_line_moved_away_is_an_error_not_a_silent_skip(copy: Path, capsys) -> None:
    chart = copy / "charts/rljob/Chart.yaml"
    chart.write_text(chart.read_text().replace("appVersion:", "app_version:"))
    assert gen_version.main([]) == 1
    assert "charts/rljob/Chart.yaml: no line matches" in capsys.readouterr().err


def test_a_version_that_is_not_one_is_refused_naming_pyproject(copy: Path) -> None:
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "', 'version = "v1 ', 1))
    with pytest.raises(ValueError, match=r"pyproject.toml: \[project\] version 'v1 "):
        gen_version.project_version(pyproject)
