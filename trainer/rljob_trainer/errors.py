"""Error reporting, by the exit codes of the trainer's contract with the operator (``rljob_contract.pod``).

* ``EXIT_OK`` (0): training finished.
* ``EXIT_PERMANENT`` (78, sysexits' EX_CONFIG): bad config, missing data, a reward function
  that cannot be imported, raises or returns the wrong shape. Retrying cannot help.
* ``EXIT_CUDA_OOM`` (200): a CUDA out-of-memory error; the operator may retry with a smaller
  per-device batch.
* anything else: retryable (a crash, a lost peer, a signal).

The first line of a fatal error goes to stderr always, and to ``/dev/termination-log``
when that path is writable, so Kubernetes shows it in the pod's termination message.
"""

from __future__ import annotations

import os
import sys

# Re-exported: the codes and names are the contract's; this module reports errors by them.
from rljob_contract.pod import ERROR_FILE_ENV as ERROR_FILE_ENV
from rljob_contract.pod import EXIT_CUDA_OOM as EXIT_CUDA_OOM
from rljob_contract.pod import EXIT_OK as EXIT_OK
from rljob_contract.pod import EXIT_PERMANENT as EXIT_PERMANENT
from rljob_contract.pod import TERMINATION_LOG_ENV, LocatedError

TERMINATION_LOG = "/dev/termination-log"


class PermanentError(LocatedError):
    """A failure no retry can fix. ``where`` names the field path, file or function."""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, each once."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_cuda_oom(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from or while handling, is a CUDA out-of-memory
    error (``torch.cuda.OutOfMemoryError``, or an error that says "CUDA out of memory"). Torch-free: by
    the exception's name and message, so the wrappers of reward functions and TRL cannot hide it."""
    return any(type(e).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(e) for e in _chain(exc))


#: torch.distributed's errors of the process group and its store (``torch.distributed.DistError`` and kin).
_DIST_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
#: What gloo says when the process at the other end of a collective died (``transport/tcp/pair.cc``).
_GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "/gloo/transport/")


def is_peer_loss(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says another rank is gone: a collective or the store failed (a
    ``torch.distributed`` error, or gloo's closed connection), not this rank's own fault. Torch-free."""
    return any(type(e).__name__ in _DIST_ERRORS or any(m in str(e) for m in _GLOO_PEER_GONE) for e in _chain(exc))


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


def write_termination_message(message: str, path: str = TERMINATION_LOG) -> None:
    """Write ``message`` where Kubernetes reads a container's termination message.

    Only when the file is writable (in a pod, or a test that points the env at a file);
    never create ``/dev`` entries on a laptop.
    """
    path = os.environ.get(TERMINATION_LOG_ENV, path)
    target_dir = os.path.dirname(path) or "."
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return
    if not os.path.exists(path) and (path.startswith("/dev/") or not os.access(target_dir, os.W_OK)):
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(message[:4096])
    except OSError:
        pass


def report_fatal(message: str) -> None:
    """Report a fatal error: stderr always, the termination log and the launcher's error file if set."""
    line = first_line(message)
    print(f"rljob: error: {message}", file=sys.stderr, flush=True)
    write_termination_message(line)
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file and not os.path.exists(error_file):
        try:
            with open(error_file, "w", encoding="utf-8") as f:
                f.write(line)
        except OSError:
            pass
