"""Which pods may speak for a job: the ones the operator created for it, recorded in its status (pure).

A worker's token lets its trainer report progress: curve points, rewards, ``best_checkpoint``, which
experiments rank trials by. Nothing on a pod proves who created it: anyone who may create pods in the
namespace can copy every worker label, and set a controller ownerReference with the job's UID (public:
``kubectl get -o yaml``), and the garbage collector keeps such a pod. So the operator writes down what
only it knows, the UIDs the API server gave the pods it created, in ``status.createdPods`` (pod name →
UID of the last pod it created under that name), and the status API accepts a token only when its pod's
name and UID are recorded there (``may_speak``). Only the operator may write a job's status (people get
``get`` on ``rltrainingjobs/status``, as the chart's roles grant): whoever could forge the record could
forge the progress itself.

By name: a pod name is held by one pod at a time and the operator names workers ``<job>-worker-<i>``, so
the record has at most one entry per worker the job may have (``MAX_WORKERS``), and a new pod under a name
replaces the entry of one that is gone (whose token the API server no longer accepts anyway). A merge patch
of the names just created updates the record without reading it.

The record starts with the job: the first status write of a job carries an empty record (``seed``), so a
pod someone made before the operator looked cannot be taken for the job's. A job whose status an operator
of an earlier version wrote (status, but no record) gets its present workers recorded once, the pods its
UID controls: what that version trusted.

The same record decides which pods are the job's gang (``known``, read by ``ObservedPod.from_pod``): a pod
with the job's labels, name or ownerReference whose UID is not recorded is a stranger, which the
decisions neither count nor let decide a phase. Between a create and the status write that records it
the operator remembers the answer itself (the reconciler's ``pending``). A crash in that moment (the
gang's pods are recorded by the next reconcile, a second later) loses that memory: nothing on a pod
proves the operator made it (its ``managedFields`` name the field manager its *client* chose, and a tenant
may choose the operator's), so such a pod is taken for a stranger, deleted, and created again, recorded.
One pod created twice after a rare crash, rather than a rule a tenant can satisfy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rljob_contract.job import RLTrainingJobStatus

from rljob_operator.decisions.observed import controller_uid

#: ``status.createdPods``.
CREATED_PODS = RLTrainingJobStatus.model_fields["created_pods"].alias or "createdPods"


def seed(stored_status: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], job_uid: str) -> dict[str, str] | None:
    """What a reconcile's status write adds to the record before any pod is created; None when it has one.

    A job without status (no operator wrote it yet): an empty record. A job with status but no record (an
    earlier operator ran it): the pods (JSON) its UID controls, by name (``ObservedPod.claimed``).
    """
    if CREATED_PODS in stored_status:
        return None
    if not stored_status:
        return {}
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("name") and meta.get("uid") and controller_uid(pod) == job_uid:
            out[str(meta["name"])] = str(meta["uid"])
    return out


def known(stored_status: Mapping[str, Any], seeded: Mapping[str, str] | None,
          pending: Mapping[str, str] | None = None) -> dict[str, str]:
    """The pods the operator created for a job, name → UID: the stored record, what this reconcile's write
    seeds it with (``seed``), and ``pending``, pods the operator created whose record is not written yet."""
    return {**(stored_status.get(CREATED_PODS) or {}), **(seeded or {}), **(pending or {})}


def created(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The record's new entries from the API server's answers to the operator's pod creates."""
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("name") and meta.get("uid"):
            out[str(meta["name"])] = str(meta["uid"])
    return out


def may_speak(job: Mapping[str, Any], pod_name: str, pod_uid: str) -> bool:
    """Did the operator create the pod ``pod_name`` with UID ``pod_uid`` for ``job`` (its JSON)?"""
    record = (job.get("status") or {}).get(CREATED_PODS) or {}
    return bool(pod_name and pod_uid) and record.get(pod_name) == pod_uid
