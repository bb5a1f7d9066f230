"""A real S3 endpoint on loopback for tests and benchmarks, spoken to through boto3.

* :class:`MotoServer` — moto's standalone server (``python -m moto.server``) in its own process.
* :class:`EndpointProxy` — a TCP proxy in front of it, in its own process, that a test can
  throttle (so an upload is reliably in flight) and SIGKILL: to the trainer the endpoint dies
  mid-request exactly as a crashed server would, while moto keeps what was committed, so the
  test can check that ``latest`` never points at a partial checkpoint.

Fixtures (register them by importing ``s3_server_fixture`` and ``bucket_fixture`` into a test
module): ``s3_server`` (module-scoped), ``bucket`` (a fresh bucket per test). ``python -m tests.support.s3_server proxy LISTEN TARGET [RATE] [STATS]`` runs
the proxy.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rljob_contract.pod import RESUME_CHECKPOINT_ENV

REPO = Path(__file__).resolve().parents[2]
#: Credentials and region for the fake endpoint (moto accepts any unless auth is enforced).
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
          "AWS_EC2_METADATA_DISABLED": "true"}
_names = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def client(endpoint: str, **credentials: str) -> Any:
    """A boto3 S3 client for the test endpoint (as production builds it, plus test credentials)."""
    import boto3

    creds = {"aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"]}
    creds.update(credentials)
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)


class MotoServer:
    """moto's S3 server in a child process on a free loopback port (or on ``host``: the real node's
    pods reach it on their bridge's gateway address)."""

    def __init__(self, port: int | None = None, log: Path | None = None, nice: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port()
        self.log = log
        self.nice = nice  # >0: yield the CPU to training (a real endpoint is not on the training host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MotoServer:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        env = {**os.environ, **S3_ENV}
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,  # noqa: PLW1509 - no threads yet
        )
        wait_for_port(self.port, host=self.host)
        return self

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def client(self, **credentials: str) -> Any:
        return client(self.endpoint, **credentials)

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"rljob-test-{os.getpid()}-{next(_names)}"
        self.client().create_bucket(Bucket=name)
        return name

    def enforce_auth(self) -> None:
        """From now on moto checks every request's signature and IAM permissions."""
        import requests

        requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()

    def iam_user_without_s3(self, name: str = "no-s3") -> dict[str, str]:
        """Access keys of a fresh IAM user with no policy (every S3 call → AccessDenied once auth is on)."""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        iam.create_user(UserName=name)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


class EndpointProxy:
    """A loopback TCP proxy to ``target_port`` in its own process; ``rate`` (bytes/s, both directions
    together) throttles it. ``kill()`` drops every connection mid-request; ``start()`` again revives it."""

    def __init__(self, target_port: int, rate: int = 0, port: int | None = None, stats: Path | None = None) -> None:
        self.target_port = target_port
        self.rate = rate
        self.port = port or free_port()
        self.stats = stats
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EndpointProxy:
        cmd = [sys.executable, "-m", "tests.support.s3_server", "proxy", str(self.port), str(self.target_port), str(self.rate)]
        if self.stats:
            cmd.append(str(self.stats))
        self.proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL)
        wait_for_port(self.port)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def forwarded(self) -> int:
        """Bytes forwarded client → server so far (needs ``stats``)."""
        try:
            return int((self.stats or Path("/nonexistent")).read_text() or 0)
        except (OSError, ValueError):
            return 0


def serve_proxy(listen_port: int, target_port: int, rate: int, stats: str | None) -> None:
    """Forward loopback connections, throttled to ``rate`` bytes/s overall (0: unthrottled)."""
    lock = threading.Lock()
    state = {"next": time.monotonic(), "up": 0}

    def throttle(n: int) -> None:
        if not rate:
            return
        with lock:
            start = max(time.monotonic(), state["next"])
            state["next"] = start + n / rate
        time.sleep(max(0.0, start + n / rate - time.monotonic()))

    def pump(src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(16384):
                throttle(len(data))
                dst.sendall(data)
                if upstream:
                    with lock:
                        state["up"] += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def report() -> None:
        while stats:
            tmp = f"{stats}.tmp"
            Path(tmp).write_text(str(state["up"]))
            os.replace(tmp, stats)
            time.sleep(0.05)

    threading.Thread(target=report, daemon=True).start()
    server = socket.create_server(("127.0.0.1", listen_port))
    while True:
        conn, _ = server.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target_port))
        except OSError:
            conn.close()
            continue
        threading.Thread(target=pump, args=(conn, upstream, True), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, conn, False), daemon=True).start()


@pytest.fixture(name="s3_server", scope="module")
def s3_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(log=tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture(name="bucket")
def bucket_fixture(s3_server: MotoServer) -> str:
    return s3_server.create_bucket()


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "proxy":
        serve_proxy(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0,
                    sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        print("usage: python -m tests.support.s3_server proxy LISTEN_PORT TARGET_PORT [RATE] [STATS_FILE]", file=sys.stderr)
        sys.exit(2)


@pytest.fixture(name="s3_env")
def s3_env_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process talks to the test server with its credentials; no resume source is preset."""
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv(RESUME_CHECKPOINT_ENV, raising=False)
