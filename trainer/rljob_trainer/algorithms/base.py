"""What an algorithm's implementation is: how the trainer runs what its descriptor declares.

The descriptor (``rljob_contract.plugins.algorithms``: name, TRL classes by name, strategies, batch rule)
is the contract's; a :class:`TrainerBuilder` turns it into a running TRL trainer. Its hooks are the
places algorithms differ: the TRL config fields the algorithm sets (:meth:`TrainerBuilder.arguments`),
the shape its trainer wants the data in (:meth:`TrainerBuilder.dataset`) and how the trainer is
constructed (:meth:`TrainerBuilder.build`). TRL's online trainers (GRPO, RLOO) need none overridden.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rljob_contract.plugins.algorithms import Algorithm
from rljob_contract.spec import TrainingSpec


@dataclass(frozen=True)
class TrainerBuilder:
    """Builds the TRL trainer of one algorithm (``descriptor``). Subclass it and override a hook where an
    algorithm differs from TRL's online trainers."""

    descriptor: Algorithm

    @property
    def name(self) -> str:
        return self.descriptor.name

    def trl_classes(self) -> tuple[Any, Any]:
        """TRL's config and trainer classes (imports TRL)."""
        trl = importlib.import_module("trl")
        return getattr(trl, self.descriptor.config_class), getattr(trl, self.descriptor.trainer_class)

    def arguments(self, training: TrainingSpec) -> dict[str, Any]:
        """TRL config fields the algorithm sets, between rljob's own (``worker.trl_arguments``) and the
        user's ``spec.training.trl``: the strategy's (which the models refuse under ``trl``)."""
        return self.descriptor.trl_arguments(training.strategy)

    def dataset(self, prompts: Any, training: TrainingSpec) -> Any:
        """The training data in the shape the trainer takes, from the prompts (a ``prompt`` column, and
        the columns rewards read): as they are for an online trainer, which generates the completions."""
        return prompts

    def build(self, trainer_cls: Any, *, model: str, reward_funcs: list[Any], args: Any, train_dataset: Any,
              processing_class: Any, callbacks: list[Any], peft_config: Any) -> Any:
        """The trainer, constructed as TRL's online trainers are."""
        return trainer_cls(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                           processing_class=processing_class, callbacks=callbacks, peft_config=peft_config)
