"""The RLTrainingJob API (``rljob.dev/v1alpha1``): pydantic models, the single source of truth.

The CRD in ``crds/`` and in the Helm chart is generated from these models (``rljob crd``).
The trainer owns ``spec.training`` and ``spec.checkpoint`` (``rljob_trainer.config``);
this module embeds them beside the cluster fields.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from rljob_trainer.config import (
    CheckpointSpec,
    Model,
    TrainerConfig,
    TrainingSpec,
    WorkersSpec,
    check_generation_batch,
)

GROUP = "rljob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLTrainingJob"
PLURAL = "rltrainingjobs"
SINGULAR = "rltrainingjob"
SHORT_NAMES = ["rltj"]
DEFAULT_IMAGE = "ghcr.io/rljob/trainer:0.1.0"


class ObjectMeta(Model):
    """The parts of metadata a manifest may carry."""

    name: str = Field(..., min_length=1, max_length=50, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    # Server-populated fields are accepted (a manifest read back from the cluster still validates).
    model_config = Model.model_config | {"extra": "allow"}


class RLTrainingJobSpec(Model):
    """Desired state of an RL post-training run."""

    image: str = Field(DEFAULT_IMAGE, min_length=1, description="Trainer container image.")
    workers: WorkersSpec = Field(default_factory=WorkersSpec, description="Worker pods and processes.")  # type: ignore[arg-type]
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="The training run.")  # type: ignore[arg-type]
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _generation_batch_fits(self) -> RLTrainingJobSpec:
        world = self.workers.replicas * self.workers.procs_per_worker
        try:
            check_generation_batch(self.training, world)
        except ValueError as e:
            raise ValueError(f"@training.numGenerations: {e}") from None
        return self


class RLTrainingJob(Model):
    """An RL post-training job: one manifest for a laptop (``rljob train``) and a cluster."""

    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = Field(KIND)
    metadata: ObjectMeta
    spec: RLTrainingJobSpec = Field(default_factory=RLTrainingJobSpec)  # type: ignore[arg-type]
    status: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _kind_and_version(self) -> RLTrainingJob:
        if self.api_version != API_VERSION:
            raise ValueError(f"apiVersion must be {API_VERSION}, got {self.api_version!r}")
        if self.kind != KIND:
            raise ValueError(f"kind must be {KIND}, got {self.kind!r}")
        return self

    @property
    def world_size(self) -> int:
        return self.spec.workers.replicas * self.spec.workers.procs_per_worker

    def trainer_config(self, output_dir: str) -> TrainerConfig:
        """The trainer's view of this job (what the ConfigMap holds)."""
        return TrainerConfig(
            job_name=self.metadata.name,
            namespace=self.metadata.namespace,
            training=self.spec.training,
            checkpoint=self.spec.checkpoint,
            world_size=self.world_size,
            output_dir=output_dir,
        )


class ManifestError(Exception):
    """A manifest that cannot be used; ``problems`` are ``field.path: message`` lines."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def format_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """``ValidationError`` → one ``spec.training.maxSteps: message`` line per problem."""
    problems = []
    for item in error.errors():
        parts: list[str] = [prefix] if prefix else []
        for loc in item["loc"]:
            if isinstance(loc, int):
                parts[-1:] = [f"{parts[-1]}[{loc}]"] if parts else [f"[{loc}]"]
            else:
                parts.append(str(loc))
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
        msg = msg.removeprefix("Value error, ")
        if msg.startswith("@") and ": " in msg:
            # A model validator that names a nested field: "@training.numGenerations: ...".
            sub, msg = msg[1:].split(": ", 1)
            parts.append(sub)
        path = ".".join(parts) or "(root)"
        problems.append(f"{path}: {msg}")
    return problems


def parse_job(document: Any, source: str = "<manifest>") -> RLTrainingJob:
    if not isinstance(document, dict):
        raise ManifestError(source, ["(root): expected a mapping with apiVersion, kind, metadata and spec"])
    try:
        return RLTrainingJob.model_validate(document)
    except ValidationError as e:
        raise ManifestError(source, format_validation_error(e)) from None


def load_jobs(path: str | os.PathLike[str]) -> list[RLTrainingJob]:
    """Every RLTrainingJob in a YAML file (other kinds are skipped)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(source, [f"cannot read file: {e.strerror}"]) from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(source, [f"invalid YAML: {e}"]) from None
    jobs = [
        parse_job(d, source)
        for d in documents
        if not (isinstance(d, dict) and d.get("kind") not in (None, KIND))
    ]
    if not jobs:
        raise ManifestError(source, [f"no {KIND} document found"])
    return jobs


def load_job(path: str | os.PathLike[str]) -> RLTrainingJob:
    jobs = load_jobs(path)
    if len(jobs) > 1:
        raise ManifestError(str(path), [f"{len(jobs)} {KIND} documents; rljob train takes exactly one"])
    return jobs[0]
