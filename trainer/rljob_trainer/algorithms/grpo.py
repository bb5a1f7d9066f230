"""GRPO's implementation: TRL's GRPOTrainer, built as an online trainer is (its descriptor:
``rljob_contract.plugins.algorithms.grpo``)."""

from __future__ import annotations

from rljob_contract.plugins.algorithms.grpo import ALGORITHM

from rljob_trainer.algorithms.base import TrainerBuilder

BUILDER = TrainerBuilder(ALGORITHM)
