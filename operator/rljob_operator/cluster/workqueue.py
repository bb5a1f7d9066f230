"""A keyed work queue (asyncio), as in client-go: one reconcile per key at a time.

Watch events for a job and for its pods only *add* the job's key; workers take keys and run
the reconcile. A key added while its reconcile runs is run once more afterwards (never
concurrently), a key added many times while waiting runs once, a reconcile may ask to be
run again after a delay (deadlines, TTLs), and a failing one is retried with exponential
backoff. This is what keeps the watches' handlers one line long and every reconcile serial.

Keys are served in three tiers, first come first served within each:

* *urgent* (``urgent=True``): an event that calls for a gang decision now (a worker ended, the
  last terminating pod of a gang is gone so its replacements can be created, the last of a gang's
  pods is ready, a Node was deleted);
* *event*: any other watch event (a job created or edited, a pod scheduled, or ready before its gang);
* *routine* (``low=True``): a delay that ran out and the periodic resync.

With a thousand jobs a failed worker's job must not wait behind a thousand routine looks, nor
behind the status updates of a hundred gangs whose pods are becoming ready.

A delayed add fires in the tier it was added in: a reconcile's requeue as a routine look, a watch
event that only changes what the status reports (a pod scheduled, running) as an event, a moment
later, so that such events of one gang close together share a reconcile and a status write. A
reconcile that starts supersedes its key's pending delays: it sees everything up to now, and
asks for its own next look.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rljob_operator import metrics

log = logging.getLogger("rljob.workqueue")


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """A namespaced object's key. Dataclass equality compares the class too, so keys of two kinds
    (the subclasses) are never equal, even for one namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class JobKey(ObjectKey):
    """The key of an RLTrainingJob: in the work queue, the job cache and the store of worker pods (``podwatch``)."""

    __slots__ = ()


class ExperimentKey(ObjectKey):
    """The work-queue key of an RLExperiment."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"RLExperiment {super().__str__()}"


#: What the operator's one work queue holds; the reconcile dispatches on the type.
Key = JobKey | ExperimentKey

URGENT, EVENT, ROUTINE = 0, 1, 2
#: The ``queued_by`` label of the queue-wait metric, per tier.
QUEUED_BY = {URGENT: "urgent", EVENT: "event", ROUTINE: "routine"}


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
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._queued: dict[Key, int] = {}
        """Queued keys and the best tier they are queued in (``URGENT``, ``EVENT`` or ``ROUTINE``)."""
        self._queued_at: dict[Key, float] = {}
        """When each queued key was queued at that priority (loop time), for the queue-wait metric."""
        self._seq = 0
        self._running: set[Key] = set()
        self._dirty: dict[Key, int] = {}
        """Keys added while their reconcile runs, and the tier they run again in (event, or urgent)."""
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, tuple[asyncio.TimerHandle, int]] = {}
        """Delayed adds: per key, the earliest one and the best tier it fires in."""
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: Key, delay: float | None = None, low: bool = False, urgent: bool = False) -> None:
        """Reconcile ``key`` soon (after ``delay`` seconds, in the tier the flags say).

        ``low``: after every key added without it (a routine look, not an event); ``urgent``: before
        every key added without it (an event that calls for a gang decision). Of several pending
        delays of a key the earliest wins, and fires in the best tier any of them asked for; none
        is kept while the key is queued in that tier or a better one.
        """
        priority = ROUTINE if low else URGENT if urgent else EVENT
        if delay is not None and delay > 0:
            if self._queued.get(key, ROUTINE + 1) <= priority:
                return  # looked at soon enough: that reconcile asks for its own next look
            loop = asyncio.get_running_loop()
            due = loop.time() + delay
            pending = self._timers.get(key)
            if pending is not None:
                timer, tier = pending
                if timer.when() <= due and tier <= priority:
                    return
                due, priority = min(due, timer.when()), min(priority, tier)
                timer.cancel()
            self._timers[key] = (loop.call_at(due, self._fire, key, priority), priority)
            return
        if key in self._running:
            self._dirty[key] = min(self._dirty.get(key, EVENT), priority)
        elif self._queued.get(key, ROUTINE + 1) > priority:  # not queued yet, or only in a later tier
            self._queued_at[key] = asyncio.get_running_loop().time()  # queued, or raised to the events
            self._queued[key] = priority
            self._seq += 1
            self._queue.put_nowait((priority, self._seq, key))
            metrics.QUEUE_DEPTH.set(len(self._queued))

    def _fire(self, key: Key, priority: int) -> None:
        self._timers.pop(key, None)
        self.add(key, low=priority == ROUTINE, urgent=priority == URGENT)

    def _cancel_timer(self, key: Key) -> None:
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[0].cancel()

    def forget(self, key: Key) -> None:
        """Drop pending retries and timers of ``key`` (its object is gone)."""
        self._cancel_timer(key)
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

    async def _worker(self) -> None:
        while True:
            priority, _, key = await self._queue.get()
            if self._queued.get(key) != priority:
                continue  # a duplicate entry: the key was raised to the front, or has run since
            del self._queued[key]
            metrics.QUEUE_DEPTH.set(len(self._queued))
            now = asyncio.get_running_loop().time()
            metrics.QUEUE_WAIT_SECONDS.labels(queued_by=QUEUED_BY[priority]).observe(
                now - self._queued_at.pop(key, now))
            self._running.add(key)
            self._cancel_timer(key)  # this reconcile sees all a pending delay would; it returns its own
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
                tier = self._dirty.pop(key)
                self.add(key, urgent=tier == URGENT)
            if requeue is not None:
                self.add(key, max(requeue, 0.01), low=True)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"rljob-worker-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for timer, _ in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
