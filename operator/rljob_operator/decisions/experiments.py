"""An RLExperiment's reconcile, decided (pure): from the experiment and its trial jobs, what should be.

The operator keeps nothing in memory: every decision is rebuilt from the experiment's status
(the trials it started, with their parameters) and the trial RLTrainingJobs (their phase and
progress curve). ``plan_experiment`` returns an ``ExperimentPlan``, which ``cluster/experiments.py``
applies in this order: the status first (a new trial is recorded, with its parameters, before its
job exists, so a crash in between re-creates the same trial, never a second one), then the trial
jobs to create (deterministic names), then the UIDs the API server gave them (``record_uids``, a
second status write), then the ones to stop (pruned trials are suspended: their checkpoints and
curves stay), then the Events.

A trial is its job only by UID: an RLTrainingJob that carries the experiment's label (and its
ownerReference, which anyone who may create jobs can copy) is a *conflict* unless its UID is the
one recorded for a trial of its name. Conflicts are reported (``status.conflicts``, the condition
``TrialConflict``, an Event) and never counted. A name squatted before the operator created the
trial (its create got a 409), or a trial whose UID write was lost (the operator stopped between
create and record), waits as Pending: the operator cannot tell its own job from a forgery there,
so it adopts neither and says so; deleting the job lets it create the trial.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rljob_contract import experiment as exp_api
from rljob_contract.experiment import (
    FINISHED_TRIAL_PHASES,
    MAX_CONFLICTS_LISTED,
    CurvePoint,
    ExperimentPhase,
    RLExperiment,
    TrialPhase,
    TrialStatus,
    bounded_checkpoint,
    bounded_message,
    curve_points_per_trial,
)
from rljob_contract.job import API_VERSION, Condition, RLTrainingJob

from rljob_operator.decisions.conditions import condition
from rljob_operator.decisions.curve import series
from rljob_operator.decisions.plan import Event, status_patch
from rljob_operator.decisions.policy import PodProfile, job_violations
from rljob_operator.experiments.health import (
    collapse_prune_message,
    collapsed,
    ordered,
    signals_from_progress,
)
from rljob_operator.experiments.leaderboard import standings
from rljob_operator.experiments.objective import objective_value, thin
from rljob_operator.experiments.pruning import should_prune
from rljob_operator.experiments.search import next_params
from rljob_operator.experiments.trials import (
    LABEL_EXPERIMENT,
    Trial,
    arm_trials,
    search_trial,
    trial_manifest,
)

#: Seconds between looks at a running experiment besides the events that wake it.
RECHECK_SECONDS = 30.0
#: Labels an experiment passes on to its trials: everything but rljob's own (a Kueue queue name, a team).
_OWN_LABEL_PREFIX = "rljob.dev/"


@dataclass
class ExperimentPlan:
    """What one reconcile of an experiment does (applied in field order)."""

    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    suspend: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    now: str = ""
    conflicts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExperimentFailure:
    """An experiment failed before a plan could run it: a spec the models refuse (``InvalidSpec``) or a
    trial job the API server refused (``TrialRejected``). Only the outcome is written (the standings
    stay), then a Warning Event with the same reason and message."""

    reason: str
    message: str
    observed_generation: int | None

    @property
    def status(self) -> dict[str, Any]:
        """The status merge patch: phase ``Failed``, reason, message and ``observedGeneration``."""
        return status_patch(exp_api.RLExperimentStatus(
            phase=ExperimentPhase.failed, reason=self.reason, message=self.message,
            observed_generation=self.observed_generation))

    @property
    def event(self) -> Event:
        return Event("Warning", self.reason, self.message)


def invalid_experiment(experiment: dict[str, Any], problems: list[str]) -> ExperimentFailure | None:
    """A spec the models refuse (an arm's overrides make an invalid job): Failed, ``InvalidSpec``, nothing
    started; None when the status already says so."""
    message = "; ".join(problems)
    if (experiment.get("status") or {}).get("message") == message:
        return None
    return ExperimentFailure("InvalidSpec", message, experiment["metadata"].get("generation"))


def refused_trial(experiment: dict[str, Any], trial: str, http_status: int | None, detail: str) -> ExperimentFailure:
    """The API server refused trial job ``trial`` (HTTP ``http_status``, saying ``detail``): the experiment fails."""
    message = f"the API server refused trial {trial} (HTTP {http_status}): {detail}"
    return ExperimentFailure("TrialRejected", message, experiment["metadata"].get("generation"))


def owner_reference(experiment: dict[str, Any]) -> dict[str, Any]:
    """The trials' ownerReference: the experiment controls them, and deleting it deletes them."""
    meta = experiment["metadata"]
    return {"apiVersion": API_VERSION, "kind": exp_api.KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def trial_job(experiment: dict[str, Any], parsed: RLExperiment, trial: Trial) -> dict[str, Any]:
    """The trial's RLTrainingJob: owned by the experiment, with its labels (a Kueue queue name too)."""
    doc = trial_manifest(parsed, trial)
    meta = doc["metadata"]
    inherited = {k: v for k, v in (experiment["metadata"].get("labels") or {}).items()
                 if not k.startswith(_OWN_LABEL_PREFIX)}
    meta["labels"] = {**inherited, **meta["labels"]}
    meta["namespace"] = experiment["metadata"]["namespace"]
    meta["ownerReferences"] = [owner_reference(experiment)]
    return doc


def _trial_phase(job: dict[str, Any] | None, previous: TrialStatus) -> str:
    if previous.phase in FINISHED_TRIAL_PHASES:
        return str(previous.phase)  # final: a pruned (suspended) or finished trial stays what it was
    if job is None:
        # Pending: recorded, its job not created yet (it will be). Seen running, now gone: deleted by someone.
        return TrialPhase.pending.value if previous.phase == TrialPhase.pending.value else TrialPhase.failed.value
    phase = (job.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return TrialPhase.succeeded.value
    if phase == "Failed":
        return TrialPhase.failed.value
    return TrialPhase.running.value if phase in ("Running", "Restarting") else TrialPhase.pending.value


def observe_trial(previous: TrialStatus, job: dict[str, Any] | None, parsed: RLExperiment) -> TrialStatus:
    """``previous`` brought up to date from its job: phase, curve of the objective's metric, objective."""
    if job is None:
        phase = _trial_phase(None, previous)
        gone = phase == TrialPhase.failed.value and previous.phase != phase
        return previous.model_copy(update={"phase": phase, **({"message": "its job was deleted"} if gone else {})})
    status = job.get("status") or {}
    progress = status.get("progress") or {}
    points = series(progress.get("curve") or [], parsed.spec.objective.metric)
    kept = curve_points_per_trial(parsed.spec.total_trials)
    curve = [CurvePoint(step=s, value=v) for s, v in thin(points, kept)] if points else previous.curve
    pairs = points or [(p.step, p.value) for p in curve]  # the objective from the job's whole curve
    phase = _trial_phase(job, previous)
    checkpoint = bounded_checkpoint(progress.get("bestCheckpoint") or progress.get("checkpoint"))
    update: dict[str, Any] = {
        "uid": job["metadata"].get("uid") or previous.uid, "phase": phase, "curve": curve,
        "health": ordered([*previous.health, *signals_from_progress(progress)]),
        "objective": objective_value(pairs, parsed.spec.objective),
        "steps": pairs[-1][0] if pairs else previous.steps,
        "checkpoint": checkpoint or previous.checkpoint,
    }
    if phase == TrialPhase.failed.value and previous.phase != phase:
        update["message"] = bounded_message(status.get("message") or status.get("reason") or "the trial job failed")
    return previous.model_copy(update=update)


def _is_trials(trial: TrialStatus, job: dict[str, Any]) -> bool:
    """Whether ``job`` is ``trial``'s: its UID is the one recorded when the operator created it. A trial an
    operator of an earlier version recorded without a UID and saw running is its job's (by name, once: its UID
    is recorded from then on); a Pending or finished one without a UID has no job yet, or needs none."""
    if trial.uid is not None:
        return bool(trial.uid == job["metadata"].get("uid"))
    return trial.phase == TrialPhase.running.value


def trial_jobs_and_conflicts(trials: list[TrialStatus], jobs: list[dict[str, Any]]
                             ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The trials' own jobs by name, and the names of the other ``jobs`` (conflicts), sorted."""
    recorded = {t.name: t for t in trials}
    own: dict[str, dict[str, Any]] = {}
    conflicts = []
    for job in jobs:
        name = job["metadata"]["name"]
        trial = recorded.get(name)
        if trial is not None and _is_trials(trial, job):
            own[name] = job
        else:
            conflicts.append(name)
    return own, sorted(conflicts)


def record_uids(status: Mapping[str, Any], created: Mapping[str, str]) -> list[dict[str, Any]]:
    """``status.trials`` with the UIDs of the trial jobs just ``created`` (name → UID) filled in."""
    return [{**t, "uid": created[t["name"]]} if t.get("name") in created else dict(t)
            for t in status.get("trials") or []]


def _recorded(parsed: RLExperiment, t: TrialStatus) -> Trial:
    """The trial a status entry records, rebuilt: an arm's by name, a search's from its number and parameters."""
    if parsed.spec.search is not None:
        return search_trial(parsed, t.number, t.params or {})
    return next(a for a in arm_trials(parsed) if a.name == t.name)


def _new_status(trial: Trial) -> TrialStatus:
    return TrialStatus(name=trial.name, number=trial.number, arm=trial.arm, params=trial.params, seed=trial.seed)


def _max_failed(parsed: RLExperiment) -> int:
    spec = parsed.spec
    return spec.search.max_failed_trials if spec.search is not None else spec.total_trials - 1


def _next_trials(parsed: RLExperiment, trials: list[TrialStatus]) -> list[Trial]:
    """Trials to start now: within parallelism and the total; a search asks Optuna one trial at a time."""
    spec = parsed.spec
    running = sum(t.phase not in FINISHED_TRIAL_PHASES for t in trials)
    slots = min(spec.max_parallel - running, spec.total_trials - len(trials))
    out: list[Trial] = []
    if slots <= 0:
        return out
    if spec.arms is not None:
        started = {t.name for t in trials}
        return [t for t in arm_trials(parsed) if t.name not in started][:slots]
    history = list(trials)
    for _ in range(slots):
        trial = search_trial(parsed, len(history), next_params(spec, history))
        out.append(trial)
        history.append(_new_status(trial).model_copy(update={"phase": TrialPhase.pending.value}))
    return out


def _prune(parsed: RLExperiment, trials: list[TrialStatus], plan: ExperimentPlan) -> list[TrialStatus]:
    """Stop running trials whose policy collapsed (``pruneCollapsed``) or that fall below the median of the
    others at a rung (median rule)."""
    spec = parsed.spec
    if spec.early_stopping is None and not spec.prune_collapsed:
        return trials
    curves = {t.name: [(p.step, p.value) for p in t.curve] for t in trials if t.curve}
    max_steps = spec.template.training.max_steps
    out = []
    for t in trials:
        if t.phase == TrialPhase.running.value:
            if spec.prune_collapsed and (why := collapse_prune_message(t.health)) is not None:
                t = _pruned(t, t.steps, why, plan)
            elif (decision := should_prune(t.name, curves, spec.objective, spec.early_stopping, max_steps)):
                t = _pruned(t, decision.step, decision.message, plan)
        out.append(t)
    return out


def _pruned(trial: TrialStatus, step: int | None, why: str, plan: ExperimentPlan) -> TrialStatus:
    """``trial`` stopped at ``step`` for ``why``: suspended, and an Event says so."""
    plan.suspend.append(trial.name)
    plan.events.append(Event("Normal", "TrialPruned", f"trial {trial.name} pruned: {why}"))
    return trial.model_copy(update={"phase": TrialPhase.pruned.value, "pruned": True, "pruned_at_step": step,
                                    "message": bounded_message(why)})


def _refused(parsed: RLExperiment, trial: Trial, profile: PodProfile | None) -> list[str]:
    """The platform's pod profile applies to trials as to any job: the operator creates them, not the user. What the
    job itself asks is judged here; its pods, shaped by its runtime, are judged when each trial job is reconciled."""
    if profile is None:
        return []
    job = RLTrainingJob.model_validate({"metadata": {"name": trial.name}, "spec": trial.spec.model_dump(by_alias=True)})
    return [v.replace("spec.", "spec.template.", 1) for v in job_violations(job, profile)]


def plan_experiment(experiment: dict[str, Any], parsed: RLExperiment, jobs: list[dict[str, Any]],
                    now: str, profile: PodProfile | None = None) -> ExperimentPlan:
    """The experiment's next step from its status and the jobs that carry its label at ``now`` (a trial's own
    job by its recorded UID; any other is a conflict)."""
    previous = exp_api.RLExperimentStatus.model_validate(experiment.get("status") or {})
    if previous.phase == ExperimentPhase.failed and previous.observed_generation == experiment["metadata"].get(
            "generation"):
        # Failed is final for this spec (a refused trial would be refused again); a changed spec tries again.
        return ExperimentPlan(status=dict(experiment.get("status") or {}), now=now)
    by_name, conflicts = trial_jobs_and_conflicts(previous.trials, jobs)
    plan = ExperimentPlan(status={}, now=now, conflicts=conflicts)
    trials = []
    for old in previous.trials:
        new = observe_trial(old, by_name.get(old.name), parsed)
        if new.phase == TrialPhase.failed.value and old.phase != new.phase:
            plan.events.append(Event("Warning", "TrialFailed", f"trial {new.name} failed: {new.message}"))
        if collapsed(new.health) and not collapsed(old.health):
            plan.events.append(Event("Warning", "TrialCollapsed", f"trial {new.name}: its policy collapsed "
                                     f"({', '.join(new.health)}; docs/guides/health.md)"))
        trials.append(new)
    trials = _prune(parsed, trials, plan)
    # Recorded before a crash (or a refused create) but never created: created now, as recorded.
    for t in trials:
        if t.phase == TrialPhase.pending.value and t.name not in by_name and t.name not in conflicts:
            plan.create.append(trial_job(experiment, parsed, _recorded(parsed, t)))
    failed = sum(t.phase == TrialPhase.failed.value for t in trials)
    if failed > _max_failed(parsed):
        return _finish(plan, parsed, trials, experiment, ExperimentPhase.failed, "TooManyFailedTrials",
                       f"{failed} trials failed (at most {_max_failed(parsed)} may)")
    for trial in _next_trials(parsed, trials):
        refused = _refused(parsed, trial, profile)
        if refused:
            return _finish(plan, parsed, trials, experiment, ExperimentPhase.failed, "PolicyViolation",
                           "the platform's pod profile refuses the trials: " + "; ".join(refused))
        trials.append(_new_status(trial))
        plan.create.append(trial_job(experiment, parsed, trial))
        what = f"arm {trial.arm} seed {trial.seed}" if trial.arm else f"params {trial.params}"
        plan.events.append(Event("Normal", "TrialStarted", f"trial {trial.name} started ({what})"))
    done = sum(t.phase in FINISHED_TRIAL_PHASES for t in trials)
    if done >= parsed.spec.total_trials:
        return _finish(plan, parsed, trials, experiment, ExperimentPhase.succeeded, "TrialsFinished",
                       f"all {done} trials finished")
    return _finish(plan, parsed, trials, experiment, ExperimentPhase.running, "TrialsRunning",
                   f"{done}/{parsed.spec.total_trials} trials finished")


def _finish(plan: ExperimentPlan, parsed: RLExperiment, trials: list[TrialStatus], experiment: dict[str, Any],
            phase: ExperimentPhase, reason: str, message: str) -> ExperimentPlan:
    """Fill in the status (standings, conditions, summary) and the WinnerFound event."""
    previous = (experiment.get("status") or {})
    ranked = standings(parsed.spec, trials)
    best_name = ranked.winner.arm if ranked.winner else (
        ranked.leaderboard[0].name if ranked.leaderboard else None)
    done = sum(t.phase in FINISHED_TRIAL_PHASES for t in trials)
    total = parsed.spec.total_trials
    status = exp_api.RLExperimentStatus(
        phase=phase, reason=reason, message=message,
        observed_generation=experiment["metadata"].get("generation"), trials_total=total, trials_done=done,
        summary=f"{done}/{total}", trials=trials, arms=ranked.arms, leaderboard=ranked.leaderboard,
        best=ranked.best, best_name=best_name,
        best_objective=ranked.leaderboard[0].objective if ranked.leaderboard else None, winner=ranked.winner,
        conditions=_conditions(phase, reason, message, plan.conflicts, previous.get("conditions") or [], plan.now),
        conflicts=plan.conflicts[:MAX_CONFLICTS_LISTED],
    )
    plan.status = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    for name in sorted(set(status.conflicts) - set(previous.get("conflicts") or [])):  # the listed: once each
        plan.events.append(Event("Warning", "TrialConflict", _conflict_message(experiment, name)))
    if ranked.winner is not None and not previous.get("winner"):
        plan.events.append(Event("Normal", "WinnerFound", f"arm {ranked.winner.arm} wins: {ranked.winner.message}"))
    if phase != previous.get("phase") and phase in (ExperimentPhase.succeeded, ExperimentPhase.failed):
        kind = "Normal" if phase == ExperimentPhase.succeeded else "Warning"
        plan.events.append(Event(kind, reason, message))
    plan.requeue_after = None if phase in (ExperimentPhase.succeeded, ExperimentPhase.failed) else RECHECK_SECONDS
    return plan


def _conflict_message(experiment: dict[str, Any], name: str) -> str:
    return (f"RLTrainingJob {name} carries the label of experiment {experiment['metadata']['name']} but the "
            "experiment did not create it (its UID is no trial's): it is not counted; delete it if it squats a "
            "trial's name")


def _conditions(phase: ExperimentPhase, reason: str, message: str, conflicts: list[str],
                previous: list[dict[str, Any]], now: str) -> list[Condition]:
    """kstatus conditions: Ready (finished well), Reconciling (trials running), Stalled (failed); TrialConflict
    (jobs that carry the experiment's label but are no trial of it)."""
    clash = (f"{len(conflicts)} RLTrainingJob(s) carry the experiment's label but are no trial of it "
             f"(not counted): {', '.join(conflicts[:MAX_CONFLICTS_LISTED])}") if conflicts else "none"
    wanted = [
        ("Ready", phase == ExperimentPhase.succeeded, reason, message),
        ("Reconciling", phase in (ExperimentPhase.pending, ExperimentPhase.running), reason, message),
        ("Stalled", phase == ExperimentPhase.failed, reason, message),
        ("TrialConflict", bool(conflicts), "JobsNotCreatedByExperiment" if conflicts else "NoConflict", clash),
    ]
    return [condition(kind, true, why, what, previous=previous, now=now) for kind, true, why, what in wanted]


def selector(name: str) -> str:
    """The label selector of an experiment's trial jobs."""
    return f"{LABEL_EXPERIMENT}={name}"

