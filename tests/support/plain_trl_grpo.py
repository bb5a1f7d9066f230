"""A plain TRL GRPOTrainer script — what a user would write by hand — for parity tests and benchmarks.

It builds the same tiny model, data and reward as the quickstart (rljob's built-ins are just
data and functions) and trains with TRL directly: no rljob launcher, config or callbacks.

    PYTHONSAFEPATH=1 python tests/support/plain_trl_grpo.py OUT_DIR MAX_STEPS [--model-overrides JSON] [--batch N]
        [--max-completion-length N] [--bf16] [--save-at-end]
        [--learning-rate LR]
    PYTHONSAFEPATH=1 python -m torch.distributed.run --nproc-per-node 2 tests/support/plain_trl_grpo.py OUT_DIR MAX_STEPS

PYTHONSAFEPATH=1 keeps this folder off the front of sys.path, where ``operator.py`` would shadow the
standard library's module.
"""

from __future__ import annotations

import argparse
import json

from datasets import Dataset
from rljob_trainer.builtin.rewards import repeat_char
from rljob_trainer.builtin.tasks import builtin_rows
from rljob_trainer.builtin.tiny_model import materialize_builtin_model
from rljob_trainer.telemetry import tokens_seen
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


def repeat_char_reward(prompts, completions, target, **kwargs):
    return repeat_char(prompts, completions, target, length=6)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("max_steps", type=int)
    p.add_argument("--model-overrides", default="{}")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-completion-length", type=int, default=6)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--learning-rate", type=float, default=0.003)
    p.add_argument("--save-at-end", action="store_true",
                   help="save a checkpoint after the last step, as rljob's trainer does (same work for benchmarks)")
    a = p.parse_args()
    out = a.out
    model_dir = materialize_builtin_model(f"{out}/model", json.loads(a.model_overrides), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_list(builtin_rows("builtin:repeat-char", 2048, seed=0))
    args = GRPOConfig(
        output_dir=f"{out}/trl",
        per_device_train_batch_size=a.batch,
        num_generations=8,
        max_completion_length=a.max_completion_length,
        learning_rate=a.learning_rate,
        lr_scheduler_type="constant",
        temperature=1.0,
        max_steps=a.max_steps,
        seed=0,
        use_cpu=not a.bf16,
        bf16=a.bf16,
        beta=0.0,
        logging_steps=1,
        save_strategy="steps" if a.save_at_end else "no",
        save_steps=a.max_steps,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[repeat_char_reward], args=args,
                          train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    if not trainer.is_world_process_zero():
        return
    logs = trainer.state.log_history
    history = [h for h in logs if "reward" in h]
    runtime = next(h["train_runtime"] for h in logs if "train_runtime" in h)
    tokens = tokens_seen(logs)
    with open(f"{out}/history.json", "w") as f:
        json.dump([{"step": h["step"], "reward": h["reward"], "loss": h["loss"]} for h in history], f)
    with open(f"{out}/runtime.json", "w") as f:
        json.dump({"train_runtime": runtime, "steps": trainer.state.global_step, "num_tokens": tokens}, f)


if __name__ == "__main__":
    main()
