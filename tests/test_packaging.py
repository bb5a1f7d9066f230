"""The images build from what the wheel needs (every package root in pyproject.toml is copied in),
and the test virtualenv starts processes from compiled bytecode."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

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


#: Modules every rank, launcher or operator process imports, a few from each heavy package.
STARTUP_MODULES = ["trl/trainer/grpo_trainer.py", "transformers/modeling_utils.py", "torch/_dynamo/__init__.py",
                   "sympy/core/basic.py", "kubernetes/client/api/core_v1_api.py", "kopf/__init__.py",
                   "pydantic/main.py"]


@pytest.mark.parametrize("module", STARTUP_MODULES)
def test_the_virtualenv_holds_compiled_bytecode_for_what_every_process_imports(module: str) -> None:
    # tools/venv.sh compiles the venv once: uv installs sources only, and with PYTHONDONTWRITEBYTECODE
    # set Python never caches what it compiles, so every torchrun rank compiled TRL, transformers and
    # torch from source (22 s of imports instead of 8 here; bench/startup.py).
    package = module.split("/", 1)[0]
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    source = Path(spec.submodule_search_locations[0]).parent / module
    assert source.is_file(), f"{source} is missing: the list of start-up modules is out of date"
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.is_file(), f"no bytecode for {source} (expected {cached}): run tools/venv.sh"
    assert cached.read_bytes()[:4] == importlib.util.MAGIC_NUMBER, f"{cached} is for another Python"
