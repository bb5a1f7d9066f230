"""What an algorithm's descriptor declares: the shape the registry (``rljob_contract.plugins.algorithms``) holds.

Pure data and small functions, importable without torch or TRL: the schema (``rljob_contract.spec``),
the TRL rules (``rljob_contract.trl_rules``), the CRD (``rljob_operator.crd``) and ``rljob validate`` read
it. Running the algorithm is its implementation's part (``rljob_trainer.algorithms``: TRL's classes, the
trainer built with them).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A named variant of an algorithm: TRL config fields it sets, and where it comes from."""

    summary: str
    trl: dict[str, Any]
    reference: str  # the paper, as ``arXiv:<id>``

    def describe(self, name: str) -> str:
        """``dapo (DAPO, arXiv:2503.14476): loss_type='dapo', epsilon_high=0.28``."""
        fields = ", ".join(f"{k}={v!r}" for k, v in self.trl.items())
        return f"{name} ({self.summary}, {self.reference}): {fields}"


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One policy-optimisation algorithm: its TRL classes, its strategies and its batch rules.

    ``config_class``/``trainer_class``: TRL's classes, by name (``trl_fields`` lists the config's fields;
    the trainer's builder imports them).
    ``strategies``: the values ``spec.training.strategy`` takes with this algorithm (none: it takes none).
    ``whole_groups``: a generation batch must hold whole groups of ``numGenerations``
    (``rljob_contract.spec.check_generation_batch``, and the rules in ``rljob_contract.job``).
    """

    name: str
    summary: str
    config_class: str
    trainer_class: str
    strategies: dict[str, Strategy] = dataclasses.field(default_factory=dict)
    whole_groups: bool = True

    def trl_arguments(self, strategy: str | None) -> dict[str, Any]:
        """The TRL config fields this algorithm sets for ``strategy`` (None: TRL's own defaults)."""
        return dict(self.strategies[strategy].trl) if strategy is not None else {}

    def group_size(self, num_generations: int) -> int:
        """Completions a generation batch must hold whole multiples of (1: no grouping)."""
        return num_generations if self.whole_groups else 1

    def strategy_fields(self) -> tuple[str, ...]:
        """Every TRL field one of this algorithm's strategies sets."""
        return tuple(dict.fromkeys(k for s in self.strategies.values() for k in s.trl))

    def effective(self, strategy: str | None, args: Any) -> dict[str, Any]:
        """summary.json's ``algorithm``: name, strategy and the strategy fields' values in TRL's config ``args``."""
        trl = {k: getattr(args, k) for k in self.strategy_fields()}
        return {"name": self.name, "strategy": strategy, "trl": trl}
