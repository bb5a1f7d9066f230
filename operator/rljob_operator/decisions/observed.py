"""What the operator observes (pure): worker pods as seen (what a failed one means: ``failure.observe``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rljob_operator.names import (
    ANNOTATION_JOB_GENERATION,
    ANNOTATION_SPEC_HASH,
    CONTAINER,
    LABEL_GANG_GENERATION,
    LABEL_WORKER_INDEX,
)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class ObservedPod:
    """One worker pod as the operator sees it (from the pod's JSON)."""

    name: str
    index: int | None
    generation: int | None
    spec_hash: str | None
    job_generation: int | None
    """``metadata.generation`` of the job when this pod was built."""
    owned: bool
    """Controlled by this job object (ownerReference uid); a pod left by a deleted job of
    the same name is not, and blocks its name until the garbage collector removes it."""
    orphan: bool
    """Controlled by nothing (its job was deleted with ``--cascade=orphan``)."""
    phase: str
    scheduled: bool
    ready: bool
    deleting: bool
    exit_code: int | None = None
    container_reason: str | None = None
    message: str | None = None
    pod_reason: str | None = None
    unschedulable: str | None = None
    waiting: str | None = None
    """Why the trainer container has not started (ErrImagePull, CreateContainerConfigError, ...)."""
    finished_at: str | None = None
    disrupted: bool = False
    """The cluster marked it for removal (condition DisruptionTarget: eviction, preemption, node lost)."""
    deleted_at: str | None = None
    """metadata.deletionTimestamp: when its grace period ends."""
    node: str | None = None
    """spec.nodeName: the node it is bound to."""
    node_lost: bool = False
    """Its node was deleted: no kubelet will run it or confirm its deletion (force-deleted at once)."""
    uid: str | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        return not self.finished and not self.deleting

    @classmethod
    def from_pod(cls, pod: dict[str, Any], job_uid: str,
                 node_gone: Callable[[str | None], bool] | None = None) -> ObservedPod:
        """``node_gone``: whether a node was deleted (the operator's Node watch; None: unknown)."""
        meta, status = pod.get("metadata", {}), pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        controllers = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
        owned = any(ref.get("uid") == job_uid for ref in controllers)
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        scheduled_cond = conditions.get("PodScheduled", {})
        unschedulable = None
        if scheduled_cond.get("status") == "False" and scheduled_cond.get("reason") == "Unschedulable":
            unschedulable = scheduled_cond.get("message") or "unschedulable"
        terminated: dict[str, Any] = {}
        waiting = None
        for cs in status.get("containerStatuses") or []:
            state = (cs.get("state") or {}).get("terminated")
            if state and (cs.get("name") == CONTAINER or not terminated):
                terminated = state
            wait = (cs.get("state") or {}).get("waiting") or {}
            if cs.get("name") == CONTAINER and wait.get("reason") not in (None, "ContainerCreating"):
                waiting = f"{wait['reason']}: {wait.get('message') or ''}".strip().rstrip(":")
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid"),
            index=_int_or_none(labels.get(LABEL_WORKER_INDEX)),
            generation=_int_or_none(labels.get(LABEL_GANG_GENERATION)),
            spec_hash=annotations.get(ANNOTATION_SPEC_HASH),
            job_generation=_int_or_none(annotations.get(ANNOTATION_JOB_GENERATION)),
            owned=owned,
            orphan=not controllers,
            phase=status.get("phase") or "Pending",
            scheduled=bool((pod.get("spec") or {}).get("nodeName")) or scheduled_cond.get("status") == "True",
            ready=conditions.get("Ready", {}).get("status") == "True",
            deleting=bool(meta.get("deletionTimestamp")),
            exit_code=_int_or_none(terminated.get("exitCode")),
            container_reason=terminated.get("reason"),
            message=(terminated.get("message") or status.get("message") or "").strip() or None,
            pod_reason=status.get("reason"),
            unschedulable=unschedulable,
            waiting=waiting,
            finished_at=terminated.get("finishedAt"),
            disrupted=conditions.get("DisruptionTarget", {}).get("status") == "True",
            deleted_at=meta.get("deletionTimestamp"),
            node=node,
            node_lost=node is not None and node_gone is not None and node_gone(node),
        )


_POD_METADATA = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences", "deletionTimestamp")
_POD_STATUS = ("phase", "conditions", "containerStatuses", "message", "reason")


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod ``ObservedPod.from_pod`` and the reconciler read (a tenth of its size:
    no managedFields, no container specs), for the operator's watch cache of worker pods."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in _POD_METADATA if k in meta},
        "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
        "status": {k: status[k] for k in _POD_STATUS if k in status},
    }
