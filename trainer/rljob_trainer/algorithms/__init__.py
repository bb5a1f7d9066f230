"""The algorithms' implementations: a trainer builder per algorithm, by its ``spec.training.algorithm``.

The descriptors (``rljob_contract.plugins.algorithms``) say what each algorithm is; the worker runs one
through its :class:`~rljob_trainer.algorithms.base.TrainerBuilder` from :data:`BUILDERS`.
docs/architecture.md ("How to add an algorithm") lists the steps.
"""

from __future__ import annotations

from rljob_contract.plugins.algorithms import ALGORITHMS

from rljob_trainer.algorithms import grpo, rloo
from rljob_trainer.algorithms.base import TrainerBuilder

#: Every algorithm's builder, by name; exactly the descriptors' algorithms.
BUILDERS: dict[str, TrainerBuilder] = {b.name: b for b in (grpo.BUILDER, rloo.BUILDER)}
if set(BUILDERS) != set(ALGORITHMS):
    raise NotImplementedError(f"rljob_trainer.algorithms: builders {sorted(BUILDERS)} for the descriptors "
                              f"{sorted(ALGORITHMS)}: each algorithm needs both (docs/architecture.md)")

__all__ = ["BUILDERS", "TrainerBuilder", "builder"]


def builder(name: str) -> TrainerBuilder:
    """The builder of the algorithm called ``name`` (KeyError naming the known ones)."""
    try:
        return BUILDERS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(BUILDERS)}") from None
