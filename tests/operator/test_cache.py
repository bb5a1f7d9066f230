"""What the operator keeps of the watches' objects (``decisions.observed.slim_pod``, ``cluster/jobcache.py``):
all the reconciler reads of a pod, and the watch's job unless the operator's own write is not shown yet.
The same against a lagging watch on the real API server: ``tests/operator/test_cache_cluster.py``."""

from __future__ import annotations

from typing import Any

from rljob_operator.decisions.observed import ObservedPod

from tests.support.jobs import UID, make_job, pod_json


def test_the_watch_cache_keeps_everything_the_reconciler_reads_of_a_pod() -> None:
    from rljob_operator.decisions.observed import slim_pod

    job = make_job()
    pods = [pod_json(job, 0), pod_json(job, 1, "Failed", False, exit_code=137, message="OOM"),
            pod_json(job, 0, "Pending", False, node=None, unschedulable="0/4 nodes"),
            pod_json(job, 1, deleting=True, generation=3)]
    for pod in pods:
        slim = slim_pod(pod)
        assert ObservedPod.from_pod(slim, UID, "train") == ObservedPod.from_pod(pod, UID, "train")
        assert slim["metadata"]["uid"] == pod["metadata"]["uid"]
        assert len(repr(slim)) < len(repr(pod)) / 2  # no container specs, volumes or env


def test_the_job_cache_serves_the_watchs_job_unless_the_operators_own_write_is_not_shown_yet() -> None:
    from rljob_operator.cluster.jobcache import JobCache

    def body(version: str, status: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
        return {"metadata": {"name": "j", "resourceVersion": version, "generation": 1, "labels": labels or {},
                             "managedFields": [{"manager": "x"}]}, "spec": {}, "status": {"phase": status}}

    jobs, key = JobCache(), ("ns", "j")
    assert jobs.get(key) is None  # never shown
    assert jobs.seen(key, body("1")) is False
    served = jobs.get(key)
    assert served == {**body("1"), "metadata": {k: v for k, v in body("1")["metadata"].items() if k != "managedFields"}}
    served["status"]["phase"] = "mutated"
    assert jobs.get(key)["status"]["phase"] == ""  # a copy each time
    # Our write (answer: version 2) is not shown yet: no cached job until it is; then its event is ours alone.
    jobs.wrote(key, body("1"), body("2", "Running"))
    assert jobs.get(key) is None
    assert jobs.seen(key, body("1")) is False and jobs.get(key) is None  # an older event does not count
    assert jobs.seen(key, body("2", "Running")) is True
    assert jobs.get(key)["status"]["phase"] == "Running"
    assert jobs.seen(key, body("2", "Running")) is False  # once only
    # Someone labelled the job between our read and our write: the write's event is not ours alone.
    jobs.wrote(key, body("2"), body("3", "Running", {"team": "a"}))
    assert jobs.seen(key, body("3", "Running", {"team": "a"})) is False and jobs.get(key) is not None
    # While a reconcile runs its job's events are held, and at its end only someone else's asks for another:
    # the watch may show our write before the reconcile's thread has read the answer.
    jobs.begin(key)
    assert jobs.seen(key, body("4", "Pending")) is True
    jobs.wrote(key, body("3"), body("4", "Pending"))
    assert jobs.get(key) is not None  # the watch was quicker: nothing pending
    assert jobs.end(key) is False
    jobs.begin(key)
    assert jobs.seen(key, body("5", "Pending")) is True  # a heartbeat's write, say
    jobs.wrote(key, body("5"), body("6", "Running"))
    assert jobs.seen(key, body("6", "Running")) is True
    assert jobs.end(key) is True
    assert jobs.seen(key, body("7")) is False  # no reconcile running: not held
    # A write the watch skipped (it restarted and showed a later version): a GET that matches the watch
    # shows the watch has caught up.
    jobs.wrote(key, body("7"), body("8"))
    assert jobs.seen(key, body("9")) is False and jobs.get(key) is None
    jobs.got(key, body("10"))
    assert jobs.get(key) is None  # the watch is behind the GET: still not served
    jobs.got(key, body("9"))
    assert jobs.get(key)["metadata"]["resourceVersion"] == "9"
    jobs.wrote(key, body("9"), body("11"))
    assert jobs.seen(key, None) is False and jobs.get(key) is None  # deleted: forgotten
    assert jobs.seen(key, body("11")) is False and jobs.get(key) is not None
