"""Run records beside the checkpoints (``rljob_contract.history``): written by rank 0 when a run ends,
read back by ``rljob history`` after the custom resources are gone.

Writing never fails a run (a location that refuses the record is a warning); reading treats every file
as hostile: each is parsed strictly, and a bad one is skipped and named, never the end of the listing.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

from rljob_contract.history import (
    MAX_RECORD_BYTES,
    MAX_RECORDS,
    BadRecord,
    CheckpointPointer,
    RunRecord,
    dump_record,
    is_record_key,
    parse_record,
    record_name,
    spec_hash,
)
from rljob_contract.spec import TrainerConfig

from rljob_trainer.checkpoints.locations import Location

log = logging.getLogger("rljob.history")


def _finite(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _pointer(ref: dict[str, Any] | None) -> CheckpointPointer | None:
    if not ref:
        return None
    value = ref.get("value")
    return CheckpointPointer(name=ref["name"], step=ref["step"], location=ref.get("location"), metric=ref.get("metric"),
                             value=float(value) if isinstance(value, int | float) and math.isfinite(value) else None)


def final_and_best(summary: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(the last reward and final evaluation's values, the best reward and the best evaluation's values)."""
    rewards = [r for _, r in summary.get("reward_history") or [] if math.isfinite(r)]
    final = _finite({"reward": summary.get("reward_last")})
    best = {"reward": max(rewards)} if rewards else {}
    evaluation = summary.get("eval") or {}
    final.update(_finite({k: v for k, v in (evaluation.get("latest") or {}).items() if k != "step"}))
    best.update(_finite({k: v for k, v in (evaluation.get("best") or {}).items() if k != "step"}))
    return final, best


def run_record(cfg: TrainerConfig, summary: dict[str, Any], started: float, stopped: bool) -> RunRecord:
    """The record of a run that ended now (``stopped``: by a signal, after a checkpoint)."""
    final, best = final_and_best(summary)
    algorithm = summary.get("algorithm")
    return RunRecord(
        job=cfg.job_name, namespace=cfg.namespace, spec_hash=spec_hash(cfg.training),
        phase="Stopped" if stopped else "Succeeded",
        started=datetime.fromtimestamp(started, UTC), finished=datetime.now(UTC),
        wall_seconds=float(summary.get("wall_seconds") or 0.0), steps=int(summary.get("steps") or 0),
        algorithm=str(algorithm.get("name") if isinstance(algorithm, dict) else cfg.training.algorithm),
        model=cfg.training.model, final=final, best=best,
        latest_checkpoint=_pointer(summary.get("latest_checkpoint")),
        best_checkpoint=_pointer(summary.get("best_checkpoint")),
        checkpoints=list(summary.get("checkpoints") or []),
        tracking={k: str(v) for k, v in ((summary.get("tracking") or {}).get("runs") or {}).items()},
    )


def write_record(record: RunRecord, locations: list[Location]) -> list[str]:
    """The record at ``runs/<started>-<hash>.json`` under every location; the URIs written (a failure is a
    warning: the run's checkpoints and summary are what matter)."""
    body, rel, written = dump_record(record), record_name(record), []
    for location in locations:
        try:
            written.append(location.put_small(rel, body))
        except Exception as e:
            log.warning("run record: not written to %s: %s", location.uri, e)
    return written


def read_records(location: Location, most: int = MAX_RECORDS) -> tuple[list[tuple[str, RunRecord]], list[BadRecord]]:
    """Every run record under ``location`` at any depth (oldest first by start), and the files that are not records."""
    good: list[tuple[str, RunRecord]] = []
    bad: list[BadRecord] = []
    for uri, body in location.small_files(is_record_key, MAX_RECORD_BYTES, most):
        if body is None:
            continue
        try:
            good.append((uri, parse_record(body, uri)))
        except BadRecord as e:
            bad.append(e)
    good.sort(key=lambda item: (item[1].started, item[0]))
    return good, bad
