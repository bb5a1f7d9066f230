"""Which checkpoints a location keeps: keepLast + keepBest, decided by pure functions.

The decision is made here and nowhere else. It is applied by one method,
:meth:`rljob_trainer.checkpoints.locations.Location.apply_retention`, for every kind of location:
the trainer's local folder (a local primary, or the staging folder in front of object storage),
buckets, mirrors — and for ``rljob checkpoints prune``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rljob_contract.spec import DEFAULT_BEST_METRIC

from rljob_trainer.checkpoints.manifest import CheckpointInfo, step_of


@dataclass(frozen=True)
class RetentionPolicy:
    """``spec.checkpoint.keepLast``/``keepBest``/``bestMetric`` (higher is better)."""

    keep_last: int
    keep_best: int = 0
    best_metric: str = DEFAULT_BEST_METRIC


def retention_keep(
    checkpoints: list[CheckpointInfo],
    keep_last: int,
    keep_best: int = 0,
    best_metric: str = DEFAULT_BEST_METRIC,
    protect: set[str] | None = None,
) -> set[str]:
    """Names to keep: the newest ``keep_last``, the best ``keep_best`` by ``best_metric``
    (higher is better), the newest one always, and any in ``protect`` (a resume source)."""
    ordered = sorted(checkpoints, key=lambda c: c.step)
    keep = {c.name for c in ordered[-max(1, keep_last) :]}
    if keep_best > 0:
        scored = [c for c in ordered if best_metric in c.metrics]
        scored.sort(key=lambda c: (c.metrics[best_metric], c.step), reverse=True)
        keep |= {c.name for c in scored[:keep_best]}
    return keep | (protect or set())


def retention_plan(
    complete: list[CheckpointInfo],
    incomplete: list[str],
    keep_last: int,
    keep_best: int = 0,
    best_metric: str = DEFAULT_BEST_METRIC,
    protect: set[str] | None = None,
) -> list[str]:
    """Names to delete at one location, oldest first: complete checkpoints outside the kept set, and
    incomplete ones older than the newest complete one (debris of a crash or a failed upload; a newer
    incomplete one may still be being written). Pure, so local folders and bucket listings share it."""
    if not complete:
        return []
    keep = retention_keep(complete, keep_last, keep_best, best_metric, protect)
    newest = max(c.step for c in complete)
    doomed = [c.name for c in complete if c.name not in keep]
    doomed += [n for n in incomplete if (s := step_of(n)) is not None and s < newest and n not in keep]
    return sorted(doomed, key=lambda n: step_of(n) or 0)


def best_of(complete: list[CheckpointInfo], metric: str) -> CheckpointInfo | None:
    """The complete checkpoint with the highest ``metric`` (the newer one on a tie), or None."""
    scored = [c for c in complete if metric in c.metrics]
    return max(scored, key=lambda c: (c.metrics[metric], c.step)) if scored else None
