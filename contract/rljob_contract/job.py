"""The RLTrainingJob API (``rljob.dev/v1alpha1``): pydantic models, the single source of truth.

The CRD in ``crds/`` and in the Helm chart is generated from these models (``rljob crd``,
``rljob_operator.crd``). ``spec.training`` is the trainer's schema (``rljob_contract.spec``); this module
embeds it beside what else is the researcher's (the workers' sizes, checkpoint cadence, ``runPolicy``)
and the status the operator writes. Everything that shapes the pod or touches the platform is the
runtime's (``rljob_contract.runtime``), named by ``spec.runtimeRef``: a job that still sets such a field
is refused, naming where it went (:data:`MOVED_TO_RUNTIME`).

Every cross-field rule is one :class:`rljob_contract.rules.Rule` (``SPEC_RULES``, ``WORKER_RULES``
here, the trainer schema's beside its models): the validators and the CRD's CEL both come from it,
so the API server rejects the same manifests ``rljob validate`` does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_snake
from pydantic_core import InitErrorDetails, PydanticCustomError

from rljob_contract import version, yamltext
from rljob_contract.health import MAX_HEALTH_REPORTS, HealthSignal
from rljob_contract.plugins.algorithms import ALGORITHMS
from rljob_contract.pod import MAX_HEARTBEAT_METRICS, format_validation_error, validate_document
from rljob_contract.quantities import is_quantity, parse_quantity
from rljob_contract.rules import Rule, enforce
from rljob_contract.spec import (
    BUILTIN_MODEL_PREFIX,
    BUILTIN_MODELS,
    EVAL_PREFIX,
    K8S_NAME_PATTERN,
    LABEL_VALUE_PATTERN,
    CheckpointCadence,
    CheckpointSpec,
    GenerationBatchError,
    Model,
    TrainerConfig,
    TrainingSpec,
    WorkersSpec,
    accumulation_for,
    check_elastic_generation,
    check_eval_metric,
    check_generation_batch,
    generation_window,
)

GROUP = "rljob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLTrainingJob"
PLURAL = "rltrainingjobs"
SINGULAR = "rltrainingjob"
SHORT_NAMES = ["rltj"]

#: The label an RLExperiment's trials carry: the experiment's name.
EXPERIMENT_LABEL = "rljob.dev/experiment"
#: Most points a job's status keeps (each ≤ ~40 + 32 metrics × ~40 bytes; far inside an object's size limit);
#: ``rljob_operator.decisions.curve`` thins the curve to it.
MAX_CURVE_POINTS = 100
CATEGORIES = ["all", "rljob"]
#: The trainer image of this release (its tag is rljob's version, ``rljob_contract.version``).
DEFAULT_IMAGE = f"ghcr.io/rljob/trainer:{version.VERSION}"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
#: A worker's grace period when neither the job nor its runtime says.
DEFAULT_GRACE_SECONDS = 120
#: The longest grace period a worker may get, whatever a runtime says: the time a stopped gang may keep its GPUs
#: after Kueue gave its quota to someone else.
MAX_GRACE_SECONDS = 3600
#: Longest job name: ``<name>-worker-1023`` must stay a DNS label (63 characters).
MAX_NAME_LENGTH = 50
#: Most workers a job may have (``spec.workers.maxReplicas``); worker pods are ``<name>-worker-0`` … ``-1023``.
MAX_WORKERS = 1024


class ObjectMeta(Model):
    """The parts of metadata a manifest may carry."""

    name: str = Field(
        ..., min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    # Server-populated fields are accepted (a manifest read back from the cluster still validates).
    model_config = Model.model_config | {"extra": "allow"}

    @field_validator("name", mode="after")
    @classmethod
    def _starts_with_a_letter(cls, name: str) -> str:
        """``NAME_STARTS_WITH_A_LETTER``'s refusal, for jobs and experiments (whose names begin their trials')."""
        if not starts_with_a_letter(name):
            raise ValueError(f"{name!r} must start with a lower-case letter: a job's name is also its headless "
                             "Service's, and Kubernetes requires a Service name to (a DNS-1035 label); an "
                             "experiment's name begins its trial jobs' names")
        return name


def starts_with_a_letter(name: str) -> bool:
    """Does ``name`` start as a DNS-1035 label (a Service's name) must: with a lower-case letter?"""
    return name[:1].isascii() and name[:1].islower()


#: On the resource: metadata is untyped in a CRD, so the name's rules are written here. A job named like
#: ``7b-grpo`` is a valid object name but not a valid Service name; the operator names the job's headless
#: Service after the job (its pods' DNS names, the rendezvous endpoint), so such a job is refused at
#: ``kubectl apply`` instead of failing later as InvalidPodSpec. (Naming the Service otherwise for such jobs
#: alone would let two jobs claim one Service name, ``7b`` and a job named after its replacement.)
ROOT_RULES = [Rule(
    "metadata.name: length", "", f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
    f"metadata.name must be at most {MAX_NAME_LENGTH} characters (pods are named <name>-worker-<i>)", None,
    holds=lambda job: len(job.metadata.name) <= MAX_NAME_LENGTH, enforced_by="ObjectMeta.name (max_length)",
), Rule(
    "metadata.name: starts with a letter", "", "self.metadata.name.matches('^[a-z]')",
    "metadata.name must start with a lower-case letter: it also names the job's headless Service, and a Service "
    "name is a DNS-1035 label", None,
    holds=lambda job: starts_with_a_letter(job.metadata.name), enforced_by="ObjectMeta._starts_with_a_letter",
)]


# ----------------------------------------------------------------------- the runtime side

CLUSTER_RUNTIME_KIND = "ClusterRLTrainingRuntime"
NAMESPACED_RUNTIME_KIND = "RLTrainingRuntime"


class RuntimeKind(StrEnum):
    cluster = CLUSTER_RUNTIME_KIND
    namespaced = NAMESPACED_RUNTIME_KIND


class RuntimeRef(Model):
    """The runtime a job runs on (``rljob_contract.runtime``): the platform's image, pod shape and bounds."""

    kind: RuntimeKind = Field(
        RuntimeKind.cluster,
        description="ClusterRLTrainingRuntime (cluster-scoped, the default) or RLTrainingRuntime (in the job's "
                    "namespace).")
    name: str = Field(..., min_length=1, max_length=253, pattern=K8S_NAME_PATTERN, description="The runtime's name.")


#: Every field that moved from the job to its runtime: job path → the runtime's field. The one table: the
#: models refuse each (in either spelling, :func:`moved_refusals`), and the CRD keeps each declared only as a
#: tombstone whose CEL rule says the same (``rljob_operator.crd``), so the API server does not prune it silently.
MOVED_TO_RUNTIME: dict[str, str] = {
    "spec.image": "spec.image",
    "spec.imagePullPolicy": "spec.imagePullPolicy",
    "spec.workers.gpuResource": "spec.gpuResource",
    "spec.workers.nodeSelector": "spec.podTemplate.spec.nodeSelector",
    "spec.workers.tolerations": "spec.podTemplate.spec.tolerations",
    "spec.workers.affinity": "spec.podTemplate.spec.affinity",
    "spec.workers.priorityClassName": "spec.podTemplate.spec.priorityClassName",
    "spec.workers.serviceAccountName": "spec.podTemplate.spec.serviceAccountName",
    "spec.workers.volumes": "spec.podTemplate.spec.volumes",
    "spec.workers.volumeMounts": "spec.podTemplate.spec.containers[name=trainer].volumeMounts",
    "spec.workers.podTemplate": "spec.podTemplate",
    "spec.workers.env[].valueFrom": "spec.podTemplate.spec.containers[name=trainer].env[].valueFrom",
    "spec.checkpoint.storage": "spec.checkpoint.storage",
    "spec.checkpoint.endpointUrl": "spec.checkpoint.endpointUrl",
    "spec.checkpoint.region": "spec.checkpoint.region",
    "spec.checkpoint.credentialsSecret": "spec.checkpoint.credentialsSecret",
    "spec.checkpoint.mirrors": "spec.checkpoint.mirrors",
}


def moved_message(job_path: str) -> str:
    """Why ``job_path`` is refused: the runtime field to use instead."""
    return (f"moved to the runtime: set {MOVED_TO_RUNTIME[job_path]} of the {CLUSTER_RUNTIME_KIND} or "
            f"{NAMESPACED_RUNTIME_KIND} the job runs on (spec.runtimeRef, else the default runtime); a job "
            "sets only what is the researcher's")


def moved_fields(data: Any, at: str) -> list[tuple[tuple[str | int, ...], str]]:
    """Every moved field ``data`` (the object at ``at``, such as ``spec``) holds, in either spelling, however
    deep: (its location under ``data``, its job path)."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    for path in MOVED_TO_RUNTIME:
        if path.startswith(at + "."):
            found += [(loc, path) for loc in _locations(data, path[len(at) + 1:].split("."))]
    return found


def _locations(value: Any, parts: list[str]) -> list[tuple[str | int, ...]]:
    """Where ``parts`` (camelCase, ``[]`` for each item of a list) are present in ``value``, by either spelling."""
    if not isinstance(value, dict):
        return []
    name = parts[0].removesuffix("[]")
    out: list[tuple[str | int, ...]] = []
    for key in dict.fromkeys((name, to_snake(name))):
        if key not in value:
            continue
        if len(parts) == 1:
            out.append((key,))
        elif parts[0].endswith("[]"):
            items = value[key] if isinstance(value[key], list) else []
            out += [(key, i, *rest) for i, item in enumerate(items) for rest in _locations(item, parts[1:])]
        else:
            out += [(key, *rest) for rest in _locations(value[key], parts[1:])]
    return out


def moved_refusals(at: str) -> Any:
    """A ``mode="before"`` model validator refusing every moved field under the object at ``at``, each at its
    own location (all of them at once: a manifest written for the old API is told every move in one go)."""

    def refuse(cls: Any, data: Any) -> Any:
        problems = [InitErrorDetails(type=PydanticCustomError("moved_to_runtime", "{message}",
                                                              {"message": moved_message(path)}),
                                     loc=loc, input=None)
                    for loc, path in moved_fields(data, at)]
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return data

    return model_validator(mode="before")(classmethod(refuse))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ workers

#: The resources a job may size its workers by (GPUs come from gpusPerWorker; anything else is the runtime's).
WORKER_RESOURCES = ("cpu", "memory")


class ResourceRequirements(Model):
    """CPU and memory of each worker pod, within the runtime's limits (GPUs come from gpusPerWorker)."""

    requests: dict[str, int | str] = Field(
        default_factory=dict, description="Minimum resources: cpu (8, 500m) and memory (64Gi). Default: the "
                                          "runtime's limits.cpuPerWorker/memoryPerWorker default.")
    limits: dict[str, int | str] = Field(
        default_factory=dict, description="Maximum resources: cpu and memory.")

    @field_validator("requests", "limits")
    @classmethod
    def _cpu_and_memory(cls, v: dict[str, int | str]) -> dict[str, int | str]:
        for key, value in v.items():
            if key not in WORKER_RESOURCES:
                raise ValueError(f"@{key}: a job sizes its workers by cpu and memory only; GPUs come from "
                                 "spec.workers.gpusPerWorker, any other resource from the runtime's spec.podTemplate")
            try:
                parse_quantity(value)
            except ValueError as e:
                raise ValueError(f"@{key}: {e}") from None
        return v


class EnvVar(Model):
    """A plain environment variable of the trainer container (one from a Secret or ConfigMap is the runtime's)."""

    name: str = Field(..., min_length=1, description="Variable name.")
    value: str = Field("", description="Literal value.")

    _moved = moved_refusals("spec.workers.env[]")


class WorkerPodsSpec(WorkersSpec):
    """The worker pods: one pod per torchrun node, procsPerWorker processes in each."""

    min_replicas: int | None = Field(
        None, ge=1, le=MAX_WORKERS,
        description="Fewest workers the job may run with. replicas (kubectl scale, an HPA) is clamped to "
        "[minReplicas, maxReplicas]; setting either bound makes the job elastic (see spec.autoscaling).",
    )
    max_replicas: int | None = Field(
        None, ge=1, le=MAX_WORKERS, description="Most workers the job may run with (see minReplicas)."
    )
    termination_grace_period_seconds: int | None = Field(
        None, ge=10, le=MAX_GRACE_SECONDS,
        description="How long a stopping worker has to save a checkpoint (the trainer saves one on SIGTERM, "
        "then exits): a resize, a suspend or a gang restart stops workers this way. Default: the runtime's "
        f"limits.terminationGracePeriodSeconds.default, else {DEFAULT_GRACE_SECONDS}; at most its max.",
    )
    gpus_per_worker: int | None = Field(
        None,
        ge=0,
        le=64,
        description="GPUs requested (and limited) per worker pod. Default: the runtime's "
        "limits.gpusPerWorker.default, else procsPerWorker (0 on a runtime whose max is 0). 0 runs on CPU.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory of each worker pod, within the runtime's limits.",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64,
        description="Extra plain environment of the trainer container, when the runtime's jobEnv allows it; the "
                    "operator's RLJOB_* variables and the runtime's own always win.")

    _moved = moved_refusals("spec.workers")

    @property
    def elastic(self) -> bool:
        """The worker count may change while the job runs (a bound is set)."""
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def bounds(self) -> tuple[int, int]:
        """(minReplicas, maxReplicas), each defaulting to the API limits 1 and 1024."""
        return (self.min_replicas or 1, self.max_replicas or 1024)

    def clamp(self, replicas: int) -> int:
        low, high = self.bounds
        return min(max(replicas, low), high)

    @model_validator(mode="after")
    def _bounds(self) -> WorkerPodsSpec:
        enforce(self, WORKER_RULES)
        return self


_RESOURCE_KEYS = f"{list(WORKER_RESOURCES)}".replace('"', "'")


def _section_holds(section: str, test: Callable[[dict[str, int | str]], bool]) -> Callable[[Any], bool]:
    """A rule's ``holds`` over ``resources.<section>``."""
    return lambda resources: test(getattr(resources, section))


WORKER_RULES = [
    Rule("spec.workers: minReplicas ≤ maxReplicas", "spec.workers",
         "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "spec.workers.maxReplicas must be ≥ minReplicas", ".maxReplicas",
         holds=lambda w: w.min_replicas is None or w.max_replicas is None or w.min_replicas <= w.max_replicas,
         refusal=lambda w: f"@maxReplicas: must be ≥ minReplicas ({w.max_replicas} < {w.min_replicas})"),
    *(Rule(f"spec.workers.resources.{section}: cpu and memory only", "spec.workers.resources",
           f"!has(self.{section}) || self.{section}.all(k, k in {_RESOURCE_KEYS})",
           f"spec.workers.resources.{section}: a job sizes its workers by cpu and memory only; GPUs come from "
           "spec.workers.gpusPerWorker, any other resource from the runtime's spec.podTemplate", f".{section}",
           holds=_section_holds(section, lambda values: set(values) <= set(WORKER_RESOURCES)),
           enforced_by="ResourceRequirements._cpu_and_memory")
      for section in ("requests", "limits")),
    *(Rule(f"spec.workers.resources.{section}: quantities", "spec.workers.resources",
           f"!has(self.{section}) || self.{section}.all(k, isQuantity(string(self.{section}[k])) && "
           f"quantity(string(self.{section}[k])).compareTo(quantity('0')) >= 0)",
           f"spec.workers.resources.{section}: each value must be a quantity, not negative (for example 4, 500m, 16Gi)",
           f".{section}", holds=_section_holds(section, lambda values: _quantities(values)),
           enforced_by="ResourceRequirements._cpu_and_memory")
      for section in ("requests", "limits")),
]


def _quantities(values: dict[str, int | str]) -> bool:
    return all(is_quantity(value) for value in values.values())


#: spec.checkpoint.subPath: relative, no segment starting with a dot (so no ``..``), no empty segment.
SUB_PATH_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"


class JobCheckpointSpec(CheckpointCadence):
    """How often checkpoints are written and how many are kept; where they go is the runtime's
    (``<its storage>/<namespace>/<job>[/<subPath>]``)."""

    sub_path: str | None = Field(
        None, min_length=1, max_length=253, json_schema_extra={"pattern": SUB_PATH_PATTERN},
        description="A folder under the job's own path on the runtime's checkpoint storage "
                    "(<storage>/<namespace>/<job>/<subPath>), for example run2 or ablations/lr-3e-4: letters, digits, "
                    "'.', '_', '-' and '/', no segment starting with '.'.")

    _moved = moved_refusals("spec.checkpoint")

    @field_validator("sub_path")
    @classmethod
    def _relative_folder(cls, v: str | None) -> str | None:
        if v is not None and not re.match(SUB_PATH_PATTERN, v):
            raise ValueError(f"{v!r} is not a relative folder (letters, digits, '.', '_', '-' and '/', no segment "
                             "starting with '.', no leading or trailing '/')")
        return v


class RestartPolicy(StrEnum):
    on_failure = "OnFailure"
    exit_code = "ExitCode"
    never = "Never"


class RunPolicy(Model):
    """How the job runs as a whole: suspension, deadline, restarts, health checks and clean-up."""

    suspend: bool = Field(
        False, description="true deletes the worker pods and keeps everything else; false recreates them."
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        description="Seconds the job may run (counted from its start or last resume) before it fails "
        "with reason DeadlineExceeded.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the job (and its pods) this many seconds after it succeeds or fails."
    )
    restart_policy: RestartPolicy = Field(
        RestartPolicy.on_failure,
        description="When a failed worker restarts the gang: OnFailure (every exit but the trainer's permanent "
        "code 78), ExitCode (codes 1-127 and 78 are permanent, 128-255 retryable) or Never.",
    )
    backoff_limit: int = Field(
        3, ge=0, le=1000,
        description="Gang restarts after worker failures before the job fails with BackoffLimitExceeded. "
        "Disruptions (node lost, eviction, preemption) do not count.",
    )
    backoff_base_seconds: float = Field(
        10.0, ge=0, le=86400,
        description="Wait before the first gang restart; doubled for every further restart.",
    )
    backoff_max_seconds: float = Field(
        600.0, ge=0, le=86400, description="Longest wait between gang restarts."
    )
    oom_recovery: bool = Field(
        True,
        description="After an out-of-memory failure (OOMKilled, or the trainer's CUDA OOM exit code 200) restart "
        "with half the per-device batchSize and twice gradientAccumulationSteps (same global batch).",
    )
    oom_min_batch_size: int = Field(
        1, ge=1, description="Smallest per-device batchSize OOM recovery goes down to."
    )
    stall_timeout_seconds: int = Field(
        600, ge=1,
        description="Restart the gang when no progress heartbeat arrives for this long (a hung job).",
    )
    startup_timeout_seconds: int = Field(
        1800, ge=1,
        description="Restart the gang when the first heartbeat of a new gang has not arrived after this long.",
    )
    check_interval_seconds: int = Field(
        30, ge=1,
        description="How often autoscaling policy Capacity looks at free GPUs and nodes (what it sees is the "
        "operator's latest look at the cluster, taken at most every capacity_refresh_seconds, 30 s by default, "
        "whatever this says). (Heartbeat deadlines, stallTimeoutSeconds and startupTimeoutSeconds, are checked "
        "when they fall due.)",
    )


class ScalingPolicy(StrEnum):
    manual = "Manual"
    capacity = "Capacity"


class AutoscalingSpec(Model):
    """How the operator changes the worker count between minReplicas and maxReplicas.

    A resize stops the gang (each worker saves a checkpoint on SIGTERM), starts a gang of the new
    size and resumes; the global batch is kept by recomputing gradientAccumulationSteps.
    """

    policy: ScalingPolicy = Field(
        ScalingPolicy.manual,
        description="Manual: only spec.workers.replicas (kubectl scale, an HPA, KEDA) sets the size. "
        "Capacity: grow toward maxReplicas into free GPUs, shrink toward minReplicas when workers cannot be "
        "scheduled or nodes are lost, wait (Pending) below minReplicas. Capacity needs both bounds.",
    )
    cooldown_seconds: int = Field(
        300, ge=0, le=86400, description="No capacity-driven growth sooner than this after the last resize."
    )
    scheduling_timeout_seconds: int = Field(
        120, ge=1, le=86400,
        description="Capacity: how long workers may stay unschedulable before the gang shrinks to what fits.",
    )


class RLTrainingJobSpec(Model):
    """Desired state of an RL post-training run: what is the researcher's (the rest is the runtime's)."""

    runtime_ref: RuntimeRef | None = Field(
        None, description="The ClusterRLTrainingRuntime or RLTrainingRuntime the job runs on: its image, pod "
                          "shape, bounds and checkpoint storage. Absent: the default runtime (the namespace's "
                          "default RLTrainingRuntime, else the default ClusterRLTrainingRuntime).")
    workers: WorkerPodsSpec = Field(default_factory=WorkerPodsSpec, description="Worker pods and processes.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="The training run.")
    checkpoint: JobCheckpointSpec = Field(
        default_factory=JobCheckpointSpec, description="Checkpoint cadence and retention (storage: the runtime's).")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Suspension, deadline and clean-up.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Elastic worker count (with workers.minReplicas/maxReplicas)."
    )

    _moved = moved_refusals("spec")

    @model_validator(mode="after")
    def _generation_batch_fits(self) -> RLTrainingJobSpec:
        model = self.training.model
        if model.startswith(BUILTIN_MODEL_PREFIX) and model not in BUILTIN_MODELS:
            # The trainer checks this when it starts; the cluster should refuse it at once.
            raise ValueError(f"@training.model: unknown built-in model {model!r}; choose one of "
                             f"{', '.join(BUILTIN_MODELS)}")
        try:
            check_eval_metric(self.checkpoint.best_metric, self.training)
        except ValueError as e:
            raise ValueError(f"@checkpoint.bestMetric: {e}") from None
        enforce(self, SPEC_RULES)
        try:
            if self.workers.elastic:
                # The operator picks gradientAccumulationSteps for each size (batch_shape).
                check_elastic_generation(self.training)
                return self
            check_generation_batch(self.training, self.workers.replicas * self.workers.procs_per_worker)
        except GenerationBatchError as e:
            raise ValueError(f"@training.{e.field}: {e}") from None
        return self


_ELASTIC = "(has(self.workers.minReplicas) || has(self.workers.maxReplicas))"
_GLOBAL_BATCH = "self.training.batchSize * self.workers.replicas * self.workers.procsPerWorker"
_CHECKED_BY = "check_generation_batch / check_elastic_generation"
#: The generation-batch rules (spec.check_generation_batch / check_elastic_generation say them with the
#: numbers) hold for algorithms whose generation batches hold whole groups of numGenerations (every one so far).
if not all(a.whole_groups for a in ALGORITHMS.values()):
    raise NotImplementedError("rljob_contract.job: the numGenerations rules below assume whole groups; guard them "
                              "with self.training.algorithm for an algorithm without (docs/architecture.md)")


def _elastic(s: RLTrainingJobSpec) -> bool:
    return s.workers.min_replicas is not None or s.workers.max_replicas is not None


def _global_batch(s: RLTrainingJobSpec) -> int:
    return s.training.batch_size * s.workers.replicas * s.workers.procs_per_worker


GENERATION_RULES = [
    Rule("spec.training.generationBatchSize: whole steps", "spec",
         f"!has(self.training.generationBatchSize) || {_ELASTIC} || "
         f"self.training.generationBatchSize % ({_GLOBAL_BATCH}) == 0",
         "spec.training.generationBatchSize must be a multiple of batchSize × replicas × procsPerWorker",
         ".training.generationBatchSize",
         holds=lambda s: (s.training.generation_batch_size is None or _elastic(s)
                          or s.training.generation_batch_size % _global_batch(s) == 0), enforced_by=_CHECKED_BY),
    Rule("spec.training.generationBatchSize: whole groups", "spec",
         "!has(self.training.generationBatchSize) || "
         "self.training.generationBatchSize % self.training.numGenerations == 0",
         "spec.training.generationBatchSize must be a multiple of numGenerations", ".training.generationBatchSize",
         holds=lambda s: (s.training.generation_batch_size is None
                          or s.training.generation_batch_size % s.training.num_generations == 0),
         enforced_by=_CHECKED_BY),
    Rule("spec.training.generationBatchSize: not elastic", "spec",
         f"!has(self.training.generationBatchSize) || !{_ELASTIC}",
         "spec.training.generationBatchSize cannot be fixed with elastic workers (the world size changes); "
         "use stepsPerGeneration", ".training.generationBatchSize",
         holds=lambda s: s.training.generation_batch_size is None or not _elastic(s), enforced_by=_CHECKED_BY),
    Rule("spec.training.stepsPerGeneration: whole groups", "spec",
         f"!has(self.training.stepsPerGeneration) || {_ELASTIC} || "
         f"({_GLOBAL_BATCH} * self.training.stepsPerGeneration) % self.training.numGenerations == 0",
         "spec.training.numGenerations must divide the generation batch "
         "batchSize × replicas × procsPerWorker × stepsPerGeneration", ".training.stepsPerGeneration",
         holds=lambda s: (s.training.steps_per_generation is None or _elastic(s)
                          or _global_batch(s) * s.training.steps_per_generation % s.training.num_generations == 0),
         enforced_by=_CHECKED_BY),
    Rule("spec.training.stepsPerGeneration: whole groups when elastic", "spec",
         f"!has(self.training.stepsPerGeneration) || !{_ELASTIC} || "
         "(self.training.batchSize * self.training.stepsPerGeneration) % self.training.numGenerations == 0",
         "spec.training.stepsPerGeneration: with elastic workers, batchSize × stepsPerGeneration must be a "
         "multiple of numGenerations", ".training.stepsPerGeneration",
         holds=lambda s: (s.training.steps_per_generation is None or not _elastic(s)
                          or s.training.batch_size * s.training.steps_per_generation % s.training.num_generations == 0),
         enforced_by=_CHECKED_BY),
]

_NUM_ITERATIONS = ("(has(self.training.trl) && has(self.training.trl.num_iterations) && "
                   "self.training.trl.num_iterations > 0 ? self.training.trl.num_iterations : 1)")


def _num_iterations(s: RLTrainingJobSpec) -> int:
    value = s.training.trl.get("num_iterations")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _window_micro_steps(s: RLTrainingJobSpec) -> tuple[int, int]:
    """(micro-batches between two generations, their divisor): stepsPerGeneration is a whole number of
    micro-batches; generationBatchSize is ``generationBatchSize / (batchSize × world size)`` of them."""
    training = s.training
    if training.generation_batch_size is not None:
        return training.generation_batch_size * _num_iterations(s), _global_batch(s)
    return (training.steps_per_generation or training.gradient_accumulation_steps) * _num_iterations(s), 1


def _checkpoints_on_windows(s: RLTrainingJobSpec) -> bool:
    gbs = s.training.generation_batch_size
    if gbs is not None and (_elastic(s) or gbs % _global_batch(s) or gbs % s.training.num_generations):
        return True  # refused by the generation-batch rules, which say more
    micro, per = _window_micro_steps(s)
    return s.checkpoint.every_steps * s.training.gradient_accumulation_steps * per % micro == 0


def _window_refusal(s: RLTrainingJobSpec) -> str:
    micro, per = _window_micro_steps(s)
    window = generation_window(max(micro // per, 1), 1, s.training.gradient_accumulation_steps)
    return (f"@checkpoint.everySteps: {s.checkpoint.every_steps} saves checkpoints inside a generation window "
            f"of {window} optimizer steps (stepsPerGeneration × num_iterations ÷ gradientAccumulationSteps): "
            f"a run resumed from one would generate afresh where the uninterrupted run reused its completions, "
            f"so every later step would differ. Make everySteps a multiple of {window}")


#: A checkpoint is only exact at a generation window's boundary (SIGTERM checkpoints wait for it, issue #48).
WINDOW_RULES = [
    Rule("spec.checkpoint.everySteps: whole generation windows", "spec",
         f"has(self.training.generationBatchSize) ? ({_ELASTIC} || "
         f"self.training.generationBatchSize % ({_GLOBAL_BATCH}) != 0 || "
         "self.training.generationBatchSize % self.training.numGenerations != 0 || self.checkpoint.everySteps * "
         f"self.training.gradientAccumulationSteps * {_GLOBAL_BATCH} % "
         f"(self.training.generationBatchSize * {_NUM_ITERATIONS}) == 0) : "
         "self.checkpoint.everySteps * self.training.gradientAccumulationSteps % "
         "((has(self.training.stepsPerGeneration) ? self.training.stepsPerGeneration : "
         f"self.training.gradientAccumulationSteps) * {_NUM_ITERATIONS}) == 0",
         "spec.checkpoint.everySteps must be a multiple of the generation window "
         "(stepsPerGeneration × num_iterations ÷ gradientAccumulationSteps optimizer steps): a checkpoint "
         "inside a window does not resume exactly", ".checkpoint.everySteps",
         holds=_checkpoints_on_windows, refusal=_window_refusal),
]


#: RLTrainingJobSpec's rules across its sections (CEL on spec; the validator raises the refusals, after
#: the checks that say more).
SPEC_RULES = [
    Rule("spec.training.numGenerations: whole groups", "spec",
         "has(self.workers.minReplicas) || has(self.workers.maxReplicas) || "
         "has(self.training.generationBatchSize) || has(self.training.stepsPerGeneration) || "
         f"({_GLOBAL_BATCH} * self.training.gradientAccumulationSteps) % self.training.numGenerations == 0",
         "spec.training.numGenerations must divide the generation batch "
         "batchSize × replicas × procsPerWorker × gradientAccumulationSteps", ".training.numGenerations",
         holds=lambda s: (_elastic(s) or s.training.generation_batch_size is not None
                          or s.training.steps_per_generation is not None
                          or _global_batch(s) * s.training.gradient_accumulation_steps % s.training.num_generations == 0),
         enforced_by=_CHECKED_BY),
    *GENERATION_RULES,
    *WINDOW_RULES,
    Rule("spec.checkpoint.bestMetric: eval/ needs evaluation", "spec",
         "!self.checkpoint.bestMetric.startsWith('eval/') || has(self.training.evaluation)",
         "spec.checkpoint.bestMetric: an evaluation metric (eval/...) needs spec.training.evaluation",
         ".checkpoint.bestMetric",
         holds=lambda s: not s.checkpoint.best_metric.startswith(EVAL_PREFIX) or s.training.evaluation is not None,
         enforced_by="check_eval_metric"),
    Rule("spec.workers: Capacity needs bounds", "spec",
         "!has(self.autoscaling) || !has(self.autoscaling.policy) || self.autoscaling.policy != 'Capacity' || "
         "(has(self.workers.minReplicas) && has(self.workers.maxReplicas))",
         "spec.workers: autoscaling.policy Capacity needs both minReplicas and maxReplicas", ".workers",
         holds=lambda s: (s.autoscaling.policy != ScalingPolicy.capacity
                          or bool(s.workers.min_replicas and s.workers.max_replicas)),
         refusal="@workers: autoscaling.policy Capacity needs both minReplicas and maxReplicas"),
]


# ----------------------------------------------------------------------------- status


class Phase(StrEnum):
    pending = "Pending"
    starting = "Starting"
    running = "Running"
    succeeded = "Succeeded"
    failed = "Failed"
    suspended = "Suspended"
    restarting = "Restarting"
    queued = "Queued"


FINISHED_PHASES = frozenset({Phase.succeeded.value, Phase.failed.value})


class StatusModel(Model):
    """Status is written by the operator and read back leniently (unknown fields are ignored)."""

    model_config = Model.model_config | {"extra": "ignore"}


class Condition(StatusModel):
    """A kstatus-compatible condition."""

    type: str = Field(..., description=(
        "Ready, Reconciling, Stalled, Succeeded, Failed or Suspended; CheckpointsDurable (reason Durable or "
        "Ephemeral) says whether checkpoints outlive a gang restart; RuntimeUpToDate (False: reason RuntimeChanged "
        "or RuntimeDeleted) whether the gang runs on its runtime as it is now."))
    status: str = Field(..., description="True, False or Unknown.", pattern=r"^(True|False|Unknown)$")
    reason: str = Field("", description="CamelCase reason for the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str | None = Field(
        None, description="When status last changed (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    observed_generation: int | None = Field(None, description="metadata.generation this condition is about.")


class WorkersStatus(StatusModel):
    """Worker pods as last observed."""

    desired: int = Field(0, description="Worker pods the spec asks for (0 while suspended or finished).")
    active: int = Field(0, description="Worker pods that exist and have not finished.")
    ready: int = Field(0, description="Worker pods whose trainer reports ready.")
    succeeded: int = Field(0, description="Worker pods that exited 0.")
    failed: int = Field(0, description="Worker pods that exited non-zero.")
    summary: str = Field("", description="ready/desired, for kubectl get.")
    current: int = Field(0, description="Worker pods of the current gang that are running.")


class CurvePoint(StatusModel):
    """One logged step of the progress curve (finite numbers only)."""

    step: int = Field(..., ge=0, description="Optimizer steps completed at this point.")
    reward: float | None = Field(None, description="Mean total reward of the step.")
    loss: float | None = Field(None, description="Training loss of the step.")
    metrics: dict[str, float] = Field(
        default_factory=dict, max_length=MAX_HEARTBEAT_METRICS,
        description="Other logged metrics of the step by their TRL names (kl, rewards/<name>/mean, ...).")


class EvaluationProgress(StatusModel):
    """The latest evaluation on held-out data (spec.training.evaluation) and the best so far."""

    metric: str = Field(..., description="The headline metric (eval/<name>: the first of evaluation.metrics).")
    step: int = Field(..., description="Step of the latest evaluation.")
    value: float | None = Field(None, description="The latest value of the headline metric.")
    values: dict[str, float] = Field(default_factory=dict, max_length=MAX_HEARTBEAT_METRICS,
                                     description="Every metric of the latest evaluation (eval/<name>).")
    best_step: int | None = Field(None, description="Step of the best evaluation by the headline metric.")
    best_value: float | None = Field(None, description="Its value of the headline metric.")


class HealthWarning(StatusModel):
    """A health signal that tripped during the run (docs/guides/health.md), as the trainer reported it."""

    signal: HealthSignal = Field(..., description="entropyCollapse, noLearningSignal, maskedBatch, klBlowUp or "
                                                  "gradNormSpike.")
    step: int = Field(..., description="The step at which it tripped.")
    last_step: int = Field(..., description="The last step at which it held.")
    active: bool = Field(..., description="It held at the latest logged step (false: it tripped and cleared).")
    value: float = Field(..., description="The value that tripped it.")
    threshold: float = Field(..., description="The bound it crossed (spec.training.health).")
    message: str = Field("", max_length=400, description="What it means, in words.")


class Progress(StatusModel):
    """Training progress reported by rank 0's heartbeats (the status API)."""

    step: int | None = Field(None, description="Optimizer steps completed.")
    reward: float | None = Field(None, description="Mean total reward of the last logged step.")
    loss: float | None = Field(None, description="Training loss of the last logged step.")
    checkpoint: str | None = Field(None, description="Newest complete checkpoint.")
    best_checkpoint: str | None = Field(None, description="Best kept checkpoint by spec.checkpoint.bestMetric.")
    best_metric: float | None = Field(None, description="That checkpoint's value of bestMetric.")
    last_heartbeat: str | None = Field(None, description="When the last heartbeat was accepted (RFC 3339).")
    last_throttled: str | None = Field(
        None, description="When the status API last refused a heartbeat of one of the job's workers for the "
                          "job's heartbeat rate (RFC 3339): the worker was alive, so the stall clock counts it.")
    evaluation: EvaluationProgress | None = Field(None, description="Held-out evaluation: latest and best.")
    health: list[HealthWarning] = Field(
        default_factory=list, max_length=MAX_HEALTH_REPORTS,
        description="The health signals that tripped during the run (at most one entry per signal; "
                    "docs/guides/health.md): a warning that the run may have stopped learning.")
    curve: list[CurvePoint] = Field(
        default_factory=list, max_length=MAX_CURVE_POINTS,
        description=f"The logged steps so far, at most {MAX_CURVE_POINTS}: steps increase; when full, every second "
                    "point is dropped (the curve spans the run evenly) and the last point is the latest step.")


class LastFailure(StatusModel):
    """The last worker failure the operator acted on."""

    worker: str | None = Field(None, description="The worker pod that failed.")
    reason: str = Field("", description="CamelCase reason (WorkerFailed, OOMKilled, HeartbeatTimeout, ...).")
    exit_code: int | None = Field(None, description="The trainer container's exit code, when it exited.")
    message: str = Field("", description="What happened (the first line of the trainer's error).")
    time: str | None = Field(None, description="When the operator saw it (RFC 3339).")
    disruption: bool = Field(False, description="Caused by the cluster (node lost, eviction, preemption).")
    replaced_pods: list[str] = Field(
        default_factory=list, max_length=1024,
        description="UIDs of the worker pods replaced in place for this failure (a job with durable "
                    "checkpoints whose surviving workers kept running); empty when the whole gang was restarted.",
    )


class OomRecovery(StatusModel):
    """The batch shape OOM recovery chose (the ConfigMap carries it)."""

    batch_size: int = Field(..., description="Per-device batchSize the gang runs with.")
    gradient_accumulation_steps: int = Field(..., description="gradientAccumulationSteps the gang runs with.")


class RuntimeStatus(StatusModel):
    """The runtime the current gang was built from (its snapshot is the job's ConfigMap's ``runtime.json``)."""

    kind: str = Field(..., description="ClusterRLTrainingRuntime or RLTrainingRuntime.")
    name: str = Field(..., description="The runtime's name (an RLTrainingRuntime's is in the job's namespace).")
    generation: int | None = Field(None, description="The runtime's metadata.generation the gang was built from.")
    hash: str = Field(..., description="A hash of the runtime's spec the gang was built from: an edit changes it, "
                                       "and applies from the job's next gang (condition RuntimeUpToDate).")


class ScalingStatus(StatusModel):
    """The worker count the operator runs and why (resizes, the global batch it keeps)."""

    replicas: int = Field(..., description="Workers the current gang is built with.")
    spec_replicas: int = Field(..., description="spec.workers.replicas when the operator last applied it.")
    reference_replicas: int = Field(
        ..., description="Workers the global batch was defined at (the first start): it stays fixed across resizes."
    )
    global_batch_size: int = Field(..., description="batchSize × gradientAccumulationSteps × processes in use.")
    gradient_accumulation_steps: int = Field(..., description="gradientAccumulationSteps of the current gang.")
    last_scale_time: str | None = Field(None, description="When the last resize was decided (RFC 3339).")
    last_scale_reason: str | None = Field(
        None, description="Why: ScaleRequested, CapacityAvailable, Unschedulable, NodesLost or InsufficientCapacity."
    )
    last_scale_message: str | None = Field(None, description="The last resize in words.")


class RLTrainingJobStatus(StatusModel):
    """Observed state of an RL post-training run (written by the operator)."""

    phase: Phase | None = Field(
        None, description="Pending, Queued (waiting for Kueue to admit it), Starting, Running, Restarting, Succeeded, "
        "Failed or Suspended."
    )
    reason: str | None = Field(None, description="CamelCase reason of the current phase.")
    message: str | None = Field(None, description="Human-readable details of the current phase.")
    observed_generation: int | None = Field(None, description="metadata.generation last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="kstatus-compatible conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    workers: WorkersStatus | None = Field(None, description="Worker pods as last observed.")
    gang_generation: int | None = Field(
        None, description="Which start of the worker gang the pods belong to (label rljob.dev/gang-generation)."
    )
    selector: str | None = Field(None, description="Label selector of the worker pods (scale subresource).")
    start_time: str | None = Field(None, description="When the pods were first created (or last resumed).")
    completion_time: str | None = Field(None, description="When the job succeeded or failed.")
    progress: Progress | None = Field(None, description="Training progress from the trainer's heartbeats.")
    restarts: int = Field(0, description="Gang restarts after worker failures (counted against backoffLimit).")
    disruptions: int = Field(0, description="Gang restarts after disruptions (not counted).")
    last_failure: LastFailure | None = Field(None, description="The last failure the operator acted on.")
    next_restart_time: str | None = Field(None, description="When the Restarting gang's pods are created.")
    gang_start_time: str | None = Field(None, description="When the current gang's pods were created.")
    oom_recovery: OomRecovery | None = Field(None, description="Reduced batch shape after out-of-memory failures.")
    scaling: ScalingStatus | None = Field(None, description="Worker count in use and the last resize.")
    runtime: RuntimeStatus | None = Field(
        None, description="The runtime the current gang was built from: kind, name, generation and a hash of its "
        "spec. An edit of the runtime applies from the next gang; a deleted one's snapshot keeps serving the job."
    )
    queue: str | None = Field(
        None, description="The queue an admission gate holds the job to (Kueue: the LocalQueue of its label "
        "kueue.x-k8s.io/queue-name), remembered: a job once queued runs only through that queue, even if the label "
        "is removed."
    )

    @field_validator("phase", mode="after")
    @classmethod
    def _plain_phase(cls, value: str | None) -> str | None:
        """The phase is kept as a plain str (never a :class:`Phase` member), however it was given:
        it compares, hashes and formats as the status the API server stores (``FINISHED_PHASES``)."""
        return None if value is None else Phase(value).value


class RLTrainingJob(Model):
    """An RL post-training job: one manifest for a laptop (``rljob train``) and a cluster."""

    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = Field(KIND)
    metadata: ObjectMeta
    spec: RLTrainingJobSpec = Field(default_factory=RLTrainingJobSpec)
    status: RLTrainingJobStatus | None = None

    @model_validator(mode="after")
    def _kind_and_version(self) -> RLTrainingJob:
        if self.api_version != API_VERSION:
            raise ValueError(f"apiVersion must be {API_VERSION}, got {self.api_version!r}")
        if self.kind != KIND:
            raise ValueError(f"kind must be {KIND}, got {self.kind!r}")
        return self

    @property
    def replicas(self) -> int:
        """Workers in use: what the operator decided (status.scaling), else replicas clamped to the bounds."""
        scaling = self.status.scaling if self.status is not None else None
        return scaling.replicas if scaling is not None else self.spec.workers.clamp(self.spec.workers.replicas)

    @property
    def world_size(self) -> int:
        return self.replicas * self.spec.workers.procs_per_worker

    def batch_shape(self, replicas: int | None = None, reference: int | None = None) -> tuple[int, int, int]:
        """(batchSize, gradientAccumulationSteps, global batch) at ``replicas`` workers.

        The global batch kept is ``target_global_batch(reference)``; out-of-memory recovery lowers
        batchSize; gradientAccumulationSteps is recomputed so the global batch stays
        (``accumulation_for``).
        """
        training, status = self.spec.training, self.status
        batch = status.oom_recovery.batch_size if status and status.oom_recovery else training.batch_size
        world = (self.replicas if replicas is None else replicas) * self.spec.workers.procs_per_worker
        accumulation = accumulation_for(batch, world, self.target_global_batch(reference), training.group_size())
        return batch, accumulation, batch * accumulation * world

    def target_global_batch(self, reference: int | None = None) -> int:
        """The spec's batchSize × gradientAccumulationSteps × processes at ``reference`` workers, by default
        the size the job first ran with (status.scaling.referenceReplicas): kept across resizes."""
        training, status = self.spec.training, self.status
        if reference is None:
            reference = status.scaling.reference_replicas if status and status.scaling else self.replicas
        return training.batch_size * training.gradient_accumulation_steps * reference * self.spec.workers.procs_per_worker

    def trainer_config(self, output_dir: str, checkpoint: CheckpointSpec | None = None,
                       sources: list[str] | None = None) -> TrainerConfig:
        """The trainer's view of this job (what the ConfigMap holds).

        ``checkpoint``: the job's cadence with the storage its runtime resolved (``runtime.resolve``); None: no
        runtime, the cadence alone (checkpoints in ``<output_dir>/checkpoints``). ``sources``: the runtime's
        ``sources.allowed`` (None: no runtime).
        """
        batch, accumulation, _ = self.batch_shape()
        training = self.spec.training
        if (batch, accumulation) != (training.batch_size, training.gradient_accumulation_steps):
            training = training.model_copy(update={"batch_size": batch, "gradient_accumulation_steps": accumulation})
        return TrainerConfig(
            job_name=self.metadata.name,
            namespace=self.metadata.namespace,
            training=training,
            checkpoint=checkpoint if checkpoint is not None else self.cadence(),
            world_size=self.world_size,
            output_dir=output_dir,
            sources=sources,
            experiment=self.experiment(),
        )

    def experiment(self) -> str | None:
        """The RLExperiment this job is a trial of (its label), None when the label is absent or no label value."""
        value = self.metadata.labels.get(EXPERIMENT_LABEL, "")
        return value if len(value) <= 63 and re.match(LABEL_VALUE_PATTERN, value) else None

    def cadence(self) -> CheckpointSpec:
        """The trainer's checkpoint settings from the job alone: its cadence and retention, no storage."""
        return CheckpointSpec(**{name: getattr(self.spec.checkpoint, name) for name in CheckpointCadence.model_fields})


class ManifestError(Exception):
    """A manifest that cannot be used; ``problems`` are ``field.path: message`` lines."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def parse_job(document: Any, source: str = "<manifest>") -> RLTrainingJob:
    if not isinstance(document, dict):
        raise ManifestError(source, ["(root): expected a mapping with apiVersion, kind, metadata and spec"])
    try:
        return validate_document(RLTrainingJob, document)
    except ValidationError as e:
        raise ManifestError(source, format_validation_error(e)) from None


def read_documents(path: str | os.PathLike[str]) -> list[Any]:
    """The YAML documents of a manifest file; ManifestError naming the file if unreadable or not YAML."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(source, [f"cannot read file: {e.strerror}"]) from None
    try:
        return [d for d in yamltext.load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(source, [f"invalid YAML: {e}"]) from None


def load_jobs(path: str | os.PathLike[str]) -> list[RLTrainingJob]:
    """Every RLTrainingJob in a YAML file (other kinds are skipped)."""
    source = str(path)
    documents = read_documents(path)
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
