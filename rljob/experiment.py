"""``rljob experiment exp.yaml``: run an RLExperiment's trials on this machine.

Each trial is an ``rljob train`` process (the same code path as a single job) with its own
manifest and output folder under ``<out>/trials/``. While trials run, their curves are read
from the trainer's metrics log (``contract.METRICS_LOG``); the objective, early stopping,
search and ranking are the operator's own pure functions (``rljob_operator.experiments``), so a
file gives the same decisions here and on a cluster. A pruned trial gets SIGTERM: the trainer
saves a checkpoint and exits. At the end ``summary.json`` (the experiment's status) and
``reward_curves.png`` are written into the output folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rljob_contract import yamltext
from rljob_contract.experiment import (
    MAX_CURVE_POINTS,
    CurvePoint,
    ExperimentPhase,
    RLExperiment,
    RLExperimentStatus,
    TrialPhase,
    TrialStatus,
)
from rljob_contract.pod import METRICS_LOG, PROGRESS_ENV, TRACKING_PARENT_RUN_ENV
from rljob_operator.experiments.health import collapse_prune_message, signals_from_logs
from rljob_operator.experiments.leaderboard import standings
from rljob_operator.experiments.objective import curve_from_logs, objective_value, thin
from rljob_operator.experiments.pruning import should_prune
from rljob_operator.experiments.search import next_params
from rljob_operator.experiments.trials import Trial, arm_trials, search_trial, trial_manifest

#: How often running trials' metrics logs are read.
POLL_SECONDS = 1.0
#: How long a SIGTERMed trial has to save and exit before its process group is killed.
STOP_GRACE_SECONDS = 120.0


def visible_gpus() -> list[str]:
    """The GPUs trials may use: CUDA_VISIBLE_DEVICES when set, else every device torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def trial_world(experiment: RLExperiment) -> int:
    """Processes one trial starts (``rljob train`` runs replicas × procsPerWorker here)."""
    workers = experiment.spec.template.workers
    return max(1, workers.replicas * workers.procs_per_worker)


def default_parallel(experiment: RLExperiment, gpus: list[str]) -> int:
    """Trials at once by default: as many as this machine's GPUs (one per process) or, without GPUs,
    its CPUs (one per process) hold; at least one, at most the experiment's own bound."""
    world = trial_world(experiment)
    capacity = len(gpus) if gpus else (os.cpu_count() or 1)
    return max(1, min(experiment.spec.max_parallel, capacity // world))


def gpu_slots(gpus: list[str], world: int, parallel: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each of ``parallel`` slots: disjoint groups of ``world`` GPUs, so trials
    running at once never share a device; None (inherit) without GPUs or when they do not go round."""
    if not gpus or len(gpus) < world * parallel:
        return [None] * parallel
    return [",".join(gpus[i * world:(i + 1) * world]) for i in range(parallel)]


def cpu_threads(cpus: int, world: int, parallel: int) -> int | None:
    """Intra-op threads (``OMP_NUM_THREADS``) of each trial process when ``parallel`` trials of ``world``
    processes share ``cpus`` cores: an equal share, at least one; None (torch's default: every core)
    for a lone single-process trial. Without it each of two one-process trials on 2 cores ran 2
    threads and its 20 steps took 19.5 s instead of 1.5 s (``bench/README.md``)."""
    if world * parallel <= 1:
        return None
    return max(1, cpus // (world * parallel))


def trial_env(base: dict[str, str], gpus: str | None, threads: int | None) -> dict[str, str]:
    """A trial's environment: ``base`` with no progress bars, its slot's GPUs and its share of the
    cores; a ``CUDA_VISIBLE_DEVICES``/``OMP_NUM_THREADS`` the user set for the slots is theirs."""
    env = dict(base)
    env.setdefault(PROGRESS_ENV, "0")  # no progress bars in the trial logs
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if threads is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


@dataclass
class RunningTrial:
    """A trial's process and what has been read of its metrics log."""

    trial: Trial
    status: TrialStatus
    proc: subprocess.Popen[bytes]
    folder: Path
    log: Path
    started: float
    records: list[dict[str, Any]] = field(default_factory=list)
    offset: int = 0
    stop_sent: float | None = None
    slot: int = 0


class LocalRunner:
    """Runs the trials of one experiment as local ``rljob train`` processes, ``parallel`` at once."""

    def __init__(self, experiment: RLExperiment, out: Path, parallel: int, stream: TextIO = sys.stdout) -> None:
        self.experiment = experiment
        self.spec = experiment.spec
        self.out = out
        self.parallel = parallel
        self.stream = stream
        self.statuses: list[TrialStatus] = []
        self.running: dict[str, RunningTrial] = {}
        self.queue: list[Trial] = arm_trials(experiment) if self.spec.arms is not None else []
        self.interrupted = False
        self.slots = gpu_slots(visible_gpus(), trial_world(experiment), parallel)
        self.threads = cpu_threads(os.cpu_count() or 1, trial_world(experiment), parallel)
        self.parent_run: str | None = None  # the experiment's MLflow run (spec.training.tracking.mlflow)

    # ------------------------------------------------------------------------ the loop

    def run(self) -> RLExperimentStatus:
        """Run every trial (pruning on the way); the experiment's final status."""
        self.say(f"experiment {self.experiment.metadata.name}: {self.spec.total_trials} trial(s), "
                 f"{self.parallel} at once; output in {self.out}")
        self.start_tracking()
        try:
            while True:
                while len(self.running) < self.parallel and (trial := self.next_trial()) is not None:
                    self.start(trial)
                if not self.running:
                    break
                time.sleep(POLL_SECONDS)
                self.poll()
        except KeyboardInterrupt:
            self.interrupted = True  # Ctrl-C: stop the trials, still write what is known
            self.say("interrupted: stopping the running trials")
        finally:
            self.stop_all()
        return self.status()

    def start_tracking(self) -> None:
        """The experiment's parent run when the template tracks to MLflow: each trial becomes a child of it."""
        if self.spec.template.training.tracking is None:
            return
        from rljob_trainer.tracking import start_experiment_run

        self.parent_run, warning = start_experiment_run(self.spec.template.training.tracking,
                                                        self.experiment.metadata.name, self.experiment.metadata.namespace)
        if warning:
            self.say(warning)
        elif self.parent_run:
            self.say(f"MLflow: the trials are child runs of run {self.parent_run}")

    def failed_too_often(self) -> bool:
        search = self.spec.search
        failed = sum(t.phase == TrialPhase.failed.value for t in self.statuses)
        return search is not None and failed > search.max_failed_trials

    def next_trial(self) -> Trial | None:
        """The next trial to start: the next arm trial, or the search's next parameters."""
        if self.spec.arms is not None:
            return self.queue.pop(0) if self.queue else None
        number = len(self.statuses)
        if number >= self.spec.total_trials or self.failed_too_often():
            return None
        return search_trial(self.experiment, number, next_params(self.spec, self.statuses))

    def start(self, trial: Trial) -> None:
        """Write the trial's manifest and start ``rljob train`` on it in its own process group."""
        folder = self.out / "trials" / trial.name
        folder.mkdir(parents=True, exist_ok=True)
        manifest = folder.parent / f"{trial.name}.yaml"
        manifest.write_text(yamltext.dump(trial_manifest(self.experiment, trial), sort_keys=False))
        log = folder.parent / f"{trial.name}.log"
        # A folder from an earlier run of this experiment is kept: like `rljob train`, the trial resumes
        # from its newest checkpoint, and the metrics log already holds the curve up to there.
        slot = min(set(range(self.parallel)) - {rt.slot for rt in self.running.values()})
        env = trial_env(dict(os.environ), self.slots[slot], self.threads)
        if self.parent_run:
            env[TRACKING_PARENT_RUN_ENV] = self.parent_run
        with log.open("wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "rljob", "train", str(manifest), "--output", str(folder)],
                                    stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        status = TrialStatus(name=trial.name, number=trial.number, arm=trial.arm, params=trial.params,
                             seed=trial.seed, phase=TrialPhase.running)
        self.statuses.append(status)
        self.running[trial.name] = RunningTrial(trial, status, proc, folder, log, time.monotonic(), slot=slot)
        self.say(f"[{trial.number + 1}/{self.spec.total_trials}] started {trial.name} ({self.describe(status)})")

    def poll(self) -> None:
        """Read new metrics, stop trials the median rule prunes, reap trials that exited."""
        for rt in self.running.values():
            self.read_metrics(rt)
        self.prune()
        for name, rt in list(self.running.items()):
            code = rt.proc.poll()
            if code is None and rt.stop_sent is not None and time.monotonic() - rt.stop_sent > STOP_GRACE_SECONDS:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rt.proc.pid, signal.SIGKILL)
                code = rt.proc.wait()
            if code is not None:
                self.read_metrics(rt)
                self.finish(rt, code)
                del self.running[name]

    # --------------------------------------------------------------------- per trial

    def read_metrics(self, rt: RunningTrial) -> None:
        """Append the metrics log's new whole lines to the trial's records; update its curve and objective."""
        path = rt.folder / METRICS_LOG
        try:
            with path.open("rb") as f:
                f.seek(rt.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next read
        rt.offset += len(whole)
        for line in whole.decode("utf-8", "replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rt.records.append(json.loads(line))
        curve = curve_from_logs(rt.records, self.spec.objective.metric)
        rt.status.curve = [CurvePoint(step=s, value=v) for s, v in thin(curve, MAX_CURVE_POINTS)]
        rt.status.steps = max((r["step"] for r in rt.records if isinstance(r.get("step"), int)), default=None)
        rt.status.objective = objective_value(curve, self.spec.objective)
        health = signals_from_logs(rt.records)
        for tripped in [s for s in health if s not in rt.status.health]:
            self.say(f"[{rt.trial.number + 1}/{self.spec.total_trials}] {rt.trial.name}: health signal {tripped} "
                     f"tripped (docs/guides/health.md)")
        rt.status.health = health

    def prune(self) -> None:
        """SIGTERM every running trial whose policy collapsed (``pruneCollapsed``) or the median rule stops (once)."""
        stopping = self.spec.early_stopping
        curves = {t.name: [(p.step, p.value) for p in t.curve] for t in self.statuses}
        for rt in self.running.values():
            if rt.stop_sent is not None:
                continue
            if self.spec.prune_collapsed and (why := collapse_prune_message(rt.status.health)) is not None:
                self.stop(rt, rt.status.steps, why)
            elif (decision := should_prune(rt.trial.name, curves, self.spec.objective, stopping,
                                           rt.trial.spec.training.max_steps)) is not None:
                self.stop(rt, decision.step, decision.message)

    def stop(self, rt: RunningTrial, step: int | None, why: str) -> None:
        """Prune ``rt`` at ``step``: SIGTERM, and the launcher stops the ranks, which save and exit."""
        rt.status.pruned, rt.status.pruned_at_step, rt.status.message = True, step, why
        self.say(f"[{rt.trial.number + 1}/{self.spec.total_trials}] pruning {rt.trial.name}: {why}")
        rt.proc.send_signal(signal.SIGTERM)
        rt.stop_sent = time.monotonic()

    def finish(self, rt: RunningTrial, code: int) -> None:
        """Record a trial's end: its phase, checkpoint and a progress line."""
        status = rt.status
        if status.pruned:
            status.phase = TrialPhase.pruned
        elif code == 0:
            status.phase = TrialPhase.succeeded
        else:
            status.phase = TrialPhase.failed
            status.message = f"rljob train exited {code}: {last_line(rt.log)} (log: {rt.log})"
        status.checkpoint = trial_checkpoint(rt.folder)
        took = time.monotonic() - rt.started
        objective = "none" if status.objective is None else f"{status.objective:.4f}"
        self.say(f"[{status.number + 1}/{self.spec.total_trials}] {status.name} {status.phase}: objective "
                 f"{objective} after {status.steps or 0} steps ({took:.0f} s)")

    def stop_all(self) -> None:
        """Stop trials still running (an interrupted runner leaves no orphans); wait for them."""
        for rt in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rt.proc.pid, signal.SIGTERM)
        for rt in self.running.values():
            try:
                rt.proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rt.proc.pid, signal.SIGKILL)
                rt.proc.wait()
            if rt.status.phase == TrialPhase.running.value:
                rt.status.phase, rt.status.message = TrialPhase.failed, "interrupted"

    # ------------------------------------------------------------------------- output

    def status(self) -> RLExperimentStatus:
        """The experiment's status from its trials (the same standings the operator writes)."""
        s = standings(self.spec, self.statuses)
        done = sum(t.phase != TrialPhase.running.value for t in self.statuses)
        ok = s.best is not None and not self.failed_too_often() and not self.interrupted
        reason = ("Interrupted" if self.interrupted else "TooManyFailedTrials" if self.failed_too_often()
                  else "TrialsFinished" if ok else "NoResult")
        best_name = (s.leaderboard[0].name if s.leaderboard else None)
        return RLExperimentStatus(
            phase=ExperimentPhase.succeeded if ok else ExperimentPhase.failed, reason=reason,
            trials_total=self.spec.total_trials, trials_done=done, summary=f"{done}/{self.spec.total_trials}",
            trials=self.statuses, arms=s.arms, leaderboard=s.leaderboard, best=s.best, winner=s.winner,
            best_name=best_name, best_objective=s.leaderboard[0].objective if s.leaderboard else None,
        )

    def describe(self, status: TrialStatus) -> str:
        if status.arm is not None:
            return f"arm {status.arm}, seed {status.seed}"
        return ", ".join(f"{k.split('.')[-1]}={v:.4g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                         for k, v in (status.params or {}).items())

    def say(self, line: str) -> None:
        print(f"rljob: {line}", file=self.stream, flush=True)


def last_line(log: Path) -> str:
    """The last non-empty line of a trial's log (its error, usually)."""
    with contextlib.suppress(OSError):
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if lines:
            return lines[-1][:300]
    return "no output"


def trial_checkpoint(folder: Path) -> str | None:
    """The trial's best (else latest) checkpoint location from its summary.json, else its newest folder."""
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        for key in ("best_checkpoint", "latest_checkpoint"):
            ref = summary.get(key)
            if isinstance(ref, dict) and ref.get("location"):
                return str(ref["location"])
    found = sorted((folder / "checkpoints").glob("checkpoint-*"),
                   key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1)
    return str(found[-1]) if found else None


def leaderboard_table(experiment: RLExperiment, status: RLExperimentStatus) -> str:
    """The final table: arms with mean and 95 % interval, or trials with parameters and objective."""
    metric = experiment.spec.objective.metric
    if experiment.spec.arms is not None:
        rows = [("rank", "arm", "n", f"mean {metric}", "95% interval", "collapsed")]
        for e in status.leaderboard:
            ci = "n/a" if e.ci95_low is None else f"[{e.ci95_low:.4f}, {e.ci95_high:.4f}]"
            rows.append((str(e.rank), e.name, str(e.n), f"{e.objective:.4f}", ci, f"{e.collapsed}/{e.n}"
                         if e.collapsed else ""))
    else:
        by_name = {t.name: t for t in status.trials}
        rows = [("rank", "trial", metric, "steps", "parameters", "health")]
        for e in status.leaderboard:
            t = by_name[e.name]
            params = " ".join(f"{k.split('.')[-1]}={v:.4g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
                              for k, v in (t.params or {}).items())
            rows.append((str(e.rank), e.name, f"{e.objective:.4f}", str(t.steps), params, ",".join(t.health)))
        rows += [("-", t.name, t.phase, str(t.steps), t.message or "", ",".join(t.health)) for t in status.trials
                 if t.phase != TrialPhase.succeeded.value]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if status.winner is not None:
        lines.append(f"winner: {status.winner.arm}: {status.winner.message} [{status.winner.test}]")
    if status.best is not None:
        lines.append(f"best trial: {status.best.trial} ({status.best.objective:.4f}); checkpoint "
                     f"{status.best.checkpoint or 'none'}")
    return "\n".join(lines)


def plot_curves(experiment: RLExperiment, status: RLExperimentStatus, path: Path) -> None:
    """reward_curves.png: per arm a mean line with a min–max band over seeds (one colour per arm),
    or for a search one line per trial (pruned ones dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
    colours = [f"C{i}" for i in range(10)]  # matplotlib's default cycle
    if experiment.spec.arms is not None:
        for i, arm in enumerate(experiment.spec.arms):
            curves = [dict((p.step, p.value) for p in t.curve) for t in status.trials if t.arm == arm.name and t.curve]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if not steps:
                continue
            values = [[c[s] for c in curves] for s in steps]
            colour = colours[i % len(colours)]
            ax.plot(steps, [sum(v) / len(v) for v in values], color=colour, label=f"{arm.name} (n={len(curves)})")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2)
    else:
        for i, t in enumerate(status.trials):
            if t.curve:
                ax.plot([p.step for p in t.curve], [p.value for p in t.curve], color=colours[i % len(colours)],
                        linestyle="--" if t.pruned else "-", label=f"{t.name}{' (pruned)' if t.pruned else ''}")
    ax.set_xlabel("step")
    ax.set_ylabel(experiment.spec.objective.metric)
    ax.set_title(f"{experiment.metadata.name}: {experiment.spec.objective.metric} by step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(experiment: RLExperiment, status: RLExperimentStatus, out: Path) -> None:
    """summary.json (the experiment, spec and status, camelCase like the cluster's) and reward_curves.png."""
    document = {"apiVersion": experiment.api_version, "kind": experiment.kind,
                "metadata": experiment.metadata.model_dump(mode="json", exclude_none=True),
                "spec": experiment.spec.model_dump(by_alias=True, mode="json", exclude_none=True),
                "status": status.model_dump(by_alias=True, mode="json", exclude_none=True)}
    (out / "summary.json").write_text(json.dumps(document, indent=2), encoding="utf-8")
    plot_curves(experiment, status, out / "reward_curves.png")


def run_experiment(experiment: RLExperiment, out: Path, parallel: int | None, stream: TextIO = sys.stdout) -> int:
    """Run ``experiment`` into ``out``; 0 when it succeeded (a best trial, not too many failures)."""
    out.mkdir(parents=True, exist_ok=True)
    runner = LocalRunner(experiment, out, parallel or default_parallel(experiment, visible_gpus()), stream)
    status = runner.run()
    write_outputs(experiment, status, out)
    if runner.parent_run:
        from rljob_trainer.tracking import record_experiment

        warning = record_experiment(runner.parent_run, status.model_dump(mode="json", exclude_none=True),
                                    [out / "summary.json", out / "reward_curves.png"])
        if warning:
            print(f"rljob: {warning}", file=stream)
    print(leaderboard_table(experiment, status), file=stream)
    print(f"rljob: experiment {status.phase}: summary in {out / 'summary.json'}, curves in "
          f"{out / 'reward_curves.png'}", file=stream, flush=True)
    return 0 if status.phase == ExperimentPhase.succeeded.value else 1
