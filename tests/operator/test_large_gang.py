"""A 1,000-worker job's failure, decided (issue #48, point 3): work linear in the gang, a status and Events
that do not grow with it.

Pure decisions only: ``plan_reconcile`` of a fixed-size job with durable checkpoints, all workers Running
but one that failed. The figures on the real control plane (1,000 KWOK pods, the operator's requests and
CPU per failure at 100 and 1,000 workers) are ``bench/large_gang.py``'s.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.times import rfc3339

from tests.support.jobs import NOW, make_job, observe, pod_json
from tests.support.operator_process import on_runtime

RUNNING = {"phase": "Running", "startTime": rfc3339(NOW), "gangStartTime": rfc3339(NOW)}
LARGE = 1000


def one_failed(workers: int, pods: list[dict[str, Any]] | None = None) -> tuple[Any, list[ObservedPod]]:
    """A running job of ``workers`` on durable checkpoints whose worker ``workers // 2`` exited 1."""
    job = make_job(workers, spec={"runPolicy": {"backoffBaseSeconds": 5}}, status=RUNNING)
    failed = workers // 2
    pods = pods or [pod_json(job, i) for i in range(workers)]
    pods[failed] = pod_json(job, failed, "Failed", False, exit_code=1, message="boom")
    return job, observe(job, *pods)


def decide(job: Any, observed: list[ObservedPod]) -> Any:
    return plan_reconcile(job, observed, NOW, runtime=on_runtime(job, {"checkpoint": {"storage": "s3://ckpt"}}))


@pytest.fixture(scope="module")
def large() -> tuple[Any, list[ObservedPod]]:
    job = make_job(LARGE, status=RUNNING)
    return one_failed(LARGE, [pod_json(job, i) for i in range(LARGE)])


def test_a_failure_in_a_large_gang_compares_pods_a_linear_number_of_times(
        large: tuple[Any, list[ObservedPod]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Telling the gang's stale pods from its current ones compared every pair of 1,000 pods field by field
    (``p not in current``): half a million comparisons, most of a reconcile's CPU at 1,000 workers."""
    compared = 0
    plain_eq = ObservedPod.__eq__

    def counting_eq(self: ObservedPod, other: object) -> bool:
        nonlocal compared
        compared += 1
        return plain_eq(self, other)

    monkeypatch.setattr(ObservedPod, "__eq__", counting_eq)
    plan = decide(*large)
    assert plan.delete_pods == [f"train-worker-{LARGE // 2}"] and plan.gang_restart is None
    assert compared <= LARGE, f"{compared} pod comparisons for {LARGE} pods"


def test_a_large_gangs_failure_writes_what_a_small_gangs_does(large: tuple[Any, list[ObservedPod]]) -> None:
    """The same conditions, Events and one replaced pod for 4 workers and 1,000; the status holds nothing per
    worker (the pods the operator created are marked by their controller reference, not listed in the status),
    so it is as large at 1,000 workers as at 4, but for the digits of the numbers in it."""
    small, big = decide(*one_failed(4)), decide(*large)
    assert [c["type"] for c in big.status["conditions"]] == [c["type"] for c in small.status["conditions"]]
    assert [(e.type, e.reason) for e in big.events] == [(e.type, e.reason) for e in small.events]
    assert big.status["lastFailure"]["replacedPods"] == [f"pod-{LARGE // 2}-0"]
    lists = {k for k, v in big.status.items() if isinstance(v, list | dict) and len(v) >= LARGE}
    assert not lists, f"status fields that grow with the gang: {lists}"
    sizes = [len(json.dumps(plan.status, separators=(",", ":"))) for plan in (small, big)]
    assert sizes[1] - sizes[0] < 100, f"the status at 4 and at {LARGE} workers: {sizes} bytes"
