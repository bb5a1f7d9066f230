"""How the status API writes heartbeats' progress to a job's status (``server/statusapi.ProgressWriter``):
coalesced while a write is under way, never reordered, the last heartbeat always written."""

from __future__ import annotations

import asyncio
from typing import Any


def test_progress_writes_are_coalesced_and_never_reordered() -> None:
    import threading
    import time as time_module

    from rljob_operator.server.statusapi import ProgressWriter

    class SlowStatus:  # records status writes; the first one is slow
        def __init__(self) -> None:
            self.writes: list[dict[str, Any]] = []
            self.lock = threading.Lock()

        def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            if not self.writes:
                time_module.sleep(0.2)
            with self.lock:
                self.writes.append(status["progress"])

    async def scenario(sink: SlowStatus) -> None:
        writer = ProgressWriter(sink, flush_seconds=0.05)  # type: ignore[arg-type]
        first = asyncio.create_task(writer.submit("ns", "job", {"step": 1}, final=False))
        await asyncio.sleep(0.01)
        for step in (2, 3, 4):
            await writer.submit("ns", "job", {"step": step, "reward": step / 10}, final=False)
        await writer.submit("ns", "job", {"step": 5}, final=True)
        await first
        await asyncio.sleep(0.2)

    sink = SlowStatus()
    asyncio.run(scenario(sink))
    steps = [w["step"] for w in sink.writes]
    assert steps == sorted(steps) and steps[-1] == 5 and len(steps) < 5
    assert sink.writes[-1]["reward"] == 0.4  # fields of coalesced heartbeats are kept
