"""The status API (HTTPS, in the operator): trainers' heartbeats in, a job's status out.

``POST /api/v1/namespaces/{ns}/rltrainingjobs/{name}/heartbeat`` (``rljob_trainer.contract.heartbeat_path``)
    Body ``{step, reward, loss, checkpoint, best_checkpoint, best_metric, final, ...}``
    (``rljob_trainer.contract.HeartbeatBody``) from the trainer's rank 0, with
    ``Authorization: Bearer <projected service-account token>``. TokenReview must accept the
    token for the audience ``rljob-status``; the token must be bound to a pod (the
    ``authentication.kubernetes.io/pod-name``/``pod-uid`` extras a kubelet-projected token
    carries), and that pod must exist with that uid in ``ns`` with label
    ``rljob.dev/job=name``. Accepted heartbeats become the job's ``status.progress``
    (step, reward, loss, checkpoint, bestCheckpoint, bestMetric, lastHeartbeat), written at most every
    ``flush_seconds`` per job (a ``final`` heartbeat at once).
``GET /api/v1/namespaces/{ns}/rltrainingjobs/{name}/status``
    For people and tools: any bearer token the API server accepts (TokenReview, default
    audience), allowed when a SubjectAccessReview says its user may ``get`` that
    rltrainingjob. Answers the job's status.

No or unknown token → 401; a valid token for another job or without permission → 403.

``RLJOB_FAULT_REVIEW_DELAY_SECONDS=S`` makes every TokenReview take S seconds longer (tests use it
to stand for a slow API server or token webhook while they flood the API with junk tokens).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from rljob_trainer.contract import HeartbeatBody, heartbeat_path

from rljob_operator import metrics
from rljob_operator.api import API_VERSION, GROUP, KIND, PLURAL
from rljob_operator.cluster.kube import Kube
from rljob_operator.names import LABEL_JOB, TOKEN_AUDIENCE
from rljob_operator.times import rfc3339

log = logging.getLogger("rljob.statusapi")
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
CACHE_SECONDS = 30.0
FAULT_REVIEW_DELAY_ENV = "RLJOB_FAULT_REVIEW_DELAY_SECONDS"


@dataclass(frozen=True)
class Identity:
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="rljob"'} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)


class _TTLCache:
    def __init__(self, seconds: float, size: int = 4096) -> None:
        self.seconds, self.size = seconds, size
        self._items: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any:
        hit = self._items.get(key)
        if hit is None or hit[0] < time.monotonic():
            self._items.pop(key, None)
            return None
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._items) >= self.size:
            self._items.clear()
        self._items[key] = (time.monotonic() + self.seconds, value)


class ProgressWriter:
    """Coalesces heartbeats into at most one status patch per job every ``flush_seconds``."""

    def __init__(self, kube: Kube, flush_seconds: float) -> None:
        self.kube = kube
        self.flush_seconds = flush_seconds
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._scheduled: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def submit(self, namespace: str, name: str, progress: dict[str, Any], final: bool) -> None:
        key = (namespace, name)
        self._pending[key] = {**self._pending.get(key, {}), **progress}
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
            if not progress:
                return
            self._last[key] = time.monotonic()
            await asyncio.to_thread(self.kube.patch_job_status, key[0], key[1], {"progress": progress})


class StatusAPI:
    def __init__(self, kube: Kube, audience: str = TOKEN_AUDIENCE, flush_seconds: float = 2.0) -> None:
        self.kube = kube
        self.audience = audience
        self.writer = ProgressWriter(kube, flush_seconds)
        self._reviews = _TTLCache(CACHE_SECONDS)
        self._pods = _TTLCache(CACHE_SECONDS)
        self._fault_review_delay = float(os.environ.get(FAULT_REVIEW_DELAY_ENV, "0") or 0)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024)
        base = "/api/v1/namespaces/{namespace}/" + PLURAL + "/{name}"
        # The trainer's contract owns the heartbeat path; its placeholders are aiohttp's route variables.
        app.router.add_post(heartbeat_path("{namespace}", "{name}"), self.heartbeat)
        app.router.add_get(base + "/status", self.get_status)
        app.router.add_get("/healthz", self.healthz)
        return app

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    # ------------------------------------------------------------------ auth
    @staticmethod
    def _bearer(request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Denied(401, "a bearer token is required")
        return token.strip()

    def _review(self, token: str, audience: str | None) -> Identity:
        key = (hashlib.sha256(token.encode()).hexdigest(), audience)
        cached = self._reviews.get(key)
        if cached is not None:
            return cached
        if self._fault_review_delay:
            time.sleep(self._fault_review_delay)  # fault injection: a slow TokenReview
        spec: dict[str, Any] = {"token": token}
        if audience:
            spec["audiences"] = [audience]
        review = self.kube.request(
            "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}, count_write=False,
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            raise Denied(401, f"token not accepted{' for audience ' + audience if audience else ''}")
        if audience and audience not in (status.get("audiences") or []):
            raise Denied(401, f"token not issued for audience {audience}")
        user = status.get("user") or {}
        identity = Identity(user.get("username", ""), user.get("uid", ""), list(user.get("groups") or []),
                            {k: list(v) for k, v in (user.get("extra") or {}).items()})
        self._reviews.put(key, identity)
        return identity

    def _check_worker(self, identity: Identity, namespace: str, name: str) -> None:
        """The token's pod must be a worker of ``namespace/name``."""
        if not identity.username.startswith(SA_PREFIX):
            raise Denied(403, "heartbeats need a service-account token")
        sa_namespace = identity.username[len(SA_PREFIX):].split(":", 1)[0]
        pod_name = (identity.extra.get(POD_NAME_EXTRA) or [""])[0]
        pod_uid = (identity.extra.get(POD_UID_EXTRA) or [""])[0]
        if not pod_name:
            raise Denied(403, "the token is not bound to a pod (use a projected service-account token)")
        if sa_namespace != namespace:
            raise Denied(403, f"pod {sa_namespace}/{pod_name} is not a worker of {namespace}/{name}")
        key = (namespace, pod_name, pod_uid)
        job = self._pods.get(key)
        if job is None:
            try:
                pod = self.kube.request("GET", Kube.core_path(namespace, "pods", pod_name))
            except ApiException as e:
                if e.status == 404:
                    raise Denied(403, f"pod {namespace}/{pod_name} does not exist") from None
                raise
            if pod_uid and pod["metadata"].get("uid") != pod_uid:
                raise Denied(403, f"the token's pod {namespace}/{pod_name} no longer exists")
            job = (pod["metadata"].get("labels") or {}).get(LABEL_JOB, "")
            self._pods.put(key, job)
        if job != name:
            raise Denied(403, f"pod {namespace}/{pod_name} is not a worker of {namespace}/{name}")

    def _check_may_get(self, identity: Identity, namespace: str, name: str) -> None:
        review = self.kube.request(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": identity.username,
                    "uid": identity.uid,
                    "groups": identity.groups,
                    "extra": identity.extra,
                    "resourceAttributes": {
                        "namespace": namespace, "verb": "get", "group": GROUP, "resource": PLURAL, "name": name,
                    },
                },
            },
            count_write=False,
        )
        if not (review.get("status") or {}).get("allowed"):
            raise Denied(403, f"{identity.username} may not get {PLURAL}.{GROUP} {namespace}/{name}")

    # -------------------------------------------------------------- handlers
    async def heartbeat(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            token = self._bearer(request)
            identity = await asyncio.to_thread(self._review, token, self.audience)
            await asyncio.to_thread(self._check_worker, identity, namespace, name)
        except Denied as e:
            metrics.HEARTBEATS.labels(result="unauthorized" if e.status == 401 else "forbidden").inc()
            return _error(e.status, e.message)
        try:
            body = HeartbeatBody.model_validate(await request.json())
        except (ValueError, ValidationError) as e:
            metrics.HEARTBEATS.labels(result="invalid").inc()
            return _error(400, f"invalid heartbeat: {e}")
        progress: dict[str, Any] = {"step": body.step, "lastHeartbeat": rfc3339(datetime.now(UTC))}
        for field, key in (("reward", "reward"), ("loss", "loss"), ("checkpoint", "checkpoint"),
                           ("best_checkpoint", "bestCheckpoint"), ("best_metric", "bestMetric")):
            value = getattr(body, field)
            if value is not None:
                progress[key] = value
        try:
            await self.writer.submit(namespace, name, progress, body.final)
        except ApiException as e:
            if e.status == 404:
                return _error(404, f"{KIND} {namespace}/{name} not found")
            raise
        if body.warnings:
            await asyncio.to_thread(self._warning_events, namespace, name, body.warnings)
        metrics.HEARTBEATS.labels(result="accepted").inc()
        return web.json_response({"accepted": True}, status=202)

    def _warning_events(self, namespace: str, name: str, warnings: list[str]) -> None:
        """A trainer's resume fell back (corrupt checkpoint, unreachable primary): tell people."""
        job = self.kube.get_job(namespace, name)
        if job is None:
            return
        now = rfc3339(datetime.now(UTC))
        for message in warnings:
            try:
                self.kube.post_event(job, "Warning", "CheckpointFallback", message, now)
            except ApiException as e:  # an Event is worth a log line, not a refused heartbeat
                log.warning("cannot post CheckpointFallback event for %s/%s: %s", namespace, name, e)

    async def get_status(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            token = self._bearer(request)
            identity = await asyncio.to_thread(self._review, token, None)
            await asyncio.to_thread(self._check_may_get, identity, namespace, name)
        except Denied as e:
            return _error(e.status, e.message)
        job = await asyncio.to_thread(self.kube.get_job, namespace, name)
        if job is None:
            return _error(404, f"{KIND} {namespace}/{name} not found")
        return web.json_response({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": job["metadata"].get("uid"),
                         "generation": job["metadata"].get("generation")},
            "status": job.get("status") or {},
        })
