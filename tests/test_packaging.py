"""The images build from what the wheel needs: every package root in pyproject.toml is copied in."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.operator_helpers import REPO


@pytest.mark.parametrize("dockerfile", ["Dockerfile.operator", "Dockerfile.trainer"])
def test_each_image_copies_every_package_root_the_wheel_is_built_from(dockerfile: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    find = project["tool"]["setuptools"]["packages"]["find"]
    roots = set()
    for where in find["where"]:
        for pattern in find["include"]:
            roots |= {p.relative_to(REPO).parts[0] for p in (REPO / where).glob(pattern.rstrip("*") + "*")
                      if (p / "__init__.py").exists()}
    copied = set(re.findall(r"^COPY (?!--from)(?:\S+ )*?(\S+) \./\S*$", (REPO / dockerfile).read_text(), re.M))
    # A package found at the top level ("rljob") is its own root; others live in operator/ and trainer/.
    missing = sorted(r for r in roots if r not in copied)
    assert not missing, f"{dockerfile} does not COPY {missing}: `pip install .` in the image would miss them"
