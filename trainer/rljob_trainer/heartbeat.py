"""Progress heartbeats from rank 0 to the operator's status API (only when running in a pod).

The operator sets ``RLJOB_STATUS_URL`` (``https://…/api/v1/namespaces/NS/rltrainingjobs/NAME/heartbeat``),
``RLJOB_TOKEN_FILE`` (a projected, audience-bound service-account token) and optionally
``RLJOB_STATUS_CA_FILE``; the body is ``rljob_contract.pod.HeartbeatBody``, which the status
API validates. Heartbeats are sent from a background thread; a failure is logged and never stops
training.

A heartbeat the status API turns away for now (429 over the job's share, 5xx, no connection) is
sent again after an exponential backoff with jitter, never sooner than its ``Retry-After``
(``retry_delay``); meanwhile the training thread only queues, and a newer heartbeat queued during
the wait replaces the one being retried (the newest progress matters; intermediate curve points
are lost). Other refusals (400, 401, 403, 404) are final for that heartbeat. The operator counts
a heartbeat refused for the job's rate as a sign of life (``status.progress.lastThrottled``), so
a busy status API never looks like a stalled job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

from pydantic import ValidationError
from rljob_contract.health import HealthReport
from rljob_contract.pod import (
    MAX_HEARTBEAT_WARNINGS,
    POD_NAME_ENV,
    RESUME_WARNINGS_ENV,
    STATUS_CA_FILE_ENV,
    STATUS_URL_ENV,
    TOKEN_FILE_ENV,
    HeartbeatBody,
)

log = logging.getLogger("rljob.heartbeat")
#: Answers after which the same heartbeat is sent again: the status API is busy or could not write now.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
#: The longest Retry-After honoured (a longer one is taken as this): a heartbeat is only worth so much delay.
RETRY_AFTER_MAX_SECONDS = 60.0


def retry_delay(failures: int, retry_after: float | None, rng: random.Random,
                base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_MAX_SECONDS) -> float:
    """Seconds to wait after ``failures`` (1, 2, ...) failed attempts: base × 2^(failures-1) capped at
    ``cap``, of which a random half ("equal jitter", so refused trainers do not come back in step),
    and never less than the server's ``retry_after``."""
    ceiling = min(cap, base * 2 ** max(failures - 1, 0))
    delay = ceiling / 2 + rng.uniform(0, ceiling / 2)
    return max(delay, min(retry_after or 0.0, RETRY_AFTER_MAX_SECONDS))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(when - (time.time() if now is None else now), 0.0)


def _warnings_from_env() -> list[str]:
    try:
        value = json.loads(os.environ.get(RESUME_WARNINGS_ENV, "[]"))
    except ValueError:
        return []
    return [str(w) for w in value] if isinstance(value, list) else []


class Heartbeat:
    def __init__(self, url: str, token_file: str | None, ca_file: str | None, pod: str | None) -> None:
        self.url = url
        self.token_file = token_file
        self.ca_file = ca_file
        self.pod = pod
        self.checkpoint: str | None = None  # newest complete checkpoint (remote when on object storage)
        # Resume fallbacks the pre-flight noted; sent until one heartbeat carrying them is accepted.
        self.warnings: list[str] = _warnings_from_env()
        self.best_checkpoint: str | None = None  # best kept checkpoint by spec.checkpoint.bestMetric
        self.best_metric: float | None = None  # its value of that metric
        self.evaluation: dict[str, Any] | None = None  # the latest evaluation's EvalReport, sent with every heartbeat
        self.health: list[HealthReport] | None = None  # the health signals tripped so far, sent with every heartbeat
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=64)
        self._rng = random.Random()
        self._delivering = threading.Event()  # set while a heartbeat is being sent or retried
        self.accepted = 0  # heartbeats the status API accepted
        self.retried = 0  # attempts answered "not now" (429, 5xx, no connection) and sent again later
        self.refused = 0  # heartbeats refused for good (400, 401, 403, 404)
        self._thread = threading.Thread(target=self._run, name="rljob-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> Heartbeat | None:
        url = os.environ.get(STATUS_URL_ENV)
        if not url:
            return None
        return cls(url, os.environ.get(TOKEN_FILE_ENV), os.environ.get(STATUS_CA_FILE_ENV),
                   os.environ.get(POD_NAME_ENV))

    def send(self, *, step: int, reward: float | None, loss: float | None, final: bool = False,
             metrics: dict[str, float] | None = None, evaluation: dict[str, Any] | None = None) -> None:
        """Queue a heartbeat (the contract's ``HeartbeatBody``); one the status API would refuse is logged."""
        try:
            body = HeartbeatBody(
                step=step, reward=reward, loss=loss, checkpoint=self.checkpoint,
                best_checkpoint=self.best_checkpoint, best_metric=self.best_metric, pod=self.pod,
                final=final, time=time.time(), warnings=self.warnings[:MAX_HEARTBEAT_WARNINGS],
                metrics=metrics or None, evaluation=evaluation or self.evaluation, health=self.health,
            ).wire()
        except ValidationError as e:  # a heartbeat never stops training
            log.warning("heartbeat: not sent, invalid: %s", e)
            return
        try:
            self._queue.put_nowait(body)
        except queue.Full:  # the operator is slow: newer heartbeats matter more, drop the oldest
            with contextlib.suppress(queue.Empty):
                self._queue.get_nowait()
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(body)
        if final:
            self.flush()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait (at most ``timeout``) until every queued heartbeat was sent or given up."""
        deadline = time.monotonic() + timeout
        while (not self._queue.empty() or self._delivering.is_set()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _run(self) -> None:
        import requests

        session = requests.Session()
        while True:
            body = self._queue.get()
            if body is None:
                return
            self._delivering.set()
            try:
                self._deliver(session, body)
            finally:
                self._delivering.clear()

    def _deliver(self, session: Any, body: dict[str, Any]) -> None:
        """Send ``body``; while the answer is "not now", wait (backoff, Retry-After) and send the newest."""
        failures = 0
        while True:
            retry, retry_after = self._post(session, body)
            if not retry:
                return
            failures += 1
            self.retried += 1
            delay = retry_delay(failures, retry_after, self._rng)
            if failures == 1:
                log.info("heartbeat: the status API is busy or unreachable; sending again in %.1f s", delay)
            time.sleep(delay)
            body = self._newest(body)

    def _newest(self, body: dict[str, Any]) -> dict[str, Any]:
        """The newest queued heartbeat (the queue emptied), else ``body``."""
        while True:
            try:
                queued = self._queue.get_nowait()
            except queue.Empty:
                return body
            if queued is None:  # stop: after this heartbeat
                self._queue.put_nowait(None)
                return body
            body = queued

    def _post(self, session: Any, body: dict[str, Any]) -> tuple[bool, float | None]:
        """One attempt: (send again later?, the answer's Retry-After seconds)."""
        headers = {}
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            except OSError as e:
                log.warning("heartbeat: cannot read token %s: %s", self.token_file, e)
        try:
            resp = session.post(self.url, json=body, headers=headers, timeout=5, verify=self.ca_file or True)
        except Exception as e:
            log.debug("heartbeat: %s: %s", self.url, e)
            return True, None
        if resp.status_code < 300:
            self.accepted += 1
            if body.get("warnings"):
                self.warnings = []
            return False, None
        if resp.status_code in RETRY_STATUSES:
            return True, parse_retry_after(resp.headers.get("Retry-After"))
        self.refused += 1
        log.warning("heartbeat: %s answered %s: %s", self.url, resp.status_code, resp.text[:200])
        return False, None
