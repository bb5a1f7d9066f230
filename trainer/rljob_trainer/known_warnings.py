"""Warnings from our dependencies that say nothing to an rljob user, filtered in one place.

The launcher and every worker call :func:`silence_known_warnings` first (workers are spawned,
so filters do not carry over). Each filter matches one message, its category and the module
that raises it, so any other warning, and the same text from anywhere else, still shows.

* transformers 5 renamed ``gradient_checkpointing*`` to ``activation_checkpointing*``; TRL 1.16
  still uses the old names itself: its GRPO/RLOO configs default ``gradient_checkpointing=True``
  (a FutureWarning from ``TrainingArguments.__post_init__`` per process) and its generation
  context managers call ``is_gradient_checkpointing`` / ``gradient_checkpointing_disable`` /
  ``gradient_checkpointing_enable`` every step (shown again after each checkpoint, because saving
  resets the warnings registry). Nothing a user can change; gone when TRL moves to the new names.
* accelerate announces that it picked a CPU thread count because ``OMP_NUM_THREADS`` is unset:
  what it does is the right default for ``rljob train`` on CPU, and the note repeats per rank.
"""

from __future__ import annotations

import warnings

#: (message regex, category, module regex) — see the module docstring for why each is noise.
KNOWN_NOISE: tuple[tuple[str, type[Warning], str], ...] = (
    (r"`(is_)?gradient_checkpointing(_enable|_disable|_kwargs)?` is deprecated and will be removed in v6\.",
     FutureWarning, r"transformers\.(modeling_utils|training_args)\Z"),
    (r"OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at \d+ to improve oob performance",
     UserWarning, r"accelerate\.state\Z"),
)


def silence_known_warnings() -> None:
    """Ignore the warnings in :data:`KNOWN_NOISE` in this process (idempotent)."""
    for message, category, module in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
