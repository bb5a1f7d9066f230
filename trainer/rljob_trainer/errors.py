"""Error reporting, by the exit codes of the trainer's contract with the operator (``rljob_trainer.contract``).

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
from rljob_trainer.contract import ERROR_FILE_ENV as ERROR_FILE_ENV
from rljob_trainer.contract import EXIT_CUDA_OOM as EXIT_CUDA_OOM
from rljob_trainer.contract import EXIT_OK as EXIT_OK
from rljob_trainer.contract import EXIT_PERMANENT as EXIT_PERMANENT
from rljob_trainer.contract import TERMINATION_LOG_ENV, LocatedError

TERMINATION_LOG = "/dev/termination-log"


class PermanentError(LocatedError):
    """A failure no retry can fix. ``where`` names the field path, file or function."""


def is_cuda_oom(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from or while handling, is a CUDA out-of-memory
    error (``torch.cuda.OutOfMemoryError``, or an error that says "CUDA out of memory"). Torch-free: by
    the exception's name and message, so the wrappers of reward functions and TRL cannot hide it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


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
