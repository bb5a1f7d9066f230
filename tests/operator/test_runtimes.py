"""The operator's runtimes (issue #42), as pure parts: which runtime serves a job (the watches' store), a job
waiting for one, the pods built on one (reward modules mounted, the runtime's egress).

The control-plane tests (a runtime created after its job, the default runtime) are in
``tests/operator/test_lifecycle_cluster.py``.
"""

from __future__ import annotations

from typing import Any

from rljob_contract import pod as contract
from rljob_contract.job import RuntimeKind
from rljob_contract.runtime import CLUSTER_KIND, NAMESPACED_KIND
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.runtimes import RuntimeEvents, RuntimeStore
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.children import JobNetwork, desired_network_policy, desired_worker_pod
from rljob_operator.decisions.egress import Egress
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.plan import RUNTIME_NOT_FOUND
from rljob_operator.decisions.policy import PodProfile, violations

from tests.support.jobs import NOW, make_job, observe, pod_json
from tests.support.operator_process import on_runtime, runtime_manifest

PROFILE = PodProfile(allowed_images=("registry.invalid/rljob-trainer:*",))


def stored(*docs: dict[str, Any], namespaces: tuple[str, ...] = ("team-a",)) -> RuntimeStore:
    """A store that has listed ``docs`` (runtime manifests) in every scope."""
    store = RuntimeStore(namespaces)
    for doc in docs:
        store.put(doc["kind"], None, doc)
    store.listed |= store.scopes
    return store


def test_a_job_runs_on_the_runtime_it_names_of_its_kind_and_namespace() -> None:
    store = stored(runtime_manifest("gpu"), runtime_manifest("gpu", kind=NAMESPACED_KIND, namespace="team-a",
                                                             spec={"image": "registry.invalid/team-a:1"}))
    named = make_job(spec={"runtimeRef": {"name": "gpu"}})
    assert store.lookup(named)[0].ref == f"{CLUSTER_KIND}/gpu"  # type: ignore[union-attr]
    mine = make_job(spec={"runtimeRef": {"kind": NAMESPACED_KIND, "name": "gpu"}})
    assert store.lookup(mine)[0].spec.image == "registry.invalid/team-a:1"  # type: ignore[union-attr]
    runtime, missing = store.lookup(make_job(spec={"runtimeRef": {"kind": NAMESPACED_KIND, "name": "cpu"}}))
    assert runtime is None and missing == ("spec.runtimeRef: RLTrainingRuntime 'cpu' does not exist in namespace "
                                           "team-a: create it, or name another")


def test_a_job_naming_none_gets_its_namespaces_default_else_the_clusters() -> None:
    cluster = runtime_manifest("default", default=True)
    theirs = runtime_manifest("theirs", kind=NAMESPACED_KIND, namespace="team-b", default=True)
    assert stored(cluster, theirs).lookup(make_job())[0].metadata.name == "default"  # type: ignore[union-attr]
    ours = runtime_manifest("ours", kind=NAMESPACED_KIND, namespace="team-a", default=True)
    assert stored(cluster, theirs, ours).lookup(make_job())[0].metadata.name == "ours"  # type: ignore[union-attr]
    runtime, missing = stored(runtime_manifest("unmarked")).lookup(make_job())
    assert runtime is None and missing is not None
    assert "names no runtime (spec.runtimeRef) and none is the default" in missing
    assert 'rljob.dev/is-default-runtime: "true"' in missing


def test_a_runtime_the_models_refuse_is_named_with_why() -> None:
    bad = runtime_manifest("bad", {"limits": {"gpusPerWorker": {"default": 3, "max": 1}}})
    runtime, missing = stored(bad).lookup(make_job(spec={"runtimeRef": {"name": "bad"}}))
    assert runtime is None and missing == ("spec.runtimeRef: ClusterRLTrainingRuntime 'bad' is invalid: "
                                           "spec.limits.gpusPerWorker.default: must be at most max (3 > 1)")


class Queue:
    """The work queue as the subscribers use it, recording what they add."""

    def __init__(self) -> None:
        self.added: list[JobKey] = []

    def add(self, key: Any, delay: float | None = None, low: bool = False, urgent: bool = False) -> None:
        self.added.append(key)

    def forget(self, key: Any) -> None:
        pass


def subscribers(namespaces: tuple[str, ...] = ("team-a",)) -> tuple[RuntimeStore, JobCache, Queue, RuntimeEvents,
                                                                    RuntimeEvents]:
    """A store, the jobs' cache, a queue and the two kinds' subscribers feeding them (as the runner wires them)."""
    store, jobs, queue = RuntimeStore(namespaces), JobCache(), Queue()
    return (store, jobs, queue, RuntimeEvents(RuntimeKind.cluster, store, jobs, queue),
            RuntimeEvents(RuntimeKind.namespaced, store, jobs, queue))


def test_the_store_is_synced_once_every_stream_listed_and_forgets_a_deleted_runtime() -> None:
    store, _, _, cluster, namespaced = subscribers()
    assert not store.synced()
    cluster.event(None, None, runtime_manifest("default", default=True))
    cluster.listed(None)
    assert not store.synced()  # the namespace's runtimes are not listed yet
    namespaced.listed("team-a")
    assert store.synced() and store.lookup(make_job())[0] is not None
    # Deleted (a relisting hands on as DELETED what it no longer shows: ``streams``).
    cluster.event(None, "DELETED", runtime_manifest("default", default=True))
    assert store.lookup(make_job())[0] is None


def test_a_runtime_event_queues_the_jobs_waiting_for_one() -> None:
    _, jobs, queue, cluster, _ = subscribers()
    waiting, running = JobKey("team-a", "waiting"), JobKey("team-a", "running")
    for key, reason in ((waiting, RUNTIME_NOT_FOUND), (running, "Running")):
        jobs.seen(key, {"metadata": {"name": key.name, "namespace": key.namespace, "resourceVersion": "1"},
                        "status": {"reason": reason}})
    cluster.event(None, None, runtime_manifest("default", default=True))
    assert queue.added == [waiting]


def test_a_job_without_a_runtime_waits_pending_saying_what_to_create_once() -> None:
    missing = "spec.runtimeRef: ClusterRLTrainingRuntime 'gpu' does not exist: create it, or name another"
    plan = plan_reconcile(make_job(), [], NOW, profile=PROFILE, runtime_missing=missing)
    assert (plan.status["phase"], plan.status["reason"], plan.status["message"]) == ("Pending", RUNTIME_NOT_FOUND,
                                                                                    missing)
    assert plan.create_pods == [] and plan.children is None
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", RUNTIME_NOT_FOUND,
                                                                     f"New → Pending: {missing}")]
    assert not any(c["type"] == "CheckpointsDurable" for c in plan.status["conditions"])  # nothing is known yet
    again = plan_reconcile(make_job(status=plan.status), [], NOW, profile=PROFILE, runtime_missing=missing)
    assert again.events == []
    other = "spec.runtimeRef: ClusterRLTrainingRuntime 'gpu' is invalid: …"
    changed = plan_reconcile(make_job(status=plan.status), [], NOW, profile=PROFILE, runtime_missing=other)
    assert [(e.type, e.message) for e in changed.events] == [("Warning", other)]
    # A running gang whose runtime went is left alone (what it was built from is the snapshot's to keep).
    running = make_job(status={"phase": "Running", "gangGeneration": 0})
    plan = plan_reconcile(running, observe(running, pod_json(running, 0), pod_json(running, 1)), NOW,
                          profile=PROFILE, runtime_missing=missing)
    assert plan.delete_pods == [] and plan.create_pods == []


def test_reward_modules_from_configmaps_are_mounted_read_only_at_their_module_paths() -> None:
    rewards = [{"name": "team.scoring:exact", "source": {"configMap": {"name": "team-rewards", "key": "s.py"}}},
               {"name": "team.scoring:partial", "source": {"configMap": {"name": "team-rewards", "key": "s.py"}}},
               {"name": "length:short", "source": {"configMap": {"name": "lengths", "key": "length.py"}}},
               {"name": "repeat_char"}]
    job = make_job(spec={"training": {"rewards": rewards}})
    pod = desired_worker_pod(job, 0, 0, runtime=on_runtime(job))
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "rljob-rewards"]
    assert volume["projected"]["sources"] == [
        {"configMap": {"name": "team-rewards", "items": [{"key": "s.py", "path": "team/scoring.py"}]}},
        {"configMap": {"name": "lengths", "items": [{"key": "length.py", "path": "length.py"}]}}]
    mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "rljob-rewards"]
    assert mounts == [{"name": "rljob-rewards", "mountPath": contract.REWARDS_DIR, "readOnly": True}]
    assert violations(job, PROFILE, on_runtime(job)) == []  # a projected volume: restricted allows it
    plain = desired_worker_pod(make_job(), 0, 0, runtime=on_runtime(make_job()))
    assert not [v for v in plain["spec"]["volumes"] if v["name"] == "rljob-rewards"]


def test_the_runtimes_egress_is_added_to_the_platforms() -> None:
    job = make_job()
    network = JobNetwork(egress=Egress(status_namespace="rljob-system"))
    base = desired_network_policy(job, network, on_runtime(job))["spec"]["egress"]
    more = desired_network_policy(job, network, on_runtime(job, {"egress": {"to": [
        {"cidr": "10.20.0.0/16", "ports": [5432]}, {"cidr": "fd00::/8"}]}}))["spec"]["egress"]
    assert more == [*base, {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 5432}]},
                    {"to": [{"ipBlock": {"cidr": "fd00::/8"}}]}]
