"""The operator↔trainer-pod contract: the one place both sides read it from.

The operator builds worker pods that run the trainer; everything the two must agree on is here,
and nowhere else:

* the environment (``RLJOB_*``) a worker pod reads, and the credential prefix of checkpoint mirrors;
* the trainer command and where its config is mounted; the config's YAML format (dump and load);
* the heartbeat the trainer's rank 0 posts to the operator's status API: its path and its body;
* the exit codes by which a node tells the operator what its failure means;
* how a pydantic ``ValidationError`` becomes messages naming the field path (the operator's
  ``rljob validate`` and the trainer's config loader say the same thing).

Only the standard library, pydantic and PyYAML may be imported here (and the trainer's torch-free
schema, ``rljob_contract.spec``): the operator image has no torch, TRL, transformers or boto3.
``tests/contract/test_boundary.py`` enforces that, and that the programs depend on each other only
through ``rljob_contract`` (neither imports the other).
"""

from __future__ import annotations

import json
import math
import re
import signal
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from rljob_contract import yamltext
from rljob_contract.health import MAX_HEALTH_REPORTS, HealthReport
from rljob_contract.spec import TrainerConfig

# ------------------------------------------------------------------------ environment
#: What every variable of this contract starts with: a job's own env never sets one (``runtime.resolve``).
ENV_PREFIX = "RLJOB_"
# Set by the operator on every worker container (``rljob_operator.decisions.children.worker_env``).

#: Worker pods in the gang (torchrun ``--nnodes``).
NNODES_ENV = "RLJOB_NNODES"
#: This pod's index in the gang (torchrun ``--node-rank``).
NODE_RANK_ENV = "RLJOB_NODE_RANK"
#: Processes in this pod (torchrun ``--nproc-per-node``).
NPROC_PER_NODE_ENV = "RLJOB_NPROC_PER_NODE"
#: ``host:port`` of worker 0, whose agent hosts the c10d rendezvous store (a replaced worker 0 hosts a new one
#: there, and the other nodes dial it again: ``rljob_trainer.launch.run_redialling``).
RDZV_ENDPOINT_ENV = "RLJOB_RDZV_ENDPOINT"
#: Rendezvous id, unique per job object and gang generation.
RUN_ID_ENV = "RLJOB_RUN_ID"
#: Seconds the launcher waits, after SIGTERM, for its ranks to save a checkpoint and exit (torch >= 2.12:
#: ``LaunchConfig.shutdown_timeout``; torch <= 2.11 has no such field and the launcher applies the bound
#: to the agent's ``PContext.close`` instead, see ``rljob_trainer.launch.bounded_worker_shutdown``).
SHUTDOWN_TIMEOUT_ENV = "RLJOB_SHUTDOWN_TIMEOUT"
#: Restarts this node's elastic agent may make of its ranks when a peer worker is lost, so that the
#: survivors re-rendezvous with the pod the operator creates in its place (jobs with durable checkpoints,
#: fixed-size or elastic, see ``rljob_operator.decisions.failure.respond``). Unset or 0: any rank failure
#: ends the node.
IN_PLACE_RESTARTS_ENV = "RLJOB_IN_PLACE_RESTARTS"
#: Where logs, TensorBoard events and the summary go (overrides the config's ``outputDir``).
OUTPUT_DIR_ENV = "RLJOB_OUTPUT_DIR"
#: Port of rank 0's ``/metrics``, ``/healthz`` and ``/readyz`` (the pod's probes use it).
METRICS_PORT_ENV = "RLJOB_METRICS_PORT"
#: The pod's own name (downward API); sent in heartbeats.
POD_NAME_ENV = "RLJOB_POD_NAME"
#: Full heartbeat URL (base URL + ``heartbeat_path``); unset means "send no heartbeats".
STATUS_URL_ENV = "RLJOB_STATUS_URL"
#: File holding the projected, audience-bound service-account token heartbeats carry.
TOKEN_FILE_ENV = "RLJOB_TOKEN_FILE"
#: PEM file the trainer trusts for the status URL (set only when the operator ships a CA).
STATUS_CA_FILE_ENV = "RLJOB_STATUS_CA_FILE"
#: Folder under which the operator mounts the Secrets that ``credentialsSecret`` fields name, one
#: file per key (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optionally ``AWS_SESSION_TOKEN``):
#: ``checkpoint/`` for spec.checkpoint's, ``mirror-<i>/`` for mirror ``i``'s. Files, never environment:
#: the keys are not in every process's environment (a reward function's subprocess, a crash dump).
CREDENTIALS_DIR_ENV = "RLJOB_CREDENTIALS_DIR"
CREDENTIALS_DIR = "/var/run/secrets/rljob/storage"
#: Outside a pod (``rljob train``), mirror ``index``'s credentials may come as
#: ``RLJOB_MIRROR<index>_AWS_*`` variables; the primary's are the usual AWS ones.
MIRROR_ENV_PREFIX = "RLJOB_MIRROR{index}_"

#: Every variable the operator sets on a worker with a status endpoint.
OPERATOR_ENV = frozenset({
    NNODES_ENV, NODE_RANK_ENV, NPROC_PER_NODE_ENV, RDZV_ENDPOINT_ENV, RUN_ID_ENV, SHUTDOWN_TIMEOUT_ENV,
    OUTPUT_DIR_ENV, METRICS_PORT_ENV, POD_NAME_ENV, STATUS_URL_ENV, TOKEN_FILE_ENV, STATUS_CA_FILE_ENV,
    CREDENTIALS_DIR_ENV,
})
#: Set besides those on the workers of a job that may restart (``restartPolicy`` other than ``Never``).
RESTARTABLE_ENV = frozenset({IN_PLACE_RESTARTS_ENV})

# Set inside the pod by the launcher for its ranks (the operator never sets these).

#: Local folder of the model the pre-flight materialised or downloaded.
MODEL_PATH_ENV = "RLJOB_MODEL_PATH"
#: Local checkpoint folder the pre-flight chose to resume from ("" = start fresh).
RESUME_CHECKPOINT_ENV = "RLJOB_RESUME_CHECKPOINT"
#: JSON list of resume fallbacks the pre-flight noted; rank 0 sends them in heartbeats.
RESUME_WARNINGS_ENV = "RLJOB_RESUME_WARNINGS"
#: Folder where each rank leaves its first error line for the launcher.
ERROR_DIR_ENV = "RLJOB_ERROR_DIR"
#: This rank's file in that folder.
ERROR_FILE_ENV = "RLJOB_ERROR_FILE"
#: The pid of the process that starts this one (the launcher for its fork server and spawned ranks, the
#: fork server for forked ranks): a process whose parent is no longer that pid lost it before it asked
#: Linux to kill it with its parent. In a container the launcher is pid 1, so "my parent is pid 1"
#: cannot mean "my parent died" there.
PARENT_PID_ENV = "RLJOB_PARENT_PID"

# Experiment tracking (spec.training.tracking; rljob_trainer.tracking).

#: The MLflow run an experiment's trials are child runs of (set by ``rljob experiment`` for its trials).
TRACKING_PARENT_RUN_ENV = "RLJOB_MLFLOW_PARENT_RUN_ID"
#: The trainer's image as the pod names it (a digest when the runtime pins one): a tag on the tracked run. Set
#: on the workers of a job with spec.training.tracking only (:data:`TRACKING_ENV`).
IMAGE_ENV = "RLJOB_IMAGE"
#: Set besides OPERATOR_ENV on the workers of a job with spec.training.tracking.
TRACKING_ENV = frozenset({IMAGE_ENV})
#: What a heartbeat warning about a tracking server starts with: the operator's Event reason is then
#: ``TrackingUnavailable`` (:func:`warning_reason`), not ``CheckpointFallback``.
TRACKING_WARNING_PREFIX = "tracking: "


def warning_reason(message: str) -> str:
    """The Event reason of a heartbeat's warning: a tracking server left out, else a resume that fell back."""
    return "TrackingUnavailable" if message.startswith(TRACKING_WARNING_PREFIX) else "CheckpointFallback"


# Optional knobs (tests, laptops, special clusters).

#: Rendezvous timeout in seconds (default 900).
RDZV_TIMEOUT_ENV = "RLJOB_RDZV_TIMEOUT"
#: "0" turns off the progress bars.
PROGRESS_ENV = "RLJOB_PROGRESS"
#: Where the termination message goes instead of ``/dev/termination-log``.
TERMINATION_LOG_ENV = "RLJOB_TERMINATION_LOG"
#: How the launcher starts its ranks: ``auto`` (default: forked from a fork server that imported the
#: training stack once, unless the node has a GPU; then ``spawn``), ``spawn`` (a fresh interpreter per
#: rank, each importing the stack) or ``forkserver``. See ``rljob_trainer.launch.rank_start_method``.
RANK_START_ENV = "RLJOB_RANK_START"


def credentials_folder(mirror: int | None = None) -> str:
    """The folder, under :data:`CREDENTIALS_DIR`, of spec.checkpoint's credentials (``mirror`` None)
    or mirror ``mirror``'s."""
    return "checkpoint" if mirror is None else f"mirror-{mirror}"


def mirror_env_prefix(index: int) -> str:
    """``RLJOB_MIRROR<index>_``: the environment prefix of mirror ``index``'s credentials."""
    return MIRROR_ENV_PREFIX.format(index=index)


# ------------------------------------------------------------------ command and config
#: Where the job's ConfigMap is mounted in every worker, and the key of the trainer config in it.
CONFIG_DIR = "/etc/rljob"
CONFIG_KEY = "trainer.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
#: Where the operator mounts the reward modules of ``spec.training.rewards[].source.configMap`` (one projected
#: volume, read-only: each module at its ``package/module.py`` path). Beside, not under, CONFIG_DIR: a mount
#: inside another volume's read-only mount needs a mount point the container runtime cannot create there.
REWARDS_DIR = "/etc/rljob-rewards"
#: Set by the launcher for its ranks: the folders (``os.pathsep``-joined) holding reward modules of
#: ``source`` fields (REWARDS_DIR, and the folder the ``uri`` sources were fetched into); put first on sys.path.
REWARD_PATH_ENV = "RLJOB_REWARD_PATH"
#: The in-pod entrypoint (``rljob_trainer.launch.main``).
TRAINER_MODULE = "rljob_trainer.launch"
TRAINER_COMMAND = ("python", "-m", TRAINER_MODULE, "--config", CONFIG_PATH)
#: The port worker 0's agent serves the c10d rendezvous store on.
RENDEZVOUS_PORT = 29500


class LocatedError(Exception):
    """An error that says where: ``where`` names the field path, file or function."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class ConfigError(LocatedError):
    """A trainer config that cannot be read or is invalid; ``where`` names the file."""


def dump_config(cfg: TrainerConfig) -> str:
    """The YAML the operator stores in a job's ConfigMap under ``CONFIG_KEY`` (camelCase keys)."""
    return yaml.safe_dump(json.loads(cfg.model_dump_json(by_alias=True)), sort_keys=False)


def load_config(path: str | Path) -> TrainerConfig:
    """Read what ``dump_config`` wrote (YAML, or JSON, which is YAML too).

    Raises ``ConfigError`` naming ``path``: unreadable file or YAML, or one ``field.path: message``
    per problem (``format_validation_error``) joined with ``; ``.
    """
    try:
        data = yamltext.load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(str(path), f"cannot read trainer config: {e}") from e
    try:
        return validate_document(TrainerConfig, data)
    except ValidationError as e:
        raise ConfigError(str(path), "; ".join(format_validation_error(e))) from e


ModelT = TypeVar("ModelT", bound=BaseModel)


def validate_document(model: type[ModelT], document: Any) -> ModelT:
    """``document`` (a manifest, a trainer config, a merged arm) as ``model``, by the API's spelling only.

    The one normalisation of everything read from outside: field names are camelCase, as the CRD
    has them; the Python spelling (``pod_template``) is an unknown field (``format_validation_error``
    says which spelling to write), so no check, merge or pod ever sees a second way of saying a thing.

    Types are read as the API server reads them (``strict``, as JSON): ``backoffLimit: true`` or ``"3"``
    is refused, not turned into 1 or 3, so ``rljob train`` never runs a manifest ``kubectl apply``
    refuses. A number with no fraction (``3.0``) is an integer, as the API server's schema validation
    takes it; enums are their strings, as in JSON.
    """
    text = json.dumps(_integral_floats(document), default=str)
    return model.model_validate_json(text, strict=True, by_alias=True, by_name=False)


def _integral_floats(value: Any) -> Any:
    """``value`` with every float that has no fraction (``3.0``) as an int (JSON does not tell them apart)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats(v) for v in value]
    return value


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
            msg = _unknown_field(item["loc"][-1] if item["loc"] else "")
        msg = msg.removeprefix("Value error, ")
        if msg.startswith("@") and ": " in msg:
            # A model validator that names a nested field: "@training.numGenerations: ...".
            sub, msg = msg[1:].split(": ", 1)
            parts.append(sub)
        path = ".".join(parts) or "(root)"
        problems.append(f"{path}: {msg}")
    return problems


def _unknown_field(key: Any) -> str:
    """The message of an unknown field; a snake_case spelling of a field is told its camelCase one."""
    camel = to_camel(str(key))
    if "_" in str(key) and str(key).islower() and camel != key:
        return f"unknown field (field names are camelCase: write {camel!r})"
    return "unknown field"


# -------------------------------------------------------------------------- heartbeat
#: Most resume warnings one heartbeat may carry (the pre-flight keeps the first ten).
MAX_HEARTBEAT_WARNINGS = 10
#: Most logged metrics one heartbeat may carry, and the pattern and longest length of a metric's name
#: (TRL's names: ``kl``, ``rewards/accuracy/mean``, ``completions/mean_length``, ...).
MAX_HEARTBEAT_METRICS = 32
METRIC_NAME_PATTERN = r"^[A-Za-z0-9_.:/-]+$"
MAX_METRIC_NAME_LENGTH = 64
_METRIC_NAME_RE = re.compile(METRIC_NAME_PATTERN)


def heartbeat_path(namespace: str, name: str) -> str:
    """Path of job ``namespace/name``'s heartbeat on the status API (the operator prepends its base URL).

    The status API routes ``heartbeat_path("{namespace}", "{name}")``, so both sides use this one.
    """
    return f"/api/v1/namespaces/{namespace}/rltrainingjobs/{name}/heartbeat"


def check_metric_names(value: dict[str, float | None] | None) -> dict[str, float | None] | None:
    """Every name 1-64 characters of letters, digits and ``_ . : / -`` (what the status keeps)."""
    for name in value or {}:
        if len(name) > MAX_METRIC_NAME_LENGTH or not _METRIC_NAME_RE.match(name):
            shown = name[:MAX_METRIC_NAME_LENGTH] + ("…" if len(name) > MAX_METRIC_NAME_LENGTH else "")
            raise ValueError(f"metric name {shown!r} must be 1-{MAX_METRIC_NAME_LENGTH} characters of "
                             "letters, digits and _ . : / -")
    return value


class EvalReport(BaseModel):
    """The latest evaluation (spec.training.evaluation) and the best so far by its headline metric."""

    model_config = ConfigDict(extra="ignore")

    metric: str = Field(..., min_length=1, max_length=MAX_METRIC_NAME_LENGTH, pattern=METRIC_NAME_PATTERN,
                        description="The headline metric (eval/<name>).")
    step: int = Field(..., ge=0, description="Step of the latest evaluation.")
    values: dict[str, float | None] = Field(default_factory=dict, max_length=MAX_HEARTBEAT_METRICS,
                                            description="Its values by metric name (eval/<name>).")
    best_step: int | None = Field(None, ge=0, description="Step of the best evaluation by the headline metric.")
    best_value: float | None = Field(None, description="Its value of the headline metric.")

    @field_validator("values")
    @classmethod
    def _metric_names(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        check_metric_names(value)
        return value

    def wire(self) -> dict[str, Any]:
        body = self.model_dump()
        body["values"] = {k: v for k, v in self.values.items() if v is not None and math.isfinite(v)}
        if body["best_value"] is not None and not math.isfinite(body["best_value"]):
            body["best_value"] = None
        return body


class HeartbeatBody(BaseModel):
    """The JSON body rank 0 posts (``rljob_trainer.heartbeat``) and the status API validates.

    Unknown fields are ignored, so a newer trainer can talk to an older operator.
    """

    model_config = ConfigDict(extra="ignore")

    step: int = Field(..., ge=0, description="Optimizer steps done.")
    reward: float | None = None
    loss: float | None = None
    checkpoint: str | None = Field(None, description="Newest complete checkpoint (remote when on object storage).")
    best_checkpoint: str | None = Field(None, description="Best kept checkpoint by spec.checkpoint.bestMetric.")
    best_metric: float | None = Field(None, description="That checkpoint's value of the metric.")
    pod: str | None = Field(None, description="The sending pod (informational; the token names the pod).")
    final: bool = Field(False, description="The run ended: write status now, not at the next flush.")
    time: float | None = Field(None, description="Sender's clock, seconds since the epoch (informational).")
    warnings: list[str] = Field(default_factory=list, max_length=MAX_HEARTBEAT_WARNINGS,
                                description="Resume fallbacks and tracking servers left out, to report as Warning "
                                            "events (warning_reason).")
    metrics: dict[str, float | None] | None = Field(
        None, max_length=MAX_HEARTBEAT_METRICS,
        description="Other metrics of the logged step by their TRL names (kl, rewards/<name>/mean, ...).")
    evaluation: EvalReport | None = Field(None, description="The latest evaluation and the best so far.")
    health: list[HealthReport] | None = Field(
        None, max_length=MAX_HEALTH_REPORTS,
        description="The health signals that tripped during the run, one per signal (None: a trainer that "
                    "computes none; [] none tripped).")

    @field_validator("health")
    @classmethod
    def _one_report_per_signal(cls, value: list[HealthReport] | None) -> list[HealthReport] | None:
        signals = [r.signal for r in value or []]
        if len(set(signals)) != len(signals):
            raise ValueError("at most one report per signal")
        return value

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, value: dict[str, float | None] | None) -> dict[str, float | None] | None:
        return check_metric_names(value)

    def wire(self) -> dict[str, Any]:
        """The JSON object to send (``warnings``/``metrics`` only when there are any, as older operators expect).

        Non-finite numbers are left out (JSON has no NaN: ``requests`` refuses to send one, so a NaN loss
        would cost the whole heartbeat).
        """
        exclude = set() if self.warnings else {"warnings"}
        body = self.model_dump(exclude=exclude | {"metrics", "evaluation", "health"})
        for key in ("reward", "loss", "best_metric"):
            if body[key] is not None and not math.isfinite(body[key]):
                body[key] = None
        finite = {k: v for k, v in (self.metrics or {}).items() if v is not None and math.isfinite(v)}
        if finite:
            body["metrics"] = finite
        if self.evaluation is not None:
            body["evaluation"] = self.evaluation.wire()
        if self.health is not None:
            body["health"] = [r.model_dump(mode="json") for r in self.health]
        return body


def finite_metrics(logs: dict[str, Any], skip: frozenset[str] = frozenset()) -> dict[str, float]:
    """The finite numbers of a Trainer's ``logs`` whose names a heartbeat may carry (at most the bound, in order;
    each reward function's ``rewards/...`` first, as objectives use them most)."""
    out: dict[str, float] = {}
    for name, value in sorted(logs.items(), key=lambda item: not str(item[0]).startswith("rewards/")):
        if len(out) >= MAX_HEARTBEAT_METRICS:
            break
        if name in skip or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value) and len(name) <= MAX_METRIC_NAME_LENGTH and _METRIC_NAME_RE.match(name):
            out[name] = float(value)
    return out


# ------------------------------------------------------------------------- exit codes
#: Training finished.
EXIT_OK = 0
#: A transient failure before training (no checkpoint storage answered), a crash, a lost peer:
#: the operator restarts the gang (every code not named here is retryable too).
EXIT_RETRYABLE = 1
#: sysexits' EX_CONFIG: bad config, missing data, a reward function that cannot be imported, raises
#: or returns the wrong shape. Retrying cannot help: the operator fails the job.
EXIT_PERMANENT = 78
#: sysexits' EX_TEMPFAIL, only with in-place restarts on: the rank lost a peer (a collective or the
#: store failed because another worker died). Its agent restarts it to meet the replacement; a node
#: whose ranks failed for any other reason ends, and its pod is the one the operator replaces.
EXIT_PEER_LOST = 75
#: A CUDA out-of-memory error: the operator may retry with a smaller per-device batch.
EXIT_CUDA_OOM = 200
#: A process stopped by signal N exits with 128 + N.
EXIT_SIGNAL_BASE = 128
#: Stopped by SIGTERM (a resize, a suspend, a preempted node) after saving a checkpoint: retryable.
EXIT_SIGTERM_CHECKPOINTED = EXIT_SIGNAL_BASE + int(signal.SIGTERM)


def exit_code_for_signal(signum: int) -> int:
    """The exit code of a node or rank that stopped because of signal ``signum`` (143 for SIGTERM)."""
    return EXIT_SIGNAL_BASE + int(signum)


# ------------------------------------------------------------------------- metrics log
#: In the output folder, rank 0 appends one JSON object per logged step: ``{"step": N, <metric>: value, …}``
#: with TRL's log keys (reward, loss, rewards/<name>/mean, …). ``rljob experiment`` reads trial curves
#: from it while trials run. A resumed run logs its steps again; readers keep the last line of a step.
METRICS_LOG = "metrics.jsonl"
