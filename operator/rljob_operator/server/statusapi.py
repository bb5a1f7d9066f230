"""The status API (HTTPS, in the operator): trainers' heartbeats in, a job's status out.

``POST /api/v1/namespaces/{ns}/rltrainingjobs/{name}/heartbeat`` (``rljob_contract.pod.heartbeat_path``)
    Body ``{step, reward, loss, checkpoint, best_checkpoint, best_metric, final, ...}``
    (``rljob_contract.pod.HeartbeatBody``) from the trainer's rank 0, with
    ``Authorization: Bearer <projected service-account token>``. TokenReview must accept the
    token for the audience ``rljob-status`` (which it does only while the pod it is bound to exists with
    that uid); the token must be bound to a pod (the ``authentication.kubernetes.io/pod-name``/``pod-uid``
    extras a kubelet-projected token carries), and that pod must be one the operator created for the
    RLTrainingJob ``ns/name``: the pod of that name and uid has the job (kind, name and uid) as its
    controller ownerReference, which the admission policy ``rljob-worker-pods`` admits only from whoever
    may patch the job's status, the operator (``decisions.observed.job_reference``). Its labels prove
    nothing: anyone who may create pods in ``ns`` can copy them. Accepted heartbeats become the job's ``status.progress``
    (step, reward, loss, checkpoint, bestCheckpoint, bestMetric, lastHeartbeat), written at most every
    ``flush_seconds`` per job (a ``final`` heartbeat at once), and its ``health`` reports become
    ``status.progress.health`` (docs/guides/health.md); the reward, loss and ``metrics`` of
    each heartbeat become a point of ``status.progress.curve`` (bounded, finite, steps increasing;
    ``decisions.curve``), from which experiments compute their objectives.
``GET /api/v1/namespaces/{ns}/rltrainingjobs/{name}/status``
    For people and tools: any bearer token the API server accepts (TokenReview, default
    audience), allowed when a SubjectAccessReview says its user may ``get`` that
    rltrainingjob. Answers the job's status.

No or unknown token → 401; a valid token for another job or without permission → 403.

Hostile requests (issue #14): before anything else the namespace and name must be Kubernetes
names (400 otherwise; ``guard.checked_names``), then the client's rate limit and the bound on
requests in flight apply (429 with Retry-After; ``guard``). A token the API server rejected is
answered 401 from memory for ``negative_cache_seconds``, so repeating a junk token costs no
TokenReview. The API requests (TokenReview, SubjectAccessReview, the job, the token's pod) go through
the typed client, which escapes every path parameter, and what comes back must be the kind,
namespace and name asked for before it is used. They run on the status API's own threads
(``review_threads``), never on the default executor that reconciles use nor on the Lease's
thread: a flood of requests whose reviews are slow cannot delay a reconcile or a renewal.

A job's pods cannot flood (issue #30 point 4): a heartbeat with a valid token is still hostile input.
A heartbeat whose token is already known (reviewed, and checked to speak for its job) skips the
per-address bucket and spends a token of the bucket of the job it speaks for (``rate_per_job``,
``burst_per_job``) before it takes a slot in flight; one not known yet, or refused before, pays per
address and is charged to its job once checked (a refused token is never charged to a job: it cannot
throttle one, nor write its ``lastThrottled``). Every job gets the same share whatever address its
pods share. Beyond it: 429 with Retry-After (which the trainer honours), and
``status.progress.lastThrottled`` records that a worker of the job was alive, so the stall clock
(``decisions.failure.observe``) does not take a throttled job for a hung one. A heartbeat's ``warnings``
and the health signals that trip (``health``, one Warning Event each, reason EntropyCollapse, MaskedBatch, ...)
become Events through ``cluster.events.EventRecorder``: repeats counted on one Event, at most
``EventLimits().bound(t)`` writes per job in t seconds (25 + t/300 s), the rest dropped and counted.

``RLJOB_FAULT_REVIEW_DELAY_SECONDS=S`` makes every TokenReview take S seconds longer (tests use it
to stand for a slow API server or token webhook while they flood the API with junk tokens).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from rljob_contract.health import HealthReport, HealthSignal
from rljob_contract.job import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    EvaluationProgress,
    HealthWarning,
    Progress,
)
from rljob_contract.pod import EvalReport, HeartbeatBody, heartbeat_path, warning_reason

from rljob_operator import metrics
from rljob_operator.cluster.events import EventRecorder
from rljob_operator.cluster.kube import Kube
from rljob_operator.decisions.curve import curve_point, merge_curve
from rljob_operator.decisions.observed import job_reference
from rljob_operator.names import TOKEN_AUDIENCE
from rljob_operator.server.guard import InvalidName, RateLimiter, StatusLimits, checked_names, retry_after
from rljob_operator.times import rfc3339

log = logging.getLogger("rljob.statusapi")
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
CACHE_SECONDS = 30.0
#: A pod whose controller is a job of the same name but another uid than the job read has it read again, at most
#: this often per job (the job deleted and made again under its name since the read).
RECORD_RECHECK_SECONDS = 2.0
FAULT_REVIEW_DELAY_ENV = "RLJOB_FAULT_REVIEW_DELAY_SECONDS"
#: Conditional curve writes tried before the progress is written without new points.
CURVE_WRITE_ATTEMPTS = 4


#: Set on a heartbeat request the guard already charged to its job's bucket.
CHARGED = "rljob.charged_to_job"


@dataclass(frozen=True)
class Identity:
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


def _pod_of(identity: Identity) -> tuple[str, str, str] | None:
    """(namespace, pod name, pod uid) a service-account token is bound to; None if it is not bound to a pod."""
    pod_name = (identity.extra.get(POD_NAME_EXTRA) or [""])[0]
    if not identity.username.startswith(SA_PREFIX) or not pod_name:
        return None
    namespace = identity.username[len(SA_PREFIX):].split(":", 1)[0]
    return namespace, pod_name, (identity.extra.get(POD_UID_EXTRA) or [""])[0]


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, retry: float | None = None) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="rljob"'} if status == 401 else {}
    if retry is not None:
        headers["Retry-After"] = retry_after(retry)
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _expect(obj: Any, api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> Any:
    """``obj`` when it is the object asked for; otherwise ``Denied(502)`` (and nothing of it is used).

    Defence in depth behind the name checks: whatever path a request took, an answer of another
    kind, namespace or name never becomes a status the API returns or a pod that vouches for a token.
    """
    meta = (obj.get("metadata") or {}) if isinstance(obj, dict) else {}
    got = (obj.get("apiVersion"), obj.get("kind")) if isinstance(obj, dict) else (None, type(obj).__name__)
    if got != (api_version, kind) or (namespace is not None and meta.get("namespace") != namespace) \
            or (name is not None and meta.get("name") != name):
        where = f" {namespace}/{name}" if name is not None else ""
        log.error("the API server answered %s %s %s/%s for %s %s%s; not using it", got[0], got[1],
                  meta.get("namespace"), meta.get("name"), api_version, kind, where)
        raise Denied(502, f"the API server answered something other than {kind}{where}")
    return obj


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class _TTLCache:
    def __init__(self, seconds: float, size: int = 4096) -> None:
        self.seconds, self.size = seconds, size
        self._items: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, max_age: float | None = None) -> Any:
        """The value put under ``key`` less than ``seconds`` ago (and, given, less than ``max_age``); else None."""
        hit = self._items.get(key)
        now = time.monotonic()
        if hit is None or hit[0] < now:
            self._items.pop(key, None)
            return None
        if max_age is not None and hit[0] - self.seconds + max_age < now:
            return None
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (time.monotonic() + self.seconds, value)


def evaluation_progress(report: EvalReport) -> dict[str, Any]:
    """``status.progress.evaluation`` from a heartbeat's evaluation: finite numbers only (JSON has no NaN; a
    ``None`` removes the field in the merge patch)."""
    values = report.wire()["values"]
    best = report.best_value if report.best_value is not None and math.isfinite(report.best_value) else None
    return EvaluationProgress(metric=report.metric, step=report.step, value=values.get(report.metric), values=values,
                              best_step=report.best_step, best_value=best).model_dump(by_alias=True, mode="json")


#: The heartbeat's values that ``status.progress`` has a field of the same name for (reward, loss,
#: checkpoint, best_checkpoint, best_metric), derived from the two models: a field added to both is
#: carried, under the status field's alias, with no table to update. ``step``, ``evaluation`` and ``health``
#: are set on their own.
REPORTED_FIELDS = tuple(name for name in HeartbeatBody.model_fields
                        if name in Progress.model_fields and name not in ("step", "evaluation", "health"))


#: The reason of the Warning Event of each tripped health signal: its name in CamelCase (EntropyCollapse, ...).
HEALTH_EVENT_REASONS = {signal.value: signal.value[0].upper() + signal.value[1:] for signal in HealthSignal}


def health_progress(reports: list[HealthReport]) -> list[dict[str, Any]]:
    """``status.progress.health`` from a heartbeat's health reports (validated and bounded by ``HeartbeatBody``:
    one per known signal, finite numbers), each with its message written here, never taken from the pod."""
    return [HealthWarning(signal=r.signal, step=r.step, last_step=r.last_step, active=r.active, value=r.value,
                          threshold=r.threshold, message=r.message()).model_dump(by_alias=True, mode="json")
            for r in reports]


def newly_tripped(body: HeartbeatBody) -> list[HealthReport]:
    """The health signals that tripped at this heartbeat's step: each becomes one Warning Event (a signal that
    stays active is not told again; a heartbeat the trainer coalesced away costs its Event, never the status)."""
    return [r for r in body.health or [] if r.active and r.step == body.step]


def _progress_key(name: str) -> str:
    """The camelCase key of ``status.progress``'s field ``name`` (the model's alias)."""
    return Progress.model_fields[name].alias or name


def heartbeat_progress(body: HeartbeatBody, now: datetime) -> dict[str, Any]:
    """The ``status.progress`` merge patch of a heartbeat accepted at ``now``: its step, the time, the
    values it reports (finite ones only: JSON has no NaN or infinity, and such a value would make the
    API server refuse the whole patch) and its evaluation."""
    progress: dict[str, Any] = {_progress_key("step"): body.step, _progress_key("last_heartbeat"): rfc3339(now)}
    for name in REPORTED_FIELDS:
        value = getattr(body, name)
        if value is not None and (not isinstance(value, float) or math.isfinite(value)):
            progress[_progress_key(name)] = value
    if body.evaluation is not None:
        progress[_progress_key("evaluation")] = evaluation_progress(body.evaluation)
    if body.health is not None:
        progress[_progress_key("health")] = health_progress(body.health)
    return progress


class ProgressWriter:
    """Coalesces heartbeats into at most one status patch per job every ``flush_seconds``.

    Each heartbeat's values also become a point of ``status.progress.curve``
    (``decisions.curve.merge_curve``). The curve is read from the job when this writer has not
    written it itself, and each write is conditional on the job's resourceVersion: when another
    replica (or the reconciler) wrote the job since, the write is refused (409), the curve is
    read again and the write repeated, so no replica's points overwrite another's.
    Patches run on ``executor`` (the status API's threads; default: asyncio's default executor).
    """

    def __init__(self, kube: Kube, flush_seconds: float, executor: ThreadPoolExecutor | None = None) -> None:
        self.kube = kube
        self.flush_seconds = flush_seconds
        self.executor = executor
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._points: dict[tuple[str, str], list[dict[str, Any]]] = {}
        # (resourceVersion, curve) this writer last wrote per job: the next write builds on it.
        self._written: dict[tuple[str, str], tuple[str, list[dict[str, Any]]]] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._scheduled: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def submit(self, namespace: str, name: str, progress: dict[str, Any], final: bool,
                     point: dict[str, Any] | None = None) -> None:
        """Queue ``progress`` (and a curve ``point``) for job ``namespace/name``; written now when due or ``final``."""
        key = (namespace, name)
        self._pending[key] = {**self._pending.get(key, {}), **progress}
        if point is not None:
            # Bounded like the curve itself, whatever the rate of heartbeats between flushes.
            self._points[key] = merge_curve(self._points.get(key, []), [point])
        wait = self._last.get(key, 0.0) + self.flush_seconds - time.monotonic()
        if final or wait <= 0:
            await self._flush(key)
        elif key not in self._scheduled:
            self._scheduled.add(key)
            task = asyncio.create_task(self._flush_later(key, wait))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush_later(self, key: tuple[str, str], wait: float) -> None:
        await asyncio.sleep(wait)
        self._scheduled.discard(key)
        try:
            await self._flush(key)
        except Exception as e:
            log.warning("cannot write progress of %s/%s: %s", *key, e)

    async def _flush(self, key: tuple[str, str]) -> None:
        # One write per job at a time, in order: an older heartbeat never lands after a newer one.
        async with self._locks.setdefault(key, asyncio.Lock()):
            progress = self._pending.pop(key, None)
            points = self._points.pop(key, [])
            if not progress:
                return
            self._last[key] = time.monotonic()
            # Names were checked by the status API (checked_names) before a heartbeat got here.
            write = functools.partial(self._write, key, progress, points)
            await asyncio.get_running_loop().run_in_executor(self.executor, write)

    def _write(self, key: tuple[str, str], progress: dict[str, Any], points: list[dict[str, Any]]) -> None:
        """Merge-patch ``progress`` with the curve extended by ``points`` (on a thread; retried on conflicts)."""
        if not points:
            self.kube.patch_job_status(key[0], key[1], {"progress": progress})
            return
        for attempt in range(CURVE_WRITE_ATTEMPTS):
            written = self._written.pop(key, None) if attempt == 0 else None
            if written is None:
                job = self.kube.get_job(*key)
                if job is None:
                    raise ApiException(status=404, reason="Not Found")
                curve = ((job.get("status") or {}).get("progress") or {}).get("curve") or []
                written = (str(job["metadata"].get("resourceVersion", "")), list(curve))
            version, curve = written
            merged = merge_curve(curve, points)
            try:
                out = self.kube.patch_job_status(key[0], key[1], {"progress": {**progress, "curve": merged}},
                                                 resource_version=version)
            except ApiException as e:
                if e.status != 409:
                    raise
                continue  # written by someone else since: read the curve again
            self._written[key] = (str((out.get("metadata") or {}).get("resourceVersion", "")), merged)
            return
        log.warning("progress of %s/%s: still conflicting after %d attempts; writing without the new curve points",
                    *key, CURVE_WRITE_ATTEMPTS)
        self.kube.patch_job_status(key[0], key[1], {"progress": progress})


Handler = Callable[[web.Request, str, str], Awaitable[web.Response]]


class StatusAPI:
    """The status API's handlers, caches and limits; ``app()`` serves them, ``close()`` stops its threads."""

    def __init__(self, kube: Kube, audience: str = TOKEN_AUDIENCE, flush_seconds: float = 2.0,
                 limits: StatusLimits | None = None) -> None:
        self.kube = kube
        self.audience = audience
        self.limits = limits or StatusLimits()
        # Reviews and reads on threads of their own: reconciles (asyncio's default executor) and
        # the Lease (its own thread) never wait behind a flood of slow reviews.
        self._executor = ThreadPoolExecutor(max_workers=self.limits.review_threads, thread_name_prefix="statusapi")
        self.writer = ProgressWriter(kube, flush_seconds, self._executor)
        self._reviews = _TTLCache(CACHE_SECONDS)
        self._rejected = _TTLCache(self.limits.negative_cache_seconds)
        self._speakers = _TTLCache(CACHE_SECONDS)  # token digest → the job its pod was checked to speak for
        self._jobs = _TTLCache(CACHE_SECONDS)  # each job's uid (which pods speak for it; its Events)
        self._pods = _TTLCache(CACHE_SECONDS)  # (namespace, pod uid) → the job its controller reference names
        self._limiter = RateLimiter(self.limits.rate_per_client, self.limits.burst_per_client)
        self._job_limiter = RateLimiter(self.limits.rate_per_job, self.limits.burst_per_job)
        self.events = EventRecorder(kube)
        self._in_flight = asyncio.Semaphore(self.limits.max_in_flight)
        self._fault_review_delay = float(os.environ.get(FAULT_REVIEW_DELAY_ENV, "0") or 0)

    # The typed clients share the Kube's ApiClient (its connection pool and credentials).
    @functools.cached_property
    def _authn(self) -> k8s.AuthenticationV1Api:
        return k8s.AuthenticationV1Api(self.kube.api_client)

    @functools.cached_property
    def _authz(self) -> k8s.AuthorizationV1Api:
        return k8s.AuthorizationV1Api(self.kube.api_client)

    @functools.cached_property
    def _core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.kube.api_client)

    @functools.cached_property
    def _custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.kube.api_client)

    def app(self) -> web.Application:
        """The aiohttp application: heartbeat, status and /healthz routes."""
        app = web.Application(client_max_size=64 * 1024)
        base = "/api/v1/namespaces/{namespace}/" + PLURAL + "/{name}"
        # The trainer's contract owns the heartbeat path; its placeholders are aiohttp's route variables.
        # A heartbeat is charged to its job once its token is checked; a status read to its address.
        app.router.add_post(heartbeat_path("{namespace}", "{name}"),
                            functools.partial(self._guarded, self.heartbeat, per_job=True))
        app.router.add_get(base + "/status", functools.partial(self._guarded, self.get_status))
        app.router.add_get("/healthz", self.healthz)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_cleanup(self, _: web.Application) -> None:
        self.close()

    def close(self) -> None:
        """Stop the review threads; queued work is dropped (its requests are gone with the server)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    # ---------------------------------------------------------------- guard
    async def _guarded(self, handler: Handler, request: web.Request, per_job: bool = False) -> web.Response:
        """Names, then the client's rate, then the in-flight bound; only then ``handler`` (see ``guard``)."""
        try:
            namespace, name = checked_names(request.match_info["namespace"], request.match_info["name"])
        except InvalidName as e:
            metrics.STATUS_API_REFUSED.labels(reason="invalid_name").inc()
            return _error(400, str(e))
        # A heartbeat whose token is known (reviewed, its pod's job cached) costs no review: it is charged
        # to the job its token speaks for, here, before it takes a slot in flight, so a job over its share
        # holds neither a slot nor a review thread, and jobs whose pods share an address (a node, a proxy)
        # do not share a bucket. Anything else pays per peer address (not a forwarded header).
        token_job = self._token_job(request) if per_job else None
        if token_job is not None:
            wait = self._job_limiter.take("/".join(token_job))
            if wait:
                return await self._throttled(*token_job, wait)
            request[CHARGED] = True
        elif wait := self._limiter.take(request.remote or "unknown"):
            metrics.STATUS_API_REFUSED.labels(reason="rate_limited").inc()
            return _error(429, f"rate limit of the status API: {self.limits.rate_per_client:g} requests per "
                               f"second per client (burst {self.limits.burst_per_client}); retry later", wait)
        if self._in_flight.locked():
            metrics.STATUS_API_REFUSED.labels(reason="busy").inc()
            return _error(429, f"the status API is busy ({self.limits.max_in_flight} requests in flight); "
                               "retry later", 1.0)
        async with self._in_flight:
            return await handler(request, namespace, name)

    def _token_job(self, request: web.Request) -> tuple[str, str] | None:
        """(namespace, job) a heartbeat's token was checked to speak for (``_check_worker``), from the cache
        alone; None when not known yet. A token that was refused is never charged to a job: it pays per
        address, and cannot throttle a job it does not speak for (nor move its stall clock)."""
        try:
            digest = hashlib.sha256(self._bearer(request).encode()).hexdigest()
        except Denied:
            return None
        return self._speakers.get(digest)  # type: ignore[no-any-return]

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the status API's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    def _call(self, verb: str, resource: str, call: Callable[..., Any], *args: Any) -> Any:
        """One typed client call, counted like ``Kube.request``; the JSON the API server answered.

        The typed client escapes every path parameter (no ``/`` survives), so even a value that
        slipped past ``checked_names`` could not change which object is addressed.
        """
        metrics.API_REQUESTS.labels(verb=verb, resource=resource).inc()
        try:
            response = call(*args, _preload_content=False, _request_timeout=self.kube.timeout)
        except ApiException as e:
            if e.status != 404:
                metrics.API_ERRORS.labels(verb=verb, resource=resource, code=str(e.status)).inc()
            raise
        except Exception:
            metrics.API_ERRORS.labels(verb=verb, resource=resource, code="connection").inc()
            raise
        return json.loads(response.data)

    # ------------------------------------------------------------------ auth
    @staticmethod
    def _bearer(request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Denied(401, "a bearer token is required")
        return token.strip()

    def _review(self, token: str, audience: str | None) -> Identity:
        """The token's identity by TokenReview (cached); a rejection is remembered too."""
        key = (hashlib.sha256(token.encode()).hexdigest(), audience)
        cached = self._reviews.get(key)
        if cached is not None:
            return cached
        rejected = self._rejected.get(key)
        if rejected is not None:
            metrics.STATUS_API_REFUSED.labels(reason="token_rejected_before").inc()
            raise Denied(401, rejected)
        if self._fault_review_delay:
            time.sleep(self._fault_review_delay)  # fault injection: a slow TokenReview
        body = k8s.V1TokenReview(api_version="authentication.k8s.io/v1", kind="TokenReview",
                                 spec=k8s.V1TokenReviewSpec(token=token, audiences=[audience] if audience else None))
        review = _expect(self._call("POST", "tokenreviews", self._authn.create_token_review, body),
                         "authentication.k8s.io/v1", "TokenReview")
        status = review.get("status") or {}
        reason = None
        if not status.get("authenticated"):
            reason = f"token not accepted{' for audience ' + audience if audience else ''}"
        elif audience and audience not in (status.get("audiences") or []):
            reason = f"token not issued for audience {audience}"
        if reason:
            if self.limits.negative_cache_seconds:
                self._rejected.put(key, reason)
            raise Denied(401, reason)
        user = status.get("user") or {}
        identity = Identity(user.get("username", ""), user.get("uid", ""), list(user.get("groups") or []),
                            {k: list(v) for k, v in (user.get("extra") or {}).items()})
        self._reviews.put(key, identity)
        return identity

    def _check_worker(self, identity: Identity, namespace: str, name: str) -> None:
        """The token's pod must be one the operator created for ``namespace/name``: the pod of the token's name and
        uid has the job, by kind, name and uid, as its controller ownerReference (``job_reference``; the admission
        policy ``rljob-worker-pods`` lets only the operator write one). A job deleted and made again under the name
        has another uid; a pod that only carries the labels is no worker. Each pod is read once per
        ``CACHE_SECONDS``, the job too, and the job once more (at most every ``RECORD_RECHECK_SECONDS``) when the
        pod names a job of its name with another uid: one made again since the read."""
        if not identity.username.startswith(SA_PREFIX):
            raise Denied(403, "heartbeats need a service-account token")
        pod = _pod_of(identity)
        if pod is None or not pod[2]:
            raise Denied(403, "the token is not bound to a pod (use a projected service-account token)")
        sa_namespace, pod_name, pod_uid = pod
        if sa_namespace != namespace:
            raise Denied(403, f"pod {sa_namespace}/{pod_name} is not a worker of {namespace}/{name}")
        claimed = self._pod_job(namespace, pod_name, pod_uid)
        job = self._cached_job(namespace, name)
        if job is not None and claimed is not None and claimed[0] == name and claimed[1] != _uid(job):
            job = self._cached_job(namespace, name, max_age=RECORD_RECHECK_SECONDS)
        if job is None:
            raise Denied(404, f"{KIND} {namespace}/{name} not found")
        if claimed is None or claimed != (name, _uid(job)):
            raise Denied(403, f"pod {namespace}/{pod_name} is not a worker of {namespace}/{name}: only pods the "
                              "operator created for the job may speak for it")

    def _pod_job(self, namespace: str, pod_name: str, pod_uid: str) -> tuple[str, str] | None:
        """(name, uid) of the RLTrainingJob that controls the pod ``namespace/pod_name`` with uid ``pod_uid``
        (``job_reference``); None when it has no such controller, or the pod of that name has another uid. Read
        at most once per ``CACHE_SECONDS`` per pod."""
        key = (namespace, pod_uid)
        hit = self._pods.get(key)
        if hit is not None:
            return hit[0]  # type: ignore[no-any-return]
        try:
            read = _expect(self._call("GET", "pods", self._core.read_namespaced_pod, pod_name, namespace),
                           "v1", "Pod", namespace, pod_name)
        except ApiException as e:
            if e.status != 404:
                raise
            read = None
        same = read is not None and (read.get("metadata") or {}).get("uid") == pod_uid
        claimed = job_reference(read) if same else None
        self._pods.put(key, (claimed,))
        return claimed

    def _cached_job(self, namespace: str, name: str, max_age: float | None = None) -> dict[str, Any] | None:
        """The job, read at most once per ``CACHE_SECONDS`` (or ``max_age``: at most that old): its uid, which the
        pods that may speak for it name, and on which its Events are."""
        key = (namespace, name)
        job = self._jobs.get(key, max_age)
        if job is None:
            job = self._read_job(namespace, name)
            if job is not None:
                self._jobs.put(key, job)
        return job  # type: ignore[no-any-return]

    def _check_may_get(self, identity: Identity, namespace: str, name: str) -> None:
        body = k8s.V1SubjectAccessReview(
            api_version="authorization.k8s.io/v1", kind="SubjectAccessReview",
            spec=k8s.V1SubjectAccessReviewSpec(
                user=identity.username, uid=identity.uid, groups=identity.groups, extra=identity.extra,
                resource_attributes=k8s.V1ResourceAttributes(
                    namespace=namespace, verb="get", group=GROUP, resource=PLURAL, name=name),
            ),
        )
        review = _expect(self._call("POST", "subjectaccessreviews", self._authz.create_subject_access_review, body),
                         "authorization.k8s.io/v1", "SubjectAccessReview")
        if not (review.get("status") or {}).get("allowed"):
            raise Denied(403, f"{identity.username} may not get {PLURAL}.{GROUP} {namespace}/{name}")

    def _read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RLTrainingJob ``namespace/name`` (checked to be that), or None when it does not exist."""
        try:
            job = self._call("GET", PLURAL, self._custom.get_namespaced_custom_object,
                             GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return _expect(job, API_VERSION, KIND, namespace, name)  # type: ignore[no-any-return]

    # -------------------------------------------------------------- handlers
    async def heartbeat(self, request: web.Request, namespace: str, name: str) -> web.Response:
        """A trainer's heartbeat for job ``namespace/name`` (names already checked by ``_guarded``)."""
        try:
            token = self._bearer(request)
            identity = await self._run(self._review, token, self.audience)
            await self._run(self._check_worker, identity, namespace, name)
            self._speakers.put(hashlib.sha256(token.encode()).hexdigest(), (namespace, name))
        except Denied as e:
            metrics.HEARTBEATS.labels(result="unauthorized" if e.status == 401 else "forbidden").inc()
            return _error(e.status, e.message)
        # Charged here when the guard could not yet tell the token's job (its first heartbeat, say).
        if not request.get(CHARGED) and (wait := self._job_limiter.take(f"{namespace}/{name}")):
            return await self._throttled(namespace, name, wait)
        try:
            body = HeartbeatBody.model_validate(await request.json())
        except (ValueError, ValidationError) as e:
            metrics.HEARTBEATS.labels(result="invalid").inc()
            return _error(400, f"invalid heartbeat: {e}")
        progress = heartbeat_progress(body, datetime.now(UTC))
        point = curve_point(body.step, body.reward, body.loss, body.metrics)
        try:
            await self.writer.submit(namespace, name, progress, body.final, point)
        except ApiException as e:
            if e.status == 404:
                return _error(404, f"{KIND} {namespace}/{name} not found")
            raise
        events = [(warning_reason(w), w) for w in body.warnings]  # CheckpointFallback or TrackingUnavailable
        events += [(HEALTH_EVENT_REASONS[r.signal], r.message()) for r in newly_tripped(body)]
        if events:
            await self._run(self._warning_events, namespace, name, events)
        metrics.HEARTBEATS.labels(result="accepted").inc()
        return web.json_response({"accepted": True}, status=202)

    async def _throttled(self, namespace: str, name: str, wait: float) -> web.Response:
        """429 for a job over its share; its worker is alive, so the stall clock hears of it (``lastThrottled``).

        The token was checked first (or is known): only a worker of this job moves its stall clock. The write is
        coalesced with the job's other progress (``ProgressWriter``): no more writes than heartbeats make.
        """
        metrics.HEARTBEATS.labels(result="throttled").inc()
        try:
            await self.writer.submit(namespace, name, {_progress_key("last_throttled"): rfc3339(datetime.now(UTC))}, False)
        except ApiException as e:
            if e.status == 404:
                return _error(404, f"{KIND} {namespace}/{name} not found")
            raise
        return _error(429, f"heartbeat rate limit of job {namespace}/{name}: {self.limits.rate_per_job:g} per "
                           f"second (burst {self.limits.burst_per_job}); retry later", wait)

    def _warning_events(self, namespace: str, name: str, warnings: list[tuple[str, str]]) -> None:
        """A trainer's resume fell back (corrupt checkpoint, unreachable primary), it left out a tracking server
        that did not answer, or a health signal tripped: tell people (``warnings``: reason and message of each).

        Through the ``EventRecorder``: repeats are counted on one Event, and a job's pods cannot cause
        more Events than its rate (``cluster.events``), whatever they send. The job (for its uid) is
        read at most once per ``CACHE_SECONDS``, however many heartbeats carry warnings.
        """
        try:
            job = self._cached_job(namespace, name)
        except Denied:
            return
        if job is None:
            return
        now, clock = rfc3339(datetime.now(UTC)), time.monotonic()
        for reason, message in warnings:
            try:
                self.events.record(job, "Warning", reason, message, now, clock)
            except ApiException as e:  # an Event is worth a log line, not a refused heartbeat
                log.warning("cannot post %s event for %s/%s: %s", reason, namespace, name, e)

    async def get_status(self, request: web.Request, namespace: str, name: str) -> web.Response:
        """Job ``namespace/name``'s status for a caller who may get it (names already checked)."""
        try:
            token = self._bearer(request)
            identity = await self._run(self._review, token, None)
            await self._run(self._check_may_get, identity, namespace, name)
            job = await self._run(self._read_job, namespace, name)
        except Denied as e:
            return _error(e.status, e.message)
        if job is None:
            return _error(404, f"{KIND} {namespace}/{name} not found")
        return web.json_response({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": job["metadata"].get("uid"),
                         "generation": job["metadata"].get("generation")},
            "status": job.get("status") or {},
        })
