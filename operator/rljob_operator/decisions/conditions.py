"""Conditions of a job (pure).

Conditions are kstatus-compatible: ``Ready``, ``Reconciling`` and ``Stalled``, plus one per
terminal or paused phase (``Succeeded``, ``Failed``, ``Suspended``); each carries the
``observedGeneration`` it describes and keeps its ``lastTransitionTime`` until its status flips.
A seventh, ``CheckpointsDurable``, says whether checkpoints outlive the gang
(``checkpoints.durability``); kstatus ignores it, ``kubectl describe`` and the printer column show it.
An experiment's conditions (``decisions.experiments``) come from the same builder, :func:`condition`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rljob_contract.job import Condition, Phase

from rljob_operator.decisions.checkpoints import CONDITION as CHECKPOINTS_CONDITION
from rljob_operator.decisions.checkpoints import Durability
from rljob_operator.times import rfc3339

CONDITION_TYPES = ("Ready", "Reconciling", "Stalled", "Succeeded", "Failed", "Suspended")
#: Reasons of a gang restarted because it stopped making progress (the Stalled condition).
STALL_REASONS = frozenset({"HeartbeatTimeout", "StartupTimeout"})


def condition(kind: str, true: bool, reason: str, message: str, *, previous: Sequence[Mapping[str, Any]],
              now: str, generation: int | None = None) -> Condition:
    """Condition ``kind`` of a job or an experiment: the one builder of conditions.

    It keeps the ``lastTransitionTime`` of ``previous`` (the stored conditions) while its status
    stays, else it is ``now`` (RFC 3339); ``generation``: the ``observedGeneration`` it describes
    (an experiment's conditions carry none).
    """
    status = "True" if true else "False"
    old = next((c for c in previous if c.get("type") == kind), None) or {}
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return Condition(type=kind, status=status, reason=reason, message=message,
                     last_transition_time=since or now, observed_generation=generation)


def make_conditions(
    phase: str,
    reason: str,
    message: str,
    *,
    ready: bool,
    reconciling: bool,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]],
    now: datetime,
    stalled: bool | None = None,
) -> list[Condition]:
    """The six conditions for a phase; unchanged ones keep their lastTransitionTime.

    ``Stalled`` is True for a failed job and, when ``stalled`` says so, for a gang restarted
    because its heartbeats stopped.
    """
    truth = {
        "Ready": ready,
        "Reconciling": reconciling,
        "Stalled": phase == Phase.failed.value if stalled is None else stalled,
        "Succeeded": phase == Phase.succeeded.value,
        "Failed": phase == Phase.failed.value,
        "Suspended": phase == Phase.suspended.value,
    }
    return [condition(kind, truth[kind], reason, message, previous=previous, now=rfc3339(now), generation=generation)
            for kind in CONDITION_TYPES]


def checkpoints_condition(
    durability: Durability | None, *, generation: int | None, previous: Sequence[Mapping[str, Any]], now: datetime
) -> list[Condition]:
    """The ``CheckpointsDurable`` condition (a list of one, or none).

    A status written without looking at the spec (``durability`` None: an invalid spec, a refused
    create) keeps the stored condition as it is, since a status write replaces the whole list.
    """
    if durability is None:
        old = next((c for c in previous if c.get("type") == CHECKPOINTS_CONDITION), None)
        return [Condition.model_validate(old)] if old is not None else []
    return [condition(CHECKPOINTS_CONDITION, durability.durable, durability.reason, durability.message,
                      previous=previous, now=rfc3339(now), generation=generation)]
