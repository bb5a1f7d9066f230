"""One rank of a training run: build model, data and rewards from the config, train with TRL.

Started by the launcher (``rljob_trainer.launch``) under torchrun's elastic agent, as
``python -m rljob_trainer.worker CONFIG``. Exit codes are described in ``rljob_trainer.errors``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from rljob_contract.pod import (
    ERROR_DIR_ENV,
    ERROR_FILE_ENV,
    EXIT_CUDA_OOM,
    EXIT_PEER_LOST,
    EXIT_PERMANENT,
    IN_PLACE_RESTARTS_ENV,
    METRICS_LOG,
    METRICS_PORT_ENV,
    MODEL_PATH_ENV,
    PARENT_PID_ENV,
    PROGRESS_ENV,
    exit_code_for_signal,
    validate_document,
)
from rljob_contract.spec import TRL_DEFAULTS, TrainerConfig, generation_window
from rljob_contract.trl_rules import MANAGED_TRL_FIELDS

from rljob_trainer.algorithms import builder
from rljob_trainer.errors import PermanentError, is_cuda_oom, is_peer_loss, report_fatal
from rljob_trainer.known_warnings import silence_known_warnings
from rljob_trainer.tracking import RunTracking, report_to, tracking_env

log = logging.getLogger("rljob.worker")


def check_trl_fields(config_cls: Any, trl: dict[str, Any]) -> None:
    """Unknown keys under ``spec.training.trl`` are errors naming the key and the TRL class."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    for key in trl:
        if key not in known:
            raise PermanentError(f"spec.training.trl.{key}", f"not a field of TRL's {config_cls.__name__}")


def trl_arguments(cfg: TrainerConfig, checkpoint_dir: str, use_cpu: bool) -> dict[str, Any]:
    """The TRL config fields rljob sets from the named spec fields."""
    t = cfg.training
    return {
        "output_dir": checkpoint_dir,
        "per_device_train_batch_size": t.batch_size,
        "max_steps": t.max_steps,
        "learning_rate": t.learning_rate,
        "num_generations": t.num_generations,
        "max_completion_length": t.max_completion_length,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "seed": t.seed,
        "data_seed": t.seed,
        "bf16": t.precision == "bf16",
        "fp16": t.precision == "fp16",
        "use_cpu": use_cpu,
        "dataloader_num_workers": t.dataloader_workers,
        "beta": t.beta,
        # transformers 5 renamed it; setting the new name too keeps the old one from warning.
        "activation_checkpointing": t.gradient_checkpointing,
        "gradient_checkpointing": t.gradient_checkpointing,
        "generation_batch_size": t.generation_batch_size,  # None: TRL's default (one step's worth)
        "steps_per_generation": t.steps_per_generation,
        "save_strategy": "steps",
        "save_steps": cfg.checkpoint.every_steps,
        "save_total_limit": None,  # rljob's retention, which knows complete from partial
        "logging_steps": t.logging_steps,
        "report_to": report_to(cfg),  # spec.training.tracking's integrations besides TensorBoard
        "reward_weights": [r.weight for r in t.rewards],
        "log_level": "warning",
        "disable_tqdm": os.environ.get(PROGRESS_ENV, "1") == "0",
        # Other ranks wait at the end for rank 0's final uploads (finish_together).
        "ddp_timeout": max(1800, cfg.checkpoint.upload_timeout_seconds + 600),
    }


def build_trl_config(cfg: TrainerConfig, config_cls: Any, checkpoint_dir: str, use_cpu: bool) -> Any:
    check_trl_fields(config_cls, cfg.training.trl)
    kwargs = trl_arguments(cfg, checkpoint_dir, use_cpu)
    # The models refuse MANAGED_TRL_FIELDS under trl; a field set here but not listed there could be
    # silently overridden by the user's trl below.
    unlisted = sorted(set(kwargs) - MANAGED_TRL_FIELDS.keys() - TRL_DEFAULTS)
    if unlisted:
        raise RuntimeError(f"trl_arguments sets {unlisted}: add them to rljob_contract.trl_rules.MANAGED_TRL_FIELDS")
    # The algorithm's TRL fields (its strategy's): the models refuse them under trl next to the strategy.
    kwargs.update(builder(cfg.training.algorithm).arguments(cfg.training))
    kwargs.update(cfg.training.trl)
    try:
        return config_cls(**kwargs)
    except (TypeError, ValueError) as e:
        where = "spec.training.trl" if cfg.training.trl else "spec.training"
        raise PermanentError(where, f"TRL rejected the config: {e}") from e


def resolve_model(cfg: TrainerConfig) -> str:
    path = os.environ.get(MODEL_PATH_ENV)
    if path:
        return path
    return cfg.training.model


class StopRequest:
    """SIGTERM or SIGINT asks the run to stop after saving a checkpoint (a resize, a suspend, a
    preempted node, Ctrl-C). The handler only records the signal; ``StopOnSignal`` acts on it.

    Installed when training begins (``StopOnSignal.on_train_begin``), not before: until a step can end
    there is nothing to checkpoint, and a rank that only recorded the signal could wait for as long as
    its agent's shutdown timeout. A rank restarted in place to meet a peer that was in fact stopped (a
    suspend that reached the other pod first) blocks in ``init_process_group`` for peers that will never
    come; the signal its own pod then gets must end it at once (the signal's default action), not at
    the agent's SIGKILL 110 s later, past the pod's grace period."""

    def __init__(self) -> None:
        self.signum = 0
        self.waiting = False  # set while a stop waits for the generation window's end
        # The signal this rank itself received, if any. A stop agreed while it is 0 came from another
        # worker's ranks (a pod deleted alone): with in-place restarts this rank then exits "lost a peer",
        # so its agent restarts it to meet the replacement, instead of the pod ending as a second failure.
        self.own = 0

    def install(self) -> None:
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if not self.signum:
            log.warning("signal %d: saving a checkpoint at the end of this step, then stopping", signum)
        self.signum = signum
        self.own = signum


STOP = StopRequest()


def in_place_restarts_on() -> bool:
    """Whether this worker's agent restarts its ranks to meet a replaced peer (``RLJOB_IN_PLACE_RESTARTS``)."""
    return os.environ.get(IN_PLACE_RESTARTS_ENV, "0") not in ("", "0")


def stop_on_signal_callback(request: StopRequest) -> Any:
    """At every step end the ranks agree (max over the group) whether any was signalled; if so, every
    rank saves the checkpoint of this step and training stops. Agreeing keeps the ranks in lockstep:
    a rank that stopped alone would leave the others blocked in a collective.

    With more than one optimizer step per generation (stepsPerGeneration, num_iterations) the stop
    waits for the generation window's last step: a checkpoint inside a window would not resume exactly
    (TRL generates afresh after a resume), and the window's remaining steps reuse the completions it
    already generated, so they are the cheap ones (issue #48)."""
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            request.install()  # from here a signal waits for the end of a step, which checkpoints it

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            signum = request.signum
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
                flag = torch.tensor([signum], dtype=torch.int64, device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                signum = int(flag.item())
            if not signum:
                return
            window = generation_window(getattr(args, "steps_per_generation", None) or 1,
                                       getattr(args, "num_iterations", None) or 1,
                                       args.gradient_accumulation_steps)
            step = state.global_step
            if step % window and step < state.max_steps:
                if not request.waiting:
                    log.warning("signal %d at step %d: finishing the generation window (%d more steps), so the "
                                "checkpoint resumes exactly", signum, step, window - step % window)
                    request.waiting = True
                request.signum = signum
                return
            request.signum = signum
            control.should_save = True
            control.should_training_stop = True

    return StopOnSignal()


@dataclasses.dataclass
class Inputs:
    """What the trainer is built from: the TRL config, reward functions, prompts, model and tokenizer."""

    args: Any
    reward_funcs: list[Any]
    dataset: Any
    model_path: str
    tokenizer: Any
    peft_config: Any = None
    eval_dataset: Any = None  # spec.training.evaluation's prompts (None: no evaluation)


def prepare_inputs(cfg: TrainerConfig, config_cls: Any, checkpoint_dir: str, use_cpu: bool) -> Inputs:
    """Build the TRL config, the rewards, the prompt dataset and the tokenizer (errors name the spec field)."""
    from transformers import AutoTokenizer

    from rljob_trainer.data import training_and_eval_prompts
    from rljob_trainer.rewards import resolve_rewards

    # transformers 5 reads the TensorBoard folder from the environment only.
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(cfg.output_dir, "tensorboard"))
    # transformers' MLflow and W&B callbacks read their settings from the environment too.
    os.environ.update(tracking_env(cfg, os.environ))
    args = build_trl_config(cfg, config_cls, checkpoint_dir, use_cpu)
    reward_funcs, _ = resolve_rewards(cfg.training.rewards)
    prompts, eval_dataset = training_and_eval_prompts(cfg.training, os.path.join(cfg.output_dir, ".cache"))
    dataset = builder(cfg.training.algorithm).dataset(prompts, cfg.training)
    model_path = resolve_model(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except Exception as e:
        raise PermanentError("spec.training.model", f"cannot load tokenizer from {model_path!r}: {e}") from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Inputs(args, reward_funcs, dataset, model_path, tokenizer, peft_config(cfg), eval_dataset)


def peft_config(cfg: TrainerConfig) -> Any:
    """PEFT's ``LoraConfig`` for ``spec.training.lora`` (None: full fine-tuning)."""
    if cfg.training.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(**cfg.training.lora.peft_kwargs())


def start_reporting(cfg: TrainerConfig, rank: int) -> tuple[Any, Any]:
    """(metrics, heartbeat) on rank 0 — Prometheus served on ``RLJOB_METRICS_PORT``, its bound port
    written to ``<output>/metrics-port`` — and (None, None) on the other ranks."""
    from rljob_trainer.heartbeat import Heartbeat
    from rljob_trainer.telemetry import TrainerMetrics

    if rank != 0:
        return None, None
    metrics = TrainerMetrics()
    bound = metrics.serve(int(os.environ.get(METRICS_PORT_ENV, "9400")))
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.output_dir) / "metrics-port").write_text(str(bound))
    return metrics, Heartbeat.from_env()


def checkpoint_callback(publisher: Any) -> Any:
    """A TrainerCallback handing each saved checkpoint to rank 0's publisher once every rank has saved
    (the publisher seals it, copies it where the plan says, and applies retention)."""
    import torch.distributed as dist
    from transformers import TrainerCallback

    class PublishCheckpoint(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            ckpt_dir = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if dist.is_available() and dist.is_initialized():
                gather_rank_files(ckpt_dir, args.process_index, dist)  # a collective: every rank has saved
            if not state.is_world_process_zero or publisher is None:
                return
            recent = [h for h in state.log_history if "reward" in h]
            metrics_now = {"reward": float(recent[-1]["reward"])} if recent else {}
            metrics_now.update(latest_eval(state.log_history))  # eval/<metric>: keepBest may rank by one
            publisher.save(Path(args.output_dir) / f"checkpoint-{state.global_step}", state.global_step, metrics_now)

    return PublishCheckpoint()


def latest_eval(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The latest evaluation's values (``eval/<metric>``), empty when none ran."""
    from rljob_trainer.evaluation import eval_history

    history = eval_history(log_history)
    return {k: float(v) for k, v in history[-1].items() if k.startswith("eval/")} if history else {}


def evaluation_callbacks(cfg: TrainerConfig, inputs: Inputs, metrics: Any, heartbeat: Any,
                         metrics_log: Path | None, tracking: RunTracking | None = None) -> tuple[list[Any], str | None]:
    """([the evaluation callback], its headline metric), or ([], None) without spec.training.evaluation."""
    evaluation = cfg.training.evaluation
    if evaluation is None or inputs.eval_dataset is None:
        return [], None
    from rljob_trainer.evaluation import EvalReporter, EvalSet, Scorer, evaluation_callback

    scorer = Scorer(evaluation, cfg.training.rewards)
    reporter = None
    if metrics_log is not None:  # rank 0
        reporter = EvalReporter(metrics, heartbeat, metrics_log, os.environ.get("TENSORBOARD_LOGGING_DIR"),
                                scorer.headline, tracking.log_eval if tracking is not None else None)
    callback = evaluation_callback(evaluation, EvalSet.from_dataset(inputs.eval_dataset), scorer, inputs.tokenizer,
                                   cfg.training.max_completion_length, cfg.training.seed, reporter)
    return [callback], scorer.headline


def gather_rank_files(ckpt_dir: Path, rank: int, dist: Any) -> None:
    """Bring every rank's own files of a checkpoint into rank 0's copy of it (the one it publishes).

    The HF Trainer saves each rank's RNG states (``rng_state_<rank>.pth``) into the checkpoint folder
    of that rank's own file system; on worker pods that is a different emptyDir per pod, so without
    this a checkpoint on object storage held rank 0's alone and the other ranks resumed with fresh
    RNGs: a resumed multi-pod job then sampled other completions than an uninterrupted one."""
    name = f"rng_state_{rank}.pth"
    own = ckpt_dir / name
    sent = (name, own.read_bytes()) if own.is_file() else None
    received: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
    dist.gather_object(sent, received if rank == 0 else None, dst=0)
    for item in received:
        if item is not None and not (ckpt_dir / item[0]).exists():
            tmp = ckpt_dir / f".{item[0]}.tmp"
            tmp.write_bytes(item[1])
            tmp.replace(ckpt_dir / item[0])
    # On a pod of its own, a rank's folder holds only what it sent: nothing would ever delete it. (In a
    # folder the ranks share it holds the whole checkpoint, which rank 0's retention looks after.)
    if rank != 0 and sent is not None and [p.name for p in ckpt_dir.iterdir()] == [name]:
        own.unlink()
        ckpt_dir.rmdir()


def build_trainer(cfg: TrainerConfig, trainer_cls: Any, inputs: Inputs, callbacks: list[Any],
                  tracking: RunTracking | None = None) -> Any:
    """The TRL trainer, with rljob's callbacks, the guarded tracking callbacks and a compact progress bar
    instead of per-step dicts."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from rljob_trainer.telemetry import compact_progress_callback
    from rljob_trainer.tracking import install

    try:
        trainer = builder(cfg.training.algorithm).build(
            trainer_cls,
            model=inputs.model_path,
            reward_funcs=inputs.reward_funcs,
            args=inputs.args,
            train_dataset=inputs.dataset,
            processing_class=inputs.tokenizer,
            callbacks=callbacks,
            peft_config=inputs.peft_config,
        )
    except (OSError, ValueError) as e:
        raise PermanentError("spec.training", f"cannot build the {cfg.training.algorithm} trainer: {e}") from e
    # Keep the progress bar, drop the per-step dict printing (metrics go to Prometheus/TensorBoard).
    trainer.remove_callback(PrinterCallback)
    if not inputs.args.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(compact_progress_callback())
    if tracking is not None:
        install(trainer, tracking)
    return trainer


def write_run_summary(
    cfg: TrainerConfig, trainer: Any, publisher: Any, resume: Path | None, started: float, heartbeat: Any,
    eval_metric: str | None = None, health: list[Any] | None = None, tracking: RunTracking | None = None,
) -> dict[str, Any]:
    """Rank 0's end of run: wait (bounded) for the last uploads, write summary.json, end the tracked runs,
    leave the run record beside the checkpoints, send the final heartbeat."""
    from rljob_trainer.checkpoints.manifest import atomic_write_text
    from rljob_trainer.telemetry import write_summary

    publisher.close(cfg.checkpoint.upload_timeout_seconds)  # an unfinished upload has no manifest: ignored
    checkpoint_fields = publisher.summary_fields()
    summary = write_summary(
        cfg.output_dir,
        steps=trainer.state.global_step,
        log_history=trainer.state.log_history,
        checkpoints=checkpoint_fields.pop("checkpoints"),
        resumed_from=resume.name if resume is not None else None,
        wall_seconds=time.time() - started,
        health=health,
    )
    summary.update(checkpoint_fields)  # latest/best checkpoint, upload failures
    if eval_metric is not None:
        from rljob_trainer.evaluation import eval_summary

        summary["eval"] = eval_summary(trainer.state.log_history, eval_metric)
    summary["peak_memory_bytes"] = peak_memory_bytes()
    summary["algorithm"] = builder(cfg.training.algorithm).descriptor.effective(cfg.training.strategy, trainer.args)
    atomic_write_text(Path(cfg.output_dir) / "summary.json", json.dumps(summary, indent=2))
    if tracking is not None and cfg.training.tracking is not None:
        summary["tracking"] = tracking.finish(summary, stopped=bool(STOP.signum))
        atomic_write_text(Path(cfg.output_dir) / "summary.json", json.dumps(summary, indent=2))
    record_run(cfg, summary, publisher, started)
    if heartbeat is not None:
        heartbeat.send(step=trainer.state.global_step, reward=summary["reward_last"], loss=None,
                       final=not STOP.signum)
    return summary


def record_run(cfg: TrainerConfig, summary: dict[str, Any], publisher: Any, started: float) -> None:
    """The run's record (``rljob history``) beside its checkpoints: the local primary and every location copied to."""
    from rljob_trainer.history import run_record, write_record

    locations = ([publisher.folder] if publisher.folder_is_primary else []) + list(publisher.locations)
    written = write_record(run_record(cfg, summary, started, stopped=bool(STOP.signum)), locations)
    if written:
        log.info("run record: %s", ", ".join(written))


def peak_memory_bytes() -> int:
    """Rank 0's peak memory: GPU memory allocated by torch on a GPU, else the process's peak RSS."""
    import resource

    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def run(cfg: TrainerConfig) -> dict[str, Any] | None:
    """Train one rank: inputs, reporting, rank 0's checkpoint publisher, the trainer, the summary."""
    import torch

    from rljob_trainer.checkpoints.export import base_identity
    from rljob_trainer.checkpoints.plan import storage_plan
    from rljob_trainer.checkpoints.publisher import CheckpointPublisher
    from rljob_trainer.checkpoints.resume import resume_checkpoint
    from rljob_trainer.checkpoints.retention import RetentionPolicy
    from rljob_trainer.telemetry import TelemetryCallback

    started = time.time()
    rank = int(os.environ.get("RANK", "0"))
    use_cpu = not torch.cuda.is_available()
    if cfg.training.precision != "fp32" and use_cpu:
        raise PermanentError("spec.training.precision", f"{cfg.training.precision} needs a GPU; use fp32 on CPU")
    config_cls, trainer_cls = builder(cfg.training.algorithm).trl_classes()
    # The HF Trainer saves into the plan's folder: the local primary itself, or a staging folder in
    # front of object storage; rank 0's publisher seals each checkpoint there and copies it onwards.
    storage = storage_plan(cfg)
    inputs = prepare_inputs(cfg, config_cls, str(storage.local_root), use_cpu)
    resume = resume_checkpoint(storage.local_root)  # fetched and verified by the pre-flight
    metrics, heartbeat = start_reporting(cfg, rank)
    tracking = RunTracking(cfg, heartbeat) if cfg.training.tracking is not None else None
    publisher = None
    if rank == 0:
        # No resume protection in retention: every node fetched and loaded its resume checkpoint
        # before the first step, so by the first save nothing is reading it any more.
        policy = RetentionPolicy(cfg.checkpoint.keep_last, cfg.checkpoint.keep_best, cfg.checkpoint.best_metric)
        publisher = CheckpointPublisher.for_plan(storage, policy, retries=cfg.checkpoint.upload_retries,
                                                 metrics=metrics, heartbeat=heartbeat,
                                                 base_model=base_identity(inputs.model_path) if inputs.peft_config else None)
    metrics_log = Path(cfg.output_dir) / METRICS_LOG if rank == 0 else None
    evaluate, eval_metric = evaluation_callbacks(cfg, inputs, metrics, heartbeat, metrics_log, tracking)
    telemetry = TelemetryCallback(metrics, heartbeat, metrics_log, health=cfg.training.health if rank == 0 else None)
    callbacks = [telemetry, *evaluate, checkpoint_callback(publisher),
                 stop_on_signal_callback(STOP)]
    trainer = build_trainer(cfg, trainer_cls, inputs, callbacks, tracking)
    if resume is not None and rank == 0:
        log.warning("resuming from %s", resume)
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    except BaseException:
        if tracking is not None:
            tracking.fail()
        raise
    summary = None
    if trainer.is_world_process_zero() and publisher is not None:
        health = telemetry.health.reports() if telemetry.health is not None else []
        summary = write_run_summary(cfg, trainer, publisher, resume, started, heartbeat, eval_metric, health,
                                    tracking)
    if metrics is not None:
        metrics.shutdown()
    finish_together()
    return summary


def finish_together() -> None:
    """Every rank waits for rank 0's end-of-run work (final uploads, summary), then leaves the group.

    A rank that exits while rank 0 is still waiting for uploads (storage slow or down) can die
    in its process-group teardown (``terminate called without an active exception``, SIGABRT);
    torchrun then SIGTERMs rank 0 and the whole run counts as failed after training succeeded.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank (or fork server) when the process that started it dies.

    torchrun starts ranks in their own sessions, so killing the launcher (a SIGKILLed
    ``rljob train``, an OOM-killed agent) would otherwise leave ranks training on as orphans,
    writing checkpoints nobody asked for. The starter's pid comes from ``RLJOB_PARENT_PID``: if the
    parent is already another process, the starter died before the request took effect. Not "the
    parent is pid 1": in a container the launcher is pid 1 (every rank exited at once there).
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    starter = os.environ.get(PARENT_PID_ENV, "")
    if starter.isdigit() and os.getppid() != int(starter):
        os._exit(137)


def run_alone_when_alone(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """In a gang of one, hide torchrun's ``LOCAL_RANK`` so the rank trains like a plain script.

    accelerate treats any process with ``LOCAL_RANK`` set as distributed, even at ``WORLD_SIZE=1``:
    the Trainer then wraps the model in DistributedDataParallel (NCCL on a GPU, gloo on CPU) and
    every step pays a gradient all-reduce with nobody and, with ``find_unused_parameters``, an
    extra pass over the autograd graph; measured as most of rljob's gap to plain TRL with one
    process. Returns True when it changed the environment.
    """
    if environ.get("WORLD_SIZE", "1") != "1" or "LOCAL_RANK" not in environ:
        return False
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        environ.pop(name, None)
    return True


def main(argv: list[str] | None = None) -> int:
    code = _main(sys.argv[1:] if argv is None else argv)
    if code:
        record_exit_code(code)
    return code


def record_exit_code(code: int) -> None:
    """Leave this rank's exit code in the launcher's error folder (``rank-N.exit``, next to the error
    line): a gang forked by multiprocessing reports only the first rank the agent saw fail, and that
    may be a peer that merely lost its connection to the one that ran out of memory."""
    error_dir = os.environ.get(ERROR_DIR_ENV)
    if not error_dir:
        return
    with contextlib.suppress(OSError):
        Path(error_dir, f"rank-{os.environ.get('RANK', '0')}.exit").write_text(str(code), encoding="utf-8")


def _main(argv: list[str]) -> int:
    die_with_parent()
    run_alone_when_alone()
    silence_known_warnings()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    error_dir = os.environ.get(ERROR_DIR_ENV)
    if error_dir:
        os.environ[ERROR_FILE_ENV] = os.path.join(error_dir, f"rank-{os.environ.get('RANK', '0')}.txt")
    if len(argv) != 1:
        print("usage: python -m rljob_trainer.worker CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = validate_document(TrainerConfig, json.loads(Path(argv[0]).read_text(encoding="utf-8")))
        run(cfg)  # a signal before training begins ends the rank at once (StopRequest)
        if STOP.signum and not STOP.own and in_place_restarts_on():
            report_fatal(f"a peer worker was stopped by signal {STOP.signum}; saved a checkpoint with it")
            return EXIT_PEER_LOST  # the agent restarts this rank to meet the peer's replacement
        if STOP.signum:  # stopped early with a checkpoint: not done, so not 0
            report_fatal(f"stopped by signal {STOP.signum} after saving a checkpoint")
            return exit_code_for_signal(STOP.signum)
        return 0
    except PermanentError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    except Exception as e:  # classify, report the first line, keep the traceback on stderr
        traceback.print_exc()
        if is_cuda_oom(e):
            report_fatal(f"CUDA out of memory: {e}")
            return EXIT_CUDA_OOM
        if in_place_restarts_on() and is_peer_loss(e):
            report_fatal(f"lost a peer worker: {e}")  # the agent restarts this rank to meet its replacement
            return EXIT_PEER_LOST
        report_fatal(f"{type(e).__name__}: {e}")
        return 1


def forked_main(config_path: str, env: dict[str, str]) -> None:
    """A rank forked from the launcher's fork server (``rljob_trainer.rank_stack``): run, then exit.

    The server ignores SIGTERM; a rank takes it back at once (``main`` then installs the handler that
    saves a checkpoint). The server's environment is the launcher's from when the server started;
    ``env`` is what the launcher added since (model path, resume checkpoint, error folder); the
    elastic agent has set this rank's own variables (``RANK``, ``WORLD_SIZE``, ...) already.
    ``sys.exit`` carries the code out of multiprocessing, which the agent reads as the rank's exit code.
    """
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.update(env)
    if "rljob_trainer.rank_stack" not in sys.modules:  # the server's preload failed (it says nothing)
        print(f"rljob: rank {os.environ.get('RANK', '?')}: {NOT_PRELOADED}", file=sys.stderr, flush=True)
    sys.exit(main([config_path]))


#: What a forked rank says when its fork server had not imported ``rljob_trainer.rank_stack``: it then
#: imports the stack itself, and the server did not tie itself to the launcher or ignore SIGTERM.
NOT_PRELOADED = ("the fork server did not preload rljob_trainer.rank_stack (is rljob_trainer importable "
                 "from the launcher's environment?); set RLJOB_RANK_START=spawn")


if __name__ == "__main__":
    sys.exit(main())
