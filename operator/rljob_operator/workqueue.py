"""A keyed work queue (asyncio), as in client-go: one reconcile per key at a time.

Watch events for a job and for its pods only *add* the job's key; workers take keys and run
the reconcile. A key added while its reconcile runs is run once more afterwards (never
concurrently), a key added many times while waiting runs once, a reconcile may ask to be
run again after a delay (deadlines, TTLs), and a failing one is retried with exponential
backoff. This is what keeps the kopf handlers one line long and every reconcile serial.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger("rljob.workqueue")

Key = Hashable


class WorkQueue:
    """Deduplicating, per-key serial queue with delayed adds and error backoff."""

    def __init__(
        self,
        handler: Callable[[Key], Awaitable[float | None]],
        workers: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 60.0,
    ) -> None:
        self._handler = handler
        self._workers = workers
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: Key, delay: float | None = None) -> None:
        """Reconcile ``key`` soon (after ``delay`` seconds; the earliest pending delay wins)."""
        if delay is not None and delay > 0:
            loop = asyncio.get_running_loop()
            due = loop.time() + delay
            timer = self._timers.get(key)
            if timer is not None and timer.when() <= due:
                return
            if timer is not None:
                timer.cancel()
            self._timers[key] = loop.call_at(due, self._fire, key)
            return
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def forget(self, key: Key) -> None:
        """Drop pending retries and timers of ``key`` (its object is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._running.add(key)
            try:
                requeue = await self._handler(key)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(self._backoff_max, self._backoff_base * 2 ** (failures - 1))
                log.exception("reconcile of %s failed (%d in a row); retrying in %.1fs", key, failures, delay)
                requeue = delay
            else:
                self._failures.pop(key, None)
            finally:
                self._running.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            if requeue is not None:
                self.add(key, max(requeue, 0.01))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"rljob-worker-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
