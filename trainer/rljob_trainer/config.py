"""The trainer's schema: ``spec.training`` and ``spec.checkpoint`` of an RLTrainingJob.

These models are the single source of truth for what the trainer accepts. They import
without torch so the operator (and ``rljob validate``) can embed them. Field names are
camelCase in YAML, snake_case in Python; unknown fields are errors.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

BUILTIN_MODEL_PREFIX = "builtin:"
BUILTIN_MODELS = ("builtin:tiny",)
BUILTIN_DATASETS = ("builtin:repeat-char", "builtin:add-digits")
#: ``package.module:function`` — a custom reward importable inside the trainer image.
CUSTOM_REWARD_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")


class Model(BaseModel):
    """Shared settings: camelCase aliases, unknown fields forbidden."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )


class Algorithm(StrEnum):
    grpo = "grpo"
    rloo = "rloo"


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class DatasetSpec(Model):
    """Where prompts come from."""

    name: str = Field(
        "builtin:repeat-char",
        description=(
            "Built-in task (builtin:repeat-char, builtin:add-digits), a local JSONL/Parquet/CSV file, "
            "an s3:// object, or a datasets-library name."
        ),
        min_length=1,
    )
    prompt_field: str = Field("prompt", description="Column that holds the prompt text.", min_length=1)
    split: str = Field("train", description="Split to train on (datasets-library names only).", min_length=1)
    size: int = Field(512, ge=1, le=1_000_000, description="Number of rows generated for a built-in task.")

    @field_validator("name")
    @classmethod
    def _known_builtin(cls, v: str) -> str:
        if v.startswith(BUILTIN_MODEL_PREFIX) and v not in BUILTIN_DATASETS:
            raise ValueError(f"unknown built-in dataset {v!r}; choose one of {', '.join(BUILTIN_DATASETS)}")
        return v


class RewardSpec(Model):
    """One reward function and its weight in the total reward."""

    name: str = Field(
        ...,
        description=(
            "A built-in reward (repeat_char, exact_match, regex_match, length_penalty, digit_match) "
            "or package.module:function importable in the trainer image."
        ),
        min_length=1,
    )
    weight: float = Field(1.0, description="Weight of this reward in the weighted sum.")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments bound to the function (for example pattern)."
    )

    @field_validator("name")
    @classmethod
    def _name_form(cls, v: str) -> str:
        from rljob_trainer.builtin.rewards import BUILTIN_REWARDS

        if ":" in v:
            if not CUSTOM_REWARD_RE.match(v):
                raise ValueError(f"{v!r} is not of the form package.module:function")
        elif v not in BUILTIN_REWARDS:
            raise ValueError(
                f"unknown built-in reward {v!r}; choose one of {', '.join(sorted(BUILTIN_REWARDS))} "
                "or give package.module:function"
            )
        return v


class TrainingSpec(Model):
    """What to train and how: the policy-optimisation run itself."""

    algorithm: Algorithm = Field(Algorithm.grpo, description="Policy-optimisation algorithm: grpo or rloo.")
    model: str = Field(
        "builtin:tiny",
        description="builtin:tiny (built from a config, no download), a local path, an s3:// prefix, or a hub id.",
        min_length=1,
    )
    model_overrides: dict[str, int | float | str | bool] = Field(
        default_factory=dict,
        description="Architecture overrides for builtin:tiny (for example hiddenSize, numHiddenLayers).",
    )
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Prompt source.")
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="repeat_char")],
        min_length=1,
        description="Reward functions; the total reward is their weighted sum.",
    )
    batch_size: int = Field(32, ge=1, description="Completions per device per step (per_device_train_batch_size).")
    max_steps: int = Field(100, ge=1, description="Optimizer steps to train for.")
    learning_rate: float = Field(1e-5, gt=0, le=1.0, description="Peak learning rate.")
    num_generations: int = Field(8, ge=2, description="Completions sampled per prompt (the group size).")
    max_completion_length: int = Field(64, ge=1, description="Maximum tokens generated per completion.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step.")
    seed: int = Field(0, ge=0, description="Random seed for model init, sampling and data order.")
    precision: Precision = Field(Precision.fp32, description="fp32, bf16 or fp16 (bf16/fp16 need a GPU).")
    dataloader_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    beta: float = Field(0.0, ge=0, description="KL coefficient against the reference model (0 disables it).")
    logging_steps: int = Field(1, ge=1, description="Log metrics every N steps.")
    trl: dict[str, Any] = Field(
        default_factory=dict,
        description="Further TRL config fields (GRPOConfig/RLOOConfig), validated when the trainer starts.",
    )

    @field_validator("trl")
    @classmethod
    def _trl_no_managed_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        managed = sorted(set(v) & MANAGED_TRL_FIELDS)
        if managed:
            raise ValueError(
                f"{', '.join(managed)} are set by rljob from the named fields or the job; remove them from trl"
            )
        return v


#: TRL fields rljob sets itself; users set them through the named fields above.
MANAGED_TRL_FIELDS = frozenset(
    {
        "output_dir",
        "per_device_train_batch_size",
        "max_steps",
        "learning_rate",
        "num_generations",
        "max_completion_length",
        "gradient_accumulation_steps",
        "seed",
        "bf16",
        "fp16",
        "use_cpu",
        "dataloader_num_workers",
        "beta",
        "save_steps",
        "save_strategy",
        "save_total_limit",
        "logging_steps",
        "logging_dir",
        "report_to",
        "reward_weights",
        "resume_from_checkpoint",
    }
)


class CheckpointSpec(Model):
    """Where and how often checkpoints are written, and how many are kept."""

    every_steps: int = Field(50, ge=1, description="Save a checkpoint every N optimizer steps.")
    keep_last: int = Field(3, ge=1, description="Number of newest complete checkpoints kept.")
    keep_best: int = Field(0, ge=0, description="Also keep the K best checkpoints by bestMetric.")
    best_metric: str = Field("reward", description="Logged metric that ranks checkpoints for keepBest.")
    storage: str | None = Field(
        None,
        description=(
            "s3://bucket/prefix or a local path / mounted volume. Default: <output>/checkpoints "
            "(locally) or /workspace/checkpoints (in a pod)."
        ),
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint URL (else AWS_ENDPOINT_URL).")
    region: str | None = Field(None, description="S3 region (else AWS_REGION).")
    mirrors: list[str] = Field(default_factory=list, description="Backup locations each checkpoint is copied to.")

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, v: str | None) -> str | None:
        if v is not None and v.startswith("s3://") and len(v) <= len("s3://"):
            raise ValueError("s3:// location needs a bucket, for example s3://my-bucket/run1")
        return v


class WorkersSpec(Model):
    """How many pods (torchrun nodes) and processes per pod."""

    replicas: int = Field(1, ge=1, le=1024, description="Number of worker pods (torchrun nodes).")
    procs_per_worker: int = Field(1, ge=1, le=64, description="Processes per worker (usually GPUs per pod).")


def check_generation_batch(training: TrainingSpec, world_size: int) -> None:
    """TRL needs every generation batch to hold whole groups of ``num_generations``.

    Raises ValueError naming the field when ``batchSize × world size × gradientAccumulationSteps``
    is not a multiple of ``numGenerations``.
    """
    generation_batch = training.batch_size * world_size * training.gradient_accumulation_steps
    if generation_batch % training.num_generations:
        raise ValueError(
            f"numGenerations ({training.num_generations}) must divide the generation batch "
            f"batchSize × workers × gradientAccumulationSteps = {training.batch_size} × {world_size} × "
            f"{training.gradient_accumulation_steps} = {generation_batch}"
        )



class TrainerConfig(Model):
    """Everything one run of the trainer needs: what the operator puts in the job's ConfigMap
    and what ``rljob train`` derives from the same manifest."""

    job_name: str = Field(..., min_length=1, description="The RLTrainingJob's name.")
    namespace: str | None = Field(None, description="The job's namespace (in a cluster).")
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    world_size: int = Field(1, ge=1, description="Total processes: replicas × procsPerWorker.")
    output_dir: str = Field("runs/job", description="Where logs, TensorBoard events and the summary go.")

    def checkpoint_location(self) -> str:
        return self.checkpoint.storage or os.path.join(self.output_dir, "checkpoints")
