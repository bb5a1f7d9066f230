"""What the operator observes (pure): worker pods as seen (what a failed one means: ``failure.observe``).

Which pods are the job's: only those the operator created for it (``ObservedPod.owned``). A pod's labels
and name are written by whoever creates it, and anyone who may create pods in the namespace can copy them.
Its controller ownerReference is written by its creator too, but one that names an RLTrainingJob (API group
``rljob.dev``) is admitted only from a user who may patch that job's status: the admission policy
``rljob-worker-pods`` asks the API server's authorizer, on every create and on every update that adds such a
reference, and only the operator may write a job's status (people get ``get`` on ``rltrainingjobs/status``).
So a controller reference to the job, by kind, name and UID (``job_reference``), is the operator's own mark
(``ObservedPod.created``), where those policies are in force (the operator refuses to start without them
unless told to, ``cluster.admission``). A pod that claims the job without that mark (a controller reference
of another kind with the job's UID, or no controller and a worker's name) is a *stranger*
(``ObservedPod.stranger``): it is never counted and decides nothing, and the operator deletes it
(``Situation.strangers``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rljob_contract.job import GROUP, KIND

from rljob_operator.names import (
    ANNOTATION_IN_PLACE_RESTARTS,
    ANNOTATION_JOB_GENERATION,
    ANNOTATION_REDIALS,
    ANNOTATION_SPEC_HASH,
    CONTAINER,
    LABEL_GANG_GENERATION,
    LABEL_JOB,
    LABEL_WORKER_INDEX,
)


def job_reference(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, UID) of the RLTrainingJob its controller ownerReference names (API group ``rljob.dev``, kind
    ``RLTrainingJob``); None: its controller is something else, or it has none. The admission policy
    ``rljob-worker-pods`` admits such a reference only from a user who may patch that job's status."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)
    if ref is None or ref.get("kind") != KIND or str(ref.get("apiVersion") or "").split("/")[0] != GROUP:
        return None
    if not ref.get("name") or not ref.get("uid"):
        return None
    return str(ref["name"]), str(ref["uid"])


def controller_uid(pod: Mapping[str, Any]) -> str | None:
    """The UID its controller ownerReference names (None: no controller). Its creator wrote it: a claim, not a proof."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((str(ref.get("uid")) for ref in refs if ref.get("controller")), None)


def creating_manager(pod: Mapping[str, Any]) -> str | None:
    """The field manager that wrote the pod's spec (``managedFields``: a pod's spec cannot be changed but for
    its images, so that is its creator). The client chooses that name (``?fieldManager=``, ``kubectl
    --field-manager``), so it says who *claims* to have made the pod: for people, never for a decision."""
    for entry in (pod.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") and not entry.get("subresource") and "f:spec" in (entry.get("fieldsV1") or {}):
            return str(entry["manager"])
    return None


def _worker_named(name: str, labels: Mapping[str, Any]) -> bool:
    """Named as the operator names the workers of the job its label names (``<job>-worker-<i>``)."""
    job = labels.get(LABEL_JOB)
    return isinstance(job, str) and re.fullmatch(re.escape(job) + r"-worker-[0-9]+", name) is not None


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
    claimed: bool
    """Its controller ownerReference names this job object's UID: what its creator wrote, which anyone may
    (the UID is public). A pod left by a deleted job of the same name names that job, and blocks its name
    until the garbage collector removes it."""
    created: bool
    """The operator created it for this job: its controller reference is this job, by kind, name and UID
    (``job_reference``), which only the operator may write (the admission policy ``rljob-worker-pods``)."""
    orphan: bool
    """Controlled by nothing (its job was deleted with ``--cascade=orphan``, or someone made it so)."""
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
    worker_named: bool = False
    """Holds one of the job's worker names (``<job>-worker-<i>``)."""
    creator: str | None = None
    """Who its creator said it was (``creating_manager``): for the ForeignPod Event, never for a decision."""
    pod_ip: str | None = None
    """status.podIP: where worker 0 is reached for the rendezvous."""
    meets_replacements: bool = False
    """Built so that its agent restarts its ranks to meet a replaced peer (``ANNOTATION_IN_PLACE_RESTARTS``)."""
    redials: bool = False
    """Built so that its launcher dials the rendezvous again when worker 0's store is lost (``ANNOTATION_REDIALS``)."""
    created_at: str | None = None
    """metadata.creationTimestamp (RFC 3339, whole seconds)."""

    @property
    def owned(self) -> bool:
        """One of the job's pods: created by the operator for the job, and still claiming it."""
        return self.claimed and self.created

    @property
    def claims_job(self) -> bool:
        """The job's to manage: its controller is the job, or it has no controller and holds a worker's name
        (a leftover of a namesake deleted with ``--cascade=orphan``, or a copy). The operator deletes such a
        pod when it is not one of the job's; a pod another object controls, or an orphan under another name,
        is never its to delete, only to ignore."""
        return self.claimed or (self.orphan and self.worker_named)

    @property
    def stranger(self) -> bool:
        """Claims the job (``claims_job``) though the operator did not create it for the job."""
        return self.claims_job and not self.created

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        return not self.finished and not self.deleting

    @classmethod
    def from_pod(cls, pod: dict[str, Any], job_uid: str, job_name: str = "",
                 node_gone: Callable[[str | None], bool] | None = None) -> ObservedPod:
        """The pod as a worker of the job ``job_name`` whose UID is ``job_uid``; ``node_gone``: whether a node
        was deleted (the operator's Node watch; None: unknown)."""
        meta, status = pod.get("metadata", {}), pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        controller = controller_uid(pod)
        name, uid = meta.get("name", ""), meta.get("uid")
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
            name=name,
            uid=uid,
            index=_int_or_none(labels.get(LABEL_WORKER_INDEX)),
            generation=_int_or_none(labels.get(LABEL_GANG_GENERATION)),
            spec_hash=annotations.get(ANNOTATION_SPEC_HASH),
            job_generation=_int_or_none(annotations.get(ANNOTATION_JOB_GENERATION)),
            claimed=controller is not None and controller == job_uid,
            created=bool(job_name) and job_reference(pod) == (job_name, job_uid),
            orphan=controller is None,
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
            worker_named=_worker_named(name, labels),
            creator=creating_manager(pod),
            pod_ip=status.get("podIP") or None,
            meets_replacements=(_int_or_none(annotations.get(ANNOTATION_IN_PLACE_RESTARTS)) or 0) > 0,
            redials=annotations.get(ANNOTATION_REDIALS) == "true",
            created_at=meta.get("creationTimestamp"),
        )


_POD_METADATA = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences", "deletionTimestamp",
                 "creationTimestamp")
_POD_STATUS = ("phase", "conditions", "containerStatuses", "message", "reason", "podIP")


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod ``ObservedPod.from_pod`` and the reconciler read (a tenth of its size:
    of managedFields only who said they created it, no container specs), for the operator's watch cache."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    made_by = creating_manager(pod)
    return {
        "metadata": {k: meta[k] for k in _POD_METADATA if k in meta}
        | ({"managedFields": [{"manager": made_by, "fieldsV1": {"f:spec": {}}}]} if made_by else {}),
        "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
        "status": {k: status[k] for k in _POD_STATUS if k in status},
    }
