"""A failure's decision is read in one pass down its steps, and the old-vs-new comparison of Plans
(``tests/support/plan_scenarios.py``) still draws scenarios that reach every outcome a failure can have."""

from __future__ import annotations

from collections import Counter
from types import ModuleType

from tests.support import plan_scenarios
from tests.support.operator_process import REPO
from tests.support.scripts import load_script

STEPS = ("failure", "failure.observe", "failure.classify", "failure.respond", "failure.record")


def _context_walk() -> ModuleType:
    """``tools/context_walk.py``."""
    return load_script(REPO / "tools" / "context_walk.py")


def test_plan_failures_context_goes_down_the_steps_in_order_and_never_back() -> None:
    walk_module = _context_walk()
    walk = walk_module.Walk(walk_module.load(REPO / "operator", walk_module.PACKAGE))
    walk.function(f"{walk_module.PACKAGE}.failure", "plan_failure", {"ctx": None})
    read = [m.removeprefix(walk_module.PACKAGE + ".") for m in walk_module.reading_order(walk.steps)]
    # Between two steps' modules the reader may look down into a shared one (situation, plan, children),
    # but never turns back to an earlier step: the step modules, read in order, form one run each.
    steps_read = [m for m in read if m in STEPS]
    assert [m for i, m in enumerate(steps_read) if i == 0 or steps_read[i - 1] != m] == list(STEPS)
    assert walk_module.visits(walk.steps, derived=False)[f"{walk_module.PACKAGE}.failure.observe"] == 1


def test_the_random_scenarios_reach_every_outcome_of_a_failure_without_errors() -> None:
    kinds = Counter(plan_scenarios.kind(line) for line in plan_scenarios.decided(seed=0, count=1500))
    assert plan_scenarios.unreached_outcomes(kinds) == []
    assert sum(n for k, n in kinds.items() if k.startswith("plan_failure")) > 500
