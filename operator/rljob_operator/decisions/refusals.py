"""What a refused create means for the job (pure): the API server's answer → the rest of the reconcile's Plan.

The reconciler creates the ConfigMap, the Service and the pods of a Plan; when one of those
creates is refused it calls :func:`plan_for_refusal` and applies the Plan it returns in place of
what was left of the interrupted one:

* a child's name taken by something else (``ChildConflict``): stuck, reason ``ChildConflict``,
  looked at again soon;
* 422 (the API server rejected the pod: podTemplate, volumes): Failed, reason ``InvalidPodSpec``
  (looked at again once the spec is edited);
* 403 naming a quota: stuck, reason ``QuotaExceeded`` (also in the Reconciling condition, so
  ``kubectl wait`` and dashboards see it), looked at again soon;
* 403 because the namespace is being deleted: nothing (the job goes with its namespace);
* 403 from admission (PodSecurity, a ValidatingAdmissionPolicy, a webhook): Failed, reason
  ``PodRejected`` with the API server's message; one attempt, looked at again once the spec is
  edited (retrying would loop for ever on a verdict that does not change);
* 403 from RBAC (the operator itself may not create the child) and anything else: not a
  decision (None): the reconcile fails and is retried, with backoff, until the platform fixes it.

"Stuck" says why in ``reason``/``message`` only and keeps the phase this reconcile wrote; the
interrupted Plan's Events still follow. A failure writes its outcome instead of those Events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rljob_contract.job import Phase

from rljob_operator.decisions.plan import (
    QUOTA_FIELDS,
    REJECTED_POD_FIELDS,
    STUCK_FIELDS,
    Event,
    Plan,
    StatusDraft,
    job_status,
    status_patch,
)
from rljob_operator.times import rfc3339

#: Retry soon when a child's name is taken by something else, or a quota is exhausted.
CONFLICT_REQUEUE_SECONDS = 10.0


def namespace_terminating(status: int | None, body: str | None) -> bool:
    """The API server's answer to a create in a namespace that is being deleted."""
    return status == 403 and "because it is being terminated" in (body or "")


@dataclass(frozen=True)
class Refusal:
    """A refused create: the HTTP ``status`` and ``body`` of the answer and its ``reason`` phrase;
    ``status`` None for a child whose name another owner holds (``conflict`` says which)."""

    status: int | None
    body: str = ""
    reason: str = ""
    conflict: str = ""

    @property
    def message(self) -> str:
        """The API server's own words (the Status object's ``message``), else the reason phrase."""
        if self.status is None:
            return self.conflict
        try:
            return str(json.loads(self.body or "{}").get("message") or self.reason)
        except ValueError:
            return str(self.reason)


def plan_for_refusal(raw: dict[str, Any], interrupted: Plan, refusal: Refusal, now: datetime) -> Plan | None:
    """The Plan that replaces what ``interrupted`` had left to do after ``refusal`` (None: not a decision).

    ``raw``: the job as read at the start of the reconcile (its metadata and stored conditions).
    """
    if refusal.status is None:
        return _stuck(raw, interrupted, "ChildConflict", refusal.message, now)
    if namespace_terminating(refusal.status, refusal.body):
        return Plan(status={})
    if refusal.status == 422:
        return _failed(raw, "InvalidPodSpec", refusal.message, now)
    if refusal.status == 403 and "quota" in refusal.body:
        return _stuck(raw, interrupted, "QuotaExceeded", refusal.message, now, QUOTA_FIELDS)
    if refusal.status == 403 and not rbac_denied(refusal.message):
        return _failed(raw, "PodRejected", refusal.message, now)
    return None


def rbac_denied(message: str) -> bool:
    """A 403 of the authorizer (the operator's own rights), not of admission.

    The authorizer says ``User "…" cannot create resource "pods" …``; admission plugins say
    ``violates PodSecurity …``, ``… denied request: …`` or ``admission webhook … denied``.
    """
    return " cannot " in message and " resource " in message and "User " in message


def _render(raw: dict[str, Any], d: StatusDraft, now: datetime, fields: tuple[str, ...]) -> dict[str, Any]:
    meta = raw["metadata"]
    return status_patch(job_status(d, job_name=meta["name"], observed_generation=meta.get("generation"),
                                   previous_conditions=(raw.get("status") or {}).get("conditions") or [], now=now),
                        fields)


def _stuck(raw: dict[str, Any], interrupted: Plan, reason: str, message: str, now: datetime,
           fields: tuple[str, ...] = STUCK_FIELDS) -> Plan:
    """Cannot go on for now: say why; the interrupted Plan's Events and requeue still apply."""
    phase = str(interrupted.status.get("phase") or "")
    draft = StatusDraft(phase, reason, message, reconciling=True)
    return Plan(
        status=_render(raw, draft, now, fields),
        events=[Event("Warning", reason, message)] + interrupted.events,
        delete_job=interrupted.delete_job,
        requeue_after=CONFLICT_REQUEUE_SECONDS,
        gang_restart=interrupted.gang_restart,
    )


def _failed(raw: dict[str, Any], reason: str, message: str, now: datetime) -> Plan:
    """A permanent refusal: the job fails; nothing of the interrupted Plan is left to do."""
    d = StatusDraft(Phase.failed.value, reason, message, completion_time=rfc3339(now))
    return Plan(status=_render(raw, d, now, REJECTED_POD_FIELDS), events=[Event("Warning", reason, message)])
