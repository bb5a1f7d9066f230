"""RLOO (REINFORCE Leave-One-Out, arXiv:2402.14740) through TRL's RLOOTrainer."""

from __future__ import annotations

from rljob_contract.plugins.algorithms.base import Algorithm

ALGORITHM = Algorithm(
    name="rloo",
    summary="REINFORCE Leave-One-Out (TRL's RLOOTrainer)",
    config_class="RLOOConfig",
    trainer_class="RLOOTrainer",
)
