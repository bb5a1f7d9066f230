"""The repository's scripts (``tools/``, ``charts/rljob/hack/``: folders that are not packages), imported from
their files so tests can call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The module of the script at ``path``, registered in ``sys.modules`` under its stem (dataclasses and
    pickling look their module up there)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
