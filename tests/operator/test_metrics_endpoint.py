"""The operator's ``/metrics``, ``/healthz`` and ``/readyz`` (``metrics.health_app``) on a real aiohttp server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from rljob_operator import metrics


def _serve(check: Callable[[TestClient[Any, Any]], Awaitable[None]], ready: bool = True) -> None:
    async def main() -> None:
        async with TestClient(TestServer(metrics.health_app(lambda: ready))) as client:
            await check(client)

    asyncio.run(main())


def test_metrics_serves_every_family_or_only_those_named_and_renders_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape of 10,000 jobs' phase series takes half a second of CPU: a client that needs a few counters
    names them (``name[]``, as prometheus_client's own server offers) and the per-job series are not rendered;
    and whatever is rendered, it is not on the event loop, which keeps serving (the status API shares it)."""
    metrics.JOB_PHASES.set(("team-a", "endpoint-test"), "Running")
    metrics.RESYNCS.inc()
    rendered_on: list[str] = []
    real = metrics.generate_latest

    def spy(registry: Any) -> bytes:
        rendered_on.append(threading.current_thread().name)
        return real(registry)

    async def check(client: TestClient[Any, Any]) -> None:
        whole = await (await client.get("/metrics")).text()
        assert 'rljob_operator_job_phase{job="endpoint-test",namespace="team-a",phase="Running"} 1.0' in whole
        answer = await client.get("/metrics", params=[("name[]", "rljob_operator_resyncs_total"),
                                                      ("name[]", "rljob_operator_queue_depth")])
        assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
        families = {f.name for f in text_string_to_metric_families(await answer.text())}
        assert families == {"rljob_operator_resyncs", "rljob_operator_queue_depth"}
        assert (await (await client.get("/healthz")).text()) == "ok\n"

    monkeypatch.setattr(metrics, "generate_latest", spy)
    try:
        _serve(check)
    finally:
        metrics.JOB_PHASES.set(("team-a", "endpoint-test"), None)
    assert len(rendered_on) == 2 and threading.main_thread().name not in rendered_on


def test_readyz_answers_503_until_ready() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        answer = await client.get("/readyz")
        assert (answer.status, await answer.text()) == (503, "not ready\n")

    _serve(check, ready=False)
