"""Experiment tracking (``spec.training.tracking``): MLflow and W&B through transformers' own callbacks.

``report_to`` names them, so TRL's trainer adds transformers' ``MLflowCallback`` and ``WandbCallback``,
configured by their own environment variables (:func:`tracking_env`: ``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_TAGS``, ``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_DIR`` …). They log
TRL's arguments and every logged metric (``eval/*`` too). :func:`install` swaps each for a guarded
subclass that adds what they lack — the job's spec as flattened ``spec.training.*`` parameters, rljob,
TRL, transformers and torch versions and the image as tags — and that never lets a tracking server
fail training: a server that does not answer is tried :data:`PROBE_ATTEMPTS` times with backoff, then
left out with a warning (the log, ``summary.json``'s ``tracking.warnings`` and, in a pod, the heartbeat's
warnings, which the operator turns into a ``TrackingUnavailable`` Warning Event on the job); an error
of the integration later does the same. After the summary is written, :meth:`RunTracking.finish` adds
the summary and reward curve as artifacts and the best checkpoint's location as a tag (never the
weights), then ends the run.

An experiment's trials are child runs of its parent run (:func:`parent_run`). ``rljob experiment`` writes the
leaderboard and winner on it (:func:`record_experiment`); for an RLExperiment on a cluster, whose verdict the
operator puts in its status without holding tracking credentials, ``python -m rljob_trainer.tracking record``
(:func:`main`) writes that status on the same run.

Credentials (``MLFLOW_TRACKING_TOKEN``, ``WANDB_API_KEY``) are never in the spec: they come from the
environment, which a runtime fills from a Secret.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rljob_contract.experiment import DNS_LABEL, RLExperimentStatus
from rljob_contract.pod import (
    IMAGE_ENV,
    TRACKING_PARENT_RUN_ENV,
    TRACKING_WARNING_PREFIX,
    format_validation_error,
    validate_document,
)
from rljob_contract.spec import TrainerConfig

log = logging.getLogger("rljob.tracking")

#: Tries of an unreachable tracking server before the run goes on without it, and the first wait between them.
PROBE_ATTEMPTS = 3
PROBE_BACKOFF_SECONDS = 2.0
#: MLflow's own HTTP retries and timeout per request, bounded so a server that goes down mid-run costs seconds
#: (MLflow's defaults retry for minutes); a user's own setting wins.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
#: Files of the output folder logged as artifacts when the run ends (never checkpoints or weights).
ARTIFACTS = ("summary.json", "reward_curve.png")
#: MLflow's longest parameter value; a longer value of the spec is cut (the full spec is in the artifacts).
MAX_PARAM_CHARS = 6000


def report_to(cfg: TrainerConfig) -> list[str]:
    """transformers' ``report_to``: TensorBoard always, then what ``spec.training.tracking`` sets."""
    tracking = cfg.training.tracking
    return ["tensorboard", *(tracking.integrations() if tracking is not None else [])]


def untracked_env(cfg: TrainerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """What the launcher sets before anything imports TRL when the run has no MLflow in
    ``spec.training.tracking``: ``DISABLE_MLFLOW_INTEGRATION``, so transformers' and TRL's imports skip
    MLflow (TRL's profiling imports it whenever it is installed: 0.6 s of one core in every process
    that imports TRL, the fork server and each spawned rank). A value the environment already has wins."""
    tracking = cfg.training.tracking
    if (tracking is not None and tracking.mlflow is not None) or "DISABLE_MLFLOW_INTEGRATION" in environ:
        return {}
    return {"DISABLE_MLFLOW_INTEGRATION": "TRUE"}


def tracking_env(cfg: TrainerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment transformers' callbacks read, from the spec (and a parent run an experiment set)."""
    tracking = cfg.training.tracking
    out: dict[str, str] = {}
    if tracking is None:
        return out
    if tracking.mlflow is not None:
        if tracking.mlflow.tracking_uri:
            out["MLFLOW_TRACKING_URI"] = tracking.mlflow.tracking_uri
        out["MLFLOW_EXPERIMENT_NAME"] = tracking.mlflow.experiment or cfg.job_name
        # mlflow.runName names the run after the job (MLflow would pick a random name).
        tags = {"mlflow.runName": cfg.job_name, "rljob.job": cfg.job_name, "rljob.algorithm": str(cfg.training.algorithm)}
        if cfg.namespace:
            tags["rljob.namespace"] = cfg.namespace
        if cfg.experiment:
            tags["rljob.experiment"] = experiment_key(cfg.experiment, cfg.namespace)
        out["MLFLOW_TAGS"] = json.dumps(tags)
        out["MLFLOW_FLATTEN_PARAMS"] = "true"
        out.update({k: v for k, v in MLFLOW_HTTP_DEFAULTS.items() if k not in environ})
    if tracking.wandb is not None:
        out.update({"WANDB_PROJECT": tracking.wandb.project, "WANDB_MODE": str(tracking.wandb.mode),
                    "WANDB_DIR": str(Path(cfg.output_dir).resolve()), "WANDB_SILENT": "true"})
        if tracking.wandb.entity:
            out["WANDB_ENTITY"] = tracking.wandb.entity
        out["WANDB_NAME"] = cfg.job_name
        if cfg.experiment:  # an experiment's trials are one W&B group
            out["WANDB_RUN_GROUP"] = experiment_key(cfg.experiment, cfg.namespace)
    return out


def flat_spec(cfg: TrainerConfig) -> dict[str, str]:
    """``spec.training`` as flat parameters (``spec.training.rewards.0.name``), values as strings."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
            if not value:
                out[prefix] = "{}"
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(f"{prefix}.{i}", item)
            if not value:
                out[prefix] = "[]"
        elif value is not None:
            out[prefix] = str(value)[:MAX_PARAM_CHARS]

    walk("spec.training", cfg.training.model_dump(mode="json", by_alias=True, exclude_none=True))
    return out


def versions() -> dict[str, str]:
    """rljob's, TRL's, transformers', torch's versions and the image (``RLJOB_IMAGE``, where the operator set it)."""
    import torch
    import transformers
    import trl

    import rljob_trainer

    out = {"rljob.version": rljob_trainer.__version__, "rljob.trl_version": trl.__version__,
           "rljob.transformers_version": transformers.__version__, "rljob.torch_version": torch.__version__}
    if os.environ.get(IMAGE_ENV):
        out["rljob.image"] = os.environ[IMAGE_ENV]
    return out


def probe(uri: str | None, attempts: int = PROBE_ATTEMPTS, backoff: float = PROBE_BACKOFF_SECONDS) -> str | None:
    """None when the MLflow server at ``uri`` answers (any HTTP answer below 500), else why not, after
    ``attempts`` tries with exponential backoff. A non-HTTP URI (a file store) is not probed."""
    import requests

    if not uri or not uri.startswith(("http://", "https://")):
        return None
    why = ""
    for attempt in range(attempts):
        try:
            answer = requests.get(uri.rstrip("/") + "/health", timeout=5)
            if answer.status_code < 500:
                return None
            why = f"HTTP {answer.status_code}"
        except requests.RequestException as e:
            why = type(e).__name__ + (f": {e.args[0]}" if e.args else "")
        if attempt + 1 < attempts:
            log.warning("tracking: MLflow at %s does not answer (%s); trying again", uri, why)
            time.sleep(backoff * 2 ** attempt)
    return f"MLflow at {uri} did not answer {attempts} tries ({why[:200]})"


def experiment_key(name: str, namespace: str | None) -> str:
    """How a tracked run names its RLExperiment (tag ``rljob.experiment``): ``namespace/name`` on a cluster."""
    return f"{namespace}/{name}" if namespace else name


def parent_run(experiment: str, key: str) -> str:
    """The run id of RLExperiment ``key``'s parent run in MLflow experiment ``experiment``, created if missing.

    Trials started together may each find none and create one: every creator then looks again and all
    take the oldest (by start time, then id), and a creator whose run lost deletes it, so the trials of one
    experiment converge on one parent without talking to each other."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        try:
            experiment_id = client.create_experiment(experiment)
        except MlflowException:  # created by another trial meanwhile
            experiment_id = client.get_experiment_by_name(experiment).experiment_id
    else:
        experiment_id = found.experiment_id
    query = f"tags.`rljob.experiment` = '{key}' and tags.`rljob.role` = 'experiment'"

    def oldest() -> Any:
        runs = client.search_runs([experiment_id], filter_string=query, max_results=50)
        return min(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id), default=None)

    chosen = oldest()
    if chosen is not None:
        return str(chosen.info.run_id)
    mine = client.create_run(experiment_id, run_name=key.rsplit("/", 1)[-1],
                             tags={"rljob.experiment": key, "rljob.role": "experiment"}).info.run_id
    chosen = oldest()
    if chosen is not None and chosen.info.run_id != mine:
        client.delete_run(mine)
        return str(chosen.info.run_id)
    return str(mine)


class RunTracking:
    """Rank 0's tracking of one run: the guarded callbacks' shared state, warnings and the end of the run."""

    def __init__(self, cfg: TrainerConfig, heartbeat: Any = None) -> None:
        self.cfg = cfg
        self.heartbeat = heartbeat
        self.warnings: list[str] = []
        self.ids: dict[str, str] = {}
        self.active: dict[str, bool] = {}

    def warn(self, integration: str, what: str) -> None:
        """Leave ``integration`` out for the rest of the run, and tell the log, the summary and the operator."""
        self.active[integration] = False
        message = f"{TRACKING_WARNING_PREFIX}{integration}: {what}; training goes on without it"
        log.warning("%s", message)
        self.warnings.append(message)
        if self.heartbeat is not None:
            self.heartbeat.warnings.append(message[:1000])

    def guard(self, integration: str, action: Callable[[], Any]) -> Any:
        """Run ``action`` of ``integration`` unless it was left out; an error leaves it out (never raises)."""
        if not self.active.get(integration, True):
            return None
        try:
            return action()
        except Exception as e:  # a tracking server never fails training
            self.warn(integration, f"{type(e).__name__}: {str(e)[:300]}")
            return None

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        """An evaluation's ``eval/*`` values (rljob's evaluation reports them itself, not through the Trainer's log)."""
        if self.active.get("mlflow"):
            self.guard("mlflow", lambda: _mlflow_metrics(values, step))
        if self.active.get("wandb"):
            self.guard("wandb", lambda: _wandb_metrics(values, step))

    def finish(self, summary: dict[str, Any], stopped: bool = False) -> dict[str, Any]:
        """Artifacts, the best checkpoint's location, then end each run (KILLED when ``stopped`` by a signal after
        its checkpoint); summary.json's ``tracking`` part."""
        best = (summary.get("best_checkpoint") or summary.get("latest_checkpoint") or {}).get("location")
        output = Path(self.cfg.output_dir)
        files = [output / name for name in ARTIFACTS if (output / name).is_file()]
        if self.active.get("mlflow"):
            self.guard("mlflow", lambda: _finish_mlflow(files, best, "KILLED" if stopped else "FINISHED"))
        if self.active.get("wandb"):
            self.guard("wandb", lambda: _finish_wandb(files, best))
        return {"runs": dict(self.ids), "warnings": list(self.warnings)}

    def fail(self) -> None:
        """End the runs as failed: training raised (else MLflow's exit hook would end the run FINISHED)."""
        if self.active.get("mlflow"):
            self.guard("mlflow", lambda: __import__("mlflow").end_run("FAILED"))
        if self.active.get("wandb"):
            self.guard("wandb", lambda: __import__("wandb").finish(exit_code=1))


def _mlflow_metrics(values: dict[str, float], step: int) -> None:
    import mlflow

    mlflow.log_metrics(values, step=step, synchronous=False)


def _wandb_metrics(values: dict[str, float], step: int) -> None:
    import wandb

    if wandb.run is not None:
        wandb.log({**values, "train/global_step": step})


def _finish_mlflow(files: list[Path], best: str | None, status: str) -> None:
    import mlflow

    for path in files:
        mlflow.log_artifact(str(path))
    if best:
        mlflow.set_tag("rljob.best_checkpoint", best)
    mlflow.end_run(status)


def _finish_wandb(files: list[Path], best: str | None) -> None:
    import wandb

    if wandb.run is None:
        return
    for path in files:
        wandb.save(str(path), base_path=str(path.parent), policy="now")
    if best:
        wandb.run.summary["rljob.best_checkpoint"] = best
    wandb.finish()


def guarded_mlflow(tracking: RunTracking) -> Any:
    """transformers' ``MLflowCallback``, probed first, guarded, with the spec and versions, not ending the run."""
    from transformers.integrations import MLflowCallback

    class GuardedMLflow(MLflowCallback):  # type: ignore[misc]
        def setup(self, args: Any, state: Any, model: Any) -> None:
            if not state.is_world_process_zero:
                self._initialized = True
                return
            self._initialized = True  # once: a failed setup is not tried again at every log
            why = probe(os.environ.get("MLFLOW_TRACKING_URI"))
            if why is not None:
                tracking.warn("mlflow", why)
                return
            tracking.guard("mlflow", lambda: self._start(args, state, model))

        def _start(self, args: Any, state: Any, model: Any) -> None:
            super().setup(args, state, model)
            cfg = tracking.cfg
            if cfg.experiment:  # a trial: a child run of its experiment's run
                experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.job_name
                parent = os.environ.get(TRACKING_PARENT_RUN_ENV) or parent_run(
                    experiment, experiment_key(cfg.experiment, cfg.namespace))
                self._ml_flow.set_tag("mlflow.parentRunId", parent)
            params = flat_spec(cfg)
            items = list(params.items())
            for i in range(0, len(items), self._MAX_PARAMS_TAGS_PER_BATCH):
                self._ml_flow.log_params(dict(items[i:i + self._MAX_PARAMS_TAGS_PER_BATCH]))
            self._ml_flow.set_tags(versions())
            tracking.ids["mlflow_run_id"] = self._ml_flow.active_run().info.run_id
            tracking.active["mlflow"] = True

        def on_log(self, *a: Any, **kw: Any) -> None:
            if tracking.active.get("mlflow"):
                tracking.guard("mlflow", lambda: super(GuardedMLflow, self).on_log(*a, **kw))

        def on_save(self, *a: Any, **kw: Any) -> None:
            if tracking.active.get("mlflow"):
                tracking.guard("mlflow", lambda: super(GuardedMLflow, self).on_save(*a, **kw))

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            """The run stays open for :meth:`RunTracking.finish` (the summary is written after training)."""

        def __del__(self) -> None:
            """Ended by :meth:`RunTracking.finish`, or by MLflow's own exit hook."""

    return GuardedMLflow()


def guarded_wandb(tracking: RunTracking) -> Any:
    """transformers' ``WandbCallback``, guarded, with the spec and versions in the run's config."""
    from transformers.integrations import WandbCallback

    class GuardedWandb(WandbCallback):  # type: ignore[misc]
        def setup(self, args: Any, state: Any, model: Any, **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                self._initialized = True
                return
            self._initialized = True
            tracking.guard("wandb", lambda: self._start(args, state, model, **kwargs))

        def _start(self, args: Any, state: Any, model: Any, **kwargs: Any) -> None:
            super().setup(args, state, model, **kwargs)
            if self._wandb.run is not None:
                self._wandb.config.update({**flat_spec(tracking.cfg), **versions()}, allow_val_change=True)
                tracking.ids["wandb_run_id"] = self._wandb.run.id
                tracking.active["wandb"] = True

        def on_log(self, *a: Any, **kw: Any) -> None:
            if tracking.active.get("wandb"):
                tracking.guard("wandb", lambda: super(GuardedWandb, self).on_log(*a, **kw))

        def on_save(self, *a: Any, **kw: Any) -> None:
            if tracking.active.get("wandb"):
                tracking.guard("wandb", lambda: super(GuardedWandb, self).on_save(*a, **kw))

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            if tracking.active.get("wandb"):
                tracking.guard("wandb", lambda: super(GuardedWandb, self).on_train_end(*a, **kw))

    return GuardedWandb()


def install(trainer: Any, tracking: RunTracking) -> None:
    """Put the guarded callbacks where ``report_to`` put transformers' own (before rljob's callbacks, so a run
    is started before the evaluation at step 0 reports)."""
    from transformers.integrations import MLflowCallback, WandbCallback

    guarded = {MLflowCallback: lambda: guarded_mlflow(tracking), WandbCallback: lambda: guarded_wandb(tracking)}
    callbacks = trainer.callback_handler.callbacks
    for i, callback in enumerate(callbacks):
        make = guarded.get(type(callback))
        if make is not None:
            callbacks[i] = make()


# ------------------------------------------------------------------------- experiments (rljob experiment)


def start_experiment_run(tracking: Any, name: str, namespace: str | None) -> tuple[str | None, str | None]:
    """(the parent run of RLExperiment ``name`` for its trials, None and why when MLflow is not tracked or does
    not answer). ``tracking``: the template's ``spec.training.tracking``; its server is probed as a trial's is."""
    if tracking is None or tracking.mlflow is None:
        return None, None
    if tracking.mlflow.tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking.mlflow.tracking_uri
    for key, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    why = probe(os.environ.get("MLFLOW_TRACKING_URI"))
    if why is not None:
        return None, f"{TRACKING_WARNING_PREFIX}mlflow: {why}; the experiment's trials are not grouped under a run"
    try:
        return parent_run(tracking.mlflow.experiment or name, experiment_key(name, namespace)), None
    except Exception as e:
        return None, f"{TRACKING_WARNING_PREFIX}mlflow: {type(e).__name__}: {str(e)[:300]}"


def record_experiment(run_id: str, status: dict[str, Any], files: list[Path]) -> str | None:
    """The leaderboard, winner and best trial on the experiment's parent run, then end it; None, or why not."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient()
        client.log_dict(run_id, {"leaderboard": status.get("leaderboard") or [], "winner": status.get("winner"),
                                 "best": status.get("best")}, "leaderboard.json")
        for path in files:
            if path.is_file():
                client.log_artifact(run_id, str(path))
        winner, best = status.get("winner") or {}, status.get("best") or {}
        tags = {"rljob.phase": str(status.get("phase")), "rljob.winner": winner.get("arm"),
                "rljob.winner_message": winner.get("message"), "rljob.best_trial": best.get("trial"),
                "rljob.best_checkpoint": best.get("checkpoint")}
        for key, value in tags.items():
            if value:
                client.set_tag(run_id, key, str(value)[:5000])
        if isinstance(best.get("objective"), int | float):
            client.log_metric(run_id, "best_objective", float(best["objective"]))
        client.set_terminated(run_id, "FINISHED" if status.get("phase") == "Succeeded" else "FAILED")
    except Exception as e:
        return f"{TRACKING_WARNING_PREFIX}mlflow: the leaderboard was not recorded: {type(e).__name__}: {str(e)[:300]}"
    return None


# ------------------------------------------------------------------ experiments on a cluster (the operator's verdict)

#: Largest status document ``record`` reads (an RLExperiment's status is bounded far below this).
MAX_STATUS_BYTES = 4 * 1024 * 1024
#: Phases in which an experiment has concluded: its leaderboard and winner are final.
CONCLUDED_PHASES = ("Succeeded", "Failed")


class VerdictError(ValueError):
    """A status document ``record`` refuses: it names the argument or field and writes nothing."""


def read_verdict(text: str) -> dict[str, Any]:
    """An RLExperiment's concluded status (as the operator writes it, camelCase), read strictly by the contract's
    model; the plain JSON form :func:`record_experiment` takes. A status still running is refused: its winner is
    not known yet."""
    if len(text.encode()) > MAX_STATUS_BYTES:
        raise VerdictError(f"status: larger than {MAX_STATUS_BYTES} bytes")
    try:
        document = json.loads(text)
    except ValueError as e:
        raise VerdictError(f"status: not JSON ({e})") from e
    document = document.get("status", document) if isinstance(document, dict) else document  # the whole object too
    if not isinstance(document, dict):
        raise VerdictError("status: not an object")
    try:
        status = validate_document(RLExperimentStatus, document)
    except ValidationError as e:
        raise VerdictError("; ".join(format_validation_error(e, "status"))) from e
    if str(status.phase) not in CONCLUDED_PHASES:
        raise VerdictError(f"status.phase: {status.phase} is not concluded (Succeeded or Failed): no winner yet")
    return status.model_dump(mode="json", exclude_none=True)


def record_concluded(name: str, namespace: str | None, mlflow_experiment: str | None, verdict: dict[str, Any]) -> str:
    """Write concluded RLExperiment ``namespace/name``'s verdict on its parent run; the run id written.

    The run is found (or created) by the experiment's own key, as its trials find it, never named by the
    status document: a document built by hand can only fill in this experiment's run. Writing it again is
    harmless (same tags, the leaderboard artifact replaced)."""
    for what, value in (("--name", name), ("--namespace", namespace)):
        if value is not None and not re.fullmatch(DNS_LABEL, value):
            raise VerdictError(f"{what}: {value!r} is not a Kubernetes name (a DNS label)")
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        raise VerdictError("MLFLOW_TRACKING_URI: not set (the experiment's tracking server)")
    for key, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    run_id = parent_run(mlflow_experiment or name, experiment_key(name, namespace))
    warning = record_experiment(run_id, verdict, [])
    if warning is not None:
        raise RuntimeError(warning)
    return run_id


def main(argv: list[str] | None = None) -> int:
    """``python -m rljob_trainer.tracking record --name N --namespace NS --status FILE``: a concluded experiment's
    leaderboard and winner (its status, ``-`` for stdin) on its MLflow parent run. Exit 0 written, 2 refused, 1 the
    server failed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m rljob_trainer.tracking", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="an RLExperiment's verdict on its parent run")
    record.add_argument("--name", required=True, help="the RLExperiment")
    record.add_argument("--namespace", help="its namespace (the trials' tag rljob.experiment is namespace/name)")
    record.add_argument("--mlflow-experiment", help="the template's tracking.mlflow.experiment (default: --name)")
    record.add_argument("--status", required=True, help="its status as JSON (kubectl get -o json), - for stdin")
    args = parser.parse_args(argv)
    try:
        if args.status == "-":
            text = sys.stdin.read(MAX_STATUS_BYTES + 1)
        else:
            with open(args.status, encoding="utf-8") as f:
                text = f.read(MAX_STATUS_BYTES + 1)
        run_id = record_concluded(args.name, args.namespace, args.mlflow_experiment, read_verdict(text))
    except (VerdictError, OSError, UnicodeDecodeError) as e:
        print(f"rljob: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        print(f"rljob: {type(e).__name__}: {str(e)[:500]}", file=sys.stderr)
        return 1
    print(f"recorded the verdict of {experiment_key(args.name, args.namespace)} on MLflow run {run_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
