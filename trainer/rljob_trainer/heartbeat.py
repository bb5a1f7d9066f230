"""Progress heartbeats from rank 0 to the operator's status API (only when running in a pod).

The operator sets ``RLJOB_STATUS_URL`` (``https://…/api/v1/namespaces/NS/rltrainingjobs/NAME/heartbeat``),
``RLJOB_TOKEN_FILE`` (a projected, audience-bound service-account token) and optionally
``RLJOB_STATUS_CA_FILE``; the body is ``rljob_trainer.contract.HeartbeatBody``, which the status
API validates. Heartbeats are sent from a background thread; a failure is logged and never stops
training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from typing import Any

from pydantic import ValidationError

from rljob_trainer.contract import (
    MAX_HEARTBEAT_WARNINGS,
    POD_NAME_ENV,
    RESUME_WARNINGS_ENV,
    STATUS_CA_FILE_ENV,
    STATUS_URL_ENV,
    TOKEN_FILE_ENV,
    HeartbeatBody,
)

log = logging.getLogger("rljob.heartbeat")


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
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=64)
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
                metrics=metrics or None, evaluation=evaluation or self.evaluation,
            ).wire()
        except ValidationError as e:  # a heartbeat never stops training
            log.warning("heartbeat: not sent, invalid: %s", e)
            return
        with contextlib.suppress(queue.Full):  # the operator is slow; newer heartbeats matter more
            self._queue.put_nowait(body)
        if final:
            self.flush()

    def flush(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _run(self) -> None:
        import requests

        session = requests.Session()
        while True:
            body = self._queue.get()
            if body is None:
                return
            headers = {}
            if self.token_file:
                try:
                    with open(self.token_file, encoding="utf-8") as f:
                        headers["Authorization"] = f"Bearer {f.read().strip()}"
                except OSError as e:
                    log.warning("heartbeat: cannot read token %s: %s", self.token_file, e)
            try:
                resp = session.post(self.url, json=body, headers=headers, timeout=5,
                                    verify=self.ca_file or True)
                if resp.status_code < 300 and body.get("warnings"):
                    self.warnings = []
                if resp.status_code >= 300:
                    log.warning("heartbeat: %s answered %s: %s", self.url, resp.status_code, resp.text[:200])
            except Exception as e:
                log.warning("heartbeat: %s: %s", self.url, e)
