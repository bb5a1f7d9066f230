"""A gang's rendezvous store in a process of its own: ``python -m rljob_trainer.rendezvous --port 29500``.

torchrun's c10d rendezvous keeps the gang's membership in a TCPStore that one agent hosts (``is_host``
in ``rdzv_configs``; ``rljob_trainer.launch`` gives it to node rank 0). Hosted there, the store dies
with worker 0, and every other agent's rendezvous with it: worker 0's loss costs the whole gang. Served
by this process instead, outside every worker, with each agent a client (``contract.RDZV_HOST_ENV`` =
"0"), any one worker may be lost: the survivors' agents keep the store, restart their ranks and meet
the replacement in the store's next round (``tests/trainer/test_rendezvous_training.py`` kills the
agent whose node holds group rank 0). The ranks' own store is not this one: with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` each round's rank 0 hosts a fresh one (``launch``).

It holds only the rendezvous' keys (a few per node and round), needs no GPU, no config and no
credentials, and ends with exit 0 on SIGTERM (a pod's deletion).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import timedelta
from typing import Any

from rljob_contract.pod import RENDEZVOUS_PORT

#: How long a client's request may wait on the store (torch's c10d backend sets its own ``read_timeout``).
STORE_TIMEOUT = timedelta(seconds=60)


def serve(port: int, stop: threading.Event, ready: Any = None) -> None:
    """Serve the store on every address of this host at ``port`` until ``stop`` is set.

    ``multi_tenant``: torch's c10d backend opens its clients so, and a server it would host itself
    (``is_host``) is the same kind; ``wait_for_workers=False``: clients come and go, none is awaited.
    ``ready`` (tests): called once the store listens.
    """
    from torch.distributed import TCPStore

    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                     timeout=STORE_TIMEOUT)
    print(f"rljob: rendezvous store listening on port {store.port}", file=sys.stderr, flush=True)
    if ready is not None:
        ready(store.port)
    stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rljob-rendezvous", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=RENDEZVOUS_PORT, help="the port the workers' agents dial")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.port, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
