"""The tests are laid out like the code: a folder per area, a file per topic, names that say what a file needs.

* Every test file is in an area's folder (``AREAS``); ``tests/support/`` and ``tests/cluster/`` hold none.
* A file that starts the control plane (a test or fixture of it asks for one of ``CLUSTER_FIXTURES``, or a
  test is marked ``cluster`` or ``realnode``) ends in ``_cluster.py``, and only such a file does:
  ``tests/conftest.py`` routes the control-plane tests to their lanes, ``*_training_cluster.py`` to its own.
* A file whose tests run real torchrun training (marked ``trainer``) has ``_training`` in its name
  (``_training.py``, or ``_training_cluster.py`` with the control plane), and only such a file.
* No grab-bag modules (``*_unit.py``): one file per topic.

Read from the source (the AST), so the check costs no collection and no control plane.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
AREAS = {"contract", "operator", "trainer", "delivery", "e2e"}
#: The fixtures that need the control plane (``tests/cluster/fixtures.py``, ``tests/support/operator_process.py``),
#: found from their own parameters: a fixture that asks for one of these needs it too.
PLANE_ROOTS = {"control_plane"}
FIXTURE_MODULES = (TESTS / "cluster" / "fixtures.py", TESTS / "support" / "operator_process.py")


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in fn.decorator_list)


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The fixtures ``fn`` asks for: its parameters but those its own ``parametrize`` gives."""
    given = {name.strip() for d in fn.decorator_list if isinstance(d, ast.Call) and "parametrize" in ast.unparse(d.func)
             and d.args and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)
             for name in d.args[0].value.split(",")}
    given |= {e.value for d in fn.decorator_list if isinstance(d, ast.Call) and "parametrize" in ast.unparse(d.func)
              and d.args and isinstance(d.args[0], ast.Tuple | ast.List)
              for e in d.args[0].elts if isinstance(e, ast.Constant)}
    return {a.arg for a in fn.args.args + fn.args.kwonlyargs} - given


def _plane_fixtures(modules: list[ast.Module], known: set[str]) -> set[str]:
    """``known`` and every fixture of ``modules`` that asks for one of them, directly or through another."""
    fixtures = {fn.name: _params(fn) for tree in modules for fn in _functions(tree) if _is_fixture(fn)}
    found = set(known)
    while True:
        more = {name for name, params in fixtures.items() if params & found} - found
        if not more:
            return found
        found |= more


CLUSTER_FIXTURES = _plane_fixtures([ast.parse(p.read_text()) for p in FIXTURE_MODULES], PLANE_ROOTS)


def _marks(tree: ast.Module) -> set[str]:
    """The ``pytest.mark.<name>`` marks anywhere in the module (decorators, ``pytestmark``, aliases)."""
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def starts_the_control_plane(tree: ast.Module) -> bool:
    local = _plane_fixtures([tree], CLUSTER_FIXTURES)
    uses = {p for fn in _functions(tree) if fn.name.startswith("test") or _is_fixture(fn) for p in _params(fn)}
    return bool(uses & local) or bool(_marks(tree) & {"cluster", "realnode"})


def runs_training(tree: ast.Module) -> bool:
    return "trainer" in _marks(tree)


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


@pytest.mark.parametrize("path", _test_files(), ids=lambda p: p.relative_to(TESTS).as_posix())
def test_each_test_file_is_in_its_area_and_named_for_what_it_needs(path: Path) -> None:
    relative = path.relative_to(TESTS)
    assert len(relative.parts) == 2 and relative.parts[0] in AREAS, f"{relative}: not in an area's folder {AREAS}"
    assert not path.stem.endswith("_unit"), f"{relative}: a grab-bag; one file per topic"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cluster, training = starts_the_control_plane(tree), runs_training(tree)
    assert cluster == path.stem.endswith("_cluster"), (
        f"{relative}: {'starts' if cluster else 'does not start'} the control plane, so its name "
        f"{'must' if cluster else 'must not'} end in _cluster.py")
    assert training == ("_training" in path.stem), (
        f"{relative}: {'runs' if training else 'runs no'} torchrun training (mark `trainer`), so its name "
        f"{'must' if training else 'must not'} contain _training (_training.py, _training_cluster.py)")


def test_no_test_files_outside_the_areas() -> None:
    stray = [p.relative_to(TESTS).as_posix() for p in _test_files() if p.relative_to(TESTS).parts[0] not in AREAS]
    assert stray == []


def test_the_checks_tell_the_kinds_apart() -> None:
    """Each check finds what it looks for, so a passing layout test means something."""
    assert {"control_plane", "kube", "namespace", "operator", "crd_installed"} <= CLUSTER_FIXTURES
    assert "tmp_path" not in CLUSTER_FIXTURES
    plane = ast.parse("def test_x(kube):\n    pass\n")
    via_fixture = ast.parse("import pytest\n@pytest.fixture\ndef mine(namespace):\n    pass\n"
                            "def test_x(mine):\n    pass\n")
    marked = ast.parse("import pytest\npytestmark = pytest.mark.cluster\ndef test_x():\n    pass\n")
    helper = ast.parse("def create(kube):\n    pass\ndef test_x(tmp_path):\n    pass\n")
    given = ast.parse("import pytest\n@pytest.mark.parametrize('namespace,name', [('a', 'b')])\n"
                      "def test_x(namespace, name):\n    pass\n")
    assert starts_the_control_plane(plane) and starts_the_control_plane(via_fixture)
    assert starts_the_control_plane(marked) and not starts_the_control_plane(helper)
    assert not starts_the_control_plane(given)
    assert runs_training(ast.parse("import pytest\n@pytest.mark.trainer\ndef test_x():\n    pass\n"))
    assert not runs_training(helper)


def test_every_fixture_a_test_asks_for_is_found_where_the_test_is() -> None:
    """A file split from another keeps the fixtures it needs (shared ones live in its folder's conftest.py
    or in tests/support/): pytest's setup plan names each missing one without running anything."""
    import os
    import subprocess
    import sys

    plan = subprocess.run([sys.executable, "-m", "pytest", "--setup-plan", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-m", "", str(TESTS)], capture_output=True, text=True,
                          cwd=TESTS.parent, env={**os.environ, "PYTEST_ADDOPTS": ""}, timeout=300)
    missing = sorted({line.strip() for line in plan.stdout.splitlines() if "fixture '" in line and "not found" in line})
    assert not missing, missing
    assert plan.returncode == 0, plan.stdout[-3000:]


def test_the_real_node_s_own_plane_runs_before_any_file_of_the_session_s_plane() -> None:
    """``test_real_node_cluster.py`` starts a control plane and real node of its own; only one real node runs
    at a time, and pytest runs files in name order, so every realnode file that uses the session's plane
    (it asks for a control-plane fixture) must sort after it. A file named ``test_install…`` once did not,
    and every test of the real node's own module then failed to start it."""
    own = TESTS / "e2e" / "test_real_node_cluster.py"
    session = []
    for path in sorted((TESTS / "e2e").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        if path != own and "realnode" in path.read_text() and any(
                _params(fn) & CLUSTER_FIXTURES for fn in _functions(tree) if fn.name.startswith("test_")):
            session.append(path.name)
    assert session, "no realnode file of the session's plane found: the check lost its subject"
    assert all(name > own.name for name in session), (own.name, session)
