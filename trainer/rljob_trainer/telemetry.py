"""What a run reports: Prometheus metrics on rank 0, health endpoints, summary.json and a reward plot.

Series (all prefixed ``rljob_trainer_``): ``step``, ``reward`` (mean total reward),
``reward_std``, ``reward_mean{reward=...}`` / ``reward_std_by_function{reward=...}`` per reward
function, ``loss``, ``step_seconds``, ``tokens_per_second``, ``kl`` (when beta > 0),
``gpu_utilization_ratio`` and ``gpu_memory_bytes`` (when a GPU is present), ``last_checkpoint_step``,
``checkpoint_upload_failures_total`` and ``last_checkpoint_upload_timestamp_seconds`` (object storage),
``eval{metric=...}`` and ``eval_step`` (spec.training.evaluation); the health signals (spec.training.health,
``rljob_trainer.health``): ``health_tripped{signal=...}`` and their inputs ``entropy``, ``entropy_start``,
``reward_zero_std_ratio``, ``completions_clipped_ratio``, ``masked_ratio`` and ``grad_norm``.
``/healthz`` answers 200 while the process lives; ``/readyz`` once the first step is logged.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from rljob_contract.health import HEALTH_LOG_PREFIX, HealthReport, HealthSignal, HealthSpec
from rljob_contract.pod import finite_metrics
from transformers import TrainerCallback

from rljob_trainer.health import HealthInputs, HealthMonitor, tripped_lines


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _ThreadingWSGIServer(WSGIServer):
    daemon_threads = True


class TrainerMetrics:
    """The trainer's Prometheus registry and its small HTTP server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge("rljob_trainer_step", "Optimizer steps completed.", registry=r)
        self.reward = Gauge("rljob_trainer_reward", "Mean total (weighted) reward of the last step.", registry=r)
        self.reward_std = Gauge("rljob_trainer_reward_std", "Std of the total reward of the last step.", registry=r)
        self.reward_mean = Gauge(
            "rljob_trainer_reward_mean", "Mean reward per reward function.", ["reward"], registry=r
        )
        self.reward_fn_std = Gauge(
            "rljob_trainer_reward_std_by_function", "Reward std per reward function.", ["reward"], registry=r
        )
        self.loss = Gauge("rljob_trainer_loss", "Training loss of the last logged step.", registry=r)
        self.step_seconds = Gauge("rljob_trainer_step_seconds", "Wall time of the last step.", registry=r)
        self.tokens_per_second = Gauge(
            "rljob_trainer_tokens_per_second", "Tokens processed per second.", registry=r
        )
        self.kl = Gauge("rljob_trainer_kl", "KL divergence to the reference model.", registry=r)
        self.gpu_util = Gauge("rljob_trainer_gpu_utilization_ratio", "GPU utilisation, 0-1.", ["gpu"], registry=r)
        self.gpu_mem = Gauge("rljob_trainer_gpu_memory_bytes", "GPU memory allocated.", ["gpu"], registry=r)
        self.last_checkpoint = Gauge(
            "rljob_trainer_last_checkpoint_step", "Step of the newest complete checkpoint.", registry=r
        )
        self.checkpoint_upload_failures = Counter(
            "rljob_trainer_checkpoint_upload_failures_total",
            "Failed checkpoint upload attempts (any location; each retry counts).", registry=r
        )
        self.last_checkpoint_upload = Gauge(
            "rljob_trainer_last_checkpoint_upload_timestamp_seconds",
            "Unix time the newest checkpoint became complete on the primary object storage.", registry=r
        )
        self.eval = Gauge("rljob_trainer_eval", "Latest evaluation value per metric (spec.training.evaluation).",
                          ["metric"], registry=r)
        self.eval_step = Gauge("rljob_trainer_eval_step", "Step of the latest evaluation.", registry=r)
        # RL health (rljob_trainer.health, spec.training.health): each signal's state and its inputs.
        self.health_tripped = Gauge(
            "rljob_trainer_health_tripped", "1 while a health signal holds (spec.training.health), else 0.",
            ["signal"], registry=r)
        self.entropy = Gauge("rljob_trainer_entropy", "Mean token entropy of the last logged step.", registry=r)
        self.entropy_start = Gauge(
            "rljob_trainer_entropy_start", "Median entropy of the run's first logged steps (entropyCollapse's base).",
            registry=r)
        self.reward_zero_std_ratio = Gauge(
            "rljob_trainer_reward_zero_std_ratio", "Fraction of groups whose rewards are all equal (no advantage).",
            registry=r)
        self.clipped_ratio = Gauge(
            "rljob_trainer_completions_clipped_ratio", "Fraction of completions that hit maxCompletionLength.",
            registry=r)
        self.masked_ratio = Gauge(
            "rljob_trainer_masked_ratio", "Fraction of the step's completions masked out of the loss.", registry=r)
        self.grad_norm = Gauge("rljob_trainer_grad_norm", "Gradient norm of the last logged step.", registry=r)
        self.ready = threading.Event()
        self._scrape_lock = threading.Lock()
        """Held by a scrape and by ``observe_eval``: a scrape never shows one evaluation's step with another's values."""
        self._server: WSGIServer | None = None
        self.port: int | None = None

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            ok = self.ready.is_set()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ready\n" if ok else b"starting\n"]
        with self._scrape_lock:  # the body is generated within the call
            return make_wsgi_app(self.registry)(environ, start_response)

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        self._server = make_server(
            host, port, self.app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self.port = self._server.server_port
        threading.Thread(target=self._server.serve_forever, name="rljob-metrics", daemon=True).start()
        return self.port

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def observe(self, logs: dict[str, Any], step: int, tokens_per_second: float | None) -> None:
        self.step.set(step)
        if "reward" in logs:
            self.reward.set(float(logs["reward"]))
        if "reward_std" in logs:
            self.reward_std.set(float(logs["reward_std"]))
        for key, value in logs.items():
            if key.startswith("rewards/") and key.endswith("/mean"):
                self.reward_mean.labels(reward=key.split("/")[1]).set(float(value))
            elif key.startswith("rewards/") and key.endswith("/std"):
                self.reward_fn_std.labels(reward=key.split("/")[1]).set(float(value))
        if "loss" in logs:
            self.loss.set(float(logs["loss"]))
        if "step_time" in logs:
            self.step_seconds.set(float(logs["step_time"]))
        if "kl" in logs:
            self.kl.set(float(logs["kl"]))
        if tokens_per_second is not None:
            self.tokens_per_second.set(tokens_per_second)
        self._observe_gpus()
        self.ready.set()

    def observe_health(self, inputs: HealthInputs, reports: list[HealthReport]) -> None:
        """The health signals' inputs at the latest logged step, and 1 for each signal that holds now."""
        for gauge, value in ((self.entropy, inputs.entropy), (self.entropy_start, inputs.entropy_start),
                             (self.reward_zero_std_ratio, inputs.reward_zero_std_ratio),
                             (self.clipped_ratio, inputs.clipped_ratio), (self.masked_ratio, inputs.masked_ratio),
                             (self.grad_norm, inputs.grad_norm)):
            if value is not None:
                gauge.set(value)
        active = {r.signal for r in reports if r.active}
        for signal in HealthSignal:
            self.health_tripped.labels(signal=signal.value).set(1 if signal in active else 0)

    def observe_eval(self, step: int, values: dict[str, float]) -> None:
        """An evaluation's values, labelled by metric name without the ``eval/`` prefix, and its step, together."""
        with self._scrape_lock:
            self.eval_step.set(step)
            for name, value in values.items():
                self.eval.labels(metric=name.removeprefix("eval/")).set(float(value))

    def _observe_gpus(self) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        for i in range(torch.cuda.device_count()):
            self.gpu_mem.labels(gpu=str(i)).set(torch.cuda.memory_allocated(i))
            with contextlib.suppress(Exception):  # needs NVML; memory is still reported
                self.gpu_util.labels(gpu=str(i)).set(torch.cuda.utilization(i) / 100.0)


class TelemetryCallback(TrainerCallback):  # type: ignore[misc]
    """Feeds metrics and heartbeats from the Trainer's logs (world rank 0 only)."""

    def __init__(self, metrics: TrainerMetrics | None, heartbeat: Any = None, log_path: Path | None = None,
                 health: HealthSpec | None = None) -> None:
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.log_path = log_path  # contract.METRICS_LOG in the output folder
        self.health_spec = health  # spec.training.health: the monitor is built once TRL's config is known
        self.health: HealthMonitor | None = None
        self._last_tokens: tuple[float, float] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self.health_spec is not None:
            self.health = HealthMonitor.for_args(self.health_spec, args)

    def _health_record(self) -> dict[str, float]:
        """The metrics log's health values: ``health/<signal>`` 1 while it holds, 0 once cleared; a signal that
        never tripped is left out (``rljob experiment`` reads which tripped)."""
        reports = self.health.reports() if self.health is not None else []
        return {f"{HEALTH_LOG_PREFIX}{r.signal}": 1.0 if r.active else 0.0 for r in reports}

    def _observe_health(self, step: int, logs: dict[str, Any]) -> None:
        """The health signals of this step: gauges, a line for each newly tripped one, the heartbeat's report."""
        if self.health is None:
            return
        tripped_lines(self.health.observe(step, logs), lambda line: print(line, file=sys.stderr, flush=True))
        reports = self.health.reports()
        if self.metrics is not None:
            self.metrics.observe_health(self.health.inputs, reports)
        if self.heartbeat is not None:
            self.heartbeat.health = reports

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        tps = None
        if "num_tokens" in logs:
            now, tokens = time.monotonic(), float(logs["num_tokens"])
            if self._last_tokens is not None and now > self._last_tokens[0]:
                tps = (tokens - self._last_tokens[1]) / (now - self._last_tokens[0])
            self._last_tokens = (now, tokens)
        if self.metrics is not None:
            self.metrics.observe(logs, state.global_step, tps)
        self._observe_health(state.global_step, logs)
        if self.log_path is not None:
            append_metrics(self.log_path, state.global_step, {**logs, **self._health_record()})
        if self.heartbeat is not None and ("reward" in logs or "loss" in logs):
            # The other logged numbers (kl, each reward's mean, ...) too: an experiment's objective may be any of them.
            metrics = finite_metrics(logs, skip=frozenset({"reward", "loss", "step"}))
            self.heartbeat.send(step=state.global_step, reward=logs.get("reward"), loss=logs.get("loss"),
                                metrics=metrics)


def append_metrics(path: Path, step: int, logs: dict[str, Any]) -> None:
    """Append one line of numeric ``logs`` at ``step`` to the metrics log (see contract.METRICS_LOG)."""
    record: dict[str, Any] = {"step": step}
    record.update({k: v for k, v in logs.items() if isinstance(v, int | float) and not isinstance(v, bool)})
    with path.open("a", encoding="utf-8") as f:  # one short write per step: a reader sees whole lines
        f.write(json.dumps(record) + "\n")


def tokens_seen(log_history: list[dict[str, Any]]) -> float:
    """Prompt + completion tokens the run processed, over all ranks: TRL's cumulative ``num_tokens``
    (``state.num_input_tokens_seen``) at its last log. The one count every benchmark and summary uses,
    so tokens/s of two runs compare like their step times when both generated the same tokens."""
    return max((float(h["num_tokens"]) for h in log_history if "num_tokens" in h), default=0.0)


def reward_history(log_history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(int(h["step"]), float(h["reward"])) for h in log_history if "reward" in h and "step" in h]


def write_summary(
    output_dir: str | Path,
    *,
    steps: int,
    log_history: list[dict[str, Any]],
    checkpoints: list[str],
    resumed_from: str | None,
    wall_seconds: float,
    health: list[HealthReport] | None = None,
) -> dict[str, Any]:
    """``summary.json`` (the contract in DESIGN.md) and ``reward_curve.png``."""
    history = reward_history(log_history)
    summary = {
        "steps": steps,
        "reward_first": history[0][1] if history else None,
        "reward_last": history[-1][1] if history else None,
        "checkpoints": checkpoints,
        "resumed_from": resumed_from,
        "wall_seconds": round(wall_seconds, 3),
        # The Trainer's own timing of the training loop (excludes start-up and model loading).
        "train_runtime": next((float(h["train_runtime"]) for h in log_history if "train_runtime" in h), None),
        "num_tokens": tokens_seen(log_history),
        "reward_history": history,
        "loss_history": [(int(h["step"]), float(h["loss"])) for h in log_history if "loss" in h and "step" in h],
        # The health signals that tripped (rljob_trainer.health), each with its line for people.
        "health": [{**r.model_dump(mode="json"), "message": r.message()} for r in health or []],
    }
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    if history:
        plot_rewards(history, out / "reward_curve.png")
    return summary


def plot_rewards(history: list[tuple[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    steps, rewards = zip(*history, strict=True)
    ax.plot(steps, rewards, marker=".", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(min(0.0, min(rewards)) - 0.05, max(1.0, max(rewards)) + 0.05)
    ax.grid(alpha=0.3)
    ax.set_title("reward")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compact_progress_callback() -> Any:
    """The Trainer's progress bar, with reward and loss in its postfix instead of printed dicts."""
    from transformers.trainer_callback import ProgressCallback

    class CompactProgress(ProgressCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if state.is_world_process_zero and self.training_bar is not None and logs:
                shown = {k: f"{float(logs[k]):.3f}" for k in ("reward", "loss") if k in logs}
                if shown:
                    self.training_bar.set_postfix(shown, refresh=False)

    return CompactProgress()
