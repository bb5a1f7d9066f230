"""A real MLflow tracking server on loopback for the tracking tests: ``mlflow server`` from PyPI, its runs in a
SQLite database and its artifacts in a folder (served through the server: ``--artifacts-destination``).

Fixture (register it by importing ``mlflow_server_fixture`` into a test module): ``mlflow_server``, module-scoped; its
``client()`` is MLflow's own ``MlflowClient``, which reads back what the trainer logged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.s3_server import free_port

#: The server's start: database migrations and the app's import take ~30 s on a loaded 2-core machine.
START_TIMEOUT_SECONDS = 180.0


class MlflowServer:
    """``mlflow server`` in its own process group on ``host``:``port`` (the real node's pods reach it on their
    bridge's gateway address, as they reach the S3 server)."""

    def __init__(self, folder: Path, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.folder = folder
        self.host = host
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).with_name("mlflow")
        cmd = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
               "--artifacts-destination", str(self.folder / "artifacts"), "--host", self.host,
               "--port", str(self.port), "--workers", "1"]
        if self.host != "127.0.0.1":  # MLflow 3 answers only the hosts it is told of (DNS rebinding protection)
            cmd += ["--allowed-hosts", f"{self.host}:{self.port},{self.host},localhost,127.0.0.1"]
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                     start_new_session=True, env={**os.environ, "MLFLOW_TRACKING_URI": ""})
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"mlflow server not up after {START_TIMEOUT_SECONDS:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)

    def runs(self, experiment: str) -> list[Any]:
        """Every run of MLflow experiment ``experiment`` (none when it does not exist)."""
        found = self.client().get_experiment_by_name(experiment)
        return [] if found is None else list(self.client().search_runs([found.experiment_id]))


@pytest.fixture(scope="module", name="mlflow_server")
def mlflow_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()
