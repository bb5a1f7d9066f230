"""The images carry what the wheel is built from (every package in pyproject.toml, on their PYTHONPATH),
and the test virtualenv starts processes from compiled bytecode."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

from tests.support.operator_process import REPO


@pytest.mark.parametrize("dockerfile", ["Dockerfile.operator", "Dockerfile.trainer"])
def test_each_image_puts_every_package_the_wheel_is_built_from_on_its_python_path(dockerfile: str) -> None:
    """The images run the code from its folders, as the tests do (no `pip install .`): each package of
    pyproject.toml's package list must be copied into a folder on the image's PYTHONPATH."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    find = project["tool"]["setuptools"]["packages"]["find"]
    packages = set()
    for where in find["where"]:
        for pattern in find["include"]:
            packages |= {str(p.relative_to(REPO)) for p in (REPO / where).glob(pattern.rstrip("*") + "*")
                         if (p / "__init__.py").exists()}
    text = (REPO / dockerfile).read_text()
    copies = dict(re.findall(r"^COPY (?!--from)(\S+) (\S+)$", text, re.M))
    path = re.search(r"PYTHONPATH=(\S+)", text)
    assert path, f"{dockerfile} sets no PYTHONPATH"
    on_path = {f"{folder}/{Path(package).name}" for folder in path.group(1).split(":") for package in packages}
    missing = sorted(p for p in packages if copies.get(p) not in on_path)
    assert not missing, f"{dockerfile} does not COPY {missing} onto its PYTHONPATH: the image would miss them"


#: Modules every rank, launcher or operator process imports, a few from each heavy package.
STARTUP_MODULES = ["trl/trainer/grpo_trainer.py", "transformers/modeling_utils.py", "torch/_dynamo/__init__.py",
                   "sympy/core/basic.py", "kubernetes/client/api/core_v1_api.py", "kubernetes/watch/watch.py",
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
