"""Heartbeats from rank 0: body, bearer token, resume warnings sent until accepted, and a busy status API
(429 with Retry-After, 503, no connection) answered by backoff off the training thread."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from rljob_trainer.heartbeat import Heartbeat, parse_retry_after, retry_delay

from tests.support.trainer import wait_until


def test_heartbeat_carries_progress_token_and_resume_warnings_until_accepted(
    receiver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = receiver
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    monkeypatch.setenv("RLJOB_STATUS_URL", url)
    monkeypatch.setenv("RLJOB_TOKEN_FILE", str(token))
    monkeypatch.setenv("RLJOB_POD_NAME", "job-worker-0")
    monkeypatch.setenv("RLJOB_RESUME_WARNINGS", json.dumps(["checkpoint-40 failed verification"]))
    hb = Heartbeat.from_env()
    assert hb is not None
    hb.checkpoint = "checkpoint-30"
    for step in (1, 2):
        hb.send(step=step, reward=0.5, loss=0.1)
        wait_until(lambda n=step: len(received) >= n, timeout=10, what=f"heartbeat {step}")
    wait_until(lambda: not hb.warnings, timeout=10, what="the accepted heartbeat to clear the warnings")
    hb.send(step=3, reward=0.5, loss=0.1)
    wait_until(lambda: len(received) >= 3, timeout=10, what="heartbeat 3")
    bodies = [b for b, _ in received]
    assert [b["step"] for b in bodies] == [1, 2, 3]
    assert all(auth == "Bearer tok-123" for _, auth in received)
    assert bodies[0]["checkpoint"] == "checkpoint-30" and bodies[0]["pod"] == "job-worker-0"
    # Refused once, so sent again; accepted with step 2, so not in step 3's.
    assert bodies[0]["warnings"] == bodies[1]["warnings"] == ["checkpoint-40 failed verification"]
    assert "warnings" not in bodies[2]


def test_no_status_url_means_no_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLJOB_STATUS_URL", raising=False)
    assert Heartbeat.from_env() is None


class _BusyServer:
    """A real local HTTP server answering each POST with the next of ``answers`` ((status, Retry-After)), then 202."""

    def __init__(self, answers: list[tuple[int, str | None]]) -> None:
        self.answers = list(answers)
        self.received: list[tuple[float, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.received.append((time.monotonic(), body))
                status, retry_after = outer.answers.pop(0) if outer.answers else (202, None)
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hb"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_throttled_heartbeat_is_sent_again_after_retry_after_without_blocking_training() -> None:
    """#30 point 4: 429 + Retry-After twice, then accepted; send() never waits; the newest progress is sent."""
    busy = _BusyServer([(429, "1"), (429, "1")])
    try:
        hb = Heartbeat(busy.url, None, None, "job-worker-0")
        started = time.monotonic()
        hb.send(step=1, reward=0.1, loss=1.0)
        wait_until(lambda: len(busy.received) >= 1, timeout=10, what="the first attempt")
        for step in range(2, 40):  # the training loop goes on while the heartbeat waits
            hb.send(step=step, reward=0.1, loss=1.0)
        assert time.monotonic() - started < 1.0, "send() waited for the status API"
        wait_until(lambda: hb.accepted == 1, timeout=15, what="the heartbeat to be accepted")
        hb.flush()
        times = [t for t, _ in busy.received]
        assert [b["step"] for _, b in busy.received] == [1, 39, 39]  # the newest replaced the one refused
        assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 1.0  # Retry-After honoured
        assert (hb.accepted, hb.retried, hb.refused) == (1, 2, 0)
    finally:
        busy.server.shutdown()


def test_a_refusal_for_good_is_not_retried_and_503_is() -> None:
    busy = _BusyServer([(503, None), (403, None)])
    try:
        hb = Heartbeat(busy.url, None, None, "job-worker-0")
        hb.send(step=1, reward=None, loss=None)
        wait_until(lambda: hb.refused == 1, timeout=15, what="the 403")
        hb.send(step=2, reward=None, loss=None)
        wait_until(lambda: hb.accepted == 1, timeout=10, what="step 2")
        assert [b["step"] for _, b in busy.received] == [1, 1, 2] and hb.retried == 1
    finally:
        busy.server.shutdown()


def test_no_connection_is_retried_until_the_status_api_answers() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hb = Heartbeat(f"http://127.0.0.1:{port}/hb", None, None, "job-worker-0")
    hb.send(step=7, reward=None, loss=None)
    wait_until(lambda: hb.retried >= 1, timeout=10, what="a failed attempt")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(202)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_until(lambda: hb.accepted == 1, timeout=15, what="delivery once the server listens")
    finally:
        server.shutdown()


def test_retry_delay_backs_off_exponentially_with_jitter_capped_and_never_before_retry_after() -> None:
    rng = random.Random(7)
    for failures in range(1, 12):
        ceiling = min(30.0, 2.0 ** (failures - 1))
        delays = [retry_delay(failures, None, rng) for _ in range(200)]
        assert ceiling / 2 <= min(delays) and max(delays) <= ceiling
        assert max(delays) - min(delays) > ceiling / 4  # jittered, not in step
    assert all(retry_delay(1, 5.0, rng) >= 5.0 for _ in range(50))
    assert retry_delay(1, 3600.0, rng) == 60.0  # a Retry-After is honoured up to a minute
    assert parse_retry_after("2") == 2.0 and parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0) == 6.0


def test_while_the_status_api_refuses_the_queue_keeps_the_newest_heartbeats() -> None:
    """A long refusal fills the queue (64): the oldest are dropped, never the newest; the newest goes out."""
    busy = _BusyServer([(429, "2")])
    try:
        hb = Heartbeat(busy.url, None, None, "job-worker-0")
        hb.send(step=0, reward=None, loss=None)
        wait_until(lambda: len(busy.received) >= 1, timeout=10, what="the first attempt")
        for step in range(1, 201):
            hb.send(step=step, reward=None, loss=None)
        assert hb._queue.qsize() == 64 and hb._queue.queue[-1]["step"] == 200
        wait_until(lambda: hb.accepted >= 1, timeout=15, what="the retry")
        assert busy.received[1][1]["step"] == 200
    finally:
        busy.server.shutdown()
