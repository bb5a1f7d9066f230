"""Built-in tasks: small prompt sets generated from a seed, with checkable answers.

* ``builtin:repeat-char`` — the prompt is one character repeated six times (``"cccccc"``);
  the best completion continues the run (``"cccccc"``). Columns: ``prompt``, ``answer``,
  ``target``. Reward it with ``repeat_char`` (or ``exact_match`` with ``prefix: true``).
  A randomly initialised tiny model scores about 0.03; a trained one close to 1.0.
* ``builtin:add-digits`` — ``"3+4="`` → ``"7"``. Columns: ``prompt``, ``answer``.
* ``builtin:first-char`` — the prompt is six random characters (``"cafbed"``); the best completion
  repeats its first (``"cccccc"``). Columns as repeat-char's. 6^6 distinct prompts, so a held-out
  split (``spec.training.evaluation.heldOutFraction``) tests a rule learnt, not prompts remembered; an
  untrained model's greedy completion repeats the last character, right by chance (1 in 6).
"""

from __future__ import annotations

import random

REPEAT_CHARS = "abcdef"
REPEAT_PROMPT_LEN = 6


def repeat_char_rows(size: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        c = rng.choice(REPEAT_CHARS)
        rows.append({"prompt": c * REPEAT_PROMPT_LEN, "answer": c * REPEAT_PROMPT_LEN, "target": c})
    return rows


def first_char_rows(size: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        prompt = "".join(rng.choice(REPEAT_CHARS) for _ in range(REPEAT_PROMPT_LEN))
        rows.append({"prompt": prompt, "answer": prompt[0] * REPEAT_PROMPT_LEN, "target": prompt[0]})
    return rows


def add_digits_rows(size: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


BUILTIN_TASKS = {
    "builtin:repeat-char": repeat_char_rows,
    "builtin:add-digits": add_digits_rows,
    "builtin:first-char": first_char_rows,
}


def builtin_rows(name: str, size: int, seed: int) -> list[dict[str, str]]:
    return BUILTIN_TASKS[name](size, seed)
