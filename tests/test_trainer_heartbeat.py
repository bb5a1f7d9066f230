"""Heartbeats from rank 0: body, bearer token, and resume warnings sent until accepted."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from rljob_trainer.heartbeat import Heartbeat

from tests.trainer_helpers import wait_until


@pytest.fixture
def receiver() -> Any:
    received: list[tuple[dict[str, Any], str]] = []
    statuses = [503, 202, 202]  # the first POST is refused: the warnings must be sent again

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((body, self.headers.get("Authorization", "")))
            self.send_response(statuses.pop(0) if statuses else 202)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hb", received
    server.shutdown()


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


@pytest.mark.trainer  # imports transformers (the callback's base class): with the trainer tests, not test-fast
def test_logged_metrics_reach_the_heartbeat_and_a_nan_loss_does_not_cost_it(receiver: Any) -> None:
    """What TRL logs at a step (the trainer's TelemetryCallback) goes out as ``metrics``, finite numbers only."""
    import math
    from types import SimpleNamespace

    from rljob_trainer.telemetry import TelemetryCallback

    url, received = receiver
    hb = Heartbeat(url, None, None, "job-worker-0")
    callback = TelemetryCallback(None, hb)
    state = SimpleNamespace(is_world_process_zero=True, global_step=4)
    logs = {"loss": math.nan, "reward": 0.7, "kl": 0.02, "rewards/repeat_char/mean": 0.7, "epoch": 0.5,
            "grad_norm": math.inf, "completions/mean_length": 6.0}
    for _ in range(2):  # the receiver refuses the first POST: the second must arrive
        callback.on_log(None, state, None, logs=logs)
    wait_until(lambda: len(received) >= 2, timeout=10, what="two heartbeats")
    body = received[-1][0]
    assert body["step"] == 4 and body["reward"] == 0.7 and body["loss"] is None
    assert body["metrics"] == {"kl": 0.02, "rewards/repeat_char/mean": 0.7, "epoch": 0.5,
                               "completions/mean_length": 6.0}
