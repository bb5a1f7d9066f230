"""The work queue (``cluster/workqueue.py``) and the reconciles it feeds (``cluster/runner.py``): each key
serially, once per burst; delays, backoff, and tiers (urgent events, events, routine looks); its metrics;
and as many reconciles at once as ``workers`` says."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from rljob_operator.cluster import runner
from rljob_operator.cluster.workqueue import JobKey, WorkQueue
from rljob_operator.settings import OperatorSettings


def test_work_queue_runs_each_key_serially_once_per_burst() -> None:
    async def scenario() -> tuple[list[str], int]:
        calls: list[str] = []
        active: set[str] = set()
        overlap = 0

        async def handler(key: Any) -> float | None:
            nonlocal overlap
            if key in active:
                overlap += 1
            active.add(key)
            calls.append(key)
            await asyncio.sleep(0.05)
            active.discard(key)
            return None

        queue = WorkQueue(handler, workers=4)
        queue.start()
        for _ in range(5):
            queue.add("a")
        await asyncio.sleep(0.01)
        for _ in range(5):
            queue.add("a")  # while "a" runs: one more run afterwards
        queue.add("b")
        await asyncio.sleep(0.3)
        await queue.stop()
        return calls, overlap

    calls, overlap = asyncio.run(scenario())
    assert calls.count("a") == 2 and calls.count("b") == 1 and overlap == 0


def test_a_job_and_an_experiment_of_one_name_are_two_keys_and_each_reaches_its_own_reconcile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_operator.cluster.workqueue import ExperimentKey

    assert JobKey("a", "x") != ExperimentKey("a", "x") and len({JobKey("a", "x"), ExperimentKey("a", "x")}) == 2
    ran: list[tuple[str, str, str]] = []
    monkeypatch.setattr(runner.Reconciler, "reconcile", lambda self, ns, name: ran.append(("job", ns, name)))
    monkeypatch.setattr(runner.ExperimentReconciler, "reconcile", lambda self, ns, name: ran.append(("exp", ns, name)))

    async def scenario() -> None:
        leading = runner._reconciling(OperatorSettings(workers=2, kueue=False, watch_nodes=False),
                                      SimpleNamespace(configuration=None), SimpleNamespace(), None, None,
                                      SimpleNamespace(in_force=True))  # type: ignore[arg-type]
        try:
            leading.work.queue.add(JobKey("a", "x"))
            leading.work.queue.add(ExperimentKey("a", "x"))
            for _ in range(200):
                if len(ran) == 2:
                    break
                await asyncio.sleep(0.02)
        finally:
            await leading.work.queue.stop()
            leading.threads.shutdown(wait=False)

    asyncio.run(scenario())
    assert sorted(ran) == [("exp", "a", "x"), ("job", "a", "x")]


def test_reconciles_run_as_many_at_once_as_workers_says_whatever_the_default_executor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``workers`` reconciles run at once in the operator's own threads: asyncio's default executor
    has min(32, CPUs + 4) threads (6 on a 2-core node) and is kept at 2 here, so a reconcile sent
    there could never meet the 8 others at the barrier."""
    workers = 8
    barrier = threading.Barrier(workers, timeout=10)
    met: list[str] = []

    def reconcile(self: Any, namespace: str, name: str) -> float | None:
        barrier.wait()  # BrokenBarrierError unless all `workers` reconciles run at once
        met.append(name)
        return None

    monkeypatch.setattr(runner.Reconciler, "reconcile", reconcile)
    settings = OperatorSettings(workers=workers, kueue=False, watch_nodes=False)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        leading = runner._reconciling(settings, SimpleNamespace(configuration=None), SimpleNamespace(), None, None,
                                      SimpleNamespace(in_force=True))  # type: ignore[arg-type]
        try:
            for i in range(workers):
                leading.work.queue.add(JobKey("team-a", f"job-{i}"))
            deadline = loop.time() + 15
            while len(met) < workers and loop.time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await leading.work.queue.stop()
            leading.threads.shutdown(wait=False)

    asyncio.run(scenario())
    assert sorted(met) == sorted(f"job-{i}" for i in range(workers))


def test_work_queue_requeues_after_a_delay_and_backs_off_errors() -> None:
    async def scenario() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        seen: list[tuple[str, float]] = []

        async def handler(key: Any) -> float | None:
            seen.append((key, loop.time() - start))
            if key == "later" and len(seen) == 1:
                return 0.2
            if key == "boom" and sum(1 for k, _ in seen if k == "boom") < 3:
                raise RuntimeError("transient")
            return None

        queue = WorkQueue(handler, workers=2, backoff_base=0.05)
        queue.start()
        queue.add("later")
        await asyncio.sleep(0.35)
        queue.add("boom")
        await asyncio.sleep(0.5)
        await queue.stop()
        return seen

    seen = asyncio.run(scenario())
    later = [t for k, t in seen if k == "later"]
    assert len(later) == 2 and later[1] - later[0] >= 0.19
    boom = [t for k, t in seen if k == "boom"]
    assert len(boom) == 3 and boom[2] - boom[1] > boom[1] - boom[0]


def test_work_queue_coalesces_delayed_events_and_fires_them_as_events() -> None:
    async def scenario() -> tuple[list[tuple[str, float]], list[str]]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        seen: list[tuple[str, float]] = []
        gate = asyncio.Event()

        async def handler(key: Any) -> float | None:
            if key == "busy":
                await gate.wait()
            seen.append((key, round(loop.time() - start, 2)))
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        for _ in range(3):  # three pods of one gang coming up: one reconcile, a moment after the first
            queue.add("gang", delay=0.2)
            await asyncio.sleep(0.05)
        queue.add("queued")  # already queued as an event: a delayed event adds nothing
        queue.add("queued", delay=0.05)
        queue.add("superseded", delay=0.3)
        queue.add("superseded")  # it runs now: the pending delay is dropped
        await asyncio.sleep(0.5)
        # A delayed event fires as an event, ahead of the routine looks queued meanwhile.
        queue.add("busy")
        await asyncio.sleep(0.01)
        queue.add("news", delay=0.05)
        for key in ("resync-1", "resync-2"):
            queue.add(key, low=True)
        await asyncio.sleep(0.1)
        gate.set()
        await asyncio.sleep(0.1)
        await queue.stop()
        return seen, [k for k, _ in seen][-4:]

    seen, tail = asyncio.run(scenario())
    assert [k for k, _ in seen].count("gang") == 1
    assert next(t for k, t in seen if k == "gang") >= 0.19  # the first add's delay: the others wait with it
    assert [k for k, _ in seen].count("queued") == 1 and [k for k, _ in seen].count("superseded") == 1
    assert tail == ["busy", "news", "resync-1", "resync-2"]


def test_work_queue_serves_events_before_routine_looks() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        gate = asyncio.Event()

        async def handler(key: Any) -> float | None:
            if key == "busy":
                await gate.wait()
            order.append(key)
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        queue.add("busy")
        await asyncio.sleep(0.01)  # the only worker is busy: everything below waits
        for key in ("resync-1", "resync-2", "raised"):
            queue.add(key, low=True)
        queue.add("failed-worker")  # an event
        queue.add("raised")  # an event for a key already waiting behind the routine looks
        gate.set()
        await asyncio.sleep(0.1)
        await queue.stop()
        return order

    order = asyncio.run(scenario())
    assert order == ["busy", "failed-worker", "raised", "resync-1", "resync-2"]  # each key once


def test_work_queue_serves_urgent_events_first_and_a_key_keeps_its_tier_while_it_runs() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        gate, running = asyncio.Event(), asyncio.Event()

        async def handler(key: Any) -> float | None:
            order.append(key)
            if key == "busy" and order.count("busy") == 1:
                running.set()
                await gate.wait()
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        queue.add("busy")
        await running.wait()  # the only worker is busy: everything below waits
        queue.add("resync", low=True)
        for key in ("ready-1", "ready-2", "raised"):
            queue.add(key)  # pods turning ready: status changes
        queue.add("failed-worker", urgent=True)
        queue.add("raised", urgent=True)  # already waiting as an event: moved up, runs once
        queue.add("busy", urgent=True)  # its pod failed while it ran: runs again, urgently
        queue.add("busy")  # a later plain event does not demote it
        gate.set()
        await asyncio.sleep(0.1)
        await queue.stop()
        return order

    order = asyncio.run(scenario())
    assert order == ["busy", "failed-worker", "raised", "busy", "ready-1", "ready-2", "resync"]


def test_work_queue_reports_how_long_keys_waited_and_how_many_wait() -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {by: (sample("rljob_operator_queue_wait_seconds_count", queued_by=by),
                   sample("rljob_operator_queue_wait_seconds_sum", queued_by=by)) for by in ("event", "routine")}
    depths: list[float] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def handler(key: Any) -> float | None:
            if key == "busy":
                await gate.wait()
            return None

        queue = WorkQueue(handler, workers=1)
        queue.start()
        queue.add("busy")
        await asyncio.sleep(0.01)
        queue.add("event")
        queue.add("routine", low=True)
        depths.append(sample("rljob_operator_queue_depth"))
        await asyncio.sleep(0.2)  # both wait behind "busy" this long
        gate.set()
        await asyncio.sleep(0.05)
        depths.append(sample("rljob_operator_queue_depth"))
        await queue.stop()

    asyncio.run(scenario())
    assert depths == [2, 0]
    event_count, event_sum = (sample(f"rljob_operator_queue_wait_seconds_{k}", queued_by="event") for k in ("count", "sum"))
    assert event_count - before["event"][0] == 2  # "busy" (at once) and "event" (after the 0.2 s)
    assert 0.2 <= event_sum - before["event"][1] < 2
    assert sample("rljob_operator_queue_wait_seconds_count", queued_by="routine") - before["routine"][0] == 1
    assert sample("rljob_operator_queue_wait_seconds_sum", queued_by="routine") - before["routine"][1] >= 0.2
