"""Event aggregation for what a job's pods report (``cluster.events``), pure, the clock injected.

The same on the control plane, next to a victim job: ``tests/operator/test_statusapi_flood_cluster.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_operator.cluster.events import COMBINED_PREFIX, EventCorrelator, EventLimits, EventRecorder


def _decide(correlator: EventCorrelator, message: str, now: float, job: str = "ns/flood") -> tuple[str, int]:
    decision = correlator.decide(job, "Warning", "CheckpointFallback", message, now)
    if decision.action == "create":  # as the recorder does once the API server answered
        correlator.written(decision.key, f"ev-{len(decision.key[3])}-{message}", decision.count)
    return decision.action, decision.count


def test_a_repeated_warning_is_one_event_whose_count_grows() -> None:
    correlator = EventCorrelator()
    assert [_decide(correlator, "checkpoint-3 is corrupt", float(t)) for t in range(4)] == [
        ("create", 1), ("patch", 2), ("patch", 3), ("patch", 4)]
    assert _decide(correlator, "checkpoint-5 is corrupt", 5.0) == ("create", 1)  # another message, its own Event


def test_writes_per_job_are_bounded_by_the_spam_filter_and_others_are_dropped() -> None:
    limits = EventLimits(burst=25, refill_seconds=300)
    correlator = EventCorrelator(limits)
    actions = [_decide(correlator, f"warning {i % 3}", i / 1000)[0] for i in range(1000)]  # 1000 in 1 s
    assert len(actions) - actions.count("drop") == 25 == limits.bound(1.0)
    assert actions.count("create") == 3
    # The victim's Events are not the flooder's: its own bucket is full.
    assert correlator.decide("ns/victim", "Warning", "CheckpointFallback", "x", 1.0).action == "create"
    # One more token every refill_seconds, no more.
    assert _decide(correlator, "warning 0", 299.0)[0] == "drop"
    assert _decide(correlator, "warning 0", 301.0)[0] == "patch"
    assert _decide(correlator, "warning 0", 301.5)[0] == "drop"
    assert limits.bound(3600) == 25 + 12


def test_distinct_messages_beyond_max_similar_share_one_combined_event() -> None:
    correlator = EventCorrelator(EventLimits(burst=1000, max_similar=10, similar_window_seconds=600))
    decisions = []
    for i in range(30):
        decisions.append(d := correlator.decide("ns/flood", "Warning", "CheckpointFallback", f"flood {i}", float(i)))
        if d.action == "create":
            correlator.written(d.key, f"ev-{i}", d.count)
    assert [d.action for d in decisions[:11]] == ["create"] * 11
    assert all(d.action == "patch" for d in decisions[11:])
    assert decisions[-1].message == COMBINED_PREFIX + "flood 29" and decisions[-1].count == 20
    assert len({d.key for d in decisions}) == 11  # 10 messages of their own and the combined one
    # A new window: messages get Events of their own again.
    assert correlator.decide("ns/flood", "Warning", "CheckpointFallback", "flood 99", 700.0).message == "flood 99"


def test_memory_is_bounded_whatever_the_messages() -> None:
    correlator = EventCorrelator(EventLimits(burst=10**6, max_similar=10**6, max_events=100))
    for i in range(5000):
        correlator.decide(f"ns/job-{i % 300}", "Warning", "R", f"m{i}", float(i))
    assert len(correlator._seen) <= 100 and len(correlator._similar) <= 101


class _FakeEventsAPI:
    """Records the recorder's writes; the Kubernetes API's Events are tested on the control plane."""

    def __init__(self, expired: bool = False) -> None:
        self.writes: list[tuple[str, Any]] = []
        self.expired = expired

    def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now: str, **kw: Any) -> Any:
        self.writes.append(("create", (message, kw["count"])))
        return {"metadata": {"name": f"ev{len(self.writes)}"}}

    def patch_event(self, namespace: str, name: str, count: int, message: str, now: str) -> Any:
        if self.expired:
            raise ApiException(status=404, reason="Not Found")
        self.writes.append(("patch", (name, count)))
        return {}


JOB = {"metadata": {"namespace": "ns", "name": "flood", "uid": "u"}, "apiVersion": "rljob.dev/v1alpha1",
       "kind": "RLTrainingJob"}


def test_recorder_patches_the_event_it_created_and_recreates_an_expired_one() -> None:
    api = _FakeEventsAPI()
    recorder = EventRecorder(api)  # type: ignore[arg-type]
    assert [recorder.record(JOB, "Warning", "R", "m", "t", float(i)) for i in range(3)] == ["create", "patch", "patch"]
    assert api.writes == [("create", ("m", 1)), ("patch", ("ev1", 2)), ("patch", ("ev1", 3))]
    api.expired = True
    assert recorder.record(JOB, "Warning", "R", "m", "t", 4.0) == "create"
    assert api.writes[-1] == ("create", ("m", 4))  # the count goes on
    # The same name made again is another job (another uid): its own Event.
    again = {**JOB, "metadata": {**JOB["metadata"], "uid": "u2"}}
    api.expired = False
    assert recorder.record(again, "Warning", "R", "m", "t", 5.0) == "create"


@pytest.mark.parametrize("seconds,bound", [(0, 25), (299, 25), (300, 26), (3600, 37)])
def test_the_stated_bound(seconds: float, bound: int) -> None:
    assert EventLimits().bound(seconds) == bound
