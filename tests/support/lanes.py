"""Lanes under pytest-xdist: the tests of one lane run in one worker, in file order (``tests/conftest.py``
says which tests go to which lane, and why).

xdist's ``loadgroup`` keeps the tests of an ``xdist_group`` together by appending ``@group`` to their node
IDs in the workers; pytest 9.2's structured node IDs ignore that (pytest-xdist#1386), and the
control-plane tests went to whichever worker was free, each of them starting a control plane (and
Kueue) of its own. So the workers also write each grouped test's lane to a file the controlling process
names, and :class:`LaneScheduling` reads the lanes from there. Should xdist append ``@group`` again, the
node IDs it sends carry the same lane, which the scheduler then reads from them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling

#: The file the workers write {node ID: lane} to, named by the controlling process for its workers.
LANES_FILE_ENV = "RLJOB_TEST_LANES_FILE"


def configure(config: pytest.Config) -> None:
    """In the controlling process: name the lanes file the workers it starts will write."""
    if not hasattr(config, "workerinput"):
        os.environ[LANES_FILE_ENV] = str(Path(tempfile.gettempdir()) / f"rljob-test-lanes-{os.getpid()}.json")


def unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and LANES_FILE_ENV in os.environ:
        Path(os.environ.pop(LANES_FILE_ENV)).unlink(missing_ok=True)


def assign(config: pytest.Config, items: list[pytest.Item], lane_of: Callable[[pytest.Item], str | None]) -> None:
    """Mark each test of a lane with it (``xdist_group``); in a worker, also write the lanes to the file."""
    lanes = {}
    for item in items:
        lane = lane_of(item)
        if lane:
            item.add_marker(pytest.mark.xdist_group(lane))
            lanes[item.nodeid] = lane
    target = os.environ.get(LANES_FILE_ENV)
    if hasattr(config, "workerinput") and target:
        # Every worker collects the same tests and writes the same map: whole files only.
        written = Path(f"{target}.{os.getpid()}")
        written.write_text(json.dumps(lanes))
        written.replace(target)


class LaneScheduling(LoadGroupScheduling):
    """``loadgroup``, with each test's lane from the workers' file: the largest lane is handed out
    first, then the next, then the other tests one by one in file order."""

    @cached_property
    def lanes(self) -> dict[str, str]:
        """Read once the workers finished collecting (the first scheduling needs every test's scope)."""
        try:
            return dict(json.loads(Path(os.environ[LANES_FILE_ENV]).read_text()))
        except (KeyError, OSError, ValueError):
            return {}

    def _split_scope(self, nodeid: str) -> str:
        return self.lanes.get(nodeid) or super()._split_scope(nodeid)
