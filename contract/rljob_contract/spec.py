"""The trainer's schema: ``spec.training`` and ``spec.checkpoint`` of an RLTrainingJob.

These models are the single source of truth for what the trainer accepts. They import
without torch so the operator (and ``rljob validate``) can embed them. Field names are
camelCase in YAML, snake_case in Python; unknown fields are errors.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from rljob_contract.health import HealthSpec
from rljob_contract.plugins.algorithms import ALGORITHMS, CONFIG_CLASSES, STRATEGY_NAMES
from rljob_contract.plugins.rewards import BUILTIN_REWARD_NAMES as BUILTIN_REWARDS
from rljob_contract.plugins.rewards import BUILTIN_REWARD_OPTIONS
from rljob_contract.plugins.storage import PVC, StorageBackend, backends
from rljob_contract.plugins.storage import check_location as _check_location
from rljob_contract.rules import Rule, cel_list, enforce
from rljob_contract.trl_fields import TRL_FIELDS, TRL_VERSION
from rljob_contract.trl_rules import CREDENTIAL_NAME_RE, CREDENTIAL_TRL_MESSAGE, OWN_REFUSALS, refused_fields

BUILTIN_MODEL_PREFIX = "builtin:"
BUILTIN_MODELS = ("builtin:tiny",)
BUILTIN_DATASETS = ("builtin:repeat-char", "builtin:add-digits", "builtin:first-char")
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


#: ``spec.training.algorithm``: one value per algorithm descriptor (``rljob_contract.plugins.algorithms``).
Algorithm = StrEnum("Algorithm", {name: name for name in ALGORITHMS})  # type: ignore[misc]
#: ``spec.training.strategy``: every algorithm's named strategies.
StrategyName = StrEnum("StrategyName", {name: name for name in STRATEGY_NAMES})  # type: ignore[misc]


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


def dataset_rules(at: str) -> list[Rule]:
    """A :class:`DatasetSpec` at ``at`` (spec.training.dataset, spec.training.evaluation.dataset)."""
    return [Rule(
        f"{at}.name: a known built-in", at,
        f"!self.name.startsWith('builtin:') || self.name in {cel_list(BUILTIN_DATASETS)}",
        f"{at}.name: unknown built-in dataset; choose one of {', '.join(BUILTIN_DATASETS)}", ".name",
        holds=lambda d: not d.name.startswith(BUILTIN_MODEL_PREFIX) or d.name in BUILTIN_DATASETS,
        enforced_by="DatasetSpec._known_builtin",
    )]


#: A Kubernetes object name (DNS-1123 subdomain), as a pattern the CRD carries too.
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A Kubernetes label value (non-empty).
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
#: Largest reward module fetched from a ``uri`` source (a module, not a model: one mebibyte).
MAX_REWARD_MODULE_BYTES = 1 << 20


class ConfigMapReward(Model):
    """A reward module held in a ConfigMap of the job's namespace (its creator must be able to read it)."""

    name: str = Field(..., min_length=1, max_length=253, pattern=K8S_NAME_PATTERN,
                      description="The ConfigMap, in the job's namespace.")
    key: str = Field(..., min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
                     description="Its key holding the module's Python source; the operator mounts it read-only as "
                                 "<module path>.py in a folder the trainer puts first on sys.path.")


class RewardSource(Model):
    """Where a custom reward's module comes from when the trainer image lacks it: set one of the two."""

    config_map: ConfigMapReward | None = Field(
        None, description="A ConfigMap of the job's namespace, mounted read-only into the workers.")
    uri: str | None = Field(
        None, min_length=1, max_length=2048,
        description=f"An s3://bucket/key.py object the trainer fetches (at most {MAX_REWARD_MODULE_BYTES} bytes) "
                    "with the runtime's storage credentials before it imports the module; it must lie under one "
                    "of the runtime's spec.sources.allowed prefixes.")

    @model_validator(mode="after")
    def _one(self) -> RewardSource:
        enforce(self, REWARD_SOURCE_RULES)
        return self


REWARD_SOURCE_RULES = [
    Rule("spec.training.rewards[].source: one of configMap, uri", "spec.training.rewards[].source",
         "has(self.configMap) != has(self.uri)",
         "spec.training.rewards[].source: set configMap or uri (exactly one)", None,
         holds=lambda s: (s.config_map is None) != (s.uri is None),
         refusal="set configMap or uri (exactly one)"),
    Rule("spec.training.rewards[].source.uri: an s3:// .py object", "spec.training.rewards[].source",
         "!has(self.uri) || (self.uri.startsWith('s3://') && self.uri.endsWith('.py'))",
         "spec.training.rewards[].source.uri must be an s3://bucket/key.py object", ".uri",
         holds=lambda s: s.uri is None or (s.uri.startswith("s3://") and s.uri.endswith(".py")
                                            and len(s.uri) > len("s3://x/.py")),
         refusal="@uri: must be an s3://bucket/key.py object"),
]


def reward_module(name: str) -> str:
    """The module of a custom reward ``package.module:function``."""
    return name.split(":", 1)[0]


def reward_module_file(name: str) -> str:
    """Where a sourced reward's module lies in its folder: ``package/module.py`` for ``package.module:function``."""
    return reward_module(name).replace(".", "/") + ".py"


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
        default_factory=dict,
        description=(
            "Keyword arguments bound to the function. A built-in takes only its options (repeat_char: length; "
            "exact_match: prefix; regex_match: pattern, mode; length_penalty: target_length; digit_match: none); "
            "a custom function's are free-form."
        ),
    )

    source: RewardSource | None = Field(
        None,
        description=(
            "Where a custom reward's module comes from, when the trainer image does not have it: a ConfigMap of "
            "the job's namespace or an s3:// object under the runtime's spec.sources.allowed. Not for built-ins."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name_form(cls, v: str) -> str:
        return check_reward_name(v)

    @field_validator("kwargs")
    @classmethod
    def _builtin_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return check_reward_kwargs(info.data.get("name"), v)

    @model_validator(mode="after")
    def _sourced_custom(self) -> RewardSpec:
        if self.source is not None and ":" not in self.name:
            raise ValueError(f"@source: {self.name} is a built-in reward; only a custom reward "
                             "(package.module:function) has a source")
        return self


REWARD_RULES = [Rule(
    "spec.training.rewards[].name: built-in or package.module:function", "spec.training.rewards[]",
    f"self.name in {cel_list(BUILTIN_REWARDS)} || self.name.matches(r'{CUSTOM_REWARD_RE.pattern}')",
    f"spec.training.rewards[].name must be a built-in reward ({', '.join(sorted(BUILTIN_REWARDS))}) or "
    "package.module:function", ".name",
    holds=lambda r: r.name in BUILTIN_REWARDS or bool(CUSTOM_REWARD_RE.match(r.name)),
    enforced_by="check_reward_name",
), Rule(
    "spec.training.rewards[].source: custom rewards only", "spec.training.rewards[]",
    "!has(self.source) || self.name.contains(':')",
    "spec.training.rewards[].source: only a custom reward (package.module:function) has a source", ".source",
    holds=lambda r: r.source is None or ":" in r.name, enforced_by="RewardSpec._sourced_custom",
)]


def check_reward_name(v: str, also: tuple[str, ...] = ()) -> str:
    """A built-in reward's name (or one of ``also``) or ``package.module:function``."""
    if ":" in v:
        if not CUSTOM_REWARD_RE.match(v):
            raise ValueError(f"{v!r} is not of the form package.module:function")
    elif v not in BUILTIN_REWARDS and v not in also:
        raise ValueError(
            f"unknown built-in {'reward or metric' if also else 'reward'} {v!r}; choose one of {', '.join(sorted((*BUILTIN_REWARDS, *also)))} "
            "or give package.module:function"
        )
    return v


def check_reward_kwargs(name: str | None, v: dict[str, Any]) -> dict[str, Any]:
    """A built-in reward takes only its own options; a custom function's kwargs are its own business."""
    if name not in BUILTIN_REWARD_OPTIONS:
        return v
    options = BUILTIN_REWARD_OPTIONS[name]
    takes = ", ".join(options) or "no options"
    check_options(v, options, "kwargs", unknown=f"not an option of the built-in reward {name} (it takes {takes})",
                  adapter_owner=name)
    if name == "regex_match" and isinstance(v.get("pattern"), str):
        try:
            re.compile(v["pattern"])
        except re.error as e:
            raise ValueError(f"@pattern: not a regular expression: {e}") from None
    return v


class LoraSpec(Model):
    """LoRA adapters (PEFT's ``LoraConfig``) trained instead of the full model."""

    r: int = Field(16, ge=1, le=4096, description="Rank of the adapter matrices.")
    alpha: int = Field(32, ge=1, description="Scaling numerator: the adapter's update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=lambda: ["all-linear"], min_length=1, max_length=256,
        description=(
            "Module names (or name suffixes) that get adapters, for example [q_proj, v_proj]; [all-linear] "
            "targets every linear layer except the output head."
        ),
    )
    modules_to_save: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=256,
        description="Modules trained in full and saved with the adapter (for example a new embedding or head).",
    )

    @field_validator("target_modules", "modules_to_save")
    @classmethod
    def _module_names(cls, v: list[str]) -> list[str]:
        for i, name in enumerate(v):
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
                raise ValueError(f"@{i}: {name!r} is not a module name (letters, digits, '_', '.', '-')")
        if "all-linear" in v and len(v) > 1:
            raise ValueError("all-linear stands alone: give it or a list of module names, not both")
        return v

    def peft_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of PEFT's ``LoraConfig`` (task CAUSAL_LM)."""
        targets: str | list[str] = "all-linear" if self.target_modules == ["all-linear"] else list(self.target_modules)
        return {"r": self.r, "lora_alpha": self.alpha, "lora_dropout": self.dropout, "target_modules": targets,
                "modules_to_save": list(self.modules_to_save) or None, "task_type": "CAUSAL_LM"}


LORA_RULES = [Rule(
    "spec.training.lora.targetModules: all-linear alone", "spec.training.lora",
    "!('all-linear' in self.targetModules) || size(self.targetModules) == 1",
    "spec.training.lora.targetModules: all-linear stands alone: give it or a list of module names, not both",
    ".targetModules",
    holds=lambda lora: "all-linear" not in lora.target_modules or len(lora.target_modules) == 1,
    enforced_by="LoraSpec._module_names",
)]

#: Text metrics computed against a reference column (sacrebleu's corpus BLEU; rouge-score's F-measures).
TEXT_METRICS = ("bleu", "rouge1", "rouge2", "rougeL")


class Decoding(StrEnum):
    greedy = "greedy"
    sampled = "sampled"


class EvalMetricSpec(Model):
    """One evaluation metric: a reward function (resolved as training rewards are) or a text metric."""

    name: str = Field(
        ..., min_length=1, max_length=256,
        description=(
            "A built-in reward (exact_match gives accuracy), package.module:function (as training rewards), or a "
            "text metric against the reference column: bleu (sacrebleu's corpus BLEU, 0-100), rouge1, rouge2, "
            "rougeL (rouge-score's mean F-measure, 0-1). Logged as eval/<name> (eval/<function> for a custom one)."
        ),
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of a reward function (as spec.training.rewards[].kwargs).",
    )

    @field_validator("name")
    @classmethod
    def _name_form(cls, v: str) -> str:
        return check_reward_name(v, also=TEXT_METRICS)

    @field_validator("kwargs")
    @classmethod
    def _options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("name") in TEXT_METRICS and v:
            raise ValueError(f"the text metric {info.data['name']} takes no kwargs")
        return check_reward_kwargs(info.data.get("name"), v)

    def label(self) -> str:
        """The metric's name in logs, without the ``eval/`` prefix."""
        return self.name.split(":", 1)[1] if ":" in self.name else self.name


EVAL_METRIC_RULES = [Rule(
    "spec.training.evaluation.metrics[].name: a reward or text metric", "spec.training.evaluation.metrics[]",
    f"self.name in {cel_list((*BUILTIN_REWARDS, *TEXT_METRICS))} || self.name.matches(r'{CUSTOM_REWARD_RE.pattern}')",
    "spec.training.evaluation.metrics[].name must be a built-in reward "
    f"({', '.join(sorted(BUILTIN_REWARDS))}), a text metric ({', '.join(TEXT_METRICS)}) or package.module:function",
    ".name",
    holds=lambda m: m.name in (*BUILTIN_REWARDS, *TEXT_METRICS) or bool(CUSTOM_REWARD_RE.match(m.name)),
    enforced_by="EvalMetricSpec._name_form",
)]

#: EvaluationSpec's cross-field rules (its validator raises each refusal, in this order).
EVALUATION_RULES = [
    Rule("spec.training.evaluation: dataset or heldOutFraction", "spec.training.evaluation",
         "has(self.dataset) != has(self.heldOutFraction)",
         "spec.training.evaluation.heldOutFraction: set dataset or heldOutFraction (exactly one)", ".heldOutFraction",
         holds=lambda e: (e.dataset is None) != (e.held_out_fraction is None),
         refusal="@heldOutFraction: set dataset or heldOutFraction (exactly one)"),
    Rule("spec.training.evaluation.numGenerations: one when greedy", "spec.training.evaluation",
         "self.decoding == 'sampled' || self.numGenerations == 1",
         "spec.training.evaluation.numGenerations: greedy decoding makes one completion per prompt; "
         "set decoding: sampled for more", ".numGenerations",
         holds=lambda e: e.decoding != Decoding.greedy or e.num_generations == 1,
         refusal="@numGenerations: greedy decoding makes one completion per prompt; set decoding: sampled for more"),
    Rule("spec.training.evaluation.passAtK: sampled", "spec.training.evaluation",
         "!has(self.passAtK) || size(self.passAtK) == 0 || self.decoding == 'sampled'",
         "spec.training.evaluation.passAtK: pass@k needs decoding: sampled", ".passAtK",
         holds=lambda e: not (e.pass_at_k and e.decoding == Decoding.greedy),
         refusal="@passAtK: pass@k needs decoding: sampled"),
    Rule("spec.training.evaluation.passAtK: at most numGenerations", "spec.training.evaluation",
         "!has(self.passAtK) || self.passAtK.all(k, k <= self.numGenerations)",
         "spec.training.evaluation.passAtK: each k must be at most numGenerations", ".passAtK",
         holds=lambda e: all(k <= e.num_generations for k in e.pass_at_k),
         refusal=lambda e: (f"@passAtK: k={[k for k in e.pass_at_k if k > e.num_generations][0]} is more than "
                            f"numGenerations ({e.num_generations})")),
]


class EvaluationSpec(Model):
    """Evaluation on held-out prompts: during training, at the end, and by ``rljob evaluate``."""

    dataset: DatasetSpec | None = Field(
        None,
        description=(
            "Evaluation prompts, in the forms of spec.training.dataset (built-in task, file, s3:// object, "
            "datasets-library name with its split, for example test). Set this or heldOutFraction."
        ),
    )
    held_out_fraction: float | None = Field(
        None, gt=0, lt=1,
        description=(
            "Hold out this fraction of the training data's distinct prompts for evaluation (a prompt is held out "
            "with every row that has it): training never sees them. Set this or dataset."
        ),
    )
    held_out_seed: int = Field(0, ge=0, description="Seed of the held-out split (fixed, so trials compare).")
    every_steps: int | None = Field(
        None, ge=1, description="Evaluate every N optimizer steps; the final model is always evaluated.",
    )
    at_start: bool = Field(True, description="Also evaluate the model before the first step (a baseline).")
    max_prompts: int = Field(256, ge=1, le=100_000, description="Evaluate on at most this many prompts (the first).")
    reference_field: str = Field(
        "answer", min_length=1, description="Column holding the reference text of the text metrics.",
    )
    decoding: Decoding = Field(
        Decoding.greedy,
        description="greedy (one deterministic completion per prompt) or sampled (numGenerations at temperature).",
    )
    num_generations: int = Field(1, ge=1, le=256, description="Completions per prompt when sampled.")
    temperature: float = Field(1.0, gt=0, le=10.0, description="Sampling temperature when sampled.")
    pass_at_k: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list, max_length=16,
        description=(
            "When sampled: also log eval/<metric>/pass_at_<k>, the unbiased estimate that at least one of k "
            "completions passes (value >= passThreshold), for every reward metric. Each k <= numGenerations."
        ),
    )
    pass_threshold: float = Field(1.0, description="A completion passes when its reward metric reaches this.")
    metrics: list[EvalMetricSpec] = Field(
        default_factory=list, max_length=32,
        description=(
            "What to compute; the first is the headline metric (status, printer column). Default: each "
            "training reward."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationSpec:
        enforce(self, EVALUATION_RULES)
        labels = [m.label() for m in self.metrics]
        if len(set(labels)) != len(labels):
            raise ValueError("@metrics: two metrics have the same name")
        return self

    def metric_specs(self, rewards: list[RewardSpec]) -> list[EvalMetricSpec]:
        """The metrics to compute: the configured ones, else each training reward (first of a name)."""
        if self.metrics:
            return list(self.metrics)
        seen: dict[str, EvalMetricSpec] = {}
        for r in rewards:
            metric = EvalMetricSpec(name=r.name, kwargs=r.kwargs)
            seen.setdefault(metric.label(), metric)
        return list(seen.values())


#: What every evaluation metric's name starts with (``eval/<name>``), in logs, heartbeats and objectives.
EVAL_PREFIX = "eval/"


def check_eval_metric(name: str, training: TrainingSpec) -> None:
    """A metric named ``eval/<name>`` must be one ``spec.training.evaluation`` logs (ValueError naming them)."""
    if not name.startswith(EVAL_PREFIX):
        return
    evaluation = training.evaluation
    if evaluation is None:
        raise ValueError(f"{name!r} is an evaluation metric, but spec.training.evaluation is not set")
    labels = [f"eval/{m.label()}" for m in evaluation.metric_specs(training.rewards)]
    logged = labels + [f"{label}/pass_at_{k}" for label in labels for k in evaluation.pass_at_k]
    if name not in logged:
        raise ValueError(f"{name!r} is not logged by spec.training.evaluation; it logs {', '.join(logged)}")


#: An MLflow experiment's name: printable, no control characters (it travels in environment variables).
TRACKING_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._/:@+-]*$"
#: A W&B project or entity: W&B's own alphabet.
WANDB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
#: Where an MLflow server is: http(s)://host[/path] with no user:password@ in it, or a file:// store.
TRACKING_URI_PATTERN = r"^(https?://[^/@?#\s]+(/[^\s]*)?|file://[^\s]+)$"


def _refuse_tracking_credentials(data: Any) -> Any:
    """A credential-like key (``token``, ``apiKey``, ``password``) is refused with where the token goes."""
    if isinstance(data, dict):
        for key in data:
            if isinstance(key, str) and CREDENTIAL_NAME_RE.search(key.replace("-", "_")):
                raise ValueError(
                    f"@{key}: credentials never go in the manifest (the trainer config is a ConfigMap); put the "
                    "token (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY) in a Secret that the runtime passes as an "
                    "environment variable (its spec.podTemplate's trainer container env[].valueFrom.secretKeyRef)")
    return data


class MlflowTracking(Model):
    """An MLflow tracking server, through transformers' own ``MLflowCallback`` (``report_to: mlflow``)."""

    _no_credentials = model_validator(mode="before")(_refuse_tracking_credentials)

    tracking_uri: str | None = Field(
        None, min_length=1, max_length=2048, pattern=TRACKING_URI_PATTERN,
        description=(
            "http(s)://host[:port][/path] of the tracking server (or file:///path, a local store). Unset: "
            "MLFLOW_TRACKING_URI from the trainer's environment (a runtime's podTemplate env points every job "
            "at the platform's server), else MLflow's default (./mlruns). Never user:password@ in it: the "
            "token comes from a Secret (MLFLOW_TRACKING_TOKEN in the runtime's podTemplate env)."
        ),
    )
    experiment: str | None = Field(
        None, min_length=1, max_length=256, pattern=TRACKING_NAME_PATTERN,
        description="The MLflow experiment the run goes in (created if missing). Default: the job's name "
                    "(an RLExperiment's trials: the experiment's name, each trial a child run of its run).",
    )

    @field_validator("tracking_uri", mode="before")
    @classmethod
    def _uri_form(cls, v: Any) -> Any:
        if isinstance(v, str) and not re.match(TRACKING_URI_PATTERN, v):
            if re.match(r"^https?://[^/?#]*@", v):
                raise ValueError("credentials never go in the tracking URI; MLFLOW_TRACKING_TOKEN (or "
                                 "MLFLOW_TRACKING_USERNAME/PASSWORD) comes from a Secret the runtime passes as env")
            raise ValueError(f"{v[:200]!r} is not an http(s)://host[/path] or file:///path URI")
        return v


class WandbMode(StrEnum):
    online = "online"
    offline = "offline"


class WandbTracking(Model):
    """Weights & Biases, through transformers' own ``WandbCallback`` (``report_to: wandb``)."""

    _no_credentials = model_validator(mode="before")(_refuse_tracking_credentials)

    project: str = Field(..., min_length=1, max_length=128, pattern=WANDB_NAME_PATTERN,
                         description="The W&B project (WANDB_PROJECT).")
    entity: str | None = Field(None, min_length=1, max_length=128, pattern=WANDB_NAME_PATTERN,
                               description="The W&B team or user (WANDB_ENTITY). Default: the API key's own.")
    mode: WandbMode = Field(
        WandbMode.online,
        description="online (needs WANDB_API_KEY from a Secret: the runtime's podTemplate env) or offline (run "
                    "files under <output>/wandb, synced later with `wandb sync`; no network).",
    )


class TrackingSpec(Model):
    """Experiment tracking besides TensorBoard and the status API: MLflow, W&B, or both.

    Credentials are never fields: the tracking server's token (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY) comes
    from a Secret the runtime passes as an environment variable, as every credential of the trainer does.
    """

    mlflow: MlflowTracking | None = Field(None, description="Log the run to an MLflow tracking server.")
    wandb: WandbTracking | None = Field(None, description="Log the run to Weights & Biases.")

    def integrations(self) -> list[str]:
        """transformers' ``report_to`` names of what is set (TensorBoard is always on besides)."""
        return [name for name in ("mlflow", "wandb") if getattr(self, name) is not None]


class TrainingSpec(Model):
    """What to train and how: the policy-optimisation run itself."""

    algorithm: Algorithm = Field(
        Algorithm(next(iter(ALGORITHMS))), description=f"Policy-optimisation algorithm: {' or '.join(ALGORITHMS)}."
    )
    strategy: StrategyName | None = Field(
        None,
        description=(
            "A named variant of the algorithm, set through TRL's own config fields (which spec.training.trl "
            "then must not set). " + "; ".join(
                f"{a.name}: " + "; ".join(s.describe(n) for n, s in a.strategies.items())
                for a in ALGORITHMS.values() if a.strategies
            ) + ". Unset: TRL's defaults."
        ),
    )
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
    gradient_checkpointing: bool = Field(
        True,
        description=(
            "Recompute activations in the backward pass instead of keeping them (TRL's default): less memory, "
            "more compute. Turning it off made a 0.5B model's GRPO step 1.34x faster on an H200 at twice the "
            "peak memory (5.8 -> 11.7 GiB); turn it off when the model fits without it."
        ),
    )
    generation_batch_size: int | None = Field(
        None, ge=1,
        description=(
            "Completions generated in one go, over all processes; one generation then feeds several optimizer "
            "steps. A multiple of batchSize x processes and of numGenerations. Default: one step's worth "
            "(batchSize x processes x stepsPerGeneration). Mutually exclusive with stepsPerGeneration."
        ),
    )
    steps_per_generation: int | None = Field(
        None, ge=1,
        description=(
            "Optimizer steps fed by one generation batch (batchSize x processes x stepsPerGeneration "
            "completions generated together). Default: gradientAccumulationSteps. Mutually exclusive with "
            "generationBatchSize."
        ),
    )
    lora: LoraSpec | None = Field(
        None,
        description=(
            "Train LoRA adapters (PEFT) instead of all weights: checkpoints hold the adapter only, and "
            "`rljob checkpoints export --merged` writes base + adapter as one model. LoRA usually wants about "
            "10x the full fine-tuning learningRate. With beta > 0 the reference model is the base model "
            "(adapters disabled), so no second copy is loaded."
        ),
    )
    evaluation: EvaluationSpec | None = Field(
        None,
        description=(
            "Evaluate on held-out prompts every everySteps and at the end (eval/<metric> in metrics.jsonl, "
            "TensorBoard, Prometheus, heartbeats and summary.json). Off when absent."
        ),
    )
    tracking: TrackingSpec | None = Field(
        None,
        description=(
            "Also log the run to MLflow and/or Weights & Biases (TRL's report_to integrations): the spec as "
            "parameters, versions, every metric (eval/* too), the summary and reward curve as artifacts, the "
            "best checkpoint's location as a tag. A tracking server that is down never fails training."
        ),
    )
    health: HealthSpec = Field(
        default_factory=HealthSpec,
        description=(
            "Thresholds of the RL health signals (entropy collapse, no learning signal, masked batch, KL blow-up, "
            "gradient-norm spikes) the trainer computes from TRL's logs: each is a Prometheus metric, a line in "
            "the run's output, a warning in status.progress.health and an alert (docs/guides/health.md)."
        ),
    )
    trl: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            f"Further fields of TRL's {' or '.join(dict.fromkeys(a.config_class for a in ALGORITHMS.values()))} "
            f"(trl {TRL_VERSION}), by their TRL names; "
            "fields rljob sets itself are refused with the rljob field to use."
        ),
    )

    @field_validator("strategy")
    @classmethod
    def _strategy_of_algorithm(cls, v: str | None, info: ValidationInfo) -> str | None:
        algorithm = ALGORITHMS.get(info.data.get("algorithm", ""))  # absent when the algorithm was invalid
        if v is not None and algorithm is not None and v not in algorithm.strategies:
            known = ", ".join(algorithm.strategies) or "none"
            raise ValueError(f"algorithm {algorithm.name} has no strategy {v!r} (its strategies: {known})")
        return v

    @field_validator("trl")
    @classmethod
    def _trl_fields(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        algorithm = info.data.get("algorithm")  # absent when the algorithm itself was invalid
        check_trl(v, algorithm if algorithm in ALGORITHMS else None, info.data.get("strategy"))
        return v

    def group_size(self) -> int:
        """Completions a generation batch holds whole multiples of: the algorithm's batch rule."""
        return ALGORITHMS[self.algorithm].group_size(self.num_generations)

    @model_validator(mode="after")
    def _one_generation_knob(self) -> TrainingSpec:
        enforce(self, TRAINING_RULES)
        check_reward_sources(self.rewards)
        return self


def check_reward_sources(rewards: list[RewardSpec]) -> None:
    """Rewards of one module share one source (Python imports a module once, from the first folder that has it)."""
    sources: dict[str, tuple[int, RewardSource | None]] = {}
    for i, reward in enumerate(rewards):
        if ":" not in reward.name:
            continue
        first = sources.setdefault(reward_module(reward.name), (i, reward.source))
        if first[1] != reward.source:
            raise ValueError(f"@rewards[{i}].source: rewards[{first[0]}] imports module {reward_module(reward.name)} "
                             "from another source; rewards of one module share its source")


#: TrainingSpec's own rules (the spec-wide ones, with workers, are ``job.SPEC_RULES``).
TRAINING_RULES = [
    Rule("spec.training.model: a known built-in", "spec.training",
         f"!self.model.startsWith('builtin:') || self.model in {cel_list(BUILTIN_MODELS)}",
         f"spec.training.model: unknown built-in model; choose one of {', '.join(BUILTIN_MODELS)}", ".model",
         holds=lambda t: not t.model.startswith(BUILTIN_MODEL_PREFIX) or t.model in BUILTIN_MODELS,
         enforced_by="RLTrainingJobSpec._generation_batch_fits (the trainer checks it when it loads the model)"),
    Rule("spec.training: one generation knob", "spec.training",
         "!has(self.generationBatchSize) || !has(self.stepsPerGeneration)",
         "spec.training.generationBatchSize: set generationBatchSize or stepsPerGeneration, not both",
         ".generationBatchSize",
         holds=lambda t: t.generation_batch_size is None or t.steps_per_generation is None,
         refusal="@generationBatchSize: set generationBatchSize or stepsPerGeneration, not both"),
]


def _credential_keys(value: Any, loc: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Locations of credential-like keys inside ``value`` (mappings and lists, kwargs as JSON strings)."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in
                ([(*loc, k)] if isinstance(k, str) and CREDENTIAL_NAME_RE.search(k) else _credential_keys(v, (*loc, k)))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _credential_keys(v, (*loc, i))]
    return []


#: TRL fields the worker gives a default that ``spec.training.trl`` may override.
TRL_DEFAULTS = frozenset({"data_seed", "log_level", "disable_tqdm", "ddp_timeout"})


def python_type(schema: dict[str, Any]) -> Any:
    """A field schema (``trl_fields``, ``BUILTIN_REWARD_OPTIONS``) → a strict pydantic type.

    Strict, so ``rljob validate`` refuses what the API server's structural schema refuses
    ("1.0" for a number, 1 for a string); integers are still numbers.
    """
    if "anyOf" in schema:
        tp: Any = Union[tuple(python_type(s) for s in schema["anyOf"])]  # noqa: UP007 - built at run time
    elif "enum" in schema:
        tp = Literal[tuple(schema["enum"])]
    else:
        kind = schema.get("type")
        if kind == "array":
            tp = list[python_type(schema.get("items", {}))]  # type: ignore[misc]
            if "minItems" in schema or "maxItems" in schema:
                tp = Annotated[tp, Field(min_length=schema.get("minItems"), max_length=schema.get("maxItems"))]
        elif kind == "object":
            tp = dict[str, python_type(schema.get("additionalProperties", {}))]  # type: ignore[misc]
        else:
            scalars: dict[str | None, Any] = {"boolean": bool, "integer": int, "number": float, "string": str}
            tp = Annotated[scalars[kind], Strict()] if kind in scalars else Any
            if "minimum" in schema:
                tp = Annotated[tp, Field(ge=schema["minimum"])]
    return Optional[tp] if schema.get("nullable") else tp  # noqa: UP045 - tp may be Any, built at run time


def describe_type(schema: dict[str, Any]) -> str:
    """A field schema in words, for messages: ``a mapping or a string``."""
    if "anyOf" in schema:
        return " or ".join(describe_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"a list of {describe_type(schema.get('items', {})).removeprefix('a ').removeprefix('an ')}s"
    words = {"boolean": "a boolean", "integer": "an integer", "number": "a number", "string": "a string",
             "object": "a mapping"}
    return words.get(kind or "", "any value")


#: Field schemas of TRL's config classes (TRL_FIELDS without algorithms and descriptions).
TRL_SCHEMAS: dict[str, dict[str, Any]] = {name: field["schema"] for name, field in TRL_FIELDS.items()}


@functools.cache
def _adapter(owner: str, name: str) -> TypeAdapter[Any]:
    return TypeAdapter(python_type(_schemas(owner)[name]))


def _schemas(owner: str) -> dict[str, dict[str, Any]]:
    """Field schemas by owner: ``trl`` or a built-in reward's name."""
    if owner == "trl":
        return TRL_SCHEMAS
    return BUILTIN_REWARD_OPTIONS[owner]


def _problem(key: str, message: str, value: Any, *loc: str | int) -> InitErrorDetails:
    error = PydanticCustomError("rljob_option", "{message}", {"message": message})
    return InitErrorDetails(type=error, loc=(key, *loc), input=value)


def check_options(
    values: dict[str, Any], fields: dict[str, dict[str, Any]], owner: str, unknown: str,
    refused: dict[str, str] | None = None, adapter_owner: str | None = None,
    problems: list[InitErrorDetails] | None = None,
) -> None:
    """Check ``values`` against ``fields`` (name → schema): every problem at once, each at its key.

    Raises ValidationError whose locations are the keys (pydantic prefixes the field's path), so
    ``format_validation_error`` prints ``spec.training.trl.temperature: Input should be a valid number``.
    ``refused``: key → message for keys that exist but must not be set here; ``problems``: found
    by the caller already, reported with the rest.
    """
    problems = list(problems or [])
    for key, value in values.items():
        if refused and key in refused:
            problems.append(_problem(key, refused[key], value))
        elif key not in fields:
            problems.append(_problem(key, unknown, value))
        elif "unsupported" in fields[key]:
            problems.append(_problem(key, f"cannot be set in a manifest (its type is {fields[key]['unsupported']})",
                                     value))
        else:
            try:
                _adapter(adapter_owner or owner, key).validate_python(value, strict=True)
            except ValidationError as e:
                if "anyOf" in fields[key]:  # pydantic's per-member errors would name the Python types
                    problems.append(_problem(key, f"Input should be {describe_type(fields[key])}", value))
                else:
                    problems += [_problem(key, err["msg"], value, *err["loc"]) for err in e.errors()]
    if problems:
        raise ValidationError.from_exception_data(owner, problems)


def check_trl(trl: dict[str, Any], algorithm: str | None, strategy: str | None = None) -> None:
    """``spec.training.trl`` against TRL's config class for ``algorithm`` (None: either class),
    and against the fields ``strategy`` (of ``algorithm``) sets: the refusals are ``trl_rules``'s,
    whose CEL the CRD has."""
    config = CONFIG_CLASSES.get(algorithm or "", "/".join(dict.fromkeys(CONFIG_CLASSES.values())))
    refused = refused_fields(trl, algorithm, strategy)
    # Credentials never sit in a ConfigMap, nested in a mapping either (which CEL cannot see), not even in
    # another algorithm's field.
    own = refused_fields(trl, algorithm, strategy, OWN_REFUSALS)
    nested = [_problem(key, CREDENTIAL_TRL_MESSAGE, value, *loc)
              for key, value in trl.items() if key not in own for loc in _credential_keys(value)]
    check_options(trl, TRL_SCHEMAS, "trl", unknown=f"not a field of TRL's {config} (trl {TRL_VERSION})",
                  refused=refused, problems=nested)


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

    location: str = Field(
        ..., min_length=1,
        description=(
            "s3://bucket/prefix, pvc://claim/prefix (a PersistentVolumeClaim of the job's namespace, which the "
            "operator mounts into every worker) or a local path / mounted volume."
        ),
    )
    endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint URL of this mirror (else the primary's rules: AWS_ENDPOINT_URL)."
    )
    region: str | None = Field(None, description="S3 region of this mirror (else AWS_REGION).")
    credentials_secret: str | None = Field(
        None,
        description=(
            "Secret whose keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN) the "
            "operator mounts as files in the workers (never environment), for a mirror on another account "
            "or provider. Default: the primary's credentials."
        ),
    )

    _no_credentials = model_validator(mode="before")(_refuse_credentials)
    _location = field_validator("location")(_check_location)
    _endpoint = field_validator("endpoint_url")(_check_endpoint)
    _secret = field_validator("credentials_secret")(_check_secret_name)


#: ``spec.checkpoint.bestMetric``'s default; the trainer's retention and ``rljob checkpoints prune`` use it too.
DEFAULT_BEST_METRIC = "reward"


class CheckpointCadence(Model):
    """How often checkpoints are written, how many are kept, and how they are uploaded: the job's own
    choices (where they go is the runtime's, :class:`CheckpointStorage`)."""

    every_steps: int = Field(50, ge=1, description="Save a checkpoint every N optimizer steps.")
    keep_last: int = Field(3, ge=1, description="Number of newest complete checkpoints kept (locally and remotely).")
    keep_best: int = Field(0, ge=0, description="Also keep the K best checkpoints by bestMetric.")
    best_metric: str = Field(DEFAULT_BEST_METRIC, description="Logged metric that ranks checkpoints for keepBest (higher is better).")
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


class CheckpointStorage(Model):
    """Where checkpoints go: a location, its endpoint and credentials, and mirrors.

    Credentials are never fields: they come from the pod's service account (IRSA / workload
    identity), the standard ``AWS_*`` environment, or the Secret named by ``credentialsSecret``.
    """

    storage: str | None = Field(
        None,
        description=(
            "Where checkpoints go: s3://bucket/prefix (any S3-compatible endpoint; the trainer writes to a "
            "local staging folder and uploads each checkpoint in the background), pvc://claim/prefix (a "
            "PersistentVolumeClaim of the job's namespace, block or file storage: the operator mounts it "
            "read-write into every worker and the trainer writes under prefix; on a cluster only) or a local "
            "path / mounted volume. Default: <output>/checkpoints, which locally is a folder that stays, but "
            "in a worker pod is /workspace/output/checkpoints on the pod's emptyDir volume: every gang restart "
            "deletes it and the job starts again from step 0 (the job then shows the condition "
            "CheckpointsDurable=False and a Warning Event EphemeralCheckpoints). On a cluster set s3:// or "
            "pvc://, or a durable mirror, for checkpoints that outlive the gang."
        ),
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint URL (else AWS_ENDPOINT_URL).")
    region: str | None = Field(None, description="S3 region (else AWS_REGION).")
    credentials_secret: str | None = Field(
        None,
        description=(
            "Name of a Secret in the job's namespace whose keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
            "optionally AWS_SESSION_TOKEN) the operator mounts as files in the workers; the trainer turns them "
            "into a private AWS credentials file (AWS_SHARED_CREDENTIALS_FILE), so the keys are never in a "
            "process's environment. Omit to use the pod's service account (IRSA / workload identity), the "
            "recommended way."
        ),
    )
    mirrors: list[MirrorSpec] = Field(
        default_factory=list, max_length=8,
        description=(
            "Backup locations each complete checkpoint is copied to (same protocol: files, verify, manifest, "
            "latest). Resume takes the newest complete checkpoint any location holds, so it falls back to a "
            "mirror when the primary is unreachable, empty or its copy is corrupt: an s3:// or pvc:// mirror "
            "keeps checkpoints across gang restarts even when the primary is the pod's own folder."
        ),
    )

    _no_credentials = model_validator(mode="before")(_refuse_credentials)
    _endpoint = field_validator("endpoint_url")(_check_endpoint)
    _secret = field_validator("credentials_secret")(_check_secret_name)

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, v: str | None) -> str | None:
        return None if v is None else _check_location(v)


class CheckpointSpec(CheckpointCadence, CheckpointStorage):
    """The trainer's checkpointing: the job's cadence and retention with the storage its runtime resolved
    (``rljob_contract.runtime.resolve``: each job under its own path). What the ConfigMap holds."""


def location_rules(at: str, field: str, kinds: list[StorageBackend], enforced_by: str) -> list[Rule]:
    """The rules of a checkpoint location field: one per storage backend that has one, its CEL and its
    Python both the backend's descriptor (``plugins.storage``); ``enforced_by`` gives the fuller message."""
    optional = at == "spec.checkpoint"
    guard = f"!has(self.{field}) || " if optional else ""
    def keeps(backend: StorageBackend) -> Callable[[Any], bool]:
        return lambda model: (value := getattr(model, field)) is None or backend.cel_holds(value)

    rules = []
    for backend in kinds:
        rule = backend.cel_rule(f"self.{field}")
        if rule is not None:
            rules.append(Rule(f"{at}.{field}: the {backend.prefix} rule", at, guard + rule[0],
                              f"{at}.{field}: {rule[1]}", f".{field}", holds=keeps(backend), enforced_by=enforced_by))
    return rules


CHECKPOINT_RULES = location_rules("spec.checkpoint", "storage", backends(), "CheckpointStorage._storage_form")
#: Mirrors: only pvc:// is checked by the CRD (a bare s3:// mirror is refused by the model alone).
MIRROR_RULES = location_rules("spec.checkpoint.mirrors[]", "location", [PVC], "MirrorSpec._location")


class WorkersSpec(Model):
    """How many pods (torchrun nodes) and processes per pod."""

    replicas: int = Field(1, ge=1, le=1024, description="Number of worker pods (torchrun nodes).")
    procs_per_worker: int = Field(1, ge=1, le=64, description="Processes per worker (usually GPUs per pod).")


class GenerationBatchError(ValueError):
    """A generation batch TRL would refuse; ``field`` is the spec.training field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_generation_batch(training: TrainingSpec, world_size: int) -> None:
    """TRL needs every generation batch to hold whole groups of ``num_generations`` and whole steps.

    The generation batch is ``generationBatchSize``, else ``batchSize × world size ×
    (stepsPerGeneration or gradientAccumulationSteps)`` (TRL's rule). Raises GenerationBatchError
    naming the field to change when TRL's ``GRPOConfig`` would refuse it.
    """
    global_batch = training.batch_size * world_size
    if training.generation_batch_size is not None:
        generation_batch = training.generation_batch_size
        if generation_batch % global_batch:
            raise GenerationBatchError("generationBatchSize", (
                f"{generation_batch} must be a multiple of batchSize × workers = {training.batch_size} × "
                f"{world_size} = {global_batch}"))
        how = f"generationBatchSize = {generation_batch}"
        field = "generationBatchSize"
    else:
        steps = training.steps_per_generation or training.gradient_accumulation_steps
        generation_batch = global_batch * steps
        name = "stepsPerGeneration" if training.steps_per_generation else "gradientAccumulationSteps"
        how = (f"batchSize × workers × {name} = {training.batch_size} × {world_size} × {steps} = "
               f"{generation_batch}")
        field = "stepsPerGeneration" if training.steps_per_generation else "numGenerations"
    if generation_batch % training.group_size():
        raise GenerationBatchError(field, (
            f"numGenerations ({training.num_generations}) must divide the generation batch {how}"))


def generation_window(steps_per_generation: int, num_iterations: int, accumulation: int) -> int:
    """Optimizer steps from one fresh generation batch to the next, as TRL counts them.

    TRL generates every ``stepsPerGeneration × num_iterations`` micro-batches and keeps the completions
    in memory between; an optimizer step is ``gradientAccumulationSteps`` micro-batches. A run resumed
    from a step inside that window generates afresh where the uninterrupted run reused its buffer, so
    every later step differs: only steps that are multiples of this window resume exactly.
    """
    micro = max(steps_per_generation, 1) * max(num_iterations, 1)
    return micro // math.gcd(micro, max(accumulation, 1))


def check_elastic_generation(training: TrainingSpec) -> None:
    """Elastic workers change the world size, so the generation batch must hold whole groups at any size.

    ``generationBatchSize`` is tied to one world size and is refused; ``stepsPerGeneration`` needs
    ``batchSize × stepsPerGeneration`` to be a multiple of ``numGenerations``.
    """
    if training.generation_batch_size is not None:
        raise GenerationBatchError("generationBatchSize", (
            "cannot be fixed with elastic workers (the world size changes); use stepsPerGeneration"))
    spg = training.steps_per_generation
    if spg is not None and (training.batch_size * spg) % training.group_size():
        raise GenerationBatchError("stepsPerGeneration", (
            f"with elastic workers, batchSize × stepsPerGeneration = {training.batch_size} × {spg} must be a "
            f"multiple of numGenerations ({training.num_generations})"))


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
    sources: list[str] | None = Field(
        None, description="The runtime's spec.sources.allowed: prefixes a reward module's uri must start with "
                          "(None: no runtime, as `rljob train` without one).")
    experiment: str | None = Field(
        None, min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN,
        description="The RLExperiment this job is a trial of (its label rljob.dev/experiment): the tracked run is a "
                    "child of the experiment's run.")

    def checkpoint_location(self) -> str:
        return self.checkpoint.storage or os.path.join(self.output_dir, "checkpoints")
