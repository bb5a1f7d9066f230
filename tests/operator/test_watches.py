"""What each watch event does (``cluster/handlers.py``: the streams' subscribers) and how the runner wires
one stream per resource to them. The streams themselves run against the real API server in
``test_watches_cluster.py``."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest
from rljob_operator.cluster import runner
from rljob_operator.cluster.handlers import (
    EXPERIMENTS,
    JOBS,
    NODES,
    STATUS_NEWS_SECONDS,
    ExperimentEvents,
    GateEvents,
    GoneNodes,
    JobEvents,
    NodeEvents,
    PodEvents,
    gate_resource,
)
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.namespaces import NAMESPACES, NamespaceEvents
from rljob_operator.cluster.podwatch import PODS, PodStore
from rljob_operator.cluster.runtimes import CLUSTER_RUNTIMES, NAMESPACED_RUNTIMES, RuntimeEvents
from rljob_operator.cluster.streams import Resource, Watches
from rljob_operator.cluster.workqueue import ExperimentKey, JobKey
from rljob_operator.experiments.trials import LABEL_EXPERIMENT
from rljob_operator.integrations.client import GateWatch
from rljob_operator.integrations.kueue.client import WORKLOADS
from rljob_operator.names import CONTAINER, LABEL_JOB
from rljob_operator.settings import OperatorSettings
from rljob_operator.times import rfc3339

from tests.support.jobs import NOW, make_job, pod_json


class Queue:
    """The work queue as the subscribers see it (``handlers.Enqueue``), recording what they ask."""

    def __init__(self) -> None:
        self.added: list[dict[str, Any]] = []
        self.forgotten: list[Any] = []

    def add(self, key: Any, delay: float | None = None, low: bool = False, urgent: bool = False) -> None:
        self.added.append({"key": key, **({"delay": delay} if delay else {}), **({"low": low} if low else {}),
                           **({"urgent": urgent} if urgent else {})})

    def forget(self, key: Any) -> None:
        self.forgotten.append(key)

    def keys(self) -> list[Any]:
        return [a["key"] for a in self.added]


def job_body(name: str = "j", namespace: str = "ns", version: str = "1", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version, "generation": 1},
            "spec": {}, **extra}


def test_the_job_events_queue_a_job_for_every_event_but_the_operators_own_status_write() -> None:
    queue, jobs = Queue(), JobCache()
    events = JobEvents(jobs, queue)
    job = job_body()
    written = {**job, "metadata": {**job["metadata"], "resourceVersion": "2"}, "status": {"phase": "Running"}}
    key = JobKey("ns", "j")
    events.event(None, None, job)  # listed
    jobs.wrote(key, job, written)
    events.event(None, "MODIFIED", written)
    assert queue.keys() == [key]  # the listing, not our own write
    events.event(None, "MODIFIED", {**written, "metadata": {**written["metadata"], "resourceVersion": "3"}})
    events.event(None, "DELETED", written)
    assert queue.keys() == [key] * 3 and jobs.get(key) is None and key not in events.known
    assert queue.forgotten == [key]


def test_a_new_job_is_queued_as_urgent_a_job_with_a_status_as_an_event() -> None:
    """Creating a gang is a gang decision: in a burst, new jobs are not served after the Running
    writes (urgent) of the gangs created before them (bench/burst_floor.py)."""
    queue = Queue()
    events = JobEvents(JobCache(), queue)
    job, key = job_body(), JobKey("ns", "j")

    def event(type: str | None, body: dict[str, Any]) -> dict[str, Any]:
        events.event(None, type, body)
        return queue.added[-1]

    assert event(None, job) == {"key": key, "urgent": True}  # listed: not deleted
    assert event("ADDED", job) == {"key": key, "urgent": True}
    assert event("MODIFIED", {**job, "status": None}) == {"key": key, "urgent": True}  # null: none yet
    edited = {**job, "metadata": {**job["metadata"], "resourceVersion": "3", "generation": 2},
              "status": {"phase": "Running"}}
    assert event("MODIFIED", edited) == {"key": key}
    assert event("DELETED", edited) == {"key": key}


def test_a_resync_queues_every_known_job_behind_the_events_and_is_counted() -> None:
    """The periodic resync (``JobEvents.resync``): every job known and not deleted, queued low, once per
    period, and ``rljob_operator_resyncs_total`` counts it (the benchmark finds a resync's cost by it)."""
    from prometheus_client import REGISTRY

    def resyncs() -> float:
        return REGISTRY.get_sample_value("rljob_operator_resyncs_total") or 0.0

    queue = Queue()
    events = JobEvents(JobCache(), queue)
    for name in ("a", "b", "gone"):
        events.event(None, None, job_body(name))
    events.event(None, "DELETED", job_body("gone"))
    queue.added.clear()
    before = resyncs()

    async def two_periods() -> None:
        task = asyncio.create_task(events.resync(0.05))
        await asyncio.sleep(0.125)
        task.cancel()

    asyncio.run(two_periods())
    assert resyncs() - before == 2
    assert sorted(a["key"].name for a in queue.added) == ["a", "a", "b", "b"]
    assert all(a.get("low") for a in queue.added)


def test_a_trial_jobs_events_wake_its_experiment_from_the_one_job_stream() -> None:
    """One watch per resource: the experiments' trials come through the RLTrainingJob stream, each event of
    a job labelled with an experiment queueing that experiment as well as the job (a listed one, a
    heartbeat's status write, the job deleted)."""
    queue = Queue()
    events = JobEvents(JobCache(), queue)
    trial = job_body("ab-high-s0", labels=None)
    trial["metadata"]["labels"] = {LABEL_EXPERIMENT: "ab"}
    for type in (None, "MODIFIED", "DELETED"):
        events.event("ns", type, trial)
    events.event("ns", "ADDED", job_body("plain"))
    experiment, job = ExperimentKey("ns", "ab"), JobKey("ns", "ab-high-s0")
    assert queue.keys() == [job, experiment, job, experiment, job, experiment, JobKey("ns", "plain")]
    ExperimentEvents(queue).event("ns", "MODIFIED", {"metadata": {"name": "ab", "namespace": "ns"}})
    assert queue.keys()[-1] == experiment


def test_a_pod_event_that_only_changes_the_status_is_queued_a_moment_later_a_decisive_one_at_once() -> None:
    queue = Queue()
    store = PodStore.watching(["team-a"])
    events = PodEvents(store, queue)
    job = make_job(replicas=2)
    key = JobKey("team-a", job.metadata.name)

    def event(type: str, pod: dict[str, Any]) -> dict[str, Any]:
        events.event("team-a", type, pod)
        return queue.added[-1]

    news = {"key": key, "delay": STATUS_NEWS_SECONDS}
    assert event("ADDED", pod_json(job, 0, "Pending", False)) == news
    assert event("ADDED", pod_json(job, 1, "Pending", False)) == news
    ready = [pod_json(job, i) for i in range(2)]
    assert event("MODIFIED", ready[0]) == news  # ready before its gang
    assert event("MODIFIED", ready[1]) == {"key": key, "urgent": True}  # the whole gang ready: Running
    failed = pod_json(job, 1, "Failed", False, exit_code=1)
    assert event("MODIFIED", failed) == {"key": key, "urgent": True}
    deleting = pod_json(job, 0, deleting=True)
    assert event("MODIFIED", deleting) == news
    assert event("DELETED", failed) == news  # worker 0 still terminating
    assert event("DELETED", deleting) == {"key": key, "urgent": True}  # the last: replacements can be created
    assert store.pods("team-a", job.metadata.name) is None  # not listed yet: the reconciler lists


def test_the_pod_store_serves_once_every_namespace_is_listed_and_forgets_deleted_pods() -> None:
    queue = Queue()
    store = PodStore.watching(["team-a", "team-b"])
    events = PodEvents(store, queue)
    job = make_job(replicas=3)
    key = JobKey("team-a", job.metadata.name)
    pods = [pod_json(job, i) for i in range(3)]
    for pod in pods:
        pod["metadata"]["namespace"] = "team-a"
        events.event("team-a", None, pod)  # the listing
    events.event("team-a", None, {"metadata": {"name": "no-label", "namespace": "team-a", "uid": "x"}})
    events.listed("team-a")
    assert store.pods(key.namespace, key.name) is None  # team-b not listed yet
    events.listed("team-b")
    assert [p["metadata"]["name"] for p in store.pods(key.namespace, key.name) or []] == \
        [p["metadata"]["name"] for p in pods]
    assert "managedFields" not in (store.pods(key.namespace, key.name) or [{}])[0]["metadata"]  # slim copies
    assert store.pods("team-a", "other") == [] and len(queue.added) == 3
    # What a stream hands on for a pod gone while it was away: the tombstone of what it last saw.
    tombstone = {"metadata": {k: pods[1]["metadata"][k] for k in ("namespace", "name", "uid", "labels")}}
    events.event("team-a", "DELETED", tombstone)
    assert len(store.pods(key.namespace, key.name) or []) == 2
    events.event("team-a", "DELETED", pods[0])
    events.event("team-a", "DELETED", pods[2])
    assert store.pods(key.namespace, key.name) == [] and store.jobs() == []


def test_a_deleted_node_queues_the_jobs_with_a_worker_there_and_the_capacity_view_hears_every_event() -> None:
    queue, gone = Queue(), GoneNodes()
    store = PodStore.watching(["team-a"])
    heard: list[tuple[str | None, str]] = []
    capacity = SimpleNamespace(node_changed=lambda type, node: heard.append((type, node["metadata"]["name"])))
    events = NodeEvents(gone, store, queue, capacity)  # type: ignore[arg-type]
    job = make_job(replicas=2)
    for pod in (pod_json(job, 0, node="node-a"), pod_json(job, 1, node="node-b")):
        pod["metadata"]["namespace"] = "team-a"
        PodEvents(store, Queue()).event("team-a", None, pod)
    node = {"metadata": {"name": "node-b"}}
    events.event(None, None, node)  # listed
    events.event(None, "MODIFIED", node)
    assert queue.added == [] and not gone.gone("node-b")
    events.event(None, "DELETED", node)
    assert gone.gone("node-b")
    assert queue.added == [{"key": JobKey("team-a", job.metadata.name), "urgent": True}]
    events.event(None, "ADDED", node)  # a Node of that name again
    assert not gone.gone("node-b") and not gone.gone(None)
    assert heard == [(None, "node-b"), ("MODIFIED", "node-b"), ("DELETED", "node-b"), ("ADDED", "node-b")]


def test_a_gates_event_wakes_the_job_its_label_names() -> None:
    queue = Queue()
    gate = GateWatch("example.com", "v1", "approvals")
    events = GateEvents(gate, queue)
    events.event("team-a", "MODIFIED", {"metadata": {"namespace": "team-a", "labels": {LABEL_JOB: "train"}}})
    events.event("team-a", "MODIFIED", {"metadata": {"namespace": "team-a", "labels": {}}})  # names none
    assert queue.keys() == [JobKey("team-a", "train")]
    resource = gate_resource(gate)
    assert (resource.path("team-a"), resource.label_selector, resource.optional) == (
        "/apis/example.com/v1/namespaces/team-a/approvals", LABEL_JOB, True)


def test_resources_name_their_paths_and_one_stream_per_resource() -> None:
    assert PODS.path("team-a") == "/api/v1/namespaces/team-a/pods" and PODS.path(None) == "/api/v1/pods"
    assert PODS.label_selector == LABEL_JOB  # the API server filters the pods
    assert NODES.path("team-a") == "/api/v1/nodes"  # cluster-scoped: wherever the operator watches
    assert JOBS.path("a/b") == "/apis/rljob.dev/v1alpha1/namespaces/a%2Fb/rltrainingjobs"
    watches = Watches(SimpleNamespace(), ["team-a", "team-b"])  # type: ignore[arg-type]
    pods = watches.add(PODS, PodEvents(PodStore.watching([]), Queue()))
    nodes = watches.add(NODES, PodEvents(PodStore.watching([]), Queue()))
    assert [f.scope for f in pods.followers] == ["team-a", "team-b"] and [f.scope for f in nodes.followers] == [None]
    with pytest.raises(ValueError, match="one stream per resource"):
        watches.add(Resource("", "v1", "pods"), PodEvents(PodStore.watching([]), Queue()))


def test_the_runner_wires_one_stream_per_resource_to_its_subscriber() -> None:
    """Jobs (which also wake experiments), worker pods, Nodes, experiments: one stream each, the
    subscribers holding the stores the reconciler reads and the queue that runs it."""
    settings = OperatorSettings(workers=2, kueue=False, watch_nodes=True, namespaces=["team-a"])
    kube = SimpleNamespace(may=lambda verb, resource: True)  # may list and watch Nodes

    async def wired() -> runner.Leading:
        leading = runner._reconciling(settings, SimpleNamespace(configuration=None), kube,  # type: ignore[arg-type]
                                      None, None, SimpleNamespace(in_force=True))
        await leading.work.queue.stop()
        leading.threads.shutdown(wait=False)
        return leading

    leading = asyncio.run(wired())
    by_path = {s.resource.path(None): s for s in leading.watches.streams}
    assert sorted(by_path) == sorted(r.path(None) for r in (JOBS, PODS, NODES, EXPERIMENTS, CLUSTER_RUNTIMES,
                                                             NAMESPACED_RUNTIMES, NAMESPACES))
    assert by_path[JOBS.path(None)].subscriber is leading.job_events
    pods, nodes = by_path[PODS.path(None)].subscriber, by_path[NODES.path(None)].subscriber
    reconciler = leading.work.reconciler
    assert isinstance(pods, PodEvents) and isinstance(nodes, NodeEvents)
    assert reconciler.pod_cache == pods.store.pods and nodes.pods is pods.store
    assert reconciler.node_gone == nodes.gone.gone and nodes.capacity is reconciler
    assert pods.queue is leading.work.queue and leading.job_events.queue is leading.work.queue
    assert [f.scope for f in by_path[PODS.path(None)].followers] == ["team-a"]
    assert [f.scope for f in by_path[NODES.path(None)].followers] == [None]
    assert gate_resource(WORKLOADS).label_selector == LABEL_JOB
    cluster, namespaced = (by_path[r.path(None)].subscriber for r in (CLUSTER_RUNTIMES, NAMESPACED_RUNTIMES))
    assert isinstance(cluster, RuntimeEvents) and isinstance(namespaced, RuntimeEvents)
    assert cluster.store is namespaced.store is reconciler.runtimes and cluster.queue is leading.work.queue
    assert [f.scope for f in by_path[CLUSTER_RUNTIMES.path(None)].followers] == [None]
    assert [f.scope for f in by_path[NAMESPACED_RUNTIMES.path(None)].followers] == ["team-a"]
    labels = by_path[NAMESPACES.path(None)].subscriber  # every Namespace's labels: the runtimes' namespaceSelectors
    assert isinstance(labels, NamespaceEvents) and labels.store is reconciler.namespaces
    assert [f.scope for f in by_path[NAMESPACES.path(None)].followers] == [None]


def test_a_pod_event_is_urgent_when_a_worker_ended_its_gangs_last_terminating_pod_is_gone_or_all_are_ready(
) -> None:
    from rljob_operator.cluster.handlers import urgent_pod_event

    job = make_job()
    running = pod_json(job, 0)
    running["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

    def variant(status: dict[str, Any] | None = None, deleting: bool = False) -> dict[str, Any]:
        pod = copy.deepcopy(running)
        if status is not None:
            pod["status"] = status
        if deleting:
            pod["metadata"]["deletionTimestamp"] = rfc3339(NOW)
        return pod

    exited = {"phase": "Running", "containerStatuses": [
        {"name": CONTAINER, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    unready = variant({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]})
    assert not urgent_pod_event("MODIFIED", running, [running, unready])  # ready before its gang: status only
    assert not urgent_pod_event("MODIFIED", running, [running, variant(deleting=True)])
    assert urgent_pod_event("MODIFIED", running, [running, running])  # the last of its gang: Running
    assert not urgent_pod_event("ADDED", variant({"phase": "Pending"}), [])
    assert not urgent_pod_event("MODIFIED", variant(deleting=True), [variant(deleting=True)])
    assert urgent_pod_event("MODIFIED", variant({"phase": "Failed"}), [])
    assert urgent_pod_event("MODIFIED", variant({"phase": "Succeeded"}), [])
    assert urgent_pod_event("MODIFIED", variant(exited), [])  # the trainer exited, the phase not yet
    assert urgent_pod_event("MODIFIED", variant({"phase": "Running", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}), [])
    assert urgent_pod_event(None, variant({"phase": "Failed"}), [])  # listed at start
    # Deleted: urgent once no other pod of the job is still terminating (its replacements can be created).
    assert not urgent_pod_event("DELETED", variant(deleting=True), [running, variant(deleting=True)])
    assert urgent_pod_event("DELETED", variant(deleting=True), [running])
    assert urgent_pod_event("DELETED", running, [])  # gone without a word: a worker lost
