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

pytest_plugins = ["tests.cluster.fixtures", "tests.support.operator"]  # cluster and operator fixtures


# ------------------------------------------------------------------ two lanes under pytest-xdist
# `make test` runs pytest with two workers (`-n 2 --dist loadgroup`). Every test that needs the control
# plane goes to one lane, in file order, so only one worker ever starts a control plane (a second would
# double its CPU and its start-up); the other tests are spread over both workers. Most of a cluster
# test's time is Kubernetes' own timers and waits, most of a trainer test's is real training, so the
# two overlap. The trainer and unit tests run at a lower CPU priority, so the cluster lane's own
# polling and the processes it starts in its session come first whenever both lanes want the two
# cores; the local tests have no clocks of that kind (leases, heartbeats, force-delete deadlines).
# With Linux's autogroup scheduling (on here), niceness weighs threads within one session only: a
# process started in a session of its own (every control-plane component; a test's torchrun gang
# started to be killed as a group; the S3 server) is scheduled as one group among equals.
CLUSTER_LANE = "cluster"
#: The niceness of the local tests and their processes while a cluster test may run beside them.
LOCAL_LANE_NICENESS = 10


def needs_control_plane(item: pytest.Item) -> bool:
    return (item.get_closest_marker("cluster") is not None or item.get_closest_marker("realnode") is not None
            or "control_plane" in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The real-node tests need root, host packages and on-demand binaries, and change the host's
    # network: unless selected by name they are deselected (not skipped: they are `make e2e`'s, and
    # a plain `make test` reports only what it ran).
    from tests.cluster.fixtures import real_node_selected  # a plugin: imported once registered

    if not real_node_selected(config):
        real_node = [item for item in items if item.get_closest_marker("realnode") is not None]
        if real_node:
            config.hook.pytest_deselected(items=real_node)
            items[:] = [item for item in items if item.get_closest_marker("realnode") is None]
    for item in items:
        if needs_control_plane(item):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_LANE))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Grouped scheduling whatever ``--dist`` says (but ``each``): spread one by one, the cluster tests
    would start a control plane in every worker."""
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadGroupScheduling

    return LoadGroupScheduling(config, log)  # type: ignore[arg-type]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist, before the test's fixtures start anything: its lane's CPU priority (the calling
    thread's niceness, which the processes and threads it starts inherit)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    wanted = 0 if needs_control_plane(item) else LOCAL_LANE_NICENESS
    # Lowering it again needs root. Not needed otherwise: the cluster lane, the largest group, is
    # handed out first, so its worker runs no local test before it.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
