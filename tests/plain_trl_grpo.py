"""A plain TRL GRPOTrainer script — what a user would write by hand — for the parity test.

It builds the same tiny model, data and reward as the quickstart (rljob's built-ins are just
data and functions) and trains with TRL directly: no rljob launcher, config or callbacks.
Usage: python tests/plain_trl_grpo.py OUT_DIR MAX_STEPS
"""

from __future__ import annotations

import json
import sys

from datasets import Dataset
from rljob_trainer.builtin.rewards import repeat_char
from rljob_trainer.builtin.tasks import builtin_rows
from rljob_trainer.builtin.tiny_model import materialize_builtin_model
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


def repeat_char_reward(prompts, completions, target, **kwargs):
    return repeat_char(prompts, completions, target, length=6)


def main(out: str, max_steps: int) -> None:
    model_dir = materialize_builtin_model(f"{out}/model", {}, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_list(builtin_rows("builtin:repeat-char", 2048, seed=0))
    args = GRPOConfig(
        output_dir=f"{out}/trl",
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=6,
        learning_rate=0.003,
        lr_scheduler_type="constant",
        temperature=1.0,
        max_steps=max_steps,
        seed=0,
        use_cpu=True,
        bf16=False,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[repeat_char_reward], args=args,
                          train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    history = [h for h in trainer.state.log_history if "reward" in h]
    with open(f"{out}/history.json", "w") as f:
        json.dump([{"step": h["step"], "reward": h["reward"], "loss": h["loss"]} for h in history], f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
