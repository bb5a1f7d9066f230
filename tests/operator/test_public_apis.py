"""Events reach the operator one way, through public APIs (``cluster/streams.py``), so an upgrade of a
library cannot break it silently.

* No module anywhere in the repository imports a private module of kopf or of the kubernetes client
  (a dotted path with a part that begins with ``_``, as ``kopf._cogs``), nor reads a private attribute
  (``registry._changing``) of anything it imported from them.
* The operator's package imports no kopf at all: its watches are ``streams.Stream``s, one per resource.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.operator_process import REPO

#: Libraries whose private parts no code of ours may touch.
LIBRARIES = ("kopf", "kubernetes")
#: Where our Python lives.
ROOTS = ("contract", "operator", "trainer", "rljob", "bench", "tests", "charts", "tools")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _python_files() -> list[Path]:
    return [p for root in ROOTS for p in sorted((REPO / root).rglob("*.py")) if ".venv" not in p.parts]


def _library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def _offences(tree: ast.Module) -> list[str]:
    """Private modules of the libraries imported, and private attributes read from what was imported of them."""
    found, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library(alias.name):
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _library(node.module):
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if any(_private(part) for part in [*node.module.split("."), alias.name]):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and (root.id in bound or root.id == "registry" and "kopf" in bound):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_touches_a_private_part_of_kopf_or_the_kubernetes_client() -> None:
    files = _python_files()
    assert len(files) > 100  # the roots are right
    offences = {p.relative_to(REPO).as_posix(): o for p in files
                if (o := _offences(ast.parse(p.read_text(encoding="utf-8"), str(p))))}
    assert not offences, f"private parts of {', '.join(LIBRARIES)} used: {offences}"


def test_the_check_finds_what_the_operator_once_did() -> None:
    """The check itself: what ``streams.py`` and ``handlers.py`` did before (kopf's internal stream and
    registry) is caught, a public use is not."""
    before = ast.parse("from kopf._cogs.clients import watching\nimport kopf\n"
                       "registry = kopf.OperatorRegistry()\nregistry._changing.get_all_handlers()\n"
                       "import kopf._cogs.structs.references as references\n")
    assert len(_offences(before)) == 3
    public = ast.parse("from kubernetes import watch\nw = watch.Watch()\nw.stop()\nimport kopf\nkopf.on.event\n")
    assert _offences(public) == []


def test_the_operator_imports_no_kopf_its_events_come_through_its_streams() -> None:
    imported = []
    for path in sorted((REPO / "operator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            imported += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names if n.split(".")[0] == "kopf"]
    assert not imported, f"kopf imported by the operator: {imported} (add a streams.Stream instead)"
