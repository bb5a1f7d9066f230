"""A failure's decision (pure): a failed, lost or stalled gang fails the job, has workers replaced in
place, or restarts as a new gang generation. ``plan_failure`` is the step of a reconcile
(``lifecycle.STEPS``); the steps of the decision are one module each, read in this order:

1. ``observe.py``: what went wrong with the current gang: a worker that failed, workers the cluster took
   away, or heartbeats that stopped (the stall clock);
2. ``classify.py``: what it means: a disruption or the job's own failure, retryable or permanent;
3. ``respond.py``: what to do: fail the job, replace the failed workers in place, or restart the gang
   after the backoff (with a smaller batch after running out of memory);
4. ``record.py``: the status and Events that say it, in the one Plan that acts on it.

Each step hands the next what it found (an ``Observation``, a ``Verdict``, a ``Response``), so the
context goes down the chain once (``tools/context_walk.py`` shows the walk). A failure is acted on once:
the Plan writes the status (the new gang generation, ``restarts`` or ``disruptions``, ``lastFailure``)
before any pod is deleted, so a later reconcile sees the failed pods as an old generation's, or as
replaced (``lastFailure.replacedPods``), and only finishes the deletion.
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
