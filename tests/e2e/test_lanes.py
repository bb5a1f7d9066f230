"""The lanes under pytest-xdist (tests/support/lanes.py): every test of a lane runs in one worker, one lane
per worker, with the locked pytest and xdist (pytest 9.2 dropped xdist's own ``@group`` node IDs, and
the control-plane tests went to every worker unnoticed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.trainer import REPO

CONFTEST = '''
import pytest
from tests.support import lanes

def lane_of(item):
    return item.get_closest_marker("lane").args[0] if item.get_closest_marker("lane") else None

def pytest_configure(config):
    config.addinivalue_line("markers", "lane(name): the test's lane")
    lanes.configure(config)

def pytest_unconfigure(config):
    lanes.unconfigure(config)

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    lanes.assign(config, items, lane_of)

def pytest_xdist_make_scheduler(config, log):
    return lanes.LaneScheduling(config, log)
'''

TESTS = '''
import json, os, time
import pytest

def record(name):
    with open(os.path.join(os.environ["LANES_OUT"], name), "w") as f:
        json.dump({"worker": os.environ["PYTEST_XDIST_WORKER"], "at": time.monotonic()}, f)

@pytest.mark.parametrize("i", range(6))
@pytest.mark.lane("plane")
def test_plane(i):
    record(f"plane-{i}")
    time.sleep(0.05)

@pytest.mark.parametrize("i", range(3))
@pytest.mark.lane("training")
def test_training(i):
    record(f"training-{i}")
    time.sleep(0.05)

@pytest.mark.parametrize("i", range(12))
def test_local(i):
    record(f"local-{i}")
    time.sleep(0.05)
'''


def test_each_lane_runs_in_one_worker_of_its_own_in_file_order(tmp_path: Path) -> None:
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "conftest.py").write_text(CONFTEST)
    (tmp_path / "suite" / "test_suite.py").write_text(TESTS)
    (tmp_path / "out").mkdir()
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
                          "--rootdir", str(tmp_path / "suite"), str(tmp_path / "suite")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**outer_env(), "PYTHONPATH": str(REPO), "LANES_OUT": str(tmp_path / "out")})
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    runs = {f.name: json.loads(f.read_text()) for f in (tmp_path / "out").iterdir()}
    assert len(runs) == 21
    workers = {lane: {r["worker"] for name, r in runs.items() if name.startswith(lane)} for lane in ("plane", "training")}
    assert [len(w) for w in workers.values()] == [1, 1] and workers["plane"] != workers["training"], workers
    plane = sorted((r["at"], name) for name, r in runs.items() if name.startswith("plane"))
    assert [name for _, name in plane] == [f"plane-{i}" for i in range(6)]  # in file order


def outer_env() -> dict[str, str]:
    """This run's environment without what would tell the inner run it is one of this run's workers."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RLJOB_TEST_LANES"))}
