"""RLOO's implementation: TRL's RLOOTrainer, built as an online trainer is (its descriptor:
``rljob_contract.plugins.algorithms.rloo``)."""

from __future__ import annotations

from rljob_contract.plugins.algorithms.rloo import ALGORITHM

from rljob_trainer.algorithms.base import TrainerBuilder

BUILDER = TrainerBuilder(ALGORITHM)
