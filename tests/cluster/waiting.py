"""Bounded polling: the only way cluster tests wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.2,
    message: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Exceptions of the types in ``ignore`` count as "not yet" (e.g. a 404 while
    an object is being created). Raises ``TimeoutError`` after ``timeout``
    seconds, naming ``message`` and the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except ignore as error:
            last = error
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", "condition")
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
