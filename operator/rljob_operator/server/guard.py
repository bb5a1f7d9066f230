"""What the status API checks before it spends anything on a request: names, rate, load.

Every request to the status API is hostile until checked. In order, before any token review:

1. the namespace and job name in the URL must be Kubernetes names (``checked_names``): a
   DNS-1123 label and a DNS-1123 subdomain. aiohttp hands route variables over percent-decoded,
   so ``..%2F..%2Fapi%2Fv1%2Fnodes%2Fx`` arrives as ``../../api/v1/nodes/x``; such a value must
   never reach a path the operator requests with its own rights (→ 400);
2. each client address has a token bucket (``RateLimiter``: ``rate`` per second, ``burst`` at
   once; → 429 with Retry-After), so one client cannot make the operator send TokenReviews
   without bound. A heartbeat whose token the status API already reviewed and accepted as a worker
   of its job (a pod the operator created for it) costs no review and skips this bucket: it is
   charged to its job's instead (4.), here, before it takes a slot in flight; a status read, and a
   token refused before, always pay here;
3. at most ``max_in_flight`` requests are handled at once (→ 429, Retry-After: 1), which also
   bounds the queue in front of the review threads;
4. after authentication, each job has a token bucket of its own (``rate_per_job``,
   ``burst_per_job``, keyed by the job the worker's token speaks for; → 429 with Retry-After):
   every job gets the same share, so one job's pods flooding valid heartbeats (issue #30 point 4)
   cannot take another job's, whether or not they share a client address (a node, a proxy).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

#: A DNS-1123 label (RFC 1123 host name part), as Kubernetes validates namespace names.
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
LABEL_MAX, SUBDOMAIN_MAX = 63, 253


class InvalidName(ValueError):
    """A namespace or name in a URL that is not a Kubernetes name; the message says which and why."""


def _shown(value: str) -> str:
    """The hostile value, short and printable, for an error message."""
    return ascii(value if len(value) <= 64 else value[:64] + "…")


def checked_names(namespace: str, name: str) -> tuple[str, str]:
    """``(namespace, name)`` when both are Kubernetes names; else ``InvalidName`` naming the field.

    The namespace must be a DNS-1123 label, the job name a DNS-1123 subdomain (what the API
    server accepts for a namespaced custom resource): neither can then contain ``/``, ``%``,
    ``..`` or anything else that changes the meaning of an API path.
    """
    if len(namespace) > LABEL_MAX or not DNS1123_LABEL.fullmatch(namespace):
        raise InvalidName(
            f"namespace {_shown(namespace)} in the URL is not a Kubernetes namespace name: it must be a "
            f"DNS-1123 label (at most {LABEL_MAX} lower-case letters, digits and '-', starting and ending "
            "with a letter or digit)")
    if len(name) > SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.fullmatch(name):
        raise InvalidName(
            f"name {_shown(name)} in the URL is not an RLTrainingJob name: it must be a DNS-1123 subdomain "
            f"(at most {SUBDOMAIN_MAX} lower-case letters, digits, '-' and '.', each dot-separated part "
            "starting and ending with a letter or digit)")
    return namespace, name


@dataclass(frozen=True)
class StatusLimits:
    """The status API's limits (``rljob_operator.settings``: ``status_*``)."""

    max_in_flight: int = 64
    rate_per_client: float = 10.0
    burst_per_client: int = 40
    review_threads: int = 4
    negative_cache_seconds: float = 10.0
    rate_per_job: float = 5.0
    burst_per_job: int = 20

    def __post_init__(self) -> None:
        for field in ("max_in_flight", "rate_per_client", "burst_per_client", "review_threads", "rate_per_job",
                      "burst_per_job"):
            if not getattr(self, field) > 0:
                raise ValueError(f"status API setting status_{field} must be above 0 "
                                 f"(RLJOB_OPERATOR_STATUS_{field.upper()}), not {getattr(self, field)!r}")
        if self.negative_cache_seconds < 0:
            raise ValueError("status API setting status_negative_cache_seconds must be 0 or more "
                             f"(RLJOB_OPERATOR_STATUS_NEGATIVE_CACHE_SECONDS), not {self.negative_cache_seconds!r}")


class RateLimiter:
    """Token buckets per client key: ``rate`` requests per second on average, ``burst`` at once.

    At most ``max_clients`` buckets are kept; past that, full buckets (clients that have been
    quiet long enough to refill) are dropped, and if none is full, all are: memory stays bounded
    whatever addresses a flood comes from, at worst forgetting who was limited.
    """

    def __init__(self, rate: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate, self.burst, self.max_clients = rate, float(burst), max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, when)

    def take(self, key: str, now: float | None = None) -> float:
        """Spend one token of ``key``'s bucket: 0 when allowed, else the seconds until one is back."""
        now = time.monotonic() if now is None else now
        tokens, when = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate
        if key not in self._buckets and len(self._buckets) >= self.max_clients:
            self._forget_full(now)
        self._buckets[key] = (tokens - 1.0, now)
        return 0.0

    def _forget_full(self, now: float) -> None:
        full = [k for k, (t, w) in self._buckets.items() if t + (now - w) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.max_clients:
            self._buckets.clear()


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
