"""Kueue's side of the cluster layer: its API's requests, a job's Workloads observed, the writes applied.

The requests go through the operator's :class:`~rljob_operator.cluster.kube.Kube` (counted by
verb and resource like every other); what to write was decided in ``decide.py``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException
from rljob_contract.job import RLTrainingJob

from rljob_operator.cluster.kube import FIELD_MANAGER, Kube
from rljob_operator.integrations.client import GateWatch, PatchStatus
from rljob_operator.integrations.gate import Gated
from rljob_operator.integrations.kueue.decide import (
    GROUP,
    KUEUE,
    PRIORITY_LABEL,
    VERSION,
    Flavor,
    Priority,
    QueueView,
    QueueWrites,
    admitted,
    assigned_flavors,
    current_workload,
    owned,
    priority_class,
    queue_name,
    rejected_status,
)

if TYPE_CHECKING:
    from rljob_operator.settings import OperatorSettings
from rljob_operator.names import LABEL_JOB

log = logging.getLogger("rljob.reconciler")  # the reconciler's: these lines are part of its reconcile
API = f"/apis/{GROUP}/{VERSION}"
#: The resources requested here, for the request metrics.
RESOURCES = ("workloads", "resourceflavors", "workloadpriorityclasses")
#: How long one answer to "is Kueue installed?" and one read of a ResourceFlavor serve.
KUEUE_API_MAX_AGE_SECONDS = 30.0
FLAVOR_MAX_AGE_SECONDS = 5.0
#: How often a queued job is looked at when no watch on Workloads wakes it (Kueue installed later).
UNWATCHED_QUEUE_SECONDS = 10.0
#: Kueue admitting, preempting or evicting a job's gang changes its Workload (labelled with the job).
WORKLOADS = GateWatch(GROUP, VERSION, "workloads")


# ------------------------------------------------------------------ requests
def kueue_served(kube: Kube) -> bool:
    """Does the API server serve Kueue's v1beta2 API (is Kueue installed)?

    A 403 (discovery denied to this identity) counts as not served: labelled jobs then say
    KueueUnavailable instead of the operator failing to start.
    """
    try:
        kube.request("GET", API)
        return True
    except ApiException as e:
        if e.status in (403, 404):
            return False
        raise


def workload_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    path = f"{API}/namespaces/{quote(namespace, safe='')}/workloads"
    if name:
        path += f"/{quote(name, safe='')}"
    return f"{path}/{subresource}" if subresource else path


def list_workloads(kube: Kube, namespace: str, label_selector: str) -> list[dict[str, Any]]:
    out = kube.request("GET", workload_path(namespace), query={"labelSelector": label_selector})
    return list(out.get("items") or [])


def create_workload(kube: Kube, workload: dict[str, Any]) -> None:
    """Create a Workload; one of that name already existing is fine (the next reconcile reads it)."""
    try:
        kube.request("POST", workload_path(workload["metadata"]["namespace"]), workload,
                     query={"fieldManager": FIELD_MANAGER})
    except ApiException as e:
        if e.status != 409:
            raise


def delete_workload(kube: Kube, namespace: str, name: str) -> None:
    try:
        kube.request("DELETE", workload_path(namespace, name), {"propagationPolicy": "Background"})
    except ApiException as e:
        if e.status != 404:
            raise


def patch_workload_status(kube: Kube, namespace: str, name: str, resource_version: str,
                          status: dict[str, Any]) -> bool:
    """Merge-patch a Workload's status if it is still at ``resource_version``; False if it moved on."""
    body = {"metadata": {"resourceVersion": resource_version}, "status": status}
    try:
        kube.request("PATCH", workload_path(namespace, name, "status"), body,
                     content_type="application/merge-patch+json", query={"fieldManager": FIELD_MANAGER})
        return True
    except ApiException as e:
        if e.status in (404, 409):
            return False
        raise


def get_kueue_object(kube: Kube, plural: str, name: str) -> dict[str, Any] | None:
    """A cluster-scoped Kueue object (a ResourceFlavor, a WorkloadPriorityClass), None if absent."""
    try:
        return kube.request("GET", f"{API}/{plural}/{quote(name, safe='')}")
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def refusal_text(error: ApiException) -> str:
    """The API server's message of a refused request (its Status body), else its reason."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


# ------------------------------------------------------------------ the gate's client
class KueueClient:
    """Kueue for one reconciler: a job's Workloads, their flavors and priority; the Workload writes."""

    name = KUEUE.name

    def __init__(self, kube: Kube, watched: bool, settings: OperatorSettings | None = None) -> None:
        self.kube = kube
        self.unwatched_requeue = None if watched else UNWATCHED_QUEUE_SECONDS
        """A watch on Workloads wakes queued jobs; without one they are looked at every few seconds."""
        self.required = settings is not None and settings.require_queue
        """The platform requires a queue: a job naming none is held (``decide.missing_queue``)."""
        self._served: tuple[float, bool] = (float("-inf"), False)
        self._flavors: dict[str, tuple[float, Flavor | None]] = {}

    def observe(self, job: RLTrainingJob, uid: str) -> Gated[QueueView] | None:
        """The job's Kueue side (its Workloads, their flavors and priority); None if it is not queued
        (by its label or its status's memory) and the platform does not require a queue."""
        if queue_name(job) is None:
            return Gated(KUEUE, QueueView(required=True)) if self.required else None
        if not self.served():
            return Gated(KUEUE, QueueView(available=False))
        namespace = job.metadata.namespace or ""
        workloads = [w for w in list_workloads(self.kube, namespace, f"{LABEL_JOB}={job.metadata.name}")
                     if owned(w, uid)]
        current = current_workload(job, job.replicas, QueueView(workloads=workloads))
        priority, problem = self._priority(job) if current is None else (None, "")
        flavors: dict[str, Flavor] = {}
        if current is not None and admitted(current):
            for flavor_name in assigned_flavors(current):
                flavor = self.flavor(flavor_name)
                if flavor is not None:
                    flavors[flavor_name] = flavor
        return Gated(KUEUE, QueueView(True, workloads, flavors, priority, problem))

    def _priority(self, job: RLTrainingJob) -> tuple[Priority | None, str]:
        """The WorkloadPriorityClass the job names, or why it cannot be used."""
        name = priority_class(job)
        if not name:
            return None, ""
        found = get_kueue_object(self.kube, "workloadpriorityclasses", name)
        if found is None:
            return None, (f"metadata.labels[{PRIORITY_LABEL}]: WorkloadPriorityClass {name} not found; create it "
                          "or correct the label")
        return Priority(name, int(found.get("value") or 0)), ""

    def served(self) -> bool:
        """Is Kueue's API served? Asked again every ``KUEUE_API_MAX_AGE_SECONDS``."""
        taken, served = self._served
        if time.monotonic() - taken >= KUEUE_API_MAX_AGE_SECONDS:
            served = kueue_served(self.kube)
            self._served = (time.monotonic(), served)
        return served

    def flavor(self, name: str) -> Flavor | None:
        """ResourceFlavor ``name`` (read again every ``FLAVOR_MAX_AGE_SECONDS``), None if absent."""
        taken, flavor = self._flavors.get(name, (float("-inf"), None))
        if time.monotonic() - taken >= FLAVOR_MAX_AGE_SECONDS:
            found = get_kueue_object(self.kube, "resourceflavors", name)
            flavor = Flavor.from_object(found) if found is not None else None
            self._flavors[name] = (time.monotonic(), flavor)
        return flavor

    def recheck(self, writes: QueueWrites) -> bool:
        """Quota given back (a Workload finished, cleared or deleted) relies on no pod being left."""
        return bool(writes.status or writes.delete)

    def apply(self, raw: dict[str, Any], writes: QueueWrites, status: dict[str, Any],
              patch_status: PatchStatus) -> None:
        """The Workload writes: stale ones deleted, the current one created, statuses patched."""
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        for workload in writes.delete:
            log.info("%s/%s: deleting Workload %s", namespace, name, workload)
            delete_workload(self.kube, namespace, workload)
        if writes.create is not None:
            log.info("%s/%s: creating Workload %s", namespace, name, writes.create["metadata"]["name"])
            try:
                create_workload(self.kube, writes.create)
            except ApiException as e:
                if e.status not in (400, 403, 422):
                    raise
                # Kueue's webhook (an invalid queue name, say) or RBAC refused it: say so on the job,
                # whose next reconciles keep that reason and try again every 30 s.
                log.warning("%s/%s: Workload refused (%s): %s", namespace, name, e.status, e.body)
                rejected = rejected_status(refusal_text(e))
                if any(status.get(k) != v for k, v in rejected.items()):
                    patch_status(raw, rejected)
        for workload, (version, new) in writes.status.items():
            if not patch_workload_status(self.kube, namespace, workload, version, new):
                log.info("%s/%s: Workload %s changed meanwhile: decided again", namespace, name, workload)


def watch(kube: Kube) -> GateWatch | None:
    """Workloads are watched only where Kueue is installed: a watch on an API nobody serves fails for ever."""
    return WORKLOADS if kueue_served(kube) else None


def describe(watched: bool) -> str:
    return "Kueue: jobs labelled kueue.x-k8s.io/queue-name wait for admission; " + (
        "Workloads watched" if watched else "its API is not served (yet): such jobs say KueueUnavailable until it is")
