"""Bad input met by a real ``rljob train`` (torchrun): a pre-flight error stops before any rank, an error in
a rank is permanent and named (the messages without a run: ``tests/trainer/test_bad_input.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.test_bad_input import _assert_permanent, _run_case, training

# Caught by the launcher's pre-flight (after the manifest is valid, before any rank starts).
PREFLIGHT_CASES = [
    ("missing-reward-module", training(rewards=[{"name": "no_such_module.rewards:score"}]),
     "spec.training.rewards[0].name: cannot import module 'no_such_module.rewards'"),
    ("missing-reward-function", training(rewards=[{"name": "rljob_test_rewards:nope"}]),
     "module 'rljob_test_rewards' has no function 'nope'"),
    ("reward-bad-signature", training(rewards=[{"name": "rljob_test_rewards:no_args"}]),
     "rljob_test_rewards:no_args must accept (prompts, completions, **kwargs)"),
    ("missing-dataset-file", training(dataset={"name": "/nonexistent/prompts.jsonl"}),
     "spec.training.dataset.name: dataset file '/nonexistent/prompts.jsonl' does not exist"),
    ("unknown-builtin-model", training(model="builtin:huge"), "spec.training.model"),
    ("reward-configmap-outside-a-cluster", training(rewards=[
        {"name": "rljob_test_rewards:boom", "source": {"configMap": {"name": "rewards", "key": "boom.py"}}}]),
     "spec.training.rewards[0].source.configMap: /etc/rljob-rewards/rljob_test_rewards.py is not there"),
]


# Only the running ranks can see these.
RUNTIME_CASES = [
    ("reward-raises", training(rewards=[{"name": "rljob_test_rewards:boom"}]),
     "reward function boom: raised RuntimeError: reward server unavailable"),
    ("reward-wrong-count", training(rewards=[{"name": "rljob_test_rewards:too_few"}]),
     "reward function too_few: returned 1 values for"),
    ("reward-not-numbers", training(rewards=[{"name": "rljob_test_rewards:not_numbers"}]),
     "reward function not_numbers: returned a non-number value 'high'"),
    ("prompt-field-missing", training(dataset={"name": "DATA", "promptField": "question"}),
     "spec.training.dataset.promptField: column 'question' not in dataset"),
    ("bf16-on-cpu", training(precision="bf16"), "spec.training.precision: bf16 needs a GPU"),
]


@pytest.mark.trainer
@pytest.mark.parametrize("case,patch,expected", PREFLIGHT_CASES, ids=[c[0] for c in PREFLIGHT_CASES])
def test_preflight_error_stops_before_any_rank(tmp_path: Path, case: str, patch: dict[str, Any], expected: str) -> None:
    result, out = _run_case(tmp_path, patch)
    _assert_permanent(result, out, expected, tmp_path)
    assert "node 0 failed" not in result.stderr  # no rank was started


@pytest.mark.trainer
@pytest.mark.parametrize("case,patch,expected", RUNTIME_CASES, ids=[c[0] for c in RUNTIME_CASES])
def test_runtime_error_in_a_rank_is_permanent_and_named(
    tmp_path: Path, case: str, patch: dict[str, Any], expected: str
) -> None:
    # One case with spawned ranks (how GPU nodes start them), the rest forked from the fork server.
    start = "spawn" if case == "reward-raises" else "auto"
    result, out = _run_case(tmp_path, patch, RLJOB_RANK_START=start)
    _assert_permanent(result, out, expected, tmp_path)
    assert "node 0 failed" in result.stderr
    # torch's agent names what it started: the worker module's interpreter, or the forked function.
    assert ("of binary: " if start == "spawn" else "of fn: forked_main") in result.stderr, result.stderr[-2000:]
