"""The runtimes (``rljob.dev/v1alpha1``): what the platform sets for a job's pods, written by its admins.

A ``ClusterRLTrainingRuntime`` (cluster-scoped) or an ``RLTrainingRuntime`` (namespaced, for a
namespace's admins) holds everything that shapes a worker pod or touches the platform: the image, a
partial pod (security context, ServiceAccount, volumes, env with ``valueFrom``, placement), the GPU
resource, bounds on what a job may ask, checkpoint storage (each job under its own path), the sources
a job's model, data and reward modules may come from, extra egress and the Kueue queue. Both kinds
share one spec model (:class:`RuntimeSpec`). A job names one with ``spec.runtimeRef``, or gets the
default runtime (annotation :data:`DEFAULT_RUNTIME_ANNOTATION`, as a StorageClass is marked).

The job keeps the researcher's side (``rljob_contract.job``); the fields that moved here are refused
on a job, naming their place here (``rljob_contract.job.MOVED_TO_RUNTIME``).

Pure functions the CLI and the operator share: :func:`resolve` (the effective values a job gets on a
runtime) and :func:`problems` (where a job asks for more than the runtime allows, each naming the
job's field and the runtime's bound).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from rljob_contract.job import (
    CLUSTER_RUNTIME_KIND,
    DEFAULT_GPU_RESOURCE,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_IMAGE,
    GROUP,
    NAMESPACED_RUNTIME_KIND,
    VERSION,
    ManifestError,
    RuntimeKind,
    read_documents,
)
from rljob_contract.job import RuntimeRef as RuntimeRef  # the job's side of the reference, re-exported
from rljob_contract.pod import ENV_PREFIX, format_validation_error, validate_document
from rljob_contract.quantities import check_quantity, is_quantity, parse_quantity
from rljob_contract.rules import Rule, enforce
from rljob_contract.spec import (
    BUILTIN_MODEL_PREFIX,
    K8S_NAME_PATTERN,
    CheckpointSpec,
    CheckpointStorage,
    Model,
)

if TYPE_CHECKING:
    from rljob_contract.job import RLTrainingJob

API_VERSION = f"{GROUP}/{VERSION}"
CLUSTER_KIND = CLUSTER_RUNTIME_KIND
CLUSTER_PLURAL = "clusterrltrainingruntimes"
CLUSTER_SINGULAR = "clusterrltrainingruntime"
CLUSTER_SHORT_NAMES = ["crlrt"]
NAMESPACED_KIND = NAMESPACED_RUNTIME_KIND
NAMESPACED_PLURAL = "rltrainingruntimes"
NAMESPACED_SINGULAR = "rltrainingruntime"
NAMESPACED_SHORT_NAMES = ["rlrt"]
#: The runtime that serves jobs naming none: ``"true"`` marks it (several: the newest wins, as for StorageClasses).
DEFAULT_RUNTIME_ANNOTATION = "rljob.dev/is-default-runtime"
#: The label by which a job names its Kueue LocalQueue (``spec.queue`` of its runtime gives one when it names none).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Prefixes that allow hub ids (``Qwen/Qwen2.5-0.5B``, a datasets-library name) in ``sources.allowed``.
HUB_PREFIXES = ("hf://", "hub:")


def _quantity_cel(expr: str) -> str:
    """CEL: ``expr`` (an int-or-string) is a quantity, not negative."""
    return f"(isQuantity(string({expr})) && quantity(string({expr})).compareTo(quantity('0')) >= 0)"


# -------------------------------------------------------------------------------- limits


class CountLimit(Model):
    """The most a job may ask for (None: the API's own bound)."""

    max: int | None = Field(None, ge=1, le=1024, description="The most a job may ask for.")


class _DefaultWithinMax(Model):
    """A bound whose default, when both are set, is at most its max."""

    default: Any = None
    max: Any = None

    @staticmethod
    def measure(value: Any) -> Any:
        return value

    @model_validator(mode="after")
    def _default_within_max(self) -> _DefaultWithinMax:
        if self.default is not None and self.max is not None and self.measure(self.default) > self.measure(self.max):
            raise ValueError(f"@default: must be at most max ({self.default} > {self.max})")
        return self


class GpuLimit(_DefaultWithinMax):
    """GPUs per worker: the default a job gets and the most it may ask for."""

    default: int | None = Field(
        None, ge=0, le=64,
        description="GPUs of a worker whose job does not set gpusPerWorker. Default: procsPerWorker, or 0 "
                    "when max is 0 (a CPU runtime).")
    max: int | None = Field(None, ge=0, le=64, description="The most GPUs a worker may ask for (0: a CPU runtime).")


class SecondsLimit(_DefaultWithinMax):
    """A duration in seconds: the default a job gets and the most it may ask for."""

    default: int | None = Field(None, ge=1, description="Seconds a job gets when it sets none.")
    max: int | None = Field(None, ge=1, description="The most seconds a job may ask for.")


class GraceLimit(_DefaultWithinMax):
    """The worker's termination grace period: the default a job gets and the most it may ask for."""

    default: int | None = Field(
        None, ge=10, le=3600,
        description=f"Seconds a stopping worker gets when the job sets none (else {DEFAULT_GRACE_SECONDS}).")
    max: int | None = Field(
        None, ge=10, le=3600,
        description="The most seconds a job may give its stopping workers: the time an evicted or failed gang "
                    "may hold its GPUs after Kueue gave its quota to someone else.")


class QuantityLimit(_DefaultWithinMax):
    """A resource quantity per worker (``4``, ``500m``, ``16Gi``): the default request and the most a job may ask."""

    default: int | str | None = Field(None, description="The request of a worker whose job sets neither request "
                                                         "nor limit.")
    max: int | str | None = Field(None, description="The most a job may request or limit per worker.")

    _quantities = field_validator("default", "max")(check_quantity)

    @staticmethod
    def measure(value: Any) -> Any:
        return parse_quantity(value)


def _limit_rules() -> list[Rule]:
    """Each limit's default at most its max (numbers compared as numbers, quantities as quantities)."""
    def within(b: Any) -> bool:
        return b.default is None or b.max is None or b.measure(b.default) <= b.measure(b.max)

    rules = [Rule(f"spec.limits.{name}: default ≤ max", f"spec.limits.{name}",
                  "!has(self.default) || !has(self.max) || self.default <= self.max",
                  f"spec.limits.{name}.default must be at most max", ".default",
                  holds=within, enforced_by="_DefaultWithinMax._default_within_max")
             for name in ("gpusPerWorker", "terminationGracePeriodSeconds", "activeDeadlineSeconds")]
    for name in ("cpuPerWorker", "memoryPerWorker"):
        at = f"spec.limits.{name}"
        rules += [
            Rule(f"{at}.{key}: a quantity", at, f"!has(self.{key}) || {_quantity_cel('self.' + key)}",
                 f"{at}.{key} must be a quantity, not negative (for example 4, 500m, 16Gi)", f".{key}",
                 holds=_key_is_quantity(key), enforced_by="check_quantity")
            for key in ("default", "max")
        ]
        rules.append(Rule(
            f"{at}: default ≤ max", at,
            f"!has(self.default) || !has(self.max) || !{_quantity_cel('self.default')} || "
            f"!{_quantity_cel('self.max')} || "
            "quantity(string(self.default)).compareTo(quantity(string(self.max))) <= 0",
            f"{at}.default must be at most max", ".default", holds=within,
            enforced_by="_DefaultWithinMax._default_within_max"))
    return rules


def _key_is_quantity(key: str) -> Callable[[Any], bool]:
    return lambda bound: getattr(bound, key) is None or is_quantity(getattr(bound, key))


#: The limits' rules (CEL on the runtime CRDs; the models' validators say them with the numbers).
LIMIT_RULES = _limit_rules()


class RuntimeLimits(Model):
    """Bounds on what a job may ask for, per worker and per job (unset: no bound beyond the API's)."""

    gpus_per_worker: GpuLimit = Field(default_factory=GpuLimit, description="spec.workers.gpusPerWorker.")
    procs_per_worker: CountLimit = Field(default_factory=CountLimit, description="spec.workers.procsPerWorker.")
    cpu_per_worker: QuantityLimit = Field(
        default_factory=QuantityLimit, description="spec.workers.resources cpu (requests and limits).")
    memory_per_worker: QuantityLimit = Field(
        default_factory=QuantityLimit, description="spec.workers.resources memory (requests and limits).")
    replicas: CountLimit = Field(
        default_factory=CountLimit, description="spec.workers.replicas, minReplicas and maxReplicas.")
    termination_grace_period_seconds: GraceLimit = Field(
        default_factory=GraceLimit, description="spec.workers.terminationGracePeriodSeconds.")
    active_deadline_seconds: SecondsLimit = Field(
        default_factory=SecondsLimit, description="spec.runPolicy.activeDeadlineSeconds.")


# ------------------------------------------------------------------------ the other parts


class JobEnv(StrEnum):
    allowed = "Allowed"
    forbidden = "Forbidden"


class LabelSelectorRequirement(Model):
    """One requirement of a label selector (Kubernetes' LabelSelectorRequirement)."""

    key: str = Field(..., min_length=1, max_length=317, description="The label key.")
    operator: str = Field(..., pattern=r"^(In|NotIn|Exists|DoesNotExist)$",
                          description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(default_factory=list, max_length=256,
                              description="Values for In and NotIn (empty for Exists and DoesNotExist).")

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        return {"In": present and labels.get(self.key) in self.values,
                "NotIn": not present or labels.get(self.key) not in self.values,
                "Exists": present, "DoesNotExist": not present}[self.operator]


class LabelSelector(Model):
    """Kubernetes' LabelSelector: every matchLabels pair and every matchExpressions requirement must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels that must be equal.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=64, description="Requirements on labels.")

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and \
            all(r.matches(labels) for r in self.match_expressions)

    def describe(self) -> str:
        """The selector as kubectl writes one (``team=a,tier in (x,y)``)."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        for r in self.match_expressions:
            words = {"In": "in", "NotIn": "notin"}
            parts.append(f"{r.key} {words[r.operator]} ({','.join(r.values)})" if r.operator in words
                         else (r.key if r.operator == "Exists" else f"!{r.key}"))
        return ",".join(parts) or "(everything)"


class ImagePullSecret(Model):
    """A Secret of the job's namespace the kubelet pulls the image with."""

    name: str = Field(..., min_length=1, max_length=253, pattern=K8S_NAME_PATTERN, description="The Secret's name.")


class ImagePullPolicy(StrEnum):
    always = "Always"
    if_not_present = "IfNotPresent"
    never = "Never"


class RuntimeCheckpoint(CheckpointStorage):
    """Where the jobs' checkpoints go: each job gets ``<storage>/<namespace>/<job>[/<subPath>]`` (mirrors alike)."""

    storage: str | None = Field(
        None,
        description=(
            "A prefix under which each job gets its own path <storage>/<namespace>/<job>[/<subPath>]: "
            "s3://bucket/prefix (any S3-compatible endpoint), pvc://claim/prefix (a PersistentVolumeClaim of "
            "the job's namespace, mounted read-write into every worker) or a folder. Unset: each pod's own "
            "/workspace/output/checkpoints, which a gang restart deletes (condition CheckpointsDurable=False)."
        ),
    )
    credentials_secret: str | None = Field(
        None,
        description=(
            "A Secret in the job's namespace whose keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally "
            "AWS_SESSION_TOKEN) the operator mounts as files in the workers (never environment). Or leave it out "
            "and give spec.podTemplate a serviceAccountName bound to a cloud role (IRSA, GKE Workload Identity)."
        ),
    )


class RuntimeSources(Model):
    """Where a job's model, datasets and reward modules may come from (``builtin:`` always may)."""

    allowed: list[str] = Field(
        default_factory=list, max_length=64,
        description="Prefixes (s3://bucket/datasets/, pvc://models/, /models/); a hub id (a model or datasets-library "
                    "name) only when hf:// or hub: is listed. Empty: built-ins only.")

    @field_validator("allowed")
    @classmethod
    def _prefixes(cls, v: list[str]) -> list[str]:
        for i, prefix in enumerate(v):
            if not prefix or len(prefix) > 2048:
                raise ValueError(f"@{i}: a prefix of 1 to 2048 characters")
        return v


class EgressRule(Model):
    """Egress the job's pods get beyond DNS, their own pods, the status API and the checkpoint storage."""

    cidr: str = Field(..., min_length=1, max_length=64, description="An IPv4 or IPv6 block (10.0.0.0/8).")
    ports: list[int] = Field(default_factory=list, max_length=32,
                             description="TCP ports (empty: every port).")

    @field_validator("cidr")
    @classmethod
    def _block(cls, v: str) -> str:
        try:
            ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise ValueError(f"{v!r} is not an IP block (10.0.0.0/8, fd00::/8)") from None
        return v

    @field_validator("ports")
    @classmethod
    def _ports(cls, v: list[int]) -> list[int]:
        for i, port in enumerate(v):
            if not 1 <= port <= 65535:
                raise ValueError(f"@{i}: a port is 1-65535")
        return v


class RuntimeEgress(Model):
    """Extra egress of the job's pods (the operator's NetworkPolicy, when the platform has them on)."""

    to: list[EgressRule] = Field(default_factory=list, max_length=32, description="Where the pods may connect.")


class RuntimeQueue(Model):
    """The Kueue LocalQueue a job uses."""

    name: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                             description="The LocalQueue a job gets when it names none (its label "
                                         "kueue.x-k8s.io/queue-name).")
    required: bool = Field(False, description="true: a job without a queue does not run (and may not remove the "
                                              "label).")


class RuntimeSpec(Model):
    """What a job's pods get from the platform: one model for ClusterRLTrainingRuntime and RLTrainingRuntime."""

    namespace_selector: LabelSelector | None = Field(
        None,
        description="ClusterRLTrainingRuntime only: the namespaces whose jobs may use it (absent: every namespace). "
                    "The operator enforces it itself (a job outside fails with reason RuntimeNotAllowed).")
    image: str = Field(..., min_length=1, max_length=1024, description="The trainer container's image.")
    image_pull_policy: ImagePullPolicy | None = Field(
        None, description="Always, IfNotPresent or Never (default: Kubernetes' rule for the tag).")
    image_pull_secrets: list[ImagePullSecret] = Field(
        default_factory=list, max_length=16, description="Secrets of the job's namespace to pull the image with.")
    gpu_resource: str = Field(
        DEFAULT_GPU_RESOURCE, min_length=1, max_length=253,
        description="The extended resource name of a GPU (nvidia.com/gpu, amd.com/gpu); the workers tolerate its "
                    "NoSchedule taint (judged by the platform's pod profile like every toleration).")
    pod_template: dict[str, Any] | None = Field(
        None,
        description=(
            "A partial Pod ({metadata: {labels, annotations}, spec: {...}}) merged over the pod the operator builds: "
            "securityContext, serviceAccountName, tolerations, nodeSelector, affinity, topologySpreadConstraints, "
            "priorityClassName, runtimeClassName, volumes, the trainer container's env (valueFrom allowed), envFrom, "
            "volumeMounts and resources. Maps merge key by key, containers and volumes merge by name, other lists "
            "replace; the operator's names, labels, restartPolicy, rendezvous env and command always win."
        ),
    )
    limits: RuntimeLimits = Field(default_factory=RuntimeLimits, description="Bounds on what a job may ask for.")
    job_env: JobEnv = Field(
        JobEnv.allowed,
        description="Allowed: a job may add plain name/value env (spec.workers.env); the operator's RLJOB_* and "
                    "the runtime's own names always win. Forbidden: a job with env does not run.")
    checkpoint: RuntimeCheckpoint = Field(default_factory=RuntimeCheckpoint, description="Checkpoint storage.")
    sources: RuntimeSources = Field(default_factory=RuntimeSources,
                                    description="Where a job's model, data and reward modules may come from.")
    egress: RuntimeEgress = Field(default_factory=RuntimeEgress, description="Extra egress of the job's pods.")
    queue: RuntimeQueue = Field(default_factory=RuntimeQueue, description="The Kueue LocalQueue jobs use.")


#: The namespaced kind's spec: a namespace's admins may not widen it to other namespaces.
NAMESPACED_RULES = [Rule(
    "spec.namespaceSelector: ClusterRLTrainingRuntime only", "spec", "!has(self.namespaceSelector)",
    "spec.namespaceSelector: only a ClusterRLTrainingRuntime has one (an RLTrainingRuntime serves its own "
    "namespace)", ".namespaceSelector",
    holds=lambda s: s.namespace_selector is None,
    refusal="@namespaceSelector: only a ClusterRLTrainingRuntime has one (an RLTrainingRuntime serves its own "
            "namespace)")]


class RuntimeMetadata(Model):
    """The parts of a runtime's metadata a manifest may carry."""

    name: str = Field(..., min_length=1, max_length=253, pattern=K8S_NAME_PATTERN)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    # Server-populated fields are accepted (a runtime read back from the cluster still validates).
    model_config = Model.model_config | {"extra": "allow"}


class TrainingRuntime(Model):
    """A ClusterRLTrainingRuntime or an RLTrainingRuntime (its ``kind`` says which)."""

    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: RuntimeKind
    metadata: RuntimeMetadata
    spec: RuntimeSpec

    @model_validator(mode="after")
    def _version_and_scope(self) -> TrainingRuntime:
        if self.api_version != API_VERSION:
            raise ValueError(f"apiVersion must be {API_VERSION}, got {self.api_version!r}")
        if self.kind == RuntimeKind.namespaced:
            try:
                enforce(self.spec, NAMESPACED_RULES)
            except ValueError as e:
                raise ValueError(f"@spec.{str(e).removeprefix('@')}") from None
        return self

    @property
    def is_default(self) -> bool:
        return self.metadata.annotations.get(DEFAULT_RUNTIME_ANNOTATION) == "true"

    @property
    def generation(self) -> int | None:
        return (self.metadata.model_extra or {}).get("generation")

    @property
    def ref(self) -> str:
        """``kind/name`` (``namespace/`` before the name of a namespaced one), for messages."""
        where = f"{self.metadata.namespace}/" if self.kind == RuntimeKind.namespaced and self.metadata.namespace else ""
        return f"{self.kind}/{where}{self.metadata.name}"


RUNTIME_KINDS = frozenset(k.value for k in RuntimeKind)


def parse_runtime(document: Any, source: str = "<manifest>") -> TrainingRuntime:
    if not isinstance(document, dict):
        raise ManifestError(source, ["(root): expected a mapping with apiVersion, kind, metadata and spec"])
    try:
        return validate_document(TrainingRuntime, document)
    except ValidationError as e:
        raise ManifestError(source, format_validation_error(e)) from None


def load_runtimes(path: str | os.PathLike[str]) -> list[TrainingRuntime]:
    """Every ClusterRLTrainingRuntime and RLTrainingRuntime in a YAML file (other kinds are skipped)."""
    source = str(path)
    runtimes = [parse_runtime(d, source) for d in read_documents(path)
                if isinstance(d, dict) and d.get("kind") in RUNTIME_KINDS]
    if not runtimes:
        raise ManifestError(source, [f"no {CLUSTER_KIND} or {NAMESPACED_KIND} document found"])
    return runtimes


def default_runtime(runtimes: list[TrainingRuntime], kind: RuntimeKind) -> TrainingRuntime | None:
    """The default runtime of ``kind`` among ``runtimes`` (the annotation; several: the newest, then by name,
    as for StorageClasses)."""
    marked = [r for r in runtimes if r.kind == kind and r.is_default]
    created = lambda r: str((r.metadata.model_extra or {}).get("creationTimestamp") or "")  # noqa: E731
    return max(marked, key=lambda r: (created(r), r.metadata.name), default=None)


# ------------------------------------------------------------------------------ resolving


@dataclass(frozen=True)
class Resolved:
    """What a job gets on its runtime: the values the operator builds its pods from and the trainer config carries.

    ``runtime`` None: no runtime at all (``rljob train`` without ``--runtime``): the shipped image, no bounds,
    checkpoints in the output folder.
    """

    runtime: TrainingRuntime | None
    image: str
    image_pull_policy: str | None
    image_pull_secrets: tuple[str, ...]
    gpu_resource: str
    gpus_per_worker: int
    resources: dict[str, dict[str, str]]
    """The trainer container's cpu and memory: ``{"requests": {...}, "limits": {...}}`` (GPUs added by the builder)."""
    termination_grace_period_seconds: int
    active_deadline_seconds: int | None
    checkpoint: CheckpointSpec
    """The job's cadence with the runtime's storage, each location under the job's own path."""
    pod_template: dict[str, Any] | None
    env: tuple[dict[str, str], ...]
    """The job's plain env that applies (none when the runtime forbids it; never RLJOB_* or the runtime's names)."""
    sources: tuple[str, ...] | None
    egress: tuple[EgressRule, ...]
    queue: str | None
    """The job's LocalQueue: its label, else the runtime's queue."""
    queue_required: bool
    namespace_selector: LabelSelector | None = field(default=None)

    @property
    def ref(self) -> str:
        return self.runtime.ref if self.runtime is not None else "(no runtime)"

    def fingerprint(self) -> str:
        """A hash of everything here: equal for equal pods and trainer configs (a runtime edit changes it)."""
        body = {k: v for k, v in self.__dict__.items() if k != "runtime"}
        body["checkpoint"] = self.checkpoint.model_dump(mode="json")
        body["egress"] = [e.model_dump(mode="json") for e in self.egress]
        body["namespace_selector"] = self.namespace_selector.model_dump(mode="json") if self.namespace_selector else None
        body["runtime"] = self.ref
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve(job: RLTrainingJob, runtime: TrainingRuntime | None, namespace: str | None = None) -> Resolved:
    """The effective values ``job`` gets on ``runtime`` (None: no runtime), in namespace ``namespace`` (default:
    the job's, else ``default``). Pure: whether the job stays within the runtime's bounds is :func:`problems`'."""
    namespace = namespace or job.metadata.namespace or "default"
    spec = runtime.spec if runtime is not None else None
    limits = spec.limits if spec is not None else RuntimeLimits()
    workers = job.spec.workers
    grace = _first(workers.termination_grace_period_seconds, limits.termination_grace_period_seconds.default,
                   DEFAULT_GRACE_SECONDS)
    deadline = _first(job.spec.run_policy.active_deadline_seconds, limits.active_deadline_seconds.default,
                      limits.active_deadline_seconds.max)
    return Resolved(
        runtime=runtime,
        image=spec.image if spec is not None else DEFAULT_IMAGE,
        image_pull_policy=spec.image_pull_policy if spec is not None else None,
        image_pull_secrets=tuple(s.name for s in spec.image_pull_secrets) if spec is not None else (),
        gpu_resource=spec.gpu_resource if spec is not None else DEFAULT_GPU_RESOURCE,
        gpus_per_worker=gpus_per_worker(job, limits.gpus_per_worker),
        resources=_resources(job, limits),
        termination_grace_period_seconds=int(grace),
        active_deadline_seconds=deadline,
        checkpoint=_checkpoint(job, spec.checkpoint if spec is not None else None, namespace),
        pod_template=spec.pod_template if spec is not None else None,
        env=_job_env(job, spec),
        sources=tuple(spec.sources.allowed) if spec is not None else None,
        egress=tuple(spec.egress.to) if spec is not None else (),
        queue=job.metadata.labels.get(QUEUE_LABEL) or (spec.queue.name if spec is not None else None),
        queue_required=spec.queue.required if spec is not None else False,
        namespace_selector=spec.namespace_selector if spec is not None else None,
    )


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def gpus_per_worker(job: RLTrainingJob, bound: GpuLimit) -> int:
    """The job's gpusPerWorker, else the runtime's default, else procsPerWorker (0 on a CPU runtime: max 0)."""
    workers = job.spec.workers
    if workers.gpus_per_worker is not None:
        return workers.gpus_per_worker
    if bound.default is not None:
        return bound.default
    return 0 if bound.max == 0 else workers.procs_per_worker


def _resources(job: RLTrainingJob, limits: RuntimeLimits) -> dict[str, dict[str, str]]:
    asked = job.spec.workers.resources
    requests = {k: str(v) for k, v in asked.requests.items()}
    out_limits = {k: str(v) for k, v in asked.limits.items()}
    for name, bound in (("cpu", limits.cpu_per_worker), ("memory", limits.memory_per_worker)):
        if bound.default is not None and name not in requests and name not in out_limits:
            requests[name] = str(bound.default)
    return {k: v for k, v in (("requests", requests), ("limits", out_limits)) if v}


def job_location(prefix: str, namespace: str, name: str, sub_path: str | None) -> str:
    """``<prefix>/<namespace>/<name>[/<sub_path>]``: a job's own place under a runtime's storage prefix."""
    return posixpath.join(prefix.rstrip("/"), namespace, name, *([sub_path] if sub_path else []))


def _checkpoint(job: RLTrainingJob, storage: RuntimeCheckpoint | None, namespace: str) -> CheckpointSpec:
    cadence = job.cadence()
    if storage is None:
        return cadence
    name, sub = job.metadata.name, job.spec.checkpoint.sub_path
    mirrors = [m.model_copy(update={"location": job_location(m.location, namespace, name, sub)})
               for m in storage.mirrors]
    return cadence.model_copy(update={
        "storage": job_location(storage.storage, namespace, name, sub) if storage.storage else None,
        "endpoint_url": storage.endpoint_url, "region": storage.region,
        "credentials_secret": storage.credentials_secret, "mirrors": mirrors,
    })


def _job_env(job: RLTrainingJob, spec: RuntimeSpec | None) -> tuple[dict[str, str], ...]:
    if spec is not None and spec.job_env == JobEnv.forbidden:
        return ()
    theirs = runtime_env_names(spec)
    return tuple({"name": e.name, "value": e.value} for e in job.spec.workers.env
                 if not e.name.startswith(ENV_PREFIX) and e.name not in theirs)


def runtime_env_names(spec: RuntimeSpec | None) -> set[str]:
    """The env names the runtime's podTemplate gives the trainer container."""
    containers = ((spec.pod_template or {}).get("spec") or {}).get("containers") if spec is not None else None
    trainer = next((c for c in containers or [] if isinstance(c, dict) and c.get("name") == "trainer"), {})
    return {str(e.get("name")) for e in trainer.get("env") or [] if isinstance(e, dict)}


# ------------------------------------------------------------------------------- problems


def problems(job: RLTrainingJob, runtime: TrainingRuntime) -> list[str]:
    """Where ``job`` asks for more than ``runtime`` allows: ``spec.field: why (runtime <kind>/<name> allows …)``.

    Empty when the job fits. Pure; the operator refuses such a job and ``rljob validate --runtime`` prints these.
    """
    limits, ref = runtime.spec.limits, runtime.ref
    workers = job.spec.workers
    out: list[str] = []

    def over(path: str, value: Any, bound: Any, what: str, measure: Any = None) -> None:
        if value is not None and bound is not None and (measure or (lambda x: x))(value) > (measure or (lambda x: x))(bound):
            out.append(f"{path}: {value} {what} (runtime {ref} allows at most {bound})")

    gpus = gpus_per_worker(job, limits.gpus_per_worker)
    if workers.gpus_per_worker is None and limits.gpus_per_worker.max is not None and gpus > limits.gpus_per_worker.max:
        out.append(f"spec.workers.gpusPerWorker: unset, so {gpus} GPUs per worker (procsPerWorker); runtime {ref} "
                   f"allows at most {limits.gpus_per_worker.max}: set gpusPerWorker")
    else:
        over("spec.workers.gpusPerWorker", gpus, limits.gpus_per_worker.max, "GPUs per worker")
    over("spec.workers.procsPerWorker", workers.procs_per_worker, limits.procs_per_worker.max, "processes per worker")
    for name in ("replicas", "min_replicas", "max_replicas"):
        alias = {"replicas": "replicas", "min_replicas": "minReplicas", "max_replicas": "maxReplicas"}[name]
        over(f"spec.workers.{alias}", getattr(workers, name), limits.replicas.max, "workers")
    for section in ("requests", "limits"):
        asked = getattr(workers.resources, section)
        for resource, bound in (("cpu", limits.cpu_per_worker.max), ("memory", limits.memory_per_worker.max)):
            over(f"spec.workers.resources.{section}.{resource}", asked.get(resource), bound, "per worker",
                 parse_quantity)
    over("spec.workers.terminationGracePeriodSeconds", workers.termination_grace_period_seconds,
         limits.termination_grace_period_seconds.max, "seconds")
    over("spec.runPolicy.activeDeadlineSeconds", job.spec.run_policy.active_deadline_seconds,
         limits.active_deadline_seconds.max, "seconds")
    if runtime.spec.job_env == JobEnv.forbidden and workers.env:
        out.append(f"spec.workers.env: runtime {ref} does not let a job set env (its spec.jobEnv is Forbidden)")
    out += _source_problems(job, runtime)
    if runtime.spec.queue.required and not (job.metadata.labels.get(QUEUE_LABEL) or runtime.spec.queue.name):
        out.append(f"metadata.labels[{QUEUE_LABEL}]: runtime {ref} requires a Kueue LocalQueue; label the job "
                   "with one")
    return out


def job_sources(job: RLTrainingJob) -> list[tuple[str, str]]:
    """(field, value) of every place a job's model, data or reward modules come from."""
    training = job.spec.training
    found = [("spec.training.model", training.model), ("spec.training.dataset.name", training.dataset.name)]
    if training.evaluation is not None and training.evaluation.dataset is not None:
        found.append(("spec.training.evaluation.dataset.name", training.evaluation.dataset.name))
    found += [(f"spec.training.rewards[{i}].source.uri", r.source.uri) for i, r in enumerate(training.rewards)
              if r.source is not None and r.source.uri is not None]
    return found


def source_allowed(value: str, allowed: tuple[str, ...] | list[str]) -> bool:
    """May a job read ``value`` (a model, dataset or module) under these ``sources.allowed`` prefixes?
    ``builtin:`` always; a hub id (no scheme, not a path) only when ``hf://`` or ``hub:`` is listed."""
    if value.startswith(BUILTIN_MODEL_PREFIX):
        return True
    if is_hub_id(value):
        return any(p in HUB_PREFIXES for p in allowed)
    return any(value.startswith(p) for p in allowed if p not in HUB_PREFIXES)


def is_hub_id(value: str) -> bool:
    """A model or datasets-library name (``Qwen/Qwen2.5-0.5B``, ``gsm8k``), not a URI, a path or a data file."""
    return "://" not in value and not value.startswith(("/", "./", "../", "~")) and \
        not value.endswith((".jsonl", ".json", ".parquet", ".csv"))


def _source_problems(job: RLTrainingJob, runtime: TrainingRuntime) -> list[str]:
    allowed = runtime.spec.sources.allowed
    shown = ", ".join(allowed) or "built-ins only"
    return [f"{path}: {value!r} is not under the sources runtime {runtime.ref} allows ({shown}; spec.sources.allowed)"
            for path, value in job_sources(job) if not source_allowed(value, allowed)]
