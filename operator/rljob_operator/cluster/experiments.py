"""RLExperiments on the cluster: one reconcile (observe, apply).

An experiment's key is an ``ExperimentKey`` in the operator's one work queue (a job's is a
``JobKey``; the reconcile dispatches on the type), so experiments get the same per-key serialisation, backoff and
leader write guard as jobs. What wakes an experiment (``handlers.ExperimentEvents`` and
``handlers.JobEvents``, from the one RLTrainingJob stream): its own events, and any event of a trial
job (label ``rljob.dev/experiment``: created, status written by a heartbeat, finished); besides
those it asks for another look every ``RECHECK_SECONDS`` while it runs.

A reconcile reads the experiment and LISTs the jobs that carry its label (a LIST, not a watch cache:
a trial created a moment ago must be seen, or a restarted operator could think it missing), lets
``decisions.experiments.plan_experiment`` decide which are its trials (by the UIDs its status
recorded; the others are conflicts), and applies the plan: status, creates (409: the name is taken,
and the job is no trial until its UID is recorded), the created jobs' UIDs, suspensions, Events.

Once an experiment whose template tracks to MLflow has concluded, the record step (``decisions.recording``) reads
its record pod (a GET by name) and the trials' runtime (the ``RuntimeStore``, as a trial job's reconcile does),
puts the condition ``Recorded`` in the status written first, then creates the ConfigMap, NetworkPolicy and pod
(not in a reconcile that also creates trials: a refused trial rewrites the status). A pod wakes no experiment,
so it looks again every few seconds while the pod runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException
from rljob_contract import experiment as exp_api
from rljob_contract.experiment import ExperimentPhase, RLExperiment
from rljob_contract.job import GROUP, PLURAL, VERSION, ManifestError, RLTrainingJob
from rljob_contract.runtime import Resolved, resolve

from rljob_operator.cluster.kube import Kube
from rljob_operator.cluster.namespaces import NamespaceStore
from rljob_operator.cluster.runtimes import RuntimeStore
from rljob_operator.decisions.children import JobNetwork
from rljob_operator.decisions.conditions import condition
from rljob_operator.decisions.experiments import (
    ExperimentFailure,
    ExperimentPlan,
    invalid_experiment,
    plan_experiment,
    record_uids,
    refused_trial,
    selector,
)
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.decisions.recording import (
    RECORDED,
    RecordPlan,
    plan_record,
    record_name,
    tracks_mlflow,
)
from rljob_operator.decisions.runtimes import not_allowed
from rljob_operator.times import rfc3339

log = logging.getLogger("rljob.experiments")


class ExperimentReconciler:
    """Reconciles experiments through a :class:`Kube` (the leader-guarded one when leading)."""

    def __init__(self, kube: Kube, profile: PodProfile | None = None, instance: str = "",
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC), runtimes: RuntimeStore | None = None,
                 namespaces: NamespaceStore | None = None, network: JobNetwork | None = None) -> None:
        self.kube = kube
        self.profile = profile
        self.instance = instance
        self.clock = clock
        self.runtimes = runtimes
        """The trials' runtimes (the record pod is built from theirs); None: no runtime (tests)."""
        self.namespaces = namespaces
        self.network = network
        """The jobs' NetworkPolicy settings: the record pod gets one as theirs (None: the operator makes none)."""

    @staticmethod
    def path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{exp_api.PLURAL}"
        if name:
            path += f"/{quote(name)}"
        return path + (f"/{subresource}" if subresource else "")

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Reconcile experiment ``namespace/name`` once; seconds until it wants another look."""
        try:
            raw = self.kube.request("GET", self.path(namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        if raw["metadata"].get("deletionTimestamp"):
            return None  # the garbage collector deletes its trials
        now = rfc3339(self.clock())
        try:
            parsed = exp_api.parse_experiment(raw, f"{namespace}/{name}")
        except ManifestError as e:
            self._invalid(raw, e.problems, now)
            return None
        listed = self.kube.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}",
                                   query={"labelSelector": selector(name)})
        plan = plan_experiment(raw, parsed, list(listed.get("items") or []), now, self.profile)
        record = self._record(raw, parsed, plan, now)
        self._apply(raw, plan, now)
        if record.create and not plan.create:  # after the trials' creates settle (a refusal rewrites the status)
            self._create_record(raw, plan.status, record, now)
        return plan.requeue_after

    def _record(self, raw: dict[str, Any], parsed: RLExperiment, plan: ExperimentPlan, now: str) -> RecordPlan:
        """The record step (``decisions.recording``), its condition put in the plan's status (the status is
        written first: a crash before the create finds no pod and creates it then)."""
        if plan.status.get("phase") not in (ExperimentPhase.succeeded, ExperimentPhase.failed) or \
                not tracks_mlflow(parsed):
            return RecordPlan()
        runtime = self._trials_runtime(raw, parsed)
        if runtime is None:  # the runtimes' watches have not listed yet
            plan.requeue_after = min(plan.requeue_after or 5.0, 5.0)
            return RecordPlan()
        namespace = raw["metadata"]["namespace"]
        try:
            pod: dict[str, Any] | None = self.kube.request(
                "GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(record_name(raw))}")
        except ApiException as e:
            if e.status != 404:
                raise
            pod = None
        record = plan_record(raw, parsed, plan.status, pod, runtime, self.profile, now, self.network)
        if record.condition is not None:
            kept = [c for c in plan.status.get("conditions") or [] if c.get("type") != RECORDED]
            plan.status = {**plan.status, "conditions": [*kept, record.condition]}
        if record.requeue_after is not None:
            plan.requeue_after = min(plan.requeue_after or record.requeue_after, record.requeue_after)
        return record

    def _trials_runtime(self, raw: dict[str, Any], parsed: RLExperiment) -> Resolved | str | None:
        """The template's runtime resolved as a trial job's is, or why there is none; None while not known yet."""
        meta = raw["metadata"]
        job = RLTrainingJob.model_validate({
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": parsed.spec.template.model_dump(by_alias=True, mode="json", exclude_unset=True)})
        if self.runtimes is None:
            return resolve(job, None)
        if not self.runtimes.synced() or (self.namespaces is not None and not self.namespaces.synced()):
            return None
        labels = self.namespaces.labels(meta["namespace"]) if self.namespaces is not None else None
        runtime, missing = self.runtimes.lookup(job, labels)
        if runtime is None:
            return missing or "the trials' runtime does not exist"
        refused = not_allowed(runtime, meta["namespace"], labels) if labels is not None else None
        return refused or resolve(job, runtime)

    def _create_record(self, raw: dict[str, Any], status: dict[str, Any], record: RecordPlan, now: str) -> None:
        """Create the ConfigMap, the NetworkPolicy, then the pod (409: made before, by this experiment or not: the next look says);
        a create the API server refuses is the condition's final word."""
        meta = raw["metadata"]
        for obj in record.create:
            try:
                self.kube.request("POST", _collection(obj, meta["namespace"]), obj)
            except ApiException as e:
                if e.status == 409:
                    continue
                if e.status not in (400, 403, 422):
                    raise
                message = f"the API server refused the record {obj['kind']} (HTTP {e.status}): {_detail(e)}"
                refused = condition(RECORDED, False, "RecordRefused", message[:1000], now=now,
                                    previous=[record.condition or {}], generation=meta.get("generation"))
                conditions = [c for c in status.get("conditions") or [] if c.get("type") != RECORDED]
                self.kube.request("PATCH", self.path(meta["namespace"], meta["name"], "status"),
                                  {"status": {"conditions": [*conditions, refused.model_dump(
                                      by_alias=True, mode="json", exclude_none=True)]}},
                                  content_type="application/merge-patch+json")
                return
        log.info("experiment %s/%s: created its record pod %s", meta["namespace"], meta["name"], record_name(raw))

    def _apply(self, raw: dict[str, Any], plan: ExperimentPlan, now: str) -> None:
        """Status, then creates and their UIDs, then suspensions, then Events (see ``decisions.experiments``)."""
        meta = raw["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if any((raw.get("status") or {}).get(k) != v for k, v in plan.status.items()):
            self.kube.request("PATCH", self.path(namespace, name, "status"), {"status": plan.status},
                              content_type="application/merge-patch+json")
        if self._create(raw, plan, now):
            return
        for trial in plan.suspend:
            try:
                self.kube.request("PATCH", self.kube.job_path(namespace, trial),
                                  {"spec": {"runPolicy": {"suspend": True}}},
                                  content_type="application/merge-patch+json")
            except ApiException as e:
                if e.status != 404:
                    raise
        for event in plan.events:
            try:
                self.kube.post_event(raw, event.type, event.reason, event.message, now, instance=self.instance)
            except ApiException as e:  # an Event is worth a log line, not a failed reconcile
                log.warning("cannot post %s event for experiment %s/%s: %s", event.reason, namespace, name, e)

    def _create(self, raw: dict[str, Any], plan: ExperimentPlan, now: str) -> bool:
        """Create the plan's trial jobs, then record the UIDs the API server gave them; True when one was refused."""
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        created: dict[str, str] = {}
        try:
            for job in plan.create:
                trial = job["metadata"]["name"]
                try:
                    created[trial] = self.kube.request("POST", self.kube.job_path(namespace), job)["metadata"]["uid"]
                    log.info("experiment %s/%s: created trial %s", namespace, name, trial)
                except ApiException as e:
                    if e.status in (400, 403, 422):  # refused (admission, quota, validation): retrying cannot help
                        self._refused(raw, trial, e, now)
                        return True
                    if e.status != 409:  # 409: the name is taken; the job is a conflict until its UID is recorded
                        raise
        finally:
            if created:  # also when a later create failed: these jobs are the trials'
                self.kube.request("PATCH", self.path(namespace, name, "status"),
                                  {"status": {"trials": record_uids(plan.status, created)}},
                                  content_type="application/merge-patch+json")
        return False

    def _refused(self, raw: dict[str, Any], trial: str, error: ApiException, now: str) -> None:
        """The API server refused a trial job: the experiment fails, saying why (TrialRejected)."""
        self._fail(raw, refused_trial(raw, trial, error.status, _detail(error)), now)

    def _invalid(self, raw: dict[str, Any], problems: list[str], now: str) -> None:
        """A spec the models refuse: Failed, InvalidSpec, nothing started (``decisions.experiments.invalid_experiment``)."""
        failure = invalid_experiment(raw, problems)
        if failure is not None:
            self._fail(raw, failure, now)

    def _fail(self, raw: dict[str, Any], failure: ExperimentFailure, now: str) -> None:
        """Write ``failure``'s status, then its Warning Event."""
        meta = raw["metadata"]
        self.kube.request("PATCH", self.path(meta["namespace"], meta["name"], "status"), {"status": failure.status},
                          content_type="application/merge-patch+json")
        event = failure.event
        self.kube.post_event(raw, event.type, event.reason, event.message, now, instance=self.instance)


def _detail(error: ApiException) -> str:
    """What the API server said when it refused a create."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


def _collection(obj: dict[str, Any], namespace: str) -> str:
    """Where a record object of ``obj``'s kind is created."""
    if obj["kind"] == "NetworkPolicy":
        return f"/apis/networking.k8s.io/v1/namespaces/{quote(namespace)}/networkpolicies"
    return f"/api/v1/namespaces/{quote(namespace)}/{'configmaps' if obj['kind'] == 'ConfigMap' else 'pods'}"
