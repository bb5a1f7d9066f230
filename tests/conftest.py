"""Shared pytest setup: this checkout's packages first, and the control-plane plugin (tests/cluster).

The virtualenv is shared by every clone on the machine (tools/venv.sh) and holds only the
dependencies, so the code under test always comes from this checkout: its ``operator/`` and
``trainer/`` go first on ``sys.path`` and on ``PYTHONPATH`` for the processes tests start
(torchrun ranks, the operator).
"""

import os
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_PATHS = [str(_REPO / "operator"), str(_REPO / "trainer"), str(_REPO)]
for _p in reversed(_PATHS):
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(_PATHS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and p not in _PATHS])

pytest_plugins = ["tests.cluster.fixtures", "tests.operator_helpers"]  # cluster and operator fixtures
