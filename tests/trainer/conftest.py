"""Fixtures of the trainer tests shared across their files."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest


@pytest.fixture
def receiver() -> Any:
    received: list[tuple[dict[str, Any], str]] = []
    statuses = [403, 202, 202]  # the first POST is refused for good: the next heartbeat carries the warnings

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
