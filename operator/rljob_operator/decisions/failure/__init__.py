"""A failure's decision, one module per step, read in this order (pure, like all of ``decisions/``):

1. ``step.py``: ``plan_failure``, the step of a reconcile (``lifecycle.STEPS``) that chains the others;
2. ``observe.py``: what went wrong with the current gang: a worker that failed, workers the cluster took
   away, or heartbeats that stopped (the stall clock);
3. ``classify.py``: what it means: a disruption or the job's own failure, retryable or permanent;
4. ``respond.py``: what to do: fail the job, replace the failed workers in place, or restart the gang
   after the backoff (with a smaller batch after running out of memory);
5. ``record.py``: the status and Events that say it, in the one Plan that acts on it.

Each step hands the next what it found (an ``Observation``, a ``Verdict``, a ``Response``), so the
context goes down the chain once (``tools/context_walk.py`` shows the walk). ``children.py`` reads
``respond.in_place_restarts`` (the pods' environment) and ``situation``, which the last step needs,
imports ``children``: so this file imports nothing, and the first three steps import ``Situation`` for
annotations only.
"""
