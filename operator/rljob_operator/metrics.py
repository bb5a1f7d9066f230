"""The operator's Prometheus metrics and its health endpoints (``/metrics``, ``/healthz``, ``/readyz``).

Series (prefix ``rljob_operator_``): ``jobs{phase}`` (jobs this replica last reconciled, by
phase), ``job_phase{namespace,job,phase}`` (1 for each job's current phase), ``reconcile_duration_seconds`` (histogram), ``reconciles_total{result}``,
``api_requests_total{verb,resource}`` (requests the reconciler sent),
``api_errors_total{verb,resource,code}`` (failed Kubernetes API calls; 404 and 409, the normal
answers of get and create-or-adopt, are not counted), ``gang_restarts_total{reason}``
(worker gangs started again: spec changes, resumes, failures, stalls), ``heartbeats_total{result}`` (status API: accepted,
throttled over the job's share, unauthorized, forbidden, invalid),
``status_api_refused_total{reason}`` (status API requests answered before any token review:
invalid_name 400, rate_limited and busy 429, token_rejected_before 401 from the rejected-token
cache), ``events_dropped_total{reason}`` (Events a job's pods caused beyond its Event rate,
``cluster.events``), ``leader`` (1 on the replica that reconciles), ``admission_policies_in_force`` (1 while the
admission policies the operator relies on are in force; 0 while they are not, and reconciles are paused, or
when they are knowingly not checked, ``cluster.admission``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter as _Counter
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from rljob_contract.job import Phase

RECONCILE_SECONDS = Histogram(
    "rljob_operator_reconcile_duration_seconds",
    "Time one reconcile of one RLTrainingJob took.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILES = Counter("rljob_operator_reconciles_total", "Reconciles by result (ok, error).", ["result"])
QUEUE_WAIT_SECONDS = Histogram(
    "rljob_operator_queue_wait_seconds",
    "Time a job waited in the work queue, from the event (or due time) that queued it to its reconcile's "
    "start, by what queued it: urgent (a worker ended, a gang's last terminating pod is gone or its last pod "
    "is ready, a Node was deleted), event (any other watch event) or routine (a timer or the periodic resync).",
    ["queued_by"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60),
)
QUEUE_DEPTH = Gauge("rljob_operator_queue_depth", "Jobs waiting in the work queue (not counting those reconciling).")
RESYNCS = Counter("rljob_operator_resyncs_total",
                  "Periodic resyncs (operator.resyncSeconds): each queues every known job for a routine reconcile.")
API_REQUESTS = Counter(
    "rljob_operator_api_requests_total", "Kubernetes API requests the reconciler sent.", ["verb", "resource"]
)
API_ERRORS = Counter(
    "rljob_operator_api_errors_total", "Failed Kubernetes API calls.", ["verb", "resource", "code"]
)
GANG_RESTARTS = Counter(
    "rljob_operator_gang_restarts_total", "Worker gangs started again, by reason.", ["reason"]
)
# Series exist from the start, so increase() sees the first restart of each kind.
for _reason in ("Resumed", "SpecChanged", "WorkerFailed", "WorkerLost", "OOMKilled", "CudaOutOfMemory",
                "HeartbeatTimeout", "StartupTimeout", "Disrupted", "Resized"):
    GANG_RESTARTS.labels(reason=_reason)
WORKERS_REPLACED = Counter(
    "rljob_operator_workers_replaced_total",
    "Failed workers of elastic jobs replaced in place (the rest of the gang kept running), by reason.", ["reason"]
)
for _reason in ("WorkerFailed", "WorkerLost", "OOMKilled", "CudaOutOfMemory", "Disrupted"):
    WORKERS_REPLACED.labels(reason=_reason)
HEARTBEATS = Counter("rljob_operator_heartbeats_total", "Status API heartbeats by result.", ["result"])
STATUS_API_REFUSED = Counter(
    "rljob_operator_status_api_refused_total",
    "Status API requests refused before a token review, by reason (invalid_name, rate_limited, busy, "
    "token_rejected_before).",
    ["reason"],
)
EVENTS_DROPPED = Counter(
    "rljob_operator_events_dropped_total",
    "Events not written because the job they were for exceeded its Event rate (cluster.events), by reason.",
    ["reason"],
)
LEADER = Gauge("rljob_operator_leader", "1 while this replica holds the lease and reconciles.")
ADMISSION_POLICIES_IN_FORCE = Gauge(
    "rljob_operator_admission_policies_in_force",
    "1 while the admission policies that check what job creators name are in force; 0 while they are not "
    "(reconciles paused, /readyz 503) or when the operator runs without them (without_admission_policies).",
)


class JobPhases(Collector):
    """``rljob_operator_jobs{phase}`` from the phases the reconciler last wrote."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def set(self, key: tuple[str, str], phase: str | None) -> None:
        with self._lock:
            if phase is None:
                self._phases.pop(key, None)
            else:
                self._phases[key] = phase

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            phases = dict(self._phases)
        counts = _Counter(phases.values())
        family = GaugeMetricFamily("rljob_operator_jobs", "RLTrainingJobs by phase.", labels=["phase"])
        for phase in Phase:
            family.add_metric([phase.value], counts.get(phase.value, 0))
        yield family
        # One series per job and phase (1 for its phase, 0 for the others), so an alert can say
        # which job has been Restarting or Failed for how long.
        per_job = GaugeMetricFamily("rljob_operator_job_phase", "Phase of each RLTrainingJob (1 = current).",
                                    labels=["namespace", "job", "phase"])
        for (namespace, job), current in sorted(phases.items()):
            for phase in Phase:
                per_job.add_metric([namespace, job, phase.value], 1 if phase.value == current else 0)
        yield per_job


JOB_PHASES = JobPhases()
REGISTRY.register(JOB_PHASES)


def health_app(ready: Callable[[], bool]) -> web.Application:
    """``/metrics`` (``?name[]=…`` for only those series, as prometheus_client's own server offers); ``/healthz``
    (the event loop answers); ``/readyz`` (``ready()``)."""

    async def metrics_handler(request: web.Request) -> web.Response:
        names = request.query.getall("name[]", [])
        registry = REGISTRY.restricted_registry(names) if names else REGISTRY
        # Rendered off the event loop: with 10,000 jobs the per-job phase series make a scrape 80,000 lines and
        # about half a second of CPU, which would hold the status API's heartbeats that long.
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok = ready()
        return web.Response(text="ready\n" if ok else "not ready\n", status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
