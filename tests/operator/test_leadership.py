"""One leader at a time: a replica whose Lease is not fresh writes nothing, even frozen and thawed.

Unit tests pin the rules (the write guard, freshness counted from when a renewal was *sent*). On
the control plane (``tests/operator/test_leadership_cluster.py``):

* the leader is frozen (SIGSTOP) in the middle of creating gangs, past its lease; a standby takes
  over and finishes the work; the old leader is thawed (SIGCONT). The API server's audit log, which
  tells the two replicas apart by their client certificates, shows the old leader sent no write
  after its lease ended;
* kube-apiserver is restarted (etcd kept) while gangs are being created and one is being
  restarted; every job converges, a pod watch finds no job with more pods than workers, the audit
  log shows each pod created exactly once, and the operator either survived or stopped cleanly
  (lease lost, status 1) and, restarted as a pod would be, converged the jobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_operator.cluster.kube import Kube, NotLeader
from rljob_operator.cluster.leader import LeaderElector

# ---------------------------------------------------------------------------- unit


class _Response:
    status = 200
    data = b"{}"

    def read(self) -> None:
        return None


class _FakeApiClient:
    """Enough of ``kubernetes.client.ApiClient`` for ``Kube.request``; remembers what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def param_serialize(self, method: str, resource_path: str, **_: Any) -> tuple[str, str]:
        return method, resource_path

    def call_api(self, method: str, path: str, **_: Any) -> _Response:
        self.sent.append((method, path))
        return _Response()


class _LeaseAPI:
    """A Lease store answering the elector (``Kube``-shaped); ``delay`` slows its writes."""

    def __init__(self, delay: float = 0.0) -> None:
        self.lease: dict[str, Any] = {}
        self.delay = delay
        self.timeout = 30.0
        self.api_client = None
        self.write_guard = None

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            if not self.lease:
                raise ApiException(status=404, reason="Not Found")
            return self.lease
        time.sleep(self.delay)
        self.lease = {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": str(time.monotonic())}}
        return self.lease


def test_the_guarded_client_refuses_writes_once_the_lease_is_not_fresh_and_keeps_reads() -> None:
    elector = LeaderElector(_LeaseAPI(), "ns", "lease", "me", lease_seconds=1.0, retry_seconds=0.5)  # type: ignore[arg-type]
    api = _FakeApiClient()
    kube = Kube(api).guarded(elector.write_guard)  # type: ignore[arg-type]
    with pytest.raises(NotLeader, match="does not hold the lease ns/lease"):
        kube.request("POST", "/api/v1/namespaces/ns/pods", {})
    assert elector.try_acquire_or_renew()
    kube.request("POST", "/api/v1/namespaces/ns/pods", {})
    time.sleep(0.6)  # past lease - retry since the renewal: a standby may take over soon
    with pytest.raises(NotLeader) as refused:
        kube.patch_job_status("ns", "job", {"phase": "Running"})
    assert "PATCH /apis/rljob.dev/v1alpha1/namespaces/ns/rltrainingjobs/job/status not sent" in str(refused.value)
    assert "another replica may lead" in str(refused.value)
    kube.request("GET", "/api/v1/namespaces/ns/pods")  # reads are harmless
    assert api.sent == [("POST", "/api/v1/namespaces/ns/pods"), ("GET", "/api/v1/namespaces/ns/pods")]
    # The elector's own client is never guarded (it renews through the Lease).
    assert elector.kube.write_guard is None


def test_freshness_counts_from_when_the_renewal_was_sent_not_when_it_was_answered() -> None:
    # A renewal answered 0.8 s after it was sent: the API server stored it (and a standby may have
    # seen it) up to 0.8 s before this replica knows. Counting from the answer would act too long.
    elector = LeaderElector(_LeaseAPI(delay=0.8), "ns", "lease", "me",  # type: ignore[arg-type]
                            lease_seconds=2.0, renew_seconds=0.5, retry_seconds=0.5)
    sent = time.monotonic()
    assert elector.try_acquire_or_renew()
    assert elector.fresh_until <= sent + 2.0 - 0.5 + 0.05, elector.fresh_until - sent


def test_a_replica_that_stopped_holding_refuses_writes_at_once() -> None:
    elector = LeaderElector(_LeaseAPI(), "ns", "lease", "me", lease_seconds=10,  # type: ignore[arg-type]
                            renew_seconds=0.05, retry_seconds=0.05)
    assert elector.try_acquire_or_renew() and elector.fresh()
    api = elector.kube  # the elector's copy holds the store
    api.lease["spec"]["holderIdentity"] = "someone-else"  # taken over (say, after a clock jump)
    api.lease["spec"]["renewTime"] = "later"
    asyncio.run(asyncio.wait_for(elector.hold(), 5))
    assert not elector.fresh()
    assert "does not hold" in (elector.write_guard() or "")


# ------------------------------------------------------------------- audit log


# ------------------------------------------------------------- control plane


class PodHistory:
    """Every pod event of a namespace seen by a watch; ``violations`` lists each moment a job had
    more pods than workers or two pods for one worker index of one gang generation.

    A restarted API server starts its watch cache afresh, so resuming at a resourceVersion from
    before the restart may be answered 410 Gone: the history then re-lists (``gaps`` counts these)
    and goes on from the listing. Events inside a gap are not seen, which is why the restart test
    also counts the operator's pod creates in the audit log, where nothing is lost.
    """

    def __init__(self, api_client: Any, namespace: str, workers: int) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace, self.workers = namespace, workers
        self.pods: dict[str, tuple[str, str, str]] = {}
        self.violations: list[str] = []
        self.gaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodHistory:
        self._relist()
        self._thread.start()
        return self

    def _relist(self) -> None:
        listed = self.core.list_namespaced_pod(self.namespace)
        self.pods.clear()
        for pod in listed.items:
            self._seen("ADDED", pod)
        self._version = listed.metadata.resource_version

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _seen(self, kind: str, pod: Any) -> None:
        labels = pod.metadata.labels or {}
        if "rljob.dev/job" not in labels:
            return
        if kind == "DELETED":
            self.pods.pop(pod.metadata.uid, None)
            return
        self.pods[pod.metadata.uid] = (labels["rljob.dev/job"], labels.get("rljob.dev/gang-generation", ""),
                                       labels.get("rljob.dev/worker-index", ""))
        by_job: dict[str, list[tuple[str, str]]] = {}
        for job, generation, index in self.pods.values():
            by_job.setdefault(job, []).append((generation, index))
        for job, slots in by_job.items():
            if len(slots) > self.workers or len(set(slots)) < len(slots):
                self.violations.append(f"{job}: {sorted(slots)}")

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace,
                                                  resource_version=self._version, timeout_seconds=5,
                                                  allow_watch_bookmarks=True):
                    obj = event["object"]
                    self._version = obj.metadata.resource_version
                    if event["type"] != "BOOKMARK":
                        self._seen(event["type"], obj)
            except ApiException as e:
                if e.status == 410:  # too old for the restarted API server's watch cache: start over
                    self.gaps += 1
                    self._relist_when_answered()
                else:
                    time.sleep(0.2)
            except Exception:  # the API server is away: resume from the last version seen
                time.sleep(0.2)

    def _relist_when_answered(self) -> None:
        while not self._stop.is_set():
            try:
                self._relist()
                return
            except Exception:
                time.sleep(0.2)


def test_the_pod_history_catches_a_job_with_more_pods_than_workers_or_one_index_twice() -> None:
    from types import SimpleNamespace

    def pod(uid: str, job: str, generation: int, index: int) -> Any:
        labels = {"rljob.dev/job": job, "rljob.dev/gang-generation": str(generation),
                  "rljob.dev/worker-index": str(index)}
        return SimpleNamespace(metadata=SimpleNamespace(uid=uid, labels=labels))

    history = PodHistory(None, "ns", workers=2)
    for uid, index in (("a", 0), ("b", 1)):
        history._seen("ADDED", pod(uid, "j", 0, index))
    history._seen("DELETED", pod("b", "j", 0, 1))
    history._seen("ADDED", pod("c", "j", 1, 1))  # a new generation's pod once the old one is gone: fine
    assert not history.violations
    history._seen("ADDED", pod("d", "j", 1, 1))  # the same worker twice
    history._seen("ADDED", pod("e", "j", 1, 0))  # and more pods than workers
    assert history.violations == ["j: [('0', '0'), ('1', '1'), ('1', '1')]",
                                  "j: [('0', '0'), ('1', '0'), ('1', '1'), ('1', '1')]"]
