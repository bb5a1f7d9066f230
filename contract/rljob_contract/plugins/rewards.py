"""The built-in reward functions' descriptors: each one's name and the options it takes.

The functions themselves are the trainer's (``rljob_trainer.builtin.rewards``, TRL's signature
``f(prompts, completions, **columns) -> list[float]``); the models (``rljob_contract.spec``) and the CRD
(``rljob_operator.crd``) need only the names and the options, which live here, without the trainer.
"""

from __future__ import annotations

from typing import Any

#: The options each built-in takes in the manifest's ``kwargs``: name → schema of the value (the
#: vocabulary of ``rljob_contract.trl_fields``). The models and the CRD refuse other keys and wrong
#: types; a unit test keeps these equal to the functions' keyword parameters and their defaults.
BUILTIN_REWARD_OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "repeat_char": {
        "length": {"type": "integer", "minimum": 1, "default": 6,
                   "description": "repeat_char: how many leading characters are compared."},
    },
    "exact_match": {
        "prefix": {"type": "boolean", "default": False,
                   "description": "exact_match: 1.0 when the completion starts with the answer."},
    },
    "regex_match": {
        "pattern": {"type": "string", "default": ".*", "description": "regex_match: the regular expression."},
        "mode": {"type": "string", "enum": ["search", "fullmatch"], "default": "search",
                 "description": "regex_match: search (anywhere) or fullmatch (the whole completion)."},
    },
    "length_penalty": {
        "target_length": {"type": "integer", "default": 32,
                          "description": "length_penalty: the completion length (characters) without penalty."},
    },
    "digit_match": {},
}

#: The built-in rewards' names, in the order above.
BUILTIN_REWARD_NAMES: tuple[str, ...] = tuple(BUILTIN_REWARD_OPTIONS)
