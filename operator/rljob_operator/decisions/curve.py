"""A job's progress curve (``status.progress.curve``): bounded, finite, step-monotonic (pure).

Heartbeats carry the latest logged step's reward, loss and other metrics; the status API turns
each into a point and merges it here into the curve the job's status keeps, so that experiments
can compute objectives and prune from the status alone (the operator keeps no state of its own).

* Only finite numbers are kept (JSON has no NaN; a NaN loss is dropped, the point stays).
* Steps strictly increase: a point at the last point's step updates it (the final heartbeat
  repeats the last step; its metrics come first, the earlier ones fill up to the 32 the CRD
  allows); a point at an earlier step means the trainer resumed from an older checkpoint, so the
  points after it are dropped (they belong to the abandoned run).
* At most ``MAX_CURVE_POINTS``: when full, every second point is dropped (first and last kept),
  so the curve always spans the whole run evenly at half the resolution; from then on a new point
  closer to the one before the last than the curve's spacing replaces the last (a moving tail
  with the latest values) instead of crowding the end.
* Evaluations on held-out data (points with ``eval/`` metrics) are kept through both while there
  are at most half as many as the limit (50: a run evaluated every 10 steps keeps them all up to
  step 500), so an ``eval/`` objective's curve, and the rungs pruning judges it at, have every
  evaluation; more are thinned with the rest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from rljob_contract.job import MAX_CURVE_POINTS
from rljob_contract.pod import MAX_HEARTBEAT_METRICS
from rljob_contract.spec import EVAL_PREFIX


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def curve_point(step: int, reward: Any = None, loss: Any = None,
                metrics: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """One curve point (status JSON, camelCase) from a heartbeat's values; None when it has no finite value."""
    point: dict[str, Any] = {"step": int(step)}
    for key, value in (("reward", reward), ("loss", loss)):
        number = _finite(value)
        if number is not None:
            point[key] = number
    finite = {k: v for k, v in ((k, _finite(v)) for k, v in (metrics or {}).items()) if v is not None}
    if finite:
        point["metrics"] = finite
    return point if len(point) > 1 else None


def evaluated(point: Mapping[str, Any]) -> bool:
    """Whether ``point`` carries an evaluation on held-out data (an ``eval/`` metric)."""
    return any(str(name).startswith(EVAL_PREFIX) for name in point.get("metrics") or {})


def _kept_evaluations(points: list[dict[str, Any]], limit: int) -> bool:
    """Whether ``points`` hold few enough evaluations (at most half of ``limit``) to keep every one."""
    return sum(1 for p in points if evaluated(p)) <= limit // 2


def _halve(points: list[dict[str, Any]], keep_evaluations: bool) -> list[dict[str, Any]]:
    """Every second point dropped, the last kept; with ``keep_evaluations``, every second of the others."""
    if not keep_evaluations:
        return points[:-1:2] + [points[-1]]
    out: list[dict[str, Any]] = []
    others = 0
    for point in points[:-1]:
        if evaluated(point):
            out.append(point)
            continue
        if others % 2 == 0:
            out.append(point)
        others += 1
    return out + [points[-1]]


def decimate(points: list[dict[str, Any]], limit: int = MAX_CURVE_POINTS) -> list[dict[str, Any]]:
    """Halve ``points`` (keep the even indices and the last, and every evaluation while they are at most half
    of ``limit``: then the other points are halved) until at most ``limit`` remain."""
    keep = _kept_evaluations(points, limit)
    while len(points) > max(limit, 2):
        points = _halve(points, keep)
    return points


def _merged(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A repeated step: ``new``'s values over ``old``'s; metrics too, ``new``'s first, at most
    MAX_HEARTBEAT_METRICS (the CRD's maxProperties: a step repeated with other names must not grow it)."""
    metrics = {**new.get("metrics", {})}
    for key, value in (old.get("metrics") or {}).items():
        if len(metrics) >= MAX_HEARTBEAT_METRICS:
            break
        metrics.setdefault(key, value)
    point = {**old, **new, "metrics": metrics}
    if not metrics:
        del point["metrics"]
    return point


def _is_tail(out: list[dict[str, Any]]) -> bool:
    """Whether the last point sits closer to the one before it than the curve's spacing (a moving tail)."""
    if len(out) < 3:
        return False
    spacing = min(b["step"] - a["step"] for a, b in zip(out[:-2], out[1:-1], strict=True))
    return bool(out[-1]["step"] - out[-2]["step"] < spacing)


def merge_curve(curve: Iterable[Mapping[str, Any]], points: Iterable[Mapping[str, Any]],
                limit: int = MAX_CURVE_POINTS) -> list[dict[str, Any]]:
    """``curve`` with ``points`` (in arrival order) merged in: finite, strictly increasing steps, ≤ ``limit``."""
    out: list[dict[str, Any]] = []
    for raw in [*curve, *points]:
        step = raw.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            continue
        point = curve_point(step, raw.get("reward"), raw.get("loss"), raw.get("metrics"))
        if point is None:
            continue
        rewound = bool(out) and out[-1]["step"] > step
        while out and out[-1]["step"] > step:  # resumed from an older checkpoint: that run is gone
            out.pop()
        if rewound and out and out[-1]["step"] == step:
            out.pop()  # the abandoned run's point at this very step goes too
        elif out and out[-1]["step"] == step:
            point = _merged(out.pop(), point)
        elif _is_tail(out) and not (evaluated(out[-1]) and _kept_evaluations(out, limit)):
            out.pop()
        out.append(point)
        if len(out) > limit:
            out = decimate(out, limit)
    return out


def series(curve: Iterable[Mapping[str, Any]], metric: str = "reward") -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` along a curve (``reward``, ``loss`` or a logged metric's name)."""
    out = []
    for point in curve:
        value = point.get(metric) if metric in ("reward", "loss") else (point.get("metrics") or {}).get(metric)
        number = _finite(value)
        if number is not None and isinstance(point.get("step"), int):
            out.append((int(point["step"]), number))
    return out
