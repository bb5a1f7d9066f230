"""Policy-optimisation algorithms' descriptors, looked up by ``spec.training.algorithm``.

Each module (``grpo``, ``rloo``) declares one :class:`~rljob_contract.plugins.algorithms.base.Algorithm`:
its TRL config and trainer classes by name, its named strategies (``spec.training.strategy``) and its batch
rules. The schema, the TRL rules and the CRD read it from :data:`ALGORITHMS`; the trainer registers a
builder for each (``rljob_trainer.algorithms``). docs/architecture.md ("How to add an algorithm") lists
the steps.
"""

from __future__ import annotations

from rljob_contract.plugins.algorithms import grpo, rloo
from rljob_contract.plugins.algorithms.base import Algorithm, Strategy

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
