"""The reconciler reads worker pods from the watch (the pod stream's store), and the watch can lag: a stale
view must never create a second pod or restart a healthy gang. Real API server, in-process reconciler."""

from __future__ import annotations

from typing import Any

import pytest
from rljob_operator import metrics
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.reconciler import Reconciler
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.names import LABEL_GANG_GENERATION

from tests.cluster.fake_pods import exit_annotations
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    annotate_pod,
    create_job,
    get_job,
    job_manifest,
    job_pods,
    runtime_store,
)

pytestmark = pytest.mark.cluster


def _count(verb: str, resource: str) -> float:
    return metrics.API_REQUESTS.labels(verb=verb, resource=resource)._value.get()  # noqa: SLF001


def test_a_lagging_pod_cache_creates_nothing_twice_and_restarts_no_healthy_gang(kube, namespace, crd_installed) -> None:
    view: dict[str, list[dict[str, Any]] | None] = {"pods": None}  # None: no watch yet, LIST
    reconciler = Reconciler(kube, pod_cache=lambda ns, name: view["pods"],
                            profile=PodProfile(allowed_images=("registry.invalid/rljob-trainer:*",)),
                            runtimes=runtime_store())
    create_job(kube, namespace, job_manifest("cached", 2, {"runPolicy": {"backoffBaseSeconds": 0}}))

    view["pods"] = []  # the watch has not seen the job's pods (there are none yet)
    reconciler.reconcile(namespace, "cached")
    assert len(job_pods(kube, namespace, "cached")) == 2

    # Created a moment ago, not yet in the watch: the reconciler looks them up instead of creating again.
    posts, lists = _count("POST", "pods"), _count("GET", "pods")
    reconciler.reconcile(namespace, "cached")
    assert _count("POST", "pods") == posts and _count("GET", "pods") == lists + 1

    def running() -> bool:
        view["pods"] = job_pods(kube, namespace, "cached")  # the watch caught up
        reconciler.reconcile(namespace, "cached")
        return (get_job(kube, namespace, "cached").get("status") or {}).get("phase") == "Running"

    wait_for(running, 60, interval=0.3, message="cached Running")
    uids = sorted(p["metadata"]["uid"] for p in job_pods(kube, namespace, "cached"))

    # A watch that lost both pods of a Running gang would mean "workers lost": verified first, no restart.
    view["pods"] = []
    reconciler.reconcile(namespace, "cached")
    status = get_job(kube, namespace, "cached")["status"]
    assert status["gangGeneration"] == 0 and status["disruptions"] == 0 and status["phase"] == "Running"
    assert sorted(p["metadata"]["uid"] for p in job_pods(kube, namespace, "cached")) == uids

    # An up-to-date view answers without a LIST.
    view["pods"] = job_pods(kube, namespace, "cached")
    lists = _count("GET", "pods")
    reconciler.reconcile(namespace, "cached")
    assert _count("GET", "pods") == lists

    # A worker fails: verified with a LIST, the gang is restarted and its pods deleted. Once the watch
    # shows them gone, the new gang is created from the watch's view alone: the view lacks no pod this
    # reconciler created, so there is nothing to look up, and a name still taken would refuse the create.
    annotate_pod(kube, namespace, "cached-worker-1", exit_annotations(1))
    wait_for(lambda: any(p["status"].get("phase") == "Failed" for p in job_pods(kube, namespace, "cached")),
             30, message="cached-worker-1 Failed")
    view["pods"] = job_pods(kube, namespace, "cached")
    lists = _count("GET", "pods")
    reconciler.reconcile(namespace, "cached")
    assert get_job(kube, namespace, "cached")["status"]["gangGeneration"] == 1
    assert _count("GET", "pods") == lists + 1
    wait_for(lambda: not job_pods(kube, namespace, "cached"), 30, message="the old gang gone")
    view["pods"] = []
    lists, posts = _count("GET", "pods"), _count("POST", "pods")
    reconciler.reconcile(namespace, "cached")
    assert _count("GET", "pods") == lists and _count("POST", "pods") == posts + 2
    pods = job_pods(kube, namespace, "cached")
    assert len(pods) == 2 and {p["metadata"]["labels"][LABEL_GANG_GENERATION] for p in pods} == {"1"}


def test_a_lagging_job_cache_never_decides_from_a_status_older_than_the_operators_own_write(
        kube, namespace, crd_installed) -> None:
    jobs = JobCache()
    view: dict[str, list[dict[str, Any]] | None] = {"pods": []}
    reconciler = Reconciler(kube, job_cache=jobs, pod_cache=lambda ns, name: view["pods"],
                            profile=PodProfile(allowed_images=("registry.invalid/rljob-trainer:*",)),
                            runtimes=runtime_store())
    key = JobKey(namespace, "jc")
    create_job(kube, namespace, job_manifest("jc", 2, {"runPolicy": {"backoffBaseSeconds": 0}}))

    # Never shown by the watch: GET. Shown (and no write of ours since): read from the cache alone.
    gets = _count("GET", "rltrainingjobs")
    reconciler.reconcile(namespace, "jc")
    assert _count("GET", "rltrainingjobs") == gets + 1
    assert jobs.get(key) is None  # unknown to the watch

    def shown() -> bool:  # the watch catches up with the job as it is now
        jobs.seen(key, get_job(kube, namespace, "jc"))
        view["pods"] = job_pods(kube, namespace, "jc")
        reconciler.reconcile(namespace, "jc")
        return (get_job(kube, namespace, "jc").get("status") or {}).get("phase") == "Running"

    wait_for(shown, 60, interval=0.3, message="jc Running")
    # The reconcile that saw the gang ready wrote Running: that event is the operator's own (once).
    assert jobs.seen(key, get_job(kube, namespace, "jc")) is True
    assert jobs.seen(key, get_job(kube, namespace, "jc")) is False
    gets = _count("GET", "rltrainingjobs")
    reconciler.reconcile(namespace, "jc")
    assert _count("GET", "rltrainingjobs") == gets

    # A worker fails: the reconcile restarts the gang (generation 1) and writes that status. The watch still
    # shows the Running job of generation 0 and the failed worker: a reconcile that believed it would decide
    # the failure again (served that job, it writes back the restart count of before). It GETs the job instead.
    before = get_job(kube, namespace, "jc")
    annotate_pod(kube, namespace, "jc-worker-1", exit_annotations(1))
    wait_for(lambda: any(p["status"].get("phase") == "Failed" for p in job_pods(kube, namespace, "jc")),
             30, message="jc-worker-1 Failed")
    view["pods"] = job_pods(kube, namespace, "jc")
    reconciler.reconcile(namespace, "jc")
    assert get_job(kube, namespace, "jc")["status"]["gangGeneration"] == 1
    assert jobs.seen(key, before) is False  # the watch lags: it shows the job before the write
    gets = _count("GET", "rltrainingjobs")
    reconciler.reconcile(namespace, "jc")
    got = _count("GET", "rltrainingjobs") - gets
    status = get_job(kube, namespace, "jc")["status"]
    assert (status["gangGeneration"], status["restarts"]) == (1, 1)
    assert got == 1
    # Once the watch shows the write, its event is the operator's own (no reconcile needed) and the cache serves.
    assert jobs.seen(key, get_job(kube, namespace, "jc")) is True
    assert jobs.get(key) is not None
