"""GRPO (Group Relative Policy Optimization, arXiv:2402.03300) through TRL's GRPOTrainer.

The named strategies are GRPO-family variants researchers A/B, each a set of TRL's own GRPOConfig
options (trl 1.16 names). Without ``spec.training.strategy`` TRL's defaults apply, which in trl 1.16
are DAPO's token-level loss normalisation with symmetric clipping (epsilon 0.2), group-std reward
scaling and token-level importance ratios.
"""

from __future__ import annotations

from rljob_contract.plugins.algorithms.base import Algorithm, Strategy

STRATEGIES = {
    "grpo": Strategy(
        "GRPO as published: per-sequence length-normalised loss, group-std reward scaling",
        {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "token"},
        "arXiv:2402.03300",
    ),
    "dapo": Strategy(
        "DAPO: asymmetric clip-higher clipping, token-level loss, truncated completions masked",
        {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "mask_truncated_completions": True},
        "arXiv:2503.14476",
    ),
    "dr-grpo": Strategy(
        "Dr. GRPO: no length normalisation (constant divisor) and no std scaling of rewards",
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
        "arXiv:2503.20783",
    ),
    "gspo": Strategy(
        "GSPO: sequence-level importance ratios, clipped per sequence",
        {"importance_sampling_level": "sequence", "loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4},
        "arXiv:2507.18071",
    ),
}

ALGORITHM = Algorithm(
    name="grpo",
    summary="Group Relative Policy Optimization (TRL's GRPOTrainer)",
    config_class="GRPOConfig",
    trainer_class="GRPOTrainer",
    strategies=STRATEGIES,
)
