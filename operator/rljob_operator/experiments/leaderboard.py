"""Ranks, per-arm intervals, the best trial and the winning arm, from the trials' status (pure).

A trial whose policy collapsed (``experiments.health``) is ranked but counted in its row's ``collapsed``,
and the winner's message says when the winner or the runner-up rests on such trials.
Only trials that finished normally (Succeeded, with an objective) are ranked: a pruned trial's
objective covers fewer steps, and a failed one has none. A search's leaderboard lists them by
objective; an A/B test's lists arms by mean objective over their seeds, with the interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rljob_contract.experiment import (
    FINISHED_TRIAL_PHASES,
    ArmStatus,
    BestTrial,
    LeaderboardEntry,
    RLExperimentSpec,
    TrialPhase,
    TrialStatus,
    Winner,
)

from rljob_operator.experiments.health import collapse_note, count_collapsed
from rljob_operator.experiments.objective import sort_key
from rljob_operator.experiments.stats import compare, mean_ci95


def ranked_trials(spec: RLExperimentSpec, trials: Sequence[TrialStatus]) -> list[TrialStatus]:
    """Succeeded trials with an objective, best first (ties: the earlier trial first)."""
    done = [t for t in trials if t.phase == TrialPhase.succeeded.value and t.objective is not None]
    return sorted(done, key=lambda t: (sort_key(t.objective, spec.objective.direction), t.number))


def arm_statuses(spec: RLExperimentSpec, trials: Sequence[TrialStatus]) -> list[ArmStatus]:
    """Each arm's mean objective and 95 % interval over its succeeded trials (in spec order)."""
    out = []
    for arm in spec.arms or []:
        mine = [t for t in trials if t.arm == arm.name]
        ranked = ranked_trials(spec, mine)
        interval = mean_ci95([t.objective for t in ranked if t.objective is not None])
        out.append(ArmStatus(name=arm.name, n=interval.n, mean=interval.mean, ci95_low=interval.low,
                             ci95_high=interval.high, note=interval.note, trials=[t.name for t in mine],
                             collapsed=count_collapsed(ranked)))
    return out


def leaderboard(spec: RLExperimentSpec, trials: Sequence[TrialStatus],
                arms: Sequence[ArmStatus] | None = None) -> list[LeaderboardEntry]:
    """Arms by mean objective (A/B test) or trials by objective (search), best first."""
    direction = spec.objective.direction
    if spec.arms is not None:
        arms = arm_statuses(spec, trials) if arms is None else arms
        order = sorted((a for a in arms if a.mean is not None), key=lambda a: sort_key(a.mean, direction))
        return [LeaderboardEntry(rank=i + 1, name=a.name, objective=a.mean, ci95_low=a.ci95_low,
                                 ci95_high=a.ci95_high, n=a.n, collapsed=a.collapsed) for i, a in enumerate(order)]
    return [LeaderboardEntry(rank=i + 1, name=t.name, objective=t.objective, n=1, collapsed=count_collapsed([t]))
            for i, t in enumerate(ranked_trials(spec, trials))]


def best_trial(spec: RLExperimentSpec, trials: Sequence[TrialStatus]) -> BestTrial | None:
    """The best succeeded trial, with its checkpoint; None before any has finished."""
    ranked = ranked_trials(spec, trials)
    if not ranked or ranked[0].objective is None:
        return None
    t = ranked[0]
    return BestTrial(trial=t.name, objective=t.objective, checkpoint=t.checkpoint, params=t.params, arm=t.arm)


def winner(spec: RLExperimentSpec, trials: Sequence[TrialStatus],
           arms: Sequence[ArmStatus] | None = None) -> Winner | None:
    """The arm with the best mean and whether it beats the runner-up significantly (Welch's t-test).

    Decided only once every trial has finished; None for a search, or while trials still run.
    """
    if spec.arms is None or len(trials) < spec.total_trials or any(
            t.phase not in FINISHED_TRIAL_PHASES for t in trials):
        return None
    board = leaderboard(spec, trials, arms)
    if not board:
        return None
    if len(board) == 1:
        note = collapse_note(board[0].name, board[0].collapsed, board[0].n, None, 0, 0)
        return Winner(arm=board[0].name, test="none: only one arm has results",
                      message=f"{board[0].name} is the only arm with finished trials{note}")
    ranked = {t.arm: [] for t in trials}  # type: dict[str | None, list[float]]
    for t in ranked_trials(spec, trials):
        ranked[t.arm].append(t.objective or 0.0)
    first, second = board[0], board[1]
    c = compare(ranked[first.name], ranked[second.name], first.name, second.name)
    note = collapse_note(first.name, first.collapsed, first.n, second.name, second.collapsed, second.n)
    return Winner(arm=first.name, runner_up=second.name, significant=c.significant, test=c.test, p_value=c.p_value,
                  message=c.message + note)


@dataclass(frozen=True)
class Standings:
    """Everything ranked at once (what the status carries besides the trials)."""

    arms: list[ArmStatus]
    leaderboard: list[LeaderboardEntry]
    best: BestTrial | None
    winner: Winner | None


def standings(spec: RLExperimentSpec, trials: Sequence[TrialStatus]) -> Standings:
    """Arms, leaderboard, best trial and winner of ``trials``."""
    arms = arm_statuses(spec, trials)
    return Standings(arms, leaderboard(spec, trials, arms), best_trial(spec, trials), winner(spec, trials, arms))
