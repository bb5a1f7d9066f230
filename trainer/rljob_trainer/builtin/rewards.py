"""Built-in reward functions (TRL signature: ``f(prompts, completions, **columns) -> list[float]``).

Every built-in returns one float per completion. Dataset columns arrive as keyword
arguments (``answer``, ``target``); options from the manifest's ``kwargs`` are bound by name.

* ``repeat_char`` — fraction of the first ``length`` characters equal to the row's ``target``
  character (the ``builtin:repeat-char`` task). 0 = none, 1 = all.
* ``exact_match`` — 1.0 when the completion, stripped, equals the row's ``answer`` (with
  ``prefix=True``: starts with it), else 0.0.
* ``regex_match`` — 1.0 when ``pattern`` matches (``mode``: ``search`` or ``fullmatch``).
* ``length_penalty`` — ``-|len - target_length| / target_length``, clipped to ``[-1, 0]``.
* ``digit_match`` — fraction of the ``answer``'s characters matched position by position
  (the ``builtin:add-digits`` task).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from rljob_contract.plugins.rewards import BUILTIN_REWARD_OPTIONS


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings, or message lists for conversational data."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def repeat_char(
    prompts: Sequence[Any], completions: Sequence[Any], target: Sequence[str], length: int = 6, **_: Any
) -> list[float]:
    out = []
    for completion, char in zip(completions, target, strict=True):
        head = completion_text(completion)[:length]
        out.append(sum(1 for c in head if c == char) / length)
    return out


def exact_match(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str], prefix: bool = False, **_: Any
) -> list[float]:
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion_text(completion).strip()
        hit = text.startswith(str(expected).strip()) if prefix else text == str(expected).strip()
        out.append(1.0 if hit else 0.0)
    return out


def regex_match(
    prompts: Sequence[Any], completions: Sequence[Any], pattern: str = ".*", mode: str = "search", **_: Any
) -> list[float]:
    compiled = re.compile(pattern)
    match = compiled.fullmatch if mode == "fullmatch" else compiled.search
    return [1.0 if match(completion_text(c)) else 0.0 for c in completions]


def length_penalty(
    prompts: Sequence[Any], completions: Sequence[Any], target_length: int = 32, **_: Any
) -> list[float]:
    out = []
    for c in completions:
        n = len(completion_text(c))
        out.append(max(-1.0, -abs(n - target_length) / max(1, target_length)))
    return out


def digit_match(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str], **_: Any
) -> list[float]:
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion_text(completion)
        expected = str(expected)
        hits = sum(1 for i, ch in enumerate(expected) if i < len(text) and text[i] == ch)
        out.append(hits / max(1, len(expected)))
    return out


#: The functions, by the names the descriptor (``rljob_contract.plugins.rewards``) declares with their options.
BUILTIN_REWARDS: dict[str, Callable[..., list[float]]] = {
    "repeat_char": repeat_char,
    "exact_match": exact_match,
    "regex_match": regex_match,
    "length_penalty": length_penalty,
    "digit_match": digit_match,
}

if set(BUILTIN_REWARDS) != set(BUILTIN_REWARD_OPTIONS):
    raise NotImplementedError("rljob_trainer.builtin.rewards: each built-in reward needs a descriptor in "
                              "rljob_contract.plugins.rewards and a function here")
