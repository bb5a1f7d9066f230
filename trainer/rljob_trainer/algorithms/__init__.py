"""Policy-optimisation algorithms as plug-in modules, looked up by ``spec.training.algorithm``.

Each module (``grpo``, ``rloo``) declares one :class:`~rljob_trainer.algorithms.base.Algorithm`: its
TRL config and trainer classes, its named strategies (``spec.training.strategy``) and its batch rules. Everything that differs between algorithms reads
it from :data:`ALGORITHMS`; docs/architecture.md ("How to add an algorithm") lists the steps.
"""

from __future__ import annotations

from rljob_trainer.algorithms import grpo, rloo
from rljob_trainer.algorithms.base import Algorithm, Strategy

#: Every algorithm, by its ``spec.training.algorithm`` value; the first is the default.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (grpo.ALGORITHM, rloo.ALGORITHM)}
#: TRL's config class of each algorithm (``trainer/hack/gen_trl_fields.py`` reads these).
CONFIG_CLASSES: dict[str, str] = {name: a.config_class for name, a in ALGORITHMS.items()}
#: Every strategy name, over all algorithms (``spec.training.strategy``'s values).
STRATEGY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(s for a in ALGORITHMS.values() for s in a.strategies))

__all__ = ["ALGORITHMS", "CONFIG_CLASSES", "STRATEGY_NAMES", "Algorithm", "Strategy", "algorithm"]


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (KeyError naming the known ones)."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}") from None
