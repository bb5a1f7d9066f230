"""Rewards without a training run: the built-in rewards' semantics, a reward function's failures named,
weights and distinct names. Custom rewards' modules from their ``source``: ``test_reward_sources.py``."""

from __future__ import annotations

import pytest
from rljob_contract.spec import RewardSpec
from rljob_trainer.builtin import rewards as builtin
from rljob_trainer.errors import PermanentError
from rljob_trainer.rewards import RewardFunctionError, checked_reward, resolve_rewards


def test_builtin_rewards_semantics() -> None:
    assert builtin.repeat_char([], ["aaab", "bbbbbb"], target=["a", "a"], length=4) == [0.75, 0.0]
    assert builtin.exact_match([], [" 12 ", "123"], answer=["12", "12"]) == [1.0, 0.0]
    assert builtin.exact_match([], ["123"], answer=["12"], prefix=True) == [1.0]
    assert builtin.regex_match([], ["<a>x</a>", "x"], pattern=r"<a>.*</a>") == [1.0, 0.0]
    assert builtin.length_penalty([], ["x" * 10, "x" * 100], target_length=10) == [0.0, -1.0]
    assert builtin.digit_match([], ["12", "19"], answer=["12", "12"]) == [1.0, 0.5]
    conversational = [[{"role": "assistant", "content": "42"}]]
    assert builtin.exact_match([], conversational, answer=["42"]) == [1.0]


def test_checked_reward_names_the_function_on_each_kind_of_failure() -> None:
    def raises(prompts, completions, **kw):
        raise KeyError("answer")

    with pytest.raises(RewardFunctionError, match="reward function scorer: raised KeyError"):
        checked_reward(raises, "scorer", {})(prompts=["p"], completions=["c"])
    with pytest.raises(RewardFunctionError, match="returned 1 values for 2 completions"):
        checked_reward(lambda prompts, completions, **k: [1.0], "scorer", {})(prompts=["p"] * 2, completions=["c"] * 2)
    with pytest.raises(RewardFunctionError, match="returned NaN"):
        checked_reward(lambda prompts, completions, **k: [float("nan")], "scorer", {})(prompts=["p"], completions=["c"])
    ok = checked_reward(builtin.repeat_char, "repeat_char", {"length": 2})
    assert ok(prompts=["aa"], completions=["ab"], target=["a"]) == [0.5]
    assert ok.__name__ == "repeat_char"


def test_resolve_rewards_keeps_weights_and_distinct_names() -> None:
    funcs, weights = resolve_rewards([RewardSpec(name="exact_match", weight=2.0), RewardSpec(name="exact_match")])
    assert [f.__name__ for f in funcs] == ["exact_match", "exact_match_1"]
    assert weights == [2.0, 1.0]
    with pytest.raises(PermanentError, match=r"spec.training.rewards\[0\].name: cannot import module"):
        resolve_rewards([RewardSpec(name="nope_mod:f")])
