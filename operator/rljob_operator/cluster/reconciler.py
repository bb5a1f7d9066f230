"""One reconcile of one RLTrainingJob: observe, decide (``lifecycle.plan_reconcile``), act.

The order of actions is what makes an interrupted reconcile converge: the status (with the
gang generation and start time it decided) is written first, then stale pods are deleted,
then the ConfigMap and Service are created or adopted, then missing pods are created under
their deterministic names, then Events are posted. A crash between any two steps leaves a
state the next reconcile reads and finishes; no step can produce a second pod for a name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from rljob_operator import metrics
from rljob_operator.api import ManifestError, RLTrainingJobStatus, ScalingPolicy, parse_job
from rljob_operator.cluster.kube import ChildConflict, Kube, namespace_terminating
from rljob_operator.decisions.children import desired_configmap, desired_service
from rljob_operator.decisions.lifecycle import (
    FORCE_DELETE_AFTER_SECONDS,
    Event,
    Plan,
    plan_invalid,
    plan_reconcile,
)
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.scaling import Capacity
from rljob_operator.names import LABEL_JOB, StatusEndpoint, job_uid
from rljob_operator.times import rfc3339

log = logging.getLogger("rljob.reconciler")
#: Retry soon when a child's name is taken by something else.
CONFLICT_REQUEUE_SECONDS = 10.0
#: How long one look at the cluster's nodes and bound pods serves policy-Capacity jobs.
CAPACITY_MAX_AGE_SECONDS = 1.0


def _without_nulls(value: Any) -> Any:
    """A value as the API server stores it after a merge patch: null members of objects dropped."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _status_changed(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Would the merge patch ``desired`` change ``current``? (A no-op patch still costs a write.)"""
    return any(_without_nulls(current.get(k)) != _without_nulls(v) for k, v in desired.items())


class Reconciler:
    """Reconciles jobs through a :class:`Kube`; ``endpoint`` is the status API pods report to."""

    def __init__(
        self,
        kube: Kube,
        endpoint: StatusEndpoint | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        instance: str = "",
        force_delete_after: float = FORCE_DELETE_AFTER_SECONDS,
        pod_cache: Callable[[str, str], list[dict[str, Any]] | None] | None = None,
    ) -> None:
        self.kube = kube
        self.pod_cache = pod_cache
        self.endpoint = endpoint
        self.clock = clock
        self.instance = instance
        self.force_delete_after = force_delete_after
        self._capacity: tuple[float, Capacity | None] = (float("-inf"), None)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rljob-create")
        self._capacity_denied = False

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Reconcile ``namespace/name`` once; returns seconds until it wants another look."""
        started = time.monotonic()
        try:
            requeue = self._reconcile(namespace, name)
            metrics.RECONCILES.labels(result="ok").inc()
            return requeue
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def _reconcile(self, namespace: str, name: str) -> float | None:
        raw = self.kube.get_job(namespace, name)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            metrics.JOB_PHASES.set((namespace, name), None)
            return None
        now = self.clock()
        try:
            job = parse_job(raw, f"{namespace}/{name}")
        except ManifestError as e:
            plan = plan_invalid(raw, e.problems, now)
            self._apply(raw, plan, now)
            return None
        uid = job_uid(job)
        capacity = self.capacity() if job.spec.autoscaling.policy == ScalingPolicy.capacity else None
        cached = self.pod_cache(namespace, name) if self.pod_cache is not None else None
        pods = cached if cached is not None else self._list_pods(namespace, name)
        plan = plan_reconcile(job, [ObservedPod.from_pod(p, uid) for p in pods], now, self.endpoint,
                              self.force_delete_after, capacity)
        if cached is not None and (plan.create_pods or plan.gang_restart):
            # The watch may lag behind the API server by a moment: what is absent from it (a pod just
            # created, one gone) is looked up before pods are created or a gang is restarted.
            pods = self._list_pods(namespace, name)
            plan = plan_reconcile(job, [ObservedPod.from_pod(p, uid) for p in pods], now, self.endpoint,
                                  self.force_delete_after, capacity)
        return self._apply(raw, plan, now, job=job, pods={p["metadata"]["name"]: p for p in pods})

    def _list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.kube.list_pods(namespace, f"{LABEL_JOB}={name}")

    def capacity(self) -> Capacity | None:
        """Nodes and bound pods, shared by the reconciles of the next ``CAPACITY_MAX_AGE_SECONDS``.

        None when the operator may not list nodes or all pods (its RBAC): Capacity jobs then keep
        their size, as with policy Manual, and the operator says so once in its log.
        """
        taken, snapshot = self._capacity
        if time.monotonic() - taken < CAPACITY_MAX_AGE_SECONDS:
            return snapshot
        try:
            snapshot = Capacity.from_objects(self.kube.list_nodes(), self.kube.list_bound_pods())
        except ApiException as e:
            if e.status != 403:
                raise
            if not self._capacity_denied:
                log.warning("autoscaling policy Capacity needs list on nodes and pods (all namespaces); "
                            "denied (%s): sizes stay as requested", e.reason)
            self._capacity_denied = True
            snapshot = None
        self._capacity = (time.monotonic(), snapshot)
        return snapshot

    def _apply(self, raw: dict[str, Any], plan: Plan, now: datetime, job: Any = None,
               pods: dict[str, dict[str, Any]] | None = None) -> float | None:
        meta = raw["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if _status_changed(raw.get("status") or {}, plan.status):
            self.kube.patch_job_status(namespace, name, plan.status)
        metrics.JOB_PHASES.set((namespace, name), plan.status.get("phase"))

        for pod_name in plan.delete_pods:
            pod_uid = ((pods or {}).get(pod_name) or {}).get("metadata", {}).get("uid")
            log.info("%s/%s: deleting pod %s", namespace, name, pod_name)
            self.kube.delete_pod(namespace, pod_name, pod_uid)
        for pod_name in plan.force_delete_pods:
            pod_uid = ((pods or {}).get(pod_name) or {}).get("metadata", {}).get("uid")
            log.warning("%s/%s: pod %s is stuck terminating: force-deleting it", namespace, name, pod_name)
            self.kube.delete_pod(namespace, pod_name, pod_uid, force=True)
            self._event(raw, Event("Warning", "ForceDeleted",
                                   f"{pod_name} stayed Terminating past its grace period (its node does not "
                                   "answer): force-deleted it"), now)

        requeue = plan.requeue_after
        if plan.create_pods:
            # The ConfigMap follows the status just written (OOM recovery's batch shape).
            job = job.model_copy(update={"status": RLTrainingJobStatus.model_validate(plan.status)})
            try:
                children = [self._pool.submit(self.kube.create_or_adopt, desired_configmap(job, self.endpoint), uid,
                                              compare_data=True),
                            self._pool.submit(self.kube.create_or_adopt, desired_service(job), uid)]
                for child in children:
                    child.result()  # both exist (or raised) before any pod is created
                for pod in plan.create_pods:
                    log.info("%s/%s: creating pod %s", namespace, name, pod["metadata"]["name"])
                # A gang's pods are independent requests: send them together (a failure still raises).
                list(self._pool.map(self.kube.create_pod, plan.create_pods))
            except ChildConflict as e:
                self._stuck(raw, "ChildConflict", str(e), now)
                requeue = CONFLICT_REQUEUE_SECONDS
            except ApiException as e:
                if namespace_terminating(e.status, e.body):  # the job goes with its namespace: nothing to do
                    log.info("%s/%s: namespace is being deleted; not creating its pods", namespace, name)
                    return None
                if e.status == 422:  # the API server rejected the pod (podTemplate, volumes): permanent
                    self._fail(raw, "InvalidPodSpec", _api_message(e), now)
                    return None
                if e.status == 403 and "quota" in (e.body or ""):
                    self._stuck(raw, "QuotaExceeded", _api_message(e), now)
                    requeue = CONFLICT_REQUEUE_SECONDS
                else:
                    raise

        if plan.gang_restart:
            metrics.GANG_RESTARTS.labels(reason=plan.gang_restart).inc()
        for event in plan.events:
            self._event(raw, event, now)
        if plan.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed: deleting the job", namespace, name)
            self.kube.delete_job(namespace, name, uid)
            metrics.JOB_PHASES.set((namespace, name), None)
            return None
        return requeue

    def _event(self, raw: dict[str, Any], event: Event, now: datetime) -> None:
        try:
            self.kube.post_event(raw, event.type, event.reason, event.message, rfc3339(now),
                                 instance=self.instance)
        except ApiException as e:  # an Event is worth a log line, not a failed reconcile
            if not namespace_terminating(e.status, e.body):
                log.warning("cannot post event %s: %s", event.reason, e.reason)

    def _stuck(self, raw: dict[str, Any], reason: str, message: str, now: datetime) -> None:
        meta = raw["metadata"]
        self.kube.patch_job_status(meta["namespace"], meta["name"], {"reason": reason, "message": message})
        self._event(raw, Event("Warning", reason, message), now)

    def _fail(self, raw: dict[str, Any], reason: str, message: str, now: datetime) -> None:
        from rljob_operator.decisions.conditions import make_conditions

        meta = raw["metadata"]
        previous = (raw.get("status") or {}).get("conditions") or []
        status = {
            "phase": "Failed",
            "reason": reason,
            "message": message,
            "completionTime": rfc3339(now),
            "conditions": make_conditions("Failed", reason, message, ready=False, reconciling=False,
                                          generation=meta.get("generation"), previous=previous, now=now),
        }
        self.kube.patch_job_status(meta["namespace"], meta["name"], status)
        self._event(raw, Event("Warning", reason, message), now)


def _api_message(error: ApiException) -> str:
    import json

    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)
