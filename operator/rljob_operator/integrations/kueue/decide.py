"""Kueue: a job labelled ``kueue.x-k8s.io/queue-name`` waits for Kueue to admit its gang (pure).

``KUEUE`` is this module as an admission gate (``integrations/gate.py``); ``client.py`` observes
the job's Kueue objects and applies the writes decided here.

The operator owns one Kueue ``Workload`` per job and size (``desired_workload``): one podSet
``workers`` with ``count`` = workers and the worker pod's requests, so Kueue admits the whole
gang or nothing. The job's pods are created only while that Workload is admitted, with the node
labels and tolerations of the ResourceFlavors Kueue assigned (``placed``), as Kueue's own job
integrations do (jobframework's podset merge). What Kueue decides, the operator follows:

* not admitted: phase ``Queued``, Kueue's reason and message, no pod; no startup or stall
  timeout runs (the gang start time is unset) and nothing counts against ``backoffLimit``;
* evicted (preempted, its queue stopped, ``spec.active`` false): the gang is stopped gracefully
  (SIGTERM: the trainer saves a checkpoint), the job goes back to ``Queued`` as a new gang
  generation (not a restart), and once no pod remains the Workload's quota reservation is
  cleared as jobframework does for a stopped job (``cleared_admission``); admitted again, the
  new gang resumes from the checkpoint;
* finished: the rest of the gang is deleted and, once no pod of the job holds resources, the
  Workload is marked ``Finished`` (quota released); suspended: once the pods are gone the Workload
  is deleted (a resumed job queues again); deleted: the Workload goes with it (owner reference).
  A Workload's quota is never given back while a pod it admitted still runs or terminates (as a
  batch Job finishes only once its pods have terminated, since Kubernetes 1.31): ``queue_writes``;
* a finished Workload never admits again: a job revived after a spec edit (``InvalidSpec``,
  ``PolicyViolation``) deletes it and queues a new one.

Why operator-owned Workloads and not Kueue's pod-group integration: with pod groups Kueue gates
and deletes the pods itself, so its preemption would fight the operator's gang restarts (a pod
deleted by Kueue looks like a lost worker), and it needs Kueue's pod webhook on every pod.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rljob_contract.job import RLTrainingJob, RLTrainingJobStatus, ScalingPolicy

from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.policy import PodProfile, flavor_violations
from rljob_operator.integrations.gate import Hold, Outcome, Verdict
from rljob_operator.names import job_labels, owner_reference
from rljob_operator.times import rfc3339

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
PODSET = "workers"
#: The reason a job keeps while the API server (Kueue's webhook, RBAC) refuses its Workload.
REJECTED = "WorkloadRejected"
#: How soon a refused Workload is tried again.
REJECTED_RETRY_SECONDS = 30.0
#: How soon a job is looked at again while Kueue's API is not served.
UNAVAILABLE_RETRY_SECONDS = 60.0
#: Pod fields Kueue reads to count a podSet's quota and pick its flavor: requests, placement, priority.
_TEMPLATE_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName", "overhead")


#: The reason of a job held because it names no queue where the platform requires one.
QUEUE_REQUIRED = "QueueRequired"


def queue_name(job: RLTrainingJob) -> str | None:
    """The LocalQueue a job waits in: its ``kueue.x-k8s.io/queue-name`` label, else the one its status
    remembers (``status.queue``, written while it was labelled: a job once queued stays queued when the
    label is removed), else None."""
    remembered = job.status.queue if job.status is not None else None
    return job.metadata.labels.get(QUEUE_LABEL) or remembered or None


def missing_queue(job: RLTrainingJob, required: bool) -> Hold | None:
    """Why a job that names no queue may not run where the platform requires one, else None.

    ``required``: the operator setting ``require_queue`` (a runtime's ``queue.required`` can feed it
    too). Held rather than failed: labelling the job (a metadata edit, which leaves the spec's
    generation alone) lets it queue at once.
    """
    if not required or queue_name(job) is not None:
        return None
    return Hold(QUEUE_REQUIRED, f"metadata.labels[{QUEUE_LABEL}]: every job on this cluster runs through a Kueue "
                "LocalQueue (the operator's require_queue); label the job with its team's queue",
                taken_back="the platform requires a queue")


def priority_class(job: RLTrainingJob) -> str | None:
    """The WorkloadPriorityClass a job names (label ``kueue.x-k8s.io/priority-class``), else None."""
    return job.metadata.labels.get(PRIORITY_LABEL) or None


def queue_violations(job: RLTrainingJob) -> list[str]:
    """What a queued job may not ask for: Kueue admits a fixed size, policy Capacity picks its own."""
    if queue_name(job) and job.spec.autoscaling.policy == ScalingPolicy.capacity:
        return [f"spec.autoscaling.policy: Capacity cannot be combined with the label {QUEUE_LABEL} (Kueue admits "
                "a gang of one size; use policy Manual and kubectl scale, which re-queues the job at the new size)"]
    return []


@dataclass(frozen=True)
class Flavor:
    """A Kueue ResourceFlavor as far as pods care: the node labels and tolerations it adds."""

    name: str
    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Flavor:
        spec = obj.get("spec") or {}
        return cls(obj["metadata"]["name"], dict(spec.get("nodeLabels") or {}), list(spec.get("tolerations") or []))


@dataclass(frozen=True)
class Priority:
    """A WorkloadPriorityClass: its name and value."""

    name: str
    value: int


@dataclass(frozen=True)
class QueueView:
    """What the reconciler observed of a labelled job's Kueue side (built in ``cluster/``)."""

    available: bool = True
    """The Workload API (kueue.x-k8s.io/v1beta2) is served; False: Kueue is not installed."""
    workloads: list[dict[str, Any]] = field(default_factory=list)
    """The job's Workloads as stored (label ``rljob.dev/job``)."""
    flavors: dict[str, Flavor] = field(default_factory=dict)
    """The ResourceFlavors the current Workload's admission names (missing ones are absent)."""
    priority: Priority | None = None
    priority_problem: str = ""
    """Why the named WorkloadPriorityClass cannot be used (it does not exist), else empty."""
    required: bool = False
    """The platform requires a queue (``missing_queue``): a job naming none is governed, and held."""


def workload_template(job: RLTrainingJob) -> dict[str, Any]:
    """The worker pod as Kueue needs to see it: containers' requests and the placement fields."""
    spec = desired_worker_pod(job, 0, 0)["spec"]
    slim: dict[str, Any] = {k: spec[k] for k in _TEMPLATE_FIELDS if k in spec}
    for kind in ("containers", "initContainers"):
        if spec.get(kind):
            slim[kind] = [{k: c[k] for k in ("name", "image", "resources", "restartPolicy") if k in c}
                          for c in spec[kind]]
    return {"spec": slim}


def workload_name(job: RLTrainingJob, replicas: int) -> str:
    """The Workload of ``job`` at ``replicas`` workers: a new size or pod shape is a new Workload."""
    shape = json.dumps([replicas, queue_name(job), workload_template(job)], sort_keys=True)
    return f"{job.metadata.name}-{replicas}w-{hashlib.sha256(shape.encode()).hexdigest()[:8]}"


def desired_workload(job: RLTrainingJob, replicas: int, priority: Priority | None) -> dict[str, Any]:
    """The Workload for ``job`` at ``replicas`` workers, owned by the job (deleted with it)."""
    spec: dict[str, Any] = {
        "queueName": queue_name(job),
        "podSets": [{"name": PODSET, "count": replicas, "template": workload_template(job)}],
    }
    if priority is not None:  # as Kueue's jobframework sets it from the label
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority.name}
        spec["priority"] = priority.value
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job, replicas),
            "namespace": job.metadata.namespace,
            "labels": job_labels(job),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """Condition ``kind`` of a Workload's status, else None."""
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def is_true(workload: dict[str, Any], kind: str) -> bool:
    """Condition ``kind`` of the Workload is True."""
    return (condition(workload, kind) or {}).get("status") == "True"


def admitted(workload: dict[str, Any]) -> bool:
    """Kueue reserved quota for the gang and admitted it, and has not evicted it since."""
    return (bool((workload.get("status") or {}).get("admission")) and is_true(workload, "Admitted")
            and not evicting(workload))


def evicting(workload: dict[str, Any]) -> bool:
    """Kueue wants the gang stopped: Evicted (preempted, queue stopped, ...) or deactivated."""
    return is_true(workload, "Evicted") or (workload.get("spec") or {}).get("active") is False


def assigned_flavors(workload: dict[str, Any]) -> list[str]:
    """Names of the ResourceFlavors the admission assigned to the workers' podSet."""
    admission = (workload.get("status") or {}).get("admission") or {}
    names: list[str] = []
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == PODSET:
            names += [n for n in (assignment.get("flavors") or {}).values() if n not in names]
    return names


def waiting_reason(workload: dict[str, Any] | None, queue: str) -> tuple[str, str]:
    """Reason and message of a gang waiting for admission, in Kueue's words where it gave some."""
    if workload is None:
        return "Queued", f"waiting for Kueue: creating its Workload in LocalQueue {queue}"
    name = workload["metadata"]["name"]
    for kind in ("Evicted", "QuotaReserved", "Admitted"):
        cond = condition(workload, kind)
        if cond is not None and cond.get("status") == ("True" if kind == "Evicted" else "False") and cond.get("message"):
            return cond.get("reason") or "Queued", f"Workload {name} in LocalQueue {queue}: {cond['message']}"
    return "Queued", f"Workload {name} in LocalQueue {queue}: waiting for Kueue to admit it"


def placed(pod: dict[str, Any], flavors: list[Flavor]) -> tuple[dict[str, Any], list[str]]:
    """``pod`` with the node labels and tolerations of ``flavors`` merged in, and any conflict.

    As Kueue's podset merge: a node label the pod already selects with another value is a
    conflict, not overwritten.
    """
    spec = pod["spec"]
    selector, tolerations = dict(spec.get("nodeSelector") or {}), list(spec.get("tolerations") or [])
    problems: list[str] = []
    for flavor in flavors:
        for key, value in flavor.node_labels.items():
            if selector.get(key, value) != value:
                problems.append(f"spec.workers.nodeSelector[{key}]: {selector[key]!r} conflicts with ResourceFlavor "
                                f"{flavor.name} (nodeLabels {key}={value!r}), which Kueue assigned")
            selector.setdefault(key, value)
        tolerations += [t for t in flavor.tolerations if t not in tolerations]
    if selector:
        spec["nodeSelector"] = selector
    spec["tolerations"] = tolerations
    return pod, problems


def placement_problems(flavors: dict[str, Flavor], names: list[str], profile: PodProfile | None) -> list[str]:
    """Why the assigned flavors cannot be applied: a flavor gone, or one the pod profile refuses."""
    problems = [f"ResourceFlavor {n}: not found (Kueue assigned it to the workers)" for n in names if n not in flavors]
    if profile is not None:
        for n in names:
            if n in flavors:
                problems += flavor_violations(n, flavors[n].tolerations, profile)
    return problems


@dataclass(frozen=True)
class QueueWrites:
    """What a reconcile writes to Kueue objects (applied right after the job's status)."""

    create: dict[str, Any] | None = None
    """A Workload to create (the job's current size has none yet)."""
    delete: list[str] = field(default_factory=list)
    """Workloads to delete: other sizes, or all of them while the job is suspended."""
    status: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """Workload name → (the resourceVersion it was decided from, its new status): a merge patch on
    the status subresource that a write racing Kueue's makes fail (409), to be decided again."""


def finished_status(workload: dict[str, Any], succeeded: bool, message: str, now: datetime) -> dict[str, Any] | None:
    """The status marking a Workload Finished (Kueue releases its quota), or None if already so."""
    if is_true(workload, "Finished"):
        return None
    cond = {"type": "Finished", "status": "True", "reason": "Succeeded" if succeeded else "Failed",
            "message": message[:1024] or "the job finished", "lastTransitionTime": rfc3339(now),
            "observedGeneration": workload["metadata"].get("generation")}
    return _with_conditions(workload, [cond])


def cleared_admission(workload: dict[str, Any], now: datetime) -> dict[str, Any] | None:
    """The status of an evicted Workload whose gang has stopped: quota reservation released.

    What Kueue's jobframework writes for a stopped job (``UnsetQuotaReservationWithCondition``
    and ``SetRequeuedCondition``): admission cleared, QuotaReserved False (reason Pending),
    Admitted False (NoReservation), Requeued True after a preemption or node failure; Evicted stays.
    """
    status = workload.get("status") or {}
    if not status.get("admission") and not is_true(workload, "QuotaReserved"):
        return None
    evicted = condition(workload, "Evicted") or {}
    reason, message = evicted.get("reason") or "Deactivated", evicted.get("message") or "the workload was deactivated"
    generation = workload["metadata"].get("generation")
    stamp = rfc3339(now)
    conds = [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message,
         "lastTransitionTime": stamp, "observedGeneration": generation},
        {"type": "Admitted", "status": "False", "reason": "NoReservation", "message": "The workload has no reservation",
         "lastTransitionTime": stamp, "observedGeneration": generation},
        {"type": "Requeued", "status": "True" if reason in ("Preempted", "NodeFailures") else "False",
         "reason": reason, "message": message, "lastTransitionTime": stamp, "observedGeneration": generation},
    ]
    patch = _with_conditions(workload, conds)
    patch["admission"] = None
    return patch


def rejected_status(error: str) -> dict[str, Any]:
    """The job's reason and message while its Workload is refused (``queued`` keeps them while it is)."""
    return {"reason": REJECTED, "message": f"the API server refused the job's Kueue Workload: {error}"[:1024]}


def _with_conditions(workload: dict[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
    """The Workload's conditions with ``new`` set (a changed status gets a new lastTransitionTime)."""
    kinds = {c["type"]: c for c in new}
    out = []
    for old in (workload.get("status") or {}).get("conditions") or []:
        cond = kinds.pop(old.get("type"), None)
        if cond is not None and cond["status"] == old.get("status"):
            cond["lastTransitionTime"] = old.get("lastTransitionTime") or cond["lastTransitionTime"]
        out.append(cond or old)
    out += kinds.values()
    return {"conditions": out}


def current_workload(job: RLTrainingJob, replicas: int, view: QueueView) -> dict[str, Any] | None:
    """The job's Workload for its current size, if it exists, is not being deleted and has not finished
    (Kueue gave its quota back: it admits nothing any more)."""
    name = workload_name(job, replicas)
    return next((w for w in view.workloads if w["metadata"]["name"] == name
                 and not w["metadata"].get("deletionTimestamp") and not is_true(w, "Finished")), None)


def _versioned(workload: dict[str, Any], status: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return workload["metadata"].get("resourceVersion", ""), status


def queue_writes(job: RLTrainingJob, replicas: int, view: QueueView, outcome: Outcome) -> QueueWrites:
    """The Workload writes that go with a reconcile's ``outcome`` (``lifecycle.plan_reconcile``'s last pass).

    What gives quota back waits for the pods it was given to: a finished job's Workload is marked
    ``Finished``, a suspended job's deleted and an evicted one's reservation cleared once no pod of the
    job holds resources (``outcome.pods_left``); a Workload of another size or shape once no pod
    outside the current gang does (``outcome.old_pods_left``). The current Workload is created at once.
    """
    if not view.available or queue_name(job) is None:
        return QueueWrites()
    live = [w for w in view.workloads if not w["metadata"].get("deletionTimestamp")]
    ended, phase = outcome.phase in ("Succeeded", "Failed"), outcome.phase
    current = None if ended or phase == "Suspended" else current_workload(job, replicas, view)
    create = None
    if current is None and not ended and phase != "Suspended" and not view.priority_problem:
        create = desired_workload(job, replicas, view.priority)
    if outcome.pods_left and (ended or phase == "Suspended"):
        return QueueWrites()
    if phase == "Suspended":
        return QueueWrites(delete=[w["metadata"]["name"] for w in live])
    if ended:
        return QueueWrites(status={w["metadata"]["name"]: _versioned(w, s) for w in live
                                   if (s := finished_status(w, phase == "Succeeded", outcome.message,
                                                            outcome.now)) is not None})
    stale = [] if outcome.old_pods_left else [w["metadata"]["name"] for w in live if w is not current]
    statuses = {}
    if current is not None and evicting(current) and not outcome.pods_left:
        cleared = cleared_admission(current, outcome.now)
        if cleared is not None:
            statuses[current["metadata"]["name"]] = _versioned(current, cleared)
    return QueueWrites(create=create, delete=stale, status=statuses)


def owned(workload: dict[str, Any], job_uid: str) -> bool:
    """The Workload is controlled by the job (a namesake someone else made is never used)."""
    return any(r.get("uid") == job_uid and r.get("controller") for r in workload["metadata"].get("ownerReferences") or [])


def _hold(job: RLTrainingJob, view: QueueView, workload: dict[str, Any] | None, prev: RLTrainingJobStatus) -> Hold:
    """Why a gang Kueue has not admitted waits, in Kueue's words where it gave some."""
    queue = queue_name(job) or ""
    if not view.available:
        reason = "KueueUnavailable"
        message = (f"the job is labelled {QUEUE_LABEL}={queue} but this cluster serves no Kueue "
                   f"Workload API ({GROUP}/{VERSION}): install Kueue, or remove the label to run without it")
    elif view.priority_problem and workload is None:
        reason, message = "PriorityClassNotFound", view.priority_problem
    elif workload is None and prev.reason == REJECTED:
        # Kept while the create is refused again: a status flipping back and forth would wake the job for ever.
        reason, message = REJECTED, prev.message or ""
    else:
        reason, message = waiting_reason(workload, queue)
    retry = UNAVAILABLE_RETRY_SECONDS if not view.available else REJECTED_RETRY_SECONDS if reason == REJECTED else None
    return Hold(reason, message, retry, "Kueue took the admission back")


class KueueGate:
    """Kueue as an admission gate: the gang runs while the job's Workload is admitted, on its flavors."""

    name = "kueue"

    def violations(self, job: RLTrainingJob, view: QueueView) -> list[str]:
        return queue_violations(job)

    def queue(self, job: RLTrainingJob, view: QueueView) -> str | None:
        return queue_name(job)

    def verdict(self, job: RLTrainingJob, view: QueueView, prev: RLTrainingJobStatus,
                profile: PodProfile | None) -> Verdict:
        unqueued = missing_queue(job, view.required)
        if unqueued is not None:
            return Verdict(hold=unqueued)
        workload = current_workload(job, job.replicas, view)
        if not (view.available and workload is not None and admitted(workload)):
            return Verdict(hold=_hold(job, view, workload, prev))
        names = assigned_flavors(workload)
        flavors = [view.flavors[n] for n in names if n in view.flavors]
        conflicts = placed(desired_worker_pod(job, 0, 0), flavors)[1]  # a node label the job selects otherwise
        return Verdict(problems=placement_problems(view.flavors, names, profile) + conflicts,
                       place=lambda pod: placed(pod, flavors)[0])

    def writes(self, job: RLTrainingJob, view: QueueView, outcome: Outcome) -> QueueWrites:
        return queue_writes(job, job.replicas, view, outcome)


KUEUE = KueueGate()
"""The Kueue gate (stateless: its view holds what was observed)."""
