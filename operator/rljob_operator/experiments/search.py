"""The next parameters of a search: an Optuna study rebuilt from the trials at every decision (pure).

Nothing is stored between decisions (no Optuna storage, no database): each call builds an
in-memory study, tells it every trial so far (``create_trial`` + ``add_trial``: finished ones
with their objective, pruned ones with their curve, failed ones as failed, running ones as
running) and asks once. The sampler is seeded from ``search.seed`` and ``len(trials)``, so the same
spec and the same history ask the same parameters: an operator that restarts between deciding
and creating a trial asks again and gets what it would have created.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from rljob_contract.experiment import (
    Direction,
    ParameterType,
    RLExperimentSpec,
    SearchAlgorithm,
    SearchParameter,
    SearchSpec,
    TrialPhase,
    TrialStatus,
)

from rljob_operator.experiments.objective import objective_value


def distribution(parameter: SearchParameter) -> Any:
    """The Optuna distribution of one parameter."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if parameter.type == ParameterType.categorical:
        return CategoricalDistribution(list(parameter.values or []))
    low, high = float(parameter.min or 0), float(parameter.max or 0)
    if parameter.type == ParameterType.int:
        return IntDistribution(int(low), int(high), log=parameter.log, step=parameter.step or 1)
    return FloatDistribution(low, high, log=parameter.log)


def sampler(search: SearchSpec, history: int) -> Any:
    """The search's sampler, seeded from ``search.seed`` and the number of trials so far.

    TPE starts modelling after half the trials (at most 10) have run at random, so a short search
    still gets some guided trials; Optuna's default waits for 10.
    """
    import optuna

    # Mixed rather than added, so that seeds 0 and 1 do not ask the same values one trial apart.
    seed = (search.seed * 1_000_003 + history) % 2**32
    if search.algorithm == SearchAlgorithm.random:
        return optuna.samplers.RandomSampler(seed=seed)
    startup = max(1, min(10, search.max_trials // 2))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)


def _frozen(trial: TrialStatus, spec: RLExperimentSpec, distributions: dict[str, Any]) -> Any:
    """A trial of the status as an Optuna FrozenTrial; None when its parameters no longer fit."""
    from optuna.trial import TrialState, create_trial

    params = trial.params or {}
    if set(params) != set(distributions):
        return None
    curve = [(p.step, p.value) for p in trial.curve]
    steps = sorted({s for s, _ in curve})
    intermediate = {s: v for s in steps if (v := objective_value(curve, spec.objective, upto=s)) is not None}
    kwargs: dict[str, Any] = {"params": params, "distributions": distributions, "intermediate_values": intermediate}
    if trial.phase == TrialPhase.succeeded.value and trial.objective is not None:
        state, kwargs["value"] = TrialState.COMPLETE, trial.objective
    elif trial.phase == TrialPhase.pruned.value:
        state = TrialState.PRUNED
    elif trial.phase in (TrialPhase.failed.value, TrialPhase.succeeded.value):
        state = TrialState.FAIL  # a success without an objective logged nothing to learn from
    else:
        state = TrialState.RUNNING
    try:
        return create_trial(state=state, **kwargs)
    except ValueError:
        return None  # its parameters lie outside the search space (the spec changed since it ran)


def rebuild_study(spec: RLExperimentSpec, trials: Sequence[TrialStatus]) -> Any:
    """An in-memory Optuna study holding ``trials`` (the status's), with the seeded sampler."""
    import optuna

    search = spec.search
    if search is None:
        raise ValueError("rebuild_study: the experiment has no search")
    optuna.logging.set_verbosity(logging.WARNING)
    distributions = {p.name: distribution(p) for p in search.parameters}
    maximize = spec.objective.direction == Direction.maximize.value
    direction = optuna.study.StudyDirection.MAXIMIZE if maximize else optuna.study.StudyDirection.MINIMIZE
    study = optuna.create_study(direction=direction, sampler=sampler(search, len(trials)))
    for trial in trials:
        frozen = _frozen(trial, spec, distributions)
        if frozen is not None:
            study.add_trial(frozen)
    return study


def next_params(spec: RLExperimentSpec, trials: Sequence[TrialStatus]) -> dict[str, Any]:
    """The parameters of the next trial: deterministic for the spec and the trials so far."""
    search = spec.search
    if search is None:
        raise ValueError("next_params: the experiment has no search")
    study = rebuild_study(spec, trials)
    asked = study.ask({p.name: distribution(p) for p in search.parameters})
    return dict(asked.params)
