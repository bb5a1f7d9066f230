"""A trial's curve (its metric by step) → the one number trials are ranked by (pure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from rljob_contract.experiment import (
    MAX_CURVE_POINTS,
    CurvePoint,
    Direction,
    ObjectiveSpec,
    Reduce,
    TrialStatus,
)

Curve = Sequence[tuple[int, float]]


def clean_curve(points: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """Points sorted by step; NaN and infinite values dropped; where a step repeats (a resumed run
    logs it again) the last value wins."""
    by_step: dict[int, float] = {}
    for step, value in points:
        if value is not None and math.isfinite(float(value)):
            by_step[int(step)] = float(value)
    return sorted(by_step.items())


def curve_from_logs(records: Iterable[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """The ``metric`` curve from logged records (TRL log entries with ``step``); others are skipped."""
    points = []
    for record in records:
        value, step = record.get(metric), record.get("step")
        if isinstance(value, int | float) and not isinstance(value, bool) and isinstance(step, int):
            points.append((step, float(value)))
    return clean_curve(points)


def objective_value(curve: Curve, objective: ObjectiveSpec, upto: int | None = None) -> float | None:
    """The objective of ``curve`` (only its points at steps ≤ ``upto`` when given); None without data.

    * ``lastMean``: the mean of the last ``k`` values (fewer when fewer were logged);
    * ``atStep``: the value at ``step``, else the last one before it (a curve that has not got there
      yet counts with what it has so far);
    * ``area``: the trapezoid area under the curve divided by the steps it spans, i.e. a mean over
      steps that weighs a slow start; a single point is its own value.
    """
    points = clean_curve(curve)
    if upto is not None:
        points = [p for p in points if p[0] <= upto]
    if objective.reduce == Reduce.at_step:
        points = [p for p in points if p[0] <= (objective.step or 0)]
    if not points:
        return None
    values = [v for _, v in points]
    if objective.reduce == Reduce.last_mean:
        tail = values[-objective.k:]
        return sum(tail) / len(tail)
    if objective.reduce == Reduce.at_step or len(points) == 1:
        return values[-1]
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:], strict=False))
    return area / (points[-1][0] - points[0][0])


def is_better(a: float, b: float, direction: str) -> bool:
    """``a`` beats ``b`` (strictly) under ``direction``."""
    return a > b if direction == Direction.maximize.value else a < b


def sort_key(value: float | None, direction: str) -> float:
    """Key that sorts objectives best first (missing ones last)."""
    if value is None:
        return math.inf
    return -value if direction == Direction.maximize.value else value


def thin(curve: Curve, max_points: int) -> list[tuple[int, float]]:
    """At most ``max_points`` points of ``curve``, evenly spread, the first and the last kept."""
    points = list(curve)
    if len(points) <= max_points:
        return points
    if max_points < 2:
        return points[-max_points:] if max_points else []
    last = len(points) - 1
    picks = sorted({round(i * last / (max_points - 1)) for i in range(max_points)})
    return [points[i] for i in picks]


def record_point(trial: TrialStatus, step: int, value: float | None, objective: ObjectiveSpec) -> TrialStatus:
    """``trial`` with one more observation of its metric (a heartbeat's step and reward): the curve
    gains (or updates) the point, is thinned to MAX_CURVE_POINTS, and steps and objective follow.
    A missing or non-finite value only moves ``steps``."""
    points = [(p.step, p.value) for p in trial.curve]
    if value is not None and math.isfinite(value):
        points.append((step, value))
    curve = thin(clean_curve(points), MAX_CURVE_POINTS)
    return trial.model_copy(update={
        "curve": [CurvePoint(step=s, value=v) for s, v in curve],
        "steps": max(step, trial.steps or 0),
        "objective": objective_value(curve, objective),
    })
