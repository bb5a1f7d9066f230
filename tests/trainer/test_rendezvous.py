"""The rendezvous store served outside the workers (``python -m rljob_trainer.rendezvous``): clients that
come and go share its keys, and SIGTERM ends it with exit 0 (issue #48, point 1)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta

from rljob_contract import pod as contract

from tests.support.operator_process import free_port


def test_the_store_serves_clients_that_come_and_go_and_ends_on_sigterm() -> None:
    from torch.distributed import TCPStore

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", contract.RENDEZVOUS_MODULE, "--port", str(port)],
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        assert f"listening on port {port}" in server.stderr.readline()

        def client() -> TCPStore:
            return TCPStore("127.0.0.1", port, is_master=False, multi_tenant=True, timeout=timedelta(seconds=10))

        first = client()
        first.set("rdzv/state", b"round 1")
        del first  # a worker lost: the store and its keys stay
        second = client()
        assert second.get("rdzv/state") == b"round 1"
        assert second.add("rdzv/joined", 1) == 1 and client().add("rdzv/joined", 1) == 2
        server.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert server.wait(timeout=20) == 0 and time.monotonic() - started < 10
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
