"""``rljob evaluate``: a checkpoint on the evaluation prompts of a job's ``spec.training.evaluation``.

The checkpoint comes from a folder or object storage through ``Location.fetch``, which verifies every
file against the checkpoint's manifest (files read back from storage are untrusted). A LoRA checkpoint
is applied to the base model its manifest records (``export.trusted_base``) or to ``--base``. The prompts
and metrics are the training's own (``data.training_and_eval_prompts``, ``evaluation.Scorer``), so with
greedy decoding the result is the value the training logged at that step.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rljob_contract.spec import DatasetSpec, EvaluationSpec, TrainerConfig

from rljob_trainer.errors import PermanentError


@dataclass
class CheckpointEval:
    """One checkpoint's evaluation: where it came from, its step, the prompts and the metrics."""

    checkpoint: str
    step: int
    prompts: int
    metrics: dict[str, float]

    def table(self) -> str:
        width = max(len(name) for name in self.metrics) if self.metrics else 6
        lines = [f"{self.checkpoint} (step {self.step}, {self.prompts} prompts)", f"{'METRIC':<{width}}  VALUE"]
        lines += [f"{name:<{width}}  {value:.4f}" for name, value in self.metrics.items()]
        return "\n".join(lines)


def with_dataset(cfg: TrainerConfig, dataset: str | None, split: str | None) -> TrainerConfig:
    """``cfg`` evaluating on ``dataset`` (the command's ``--dataset``) instead of what the manifest says."""
    evaluation = cfg.training.evaluation
    if dataset is None:
        if evaluation is None:
            raise PermanentError("spec.training.evaluation", "the manifest has no evaluation section; add one or "
                                 "give --dataset")
        return cfg
    spec = DatasetSpec(name=dataset, split=split or "test",
                       prompt_field=cfg.training.dataset.prompt_field)
    base = evaluation.model_dump(exclude={"dataset", "held_out_fraction"}) if evaluation else {}
    new = EvaluationSpec.model_validate({**base, "dataset": spec.model_dump()})
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"evaluation": new})})


def load_policy(checkpoint: Path, base: str | None) -> tuple[Any, Any]:
    """(model, tokenizer) of a verified local checkpoint: a full model, or a LoRA adapter on its base."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rljob_trainer.checkpoints.export import ADAPTER_CONFIG, trusted_base

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not (checkpoint / ADAPTER_CONFIG).is_file():
        return AutoModelForCausalLM.from_pretrained(str(checkpoint)), tokenizer
    from peft import PeftModel

    base_model = AutoModelForCausalLM.from_pretrained(base or trusted_base(checkpoint))
    return PeftModel.from_pretrained(base_model, str(checkpoint)), tokenizer


def evaluate_checkpoint(uri: str, cfg: TrainerConfig, *, base: str | None = None, endpoint_url: str | None = None,
                        region: str | None = None) -> CheckpointEval:
    """Fetch (verified) and evaluate the checkpoint at ``uri`` (a checkpoint, or a location's latest)."""
    import torch

    from rljob_trainer.checkpoints.backends import location_for
    from rljob_trainer.checkpoints.compare import split_checkpoint_uri
    from rljob_trainer.checkpoints.manifest import step_of
    from rljob_trainer.data import training_and_eval_prompts
    from rljob_trainer.evaluation import EvalSet, Scorer, evaluate_model

    evaluation = cfg.training.evaluation
    assert evaluation is not None  # with_dataset made sure
    scorer = Scorer(evaluation, cfg.training.rewards)
    root, name = split_checkpoint_uri(uri)
    loc = location_for(root, endpoint_url=endpoint_url, region=region)
    listing = loc.listing()
    name = name or listing.latest
    info = next((c for c in listing.complete if c.name == name), None)
    if info is None:
        raise PermanentError(uri, f"no complete checkpoint {name or '(no latest)'} at {loc.uri}")
    with tempfile.TemporaryDirectory(prefix="rljob-evaluate-") as tmp:
        local = loc.fetch(info, listing, Path(tmp))  # every file verified against the manifest
        model, tokenizer = load_policy(local, base)
        if torch.cuda.is_available():  # as the training evaluated it
            model.to("cuda")
        _, eval_dataset = training_and_eval_prompts(cfg.training, str(Path(tmp) / ".cache"))
        data = EvalSet.from_dataset(eval_dataset)
        values = evaluate_model(model, tokenizer, data, scorer, cfg.training.max_completion_length, cfg.training.seed)
    assert values is not None  # one process: rank 0
    return CheckpointEval(loc.child_uri(info.name), step_of(info.name) or 0, len(data.prompts), values)
