"""Shared pytest setup: this checkout's packages first, and the control-plane plugin (tests/cluster).

The virtualenv is shared by every clone on the machine (tools/venv.sh) and holds only the
dependencies, so the code under test always comes from this checkout: its ``operator/`` and
``trainer/`` go first on ``sys.path`` and on ``PYTHONPATH`` for the processes tests start
(torchrun ranks, the operator).
"""

import contextlib
import os
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
_PATHS = [str(_REPO / "contract"), str(_REPO / "operator"), str(_REPO / "trainer"), str(_REPO)]
for _p in reversed(_PATHS):
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(_PATHS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and p not in _PATHS])

pytest_plugins = ["tests.cluster.fixtures", "tests.support.operator_process"]  # cluster and operator fixtures

from tests.support import lanes  # noqa: E402 - after sys.path is set

# ------------------------------------------------------------------ lanes under pytest-xdist
# `make test` runs pytest with three workers (`-n 3 --dist loadgroup`). The tests that need the control
# plane go to two lanes, in file order, each with its own control plane (it starts in 4 s and idles at
# 1.5 CPU-seconds a minute): the real training runs against it (`*_training_cluster.py`, minutes of
# torchrun) in one, every other one (mostly waits on Kubernetes' own timers and deadlines) in the other,
# so neither waits behind the other. The third worker takes the rest, and each control-plane worker
# joins it once its lane is done. The trainer and unit tests run at a lower CPU priority, so the
# control-plane lanes' own polling and the processes they start in their session come first whenever
# all want the two cores; the local tests have no clocks of that kind (leases, heartbeats, force-delete
# deadlines). With Linux's autogroup scheduling (on here), niceness weighs threads within one session
# only: a process started in a session of its own (every control-plane component; a test's torchrun
# gang started to be killed as a group; the S3 server) is scheduled as one group among equals.
CLUSTER_LANE = "cluster"
#: The lane of the real training runs against the control plane (files ``*_training_cluster.py``).
TRAINING_CLUSTER_LANE = "cluster-training"
#: The niceness of the local tests and their processes while a cluster test may run beside them.
LOCAL_LANE_NICENESS = 10


def needs_control_plane(item: pytest.Item) -> bool:
    return (item.get_closest_marker("cluster") is not None or item.get_closest_marker("realnode") is not None
            or "control_plane" in getattr(item, "fixturenames", ()))


def lane_of(item: pytest.Item) -> str | None:
    """The control-plane lane of ``item``; None for a local test."""
    if not needs_control_plane(item):
        return None
    return TRAINING_CLUSTER_LANE if item.path.name.endswith("_training_cluster.py") else CLUSTER_LANE


#: Marks whose tests run only when the mark expression names them (``make e2e``).
HEAVY_MARKS = ("e2e", "images")


def heavy_marks(config: pytest.Config) -> list[str]:
    """The heavy marks the run's ``-m`` does not name: their tests are deselected."""
    expression = config.getoption("markexpr", "") or ""
    return [mark for mark in HEAVY_MARKS if mark not in expression]


def pytest_configure(config: pytest.Config) -> None:
    lanes.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    lanes.unconfigure(config)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the lanes' xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The real-node tests need root, host packages and on-demand binaries, and change the host's
    # network: unless selected by name they are deselected (not skipped: they are `make e2e`'s, and
    # a plain `make test` reports only what it ran).
    from tests.cluster.fixtures import real_node_selected  # a plugin: imported once registered

    # The heavy end-to-end tests (the images built and run, the real trainer run from the operator's pods)
    # are `make e2e`'s too, so `make test` keeps to CI's budget: deselected unless the mark expression
    # names them (`make e2e` runs `-m "e2e or images"` after the real node's tests).
    for mark in heavy_marks(config) + ([] if real_node_selected(config) else ["realnode"]):
        heavy = [item for item in items if item.get_closest_marker(mark) is not None]
        if heavy:
            config.hook.pytest_deselected(items=heavy)
            items[:] = [item for item in items if item.get_closest_marker(mark) is None]
    lanes.assign(config, items, lane_of)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The lanes whatever ``--dist`` says (but ``each``): spread one by one, the cluster tests would
    start a control plane in every worker (``tests/support/lanes.py``)."""
    if config.getvalue("dist") == "each":
        return None
    return lanes.LaneScheduling(config, log)  # type: ignore[arg-type]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist, before the test's fixtures start anything: its lane's CPU priority (the calling
    thread's niceness, which the processes and threads it starts inherit)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    wanted = 0 if needs_control_plane(item) else LOCAL_LANE_NICENESS
    # Lowering it again needs root. Not needed otherwise: the control-plane lanes, the largest groups,
    # are handed out first, so their workers run no local test before them.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
