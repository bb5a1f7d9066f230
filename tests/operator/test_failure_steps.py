"""A failure's decision is read in one pass down its steps, and the old-vs-new comparison of Plans
(``tests/support/plan_scenarios.py``) still draws scenarios that reach every outcome a failure can have."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from types import ModuleType

from tests.support import plan_scenarios
from tests.support.operator import REPO

STEPS = ("failure.step", "failure.observe", "failure.classify", "failure.respond", "failure.record")


def _context_walk() -> ModuleType:
    """``tools/context_walk.py``, imported from its file (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("context_walk", REPO / "tools" / "context_walk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["context_walk"] = module
    spec.loader.exec_module(module)
    return module


def test_plan_failures_context_goes_down_the_steps_in_order_each_read_in_one_pass() -> None:
    walk_module = _context_walk()
    walk = walk_module.Walk(walk_module.load(REPO / "operator", walk_module.PACKAGE))
    walk.function(f"{walk_module.PACKAGE}.failure.step", "plan_failure", {"ctx": None})
    read = [s.module.removeprefix(walk_module.PACKAGE + ".") for s in walk.steps if s.expanded]
    first_read = [m for i, m in enumerate(read) if m.startswith("failure.") and m not in read[:i]]
    assert first_read == list(STEPS)
    turns = walk_module.visits(walk.steps, derived=False)
    # record looks down into the renderers every step shares (Situation.draft, settled) and comes back.
    assert {m: turns[f"{walk_module.PACKAGE}.{m}"] for m in STEPS[:4]} == dict.fromkeys(STEPS[:4], 1)


def test_the_random_scenarios_reach_every_outcome_of_a_failure_without_errors() -> None:
    kinds = Counter(plan_scenarios.kind(line) for line in plan_scenarios.decided(seed=0, count=1500))
    assert plan_scenarios.unreached_outcomes(kinds) == []
    assert sum(n for k, n in kinds.items() if k.startswith("plan_failure")) > 500
