"""The trainer's schema: ``spec.training`` and ``spec.checkpoint`` of an RLTrainingJob.

These models are the single source of truth for what the trainer accepts. They import
without torch so the operator (and ``rljob validate``) can embed them. Field names are
camelCase in YAML, snake_case in Python; unknown fields are errors.
"""

from __future__ import annotations

import math
import os
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
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


#: Manifest keys that look like credentials: refused with a pointer to credentialsSecret.
CREDENTIAL_KEYS = frozenset(
    k.lower()
    for k in (
        "accessKeyId", "secretAccessKey", "sessionToken", "awsAccessKeyId", "awsSecretAccessKey",
        "awsSessionToken", "secretKey", "accessKey", "credentials", "password",
    )
)
#: A Kubernetes object name (DNS-1123 subdomain).
K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _refuse_credentials(data: Any) -> Any:
    if isinstance(data, dict):
        for key in data:
            if isinstance(key, str) and key.replace("_", "").lower() in CREDENTIAL_KEYS:
                raise ValueError(
                    f"@{key}: credentials never go in the manifest (it ends up in a ConfigMap and in Git); "
                    "put them in a Secret named by credentialsSecret, or use the pod's service account "
                    "(IRSA / workload identity)"
                )
    return data


def _check_location(v: str) -> str:
    if v.startswith("s3://"):
        if len(v) <= len("s3://") or v[len("s3://")] == "/":
            raise ValueError("s3:// location needs a bucket, for example s3://my-bucket/run1")
    elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", v):
        raise ValueError(
            f"{v!r}: use s3://bucket/prefix (any S3-compatible endpoint, with endpointUrl) or a local path"
        )
    return v


def _check_endpoint(v: str | None) -> str | None:
    if v is None:
        return v
    if not re.match(r"^https?://[^/?#]+", v):
        raise ValueError(f"{v!r} is not an http(s):// URL")
    if "@" in v.split("://", 1)[1].split("/", 1)[0]:
        raise ValueError("credentials never go in the endpoint URL; use credentialsSecret or the service account")
    return v


def _check_secret_name(v: str | None) -> str | None:
    if v is not None and (len(v) > 253 or not K8S_NAME_RE.match(v)):
        raise ValueError(f"{v!r} is not a Secret name (lowercase letters, digits, '-' and '.')")
    return v


class MirrorSpec(Model):
    """A backup location every complete checkpoint is copied to (another bucket, region or endpoint)."""

    location: str = Field(..., min_length=1, description="s3://bucket/prefix or a local path / mounted volume.")
    endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint URL of this mirror (else the primary's rules: AWS_ENDPOINT_URL)."
    )
    region: str | None = Field(None, description="S3 region of this mirror (else AWS_REGION).")
    credentials_secret: str | None = Field(
        None,
        description=(
            "Secret whose keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN) the "
            "operator exposes as environment with the prefix RLJOB_MIRROR<i>_ (i = index in mirrors), for a "
            "mirror on another account or provider. Default: the primary's credentials."
        ),
    )

    _no_credentials = model_validator(mode="before")(_refuse_credentials)
    _location = field_validator("location")(_check_location)
    _endpoint = field_validator("endpoint_url")(_check_endpoint)
    _secret = field_validator("credentials_secret")(_check_secret_name)


class CheckpointSpec(Model):
    """Where and how often checkpoints are written, and how many are kept.

    Credentials are never fields: they come from the pod's service account (IRSA / workload
    identity), the standard ``AWS_*`` environment, or the Secret named by ``credentialsSecret``.
    """

    every_steps: int = Field(50, ge=1, description="Save a checkpoint every N optimizer steps.")
    keep_last: int = Field(3, ge=1, description="Number of newest complete checkpoints kept (locally and remotely).")
    keep_best: int = Field(0, ge=0, description="Also keep the K best checkpoints by bestMetric.")
    best_metric: str = Field("reward", description="Logged metric that ranks checkpoints for keepBest (higher is better).")
    storage: str | None = Field(
        None,
        description=(
            "s3://bucket/prefix (any S3-compatible endpoint) or a local path / mounted volume. Default: "
            "<output>/checkpoints (locally) or /workspace/checkpoints (in a pod). With s3:// the trainer "
            "writes to a local staging folder and uploads each checkpoint in the background."
        ),
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint URL (else AWS_ENDPOINT_URL).")
    region: str | None = Field(None, description="S3 region (else AWS_REGION).")
    credentials_secret: str | None = Field(
        None,
        description=(
            "Name of a Secret in the job's namespace exposed to the trainer as environment (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN). Omit to use the pod's service account "
            "(IRSA / workload identity)."
        ),
    )
    mirrors: list[MirrorSpec] = Field(
        default_factory=list,
        description=(
            "Backup locations each complete checkpoint is copied to (same protocol: files, verify, manifest, "
            "latest). Resume falls back to a mirror when the primary is unreachable or its copy is corrupt."
        ),
    )
    upload_retries: int = Field(
        3, ge=0, le=20,
        description=(
            "Retries (with exponential backoff) of a failed upload of one checkpoint to one location before it "
            "is skipped; training never waits for them."
        ),
    )
    upload_timeout_seconds: int = Field(
        900, ge=0,
        description="At the end of training, how long to wait for pending uploads before writing the summary.",
    )
    part_size_mib: int = Field(
        16, ge=5, le=5120,
        description="Multipart part size (MiB) of uploads; files smaller than this go in one PUT.",
    )
    upload_concurrency: int = Field(10, ge=1, le=64, description="Parallel transfers (files and parts) of an upload.")

    _no_credentials = model_validator(mode="before")(_refuse_credentials)
    _endpoint = field_validator("endpoint_url")(_check_endpoint)
    _secret = field_validator("credentials_secret")(_check_secret_name)

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, v: str | None) -> str | None:
        return None if v is None else _check_location(v)


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


def accumulation_for(batch_size: int, world_size: int, global_batch: int, num_generations: int) -> int:
    """``gradientAccumulationSteps`` that keeps ``global_batch`` at ``world_size`` processes.

    The exact value is ``global_batch / (batch_size × world_size)``. When that is not a whole
    number, or the resulting generation batch would not hold whole groups of ``num_generations``,
    the nearest valid value is chosen (ties: the larger global batch). Always ≥ 1.
    """
    per_step = batch_size * world_size
    ideal = global_batch / per_step
    step = num_generations // math.gcd(per_step, num_generations)  # valid values are multiples of this
    low = max(step, math.floor(ideal / step) * step)
    candidates = {low, low + step}
    return min(candidates, key=lambda a: (abs(a * per_step - global_batch), -a))


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
