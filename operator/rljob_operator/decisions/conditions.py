"""Conditions of a job (pure).

Conditions are kstatus-compatible: ``Ready``, ``Reconciling`` and ``Stalled``, plus one per
terminal or paused phase (``Succeeded``, ``Failed``, ``Suspended``); each carries the
``observedGeneration`` it describes and keeps its ``lastTransitionTime`` until its status flips.
A seventh, ``CheckpointsDurable``, says whether checkpoints outlive the gang
(``checkpoints.durability``); kstatus ignores it, ``kubectl describe`` and the printer column show it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rljob.contract.job import Phase
from rljob_operator.decisions.checkpoints import CONDITION as CHECKPOINTS_CONDITION
from rljob_operator.decisions.checkpoints import Durability
from rljob_operator.times import rfc3339

CONDITION_TYPES = ("Ready", "Reconciling", "Stalled", "Succeeded", "Failed", "Suspended")
#: Reasons of a gang restarted because it stopped making progress (the Stalled condition).
STALL_REASONS = frozenset({"HeartbeatTimeout", "StartupTimeout"})


def make_conditions(
    phase: str,
    reason: str,
    message: str,
    *,
    ready: bool,
    reconciling: bool,
    generation: int | None,
    previous: list[dict[str, Any]],
    now: datetime,
    stalled: bool | None = None,
) -> list[dict[str, Any]]:
    """The six conditions for a phase; unchanged ones keep their lastTransitionTime.

    ``Stalled`` is True for a failed job and, when ``stalled`` says so, for a gang restarted
    because its heartbeats stopped.
    """
    before = {c.get("type"): c for c in previous}
    truth = {
        "Ready": ready,
        "Reconciling": reconciling,
        "Stalled": phase == Phase.failed.value if stalled is None else stalled,
        "Succeeded": phase == Phase.succeeded.value,
        "Failed": phase == Phase.failed.value,
        "Suspended": phase == Phase.suspended.value,
    }
    out = []
    for kind in CONDITION_TYPES:
        status = "True" if truth[kind] else "False"
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or rfc3339(now),
                "observedGeneration": generation,
            }
        )
    return out


def checkpoints_condition(
    durability: Durability | None, *, generation: int | None, previous: list[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """The ``CheckpointsDurable`` condition (a list of one, or none).

    A status written without looking at the spec (``durability`` None: an invalid spec, a refused
    create) keeps the stored condition as it is, since a status write replaces the whole list.
    """
    old = next((c for c in previous if c.get("type") == CHECKPOINTS_CONDITION), None)
    if durability is None:
        return [dict(old)] if old is not None else []
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == durability.status else None
    return [{
        "type": CHECKPOINTS_CONDITION,
        "status": durability.status,
        "reason": durability.reason,
        "message": durability.message,
        "lastTransitionTime": since or rfc3339(now),
        "observedGeneration": generation,
    }]
