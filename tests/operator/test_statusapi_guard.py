"""The status API's guard without a cluster: name checks, the rate limiter, the limits' validation.

The same behaviour on the control plane: ``tests/operator/test_statusapi_hostile_cluster.py``.
"""

from __future__ import annotations

import pytest
from rljob_operator.server.guard import InvalidName, RateLimiter, StatusLimits, checked_names, retry_after


@pytest.mark.parametrize("namespace,name", [
    ("ml-a", "st"), ("a", "b"), ("a" * 63, "a" * 253), ("ns1", "job.v2"), ("0ns", "9-x.y-z"),
])
def test_kubernetes_names_pass(namespace: str, name: str) -> None:
    assert checked_names(namespace, name) == (namespace, name)


@pytest.mark.parametrize("namespace,name,field", [
    ("ns", "../../api/v1/nodes/x", "name"), ("ns", "..", "name"), ("ns", ".", "name"), ("ns", "", "name"),
    ("ns", "st/status", "name"), ("ns", "St", "name"), ("ns", "-st", "name"), ("ns", "st-", "name"),
    ("ns", "st..x", "name"), ("ns", ".st", "name"), ("ns", "a" * 254, "name"), ("ns", "st%2F", "name"),
    ("ns", "st\n", "name"), ("ns", "sté", "name"),
    ("kube-system/pods", "st", "namespace"), ("a.b", "st", "namespace"), ("", "st", "namespace"),
    ("A", "st", "namespace"), ("a" * 64, "st", "namespace"), ("ns\n", "st", "namespace"),
])
def test_anything_else_is_refused_naming_the_field(namespace: str, name: str, field: str) -> None:
    with pytest.raises(InvalidName) as e:
        checked_names(namespace, name)
    message = str(e.value)
    assert message.startswith(f"{field} ") and "DNS-1123" in message
    assert "\n" not in message and len(message) < 400  # hostile input shown short and escaped


def test_rate_limiter_allows_a_burst_then_the_rate_per_client() -> None:
    limiter = RateLimiter(rate=2.0, burst=3)
    assert [limiter.take("a", now=0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a", now=0.0) == pytest.approx(0.5)  # the next token in 1/rate s
    assert limiter.take("b", now=0.0) == 0.0  # another client has its own bucket
    assert limiter.take("a", now=0.5) == 0.0
    assert limiter.take("a", now=0.5) > 0
    assert limiter.take("a", now=100.0) == 0.0  # refilled, never above the burst
    assert [limiter.take("a", now=100.0) for _ in range(3)][-1] > 0
    assert retry_after(0.01) == "1" and retry_after(1.2) == "2"


def test_rate_limiter_memory_is_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=2, max_clients=100)
    for i in range(1000):
        limiter.take(f"10.0.{i // 256}.{i % 256}", now=float(i) / 1000)
    assert len(limiter._buckets) <= 100


@pytest.mark.parametrize("field", ["max_in_flight", "rate_per_client", "burst_per_client", "review_threads",
                                   "rate_per_job", "burst_per_job"])
def test_limits_must_be_positive_and_say_which_setting(field: str) -> None:
    with pytest.raises(ValueError, match=f"RLJOB_OPERATOR_STATUS_{field.upper()}"):
        StatusLimits(**{field: 0})
    with pytest.raises(ValueError, match="NEGATIVE_CACHE_SECONDS"):
        StatusLimits(negative_cache_seconds=-1)


def test_each_job_has_its_own_share_whatever_another_job_sends() -> None:
    """The per-job bucket (keyed by the job a worker's token speaks for): a flooding job empties its own only."""
    limits = StatusLimits(rate_per_job=2.0, burst_per_job=4)
    jobs = RateLimiter(limits.rate_per_job, limits.burst_per_job)
    flooded = [jobs.take("ns/flood", now=t / 100) for t in range(100)]  # 100 heartbeats in 1 s
    assert flooded.count(0.0) == 5 <= 4 + 2 * 0.99  # the burst, then the rate
    victim = [jobs.take("ns/victim", now=t / 2) for t in range(2)]  # its usual 2 in that second
    assert victim == [0.0, 0.0]
