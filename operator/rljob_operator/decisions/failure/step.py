"""The failure step of a reconcile (pure): a failed, lost or stalled gang fails the job, has workers
replaced in place, or restarts as a new gang generation.

The four steps of the chain, each in its own module (``failure/__init__.py``). A failure is acted on
once: the Plan writes the status (the new gang generation, ``restarts`` or ``disruptions``,
``lastFailure``) before any pod is deleted, so a later reconcile sees the failed pods as an old
generation's, or as replaced (``lastFailure.replacedPods``), and only finishes the deletion.
"""

from __future__ import annotations

from rljob_operator.decisions.failure.classify import classify
from rljob_operator.decisions.failure.observe import observe
from rljob_operator.decisions.failure.record import record
from rljob_operator.decisions.failure.respond import respond
from rljob_operator.decisions.plan import Plan
from rljob_operator.decisions.situation import Situation


def plan_failure(ctx: Situation) -> Plan | None:
    """The Plan for the current gang's failure; None when nothing went wrong (the next step decides)."""
    seen = observe(ctx)
    if seen is None:
        return None
    verdict = classify(ctx.job, seen)
    return record(ctx, seen, verdict, respond(ctx, seen, verdict))
