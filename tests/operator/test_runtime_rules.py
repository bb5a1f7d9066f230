"""The operator's rules for runtimes (issue #42, operator half), as pure decisions: the built pod judged whole
(the three escapes: a template's grace period, ``gpuResource`` as a control-plane toleration, pod-level
resources and claims), Kueue charged what the built pod asks for, the runtime's queue, the snapshot a running
gang keeps when its runtime is edited or deleted, and the namespaceSelector the operator enforces itself.

On the real API server: ``tests/operator/test_runtimes_cluster.py``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from rljob_contract.job import RLTrainingJob
from rljob_contract.runtime import NAMESPACED_KIND, TrainingRuntime, parse_runtime, resolve
from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.podbounds import defaulted_pod_resources, pod_limits, pod_requests
from rljob_operator.decisions.policy import PodProfile, violations
from rljob_operator.decisions.runtimes import (
    CHANGED,
    CONDITION,
    DELETED,
    NOT_ALLOWED,
    SNAPSHOT_KEY,
    read_snapshot,
    runtime_hash,
    runtime_in_use,
    runtime_record,
    snapshot,
    wants_snapshot,
)
from rljob_operator.integrations.kueue.client import KueueClient
from rljob_operator.integrations.kueue.decide import KUEUE, QUEUE_REQUIRED, QueueView, desired_workload
from rljob_operator.settings import OperatorSettings
from rljob_operator.times import rfc3339

from tests.support.jobs import NOW, UID, make_job, observe, pod_json
from tests.support.operator_process import on_runtime, runtime_manifest

PROFILE = PodProfile(allowed_images=("registry.invalid/*",))
PRIVILEGED = dataclasses.replace(PROFILE, level="privileged")
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def refusals(job: RLTrainingJob, spec: dict[str, Any], profile: PodProfile = PROFILE, **kw: Any) -> list[str]:
    """What the operator refuses of ``job`` on the tests' runtime with ``spec`` merged."""
    return violations(job, profile, on_runtime(job, spec, **kw))


def runtime(spec: dict[str, Any] | None = None, generation: int = 1, name: str = "gpu", **kw: Any) -> TrainingRuntime:
    doc = runtime_manifest(name, spec, **kw)
    doc["metadata"]["generation"] = generation
    return parse_runtime(doc)


# ------------------------------------------------------------------ the built pod judged whole


def test_a_templates_grace_period_beyond_the_runtimes_bound_or_the_ceiling_is_refused() -> None:
    job = make_job()
    year = {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 31536000}}}
    bounded = {**year, "limits": {"terminationGracePeriodSeconds": {"max": 600}}}
    assert any(r.endswith("spec.podTemplate.spec.terminationGracePeriodSeconds: 31536000 seconds (at most 600: "
                          "spec.limits.terminationGracePeriodSeconds.max bounds every worker's grace period, and no "
                          "worker gets more than 3600; a stopped gang keeps its GPUs that long)")
               for r in refusals(job, bounded))
    assert any("31536000 seconds (at most 3600" in r for r in refusals(job, year))  # no bound: the ceiling
    # Even where the job's own grace period would win, the runtime stays refused: its other jobs would not.
    own = make_job(spec={"workers": {"terminationGracePeriodSeconds": 60}})
    assert any("31536000 seconds" in r for r in refusals(own, bounded))


def test_a_jobs_own_grace_period_wins_over_the_templates_default_and_the_pod_says_the_same_everywhere() -> None:
    template = {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 30}}}
    own = make_job(spec={"workers": {"terminationGracePeriodSeconds": 90}})
    pod = desired_worker_pod(own, 0, 0, runtime=on_runtime(own, template))
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["RLJOB_SHUTDOWN_TIMEOUT"] == "80"  # the launcher's wait fits the grace period the pod has
    default = desired_worker_pod(make_job(), 0, 0, runtime=on_runtime(make_job(), template))
    assert default["spec"]["terminationGracePeriodSeconds"] == 30


def test_the_built_pods_grace_period_stays_within_the_bound_when_the_job_sets_none() -> None:
    job = make_job()  # no grace period of its own: the operator's 120 s, over a bound of 60
    found = refusals(job, {"limits": {"terminationGracePeriodSeconds": {"max": 60}}})
    assert found == ["ClusterRLTrainingRuntime/rljob-tests: spec.workers.terminationGracePeriodSeconds: the worker "
                     "pod's grace period is 120 seconds (spec.limits.terminationGracePeriodSeconds.max allows at most "
                     "60; a stopped gang keeps its GPUs that long)"]


def test_a_gpu_resource_naming_the_control_plane_is_refused_whatever_the_profile() -> None:
    job = make_job()
    cluster = refusals(job, {"gpuResource": CONTROL_PLANE}, PRIVILEGED)
    assert cluster == [f"ClusterRLTrainingRuntime/rljob-tests: spec.gpuResource: '{CONTROL_PLANE}' is not an "
                       "extended resource name (a domain-qualified name outside kubernetes.io, such as nvidia.com/gpu "
                       "or amd.com/gpu); the workers tolerate its taint"]
    namespaced = refusals(job, {"gpuResource": CONTROL_PLANE}, PRIVILEGED, kind=NAMESPACED_KIND, namespace="team-a")
    assert f"spec.gpuResource: tolerating the control-plane taint {CONTROL_PLANE} is not allowed in an " \
           "RLTrainingRuntime (the cluster's nodes are the platform team's)" in " ".join(namespaced)
    restricted = refusals(job, {"gpuResource": CONTROL_PLANE})
    assert any(f'spec.gpuResource: tolerating the control-plane taint {CONTROL_PLANE} is not allowed by the platform '
               'profile "restricted"' in r for r in restricted)
    assert refusals(job, {"gpuResource": "amd.com/gpu"}) == []


def test_a_namespaced_runtimes_template_may_not_tolerate_the_control_plane_even_where_pods_may_be_privileged() -> None:
    job = make_job()
    template = {"podTemplate": {"spec": {"tolerations": [{"key": CONTROL_PLANE, "operator": "Exists"}]}}}
    assert refusals(job, template, PRIVILEGED) == []  # the platform's own runtime, on a privileged platform
    mine = refusals(job, template, PRIVILEGED, kind=NAMESPACED_KIND, namespace="team-a")
    assert mine == [f"RLTrainingRuntime/team-a/rljob-tests: spec.podTemplate.spec.tolerations[0].key: tolerating the "
                    f"control-plane taint {CONTROL_PLANE} is not allowed in an RLTrainingRuntime (the cluster's "
                    "nodes are the platform team's)"]
    everything = {"podTemplate": {"spec": {"tolerations": [{"operator": "Exists"}]}}}
    assert refusals(job, everything, PRIVILEGED, kind=NAMESPACED_KIND, namespace="team-a")


def test_tolerating_a_cordoned_node_is_refused() -> None:
    template = {"podTemplate": {"spec": {"tolerations": [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}}}
    assert any("tolerating the taint node.kubernetes.io/unschedulable (a cordoned node: its admin is draining it)"
               in r for r in refusals(make_job(), template))


def test_pod_level_resources_beyond_the_runtimes_bound_are_refused() -> None:
    job = make_job()
    bound = {"limits": {"cpuPerWorker": {"max": "32"}, "memoryPerWorker": {"max": "64Gi"}}}
    big = {**bound, "podTemplate": {"spec": {"resources": {"limits": {"cpu": "96", "memory": "1Ti"}}}}}
    assert refusals(job, big) == [
        "ClusterRLTrainingRuntime/rljob-tests: spec.podTemplate.spec.resources.limits.cpu: the worker pod's cpu "
        "requests come to 96 (spec.limits.cpuPerWorker.max allows at most 32)",  # a request defaulted from the limit
        "ClusterRLTrainingRuntime/rljob-tests: spec.podTemplate.spec.resources.limits.cpu: the worker pod's cpu limits "
        "come to 96 (spec.limits.cpuPerWorker.max allows at most 32)",
        "ClusterRLTrainingRuntime/rljob-tests: spec.podTemplate.spec.resources.limits.memory: the worker pod's memory "
        "requests come to 1Ti (spec.limits.memoryPerWorker.max allows at most 64Gi)",
        "ClusterRLTrainingRuntime/rljob-tests: spec.podTemplate.spec.resources.limits.memory: the worker pod's memory "
        "limits come to 1Ti (spec.limits.memoryPerWorker.max allows at most 64Gi)",
    ]
    small = {**bound, "podTemplate": {"spec": {"resources": {"limits": {"cpu": "16", "memory": "32Gi"}}}}}
    assert refusals(job, small) == []


def test_a_templates_container_resources_are_measured_with_the_jobs() -> None:
    job = make_job(spec={"workers": {"resources": {"requests": {"cpu": "8"}}}})
    template = {"limits": {"cpuPerWorker": {"max": "32"}},
                "podTemplate": {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"cpu": "48"}}}]}}}
    assert refusals(job, template) == [
        "ClusterRLTrainingRuntime/rljob-tests: spec.workers.resources.limits.cpu (or spec.podTemplate.spec.containers[]"
        ".resources): the worker pod's cpu limits come to 48 (spec.limits.cpuPerWorker.max allows at most 32)"]


def test_a_template_may_not_add_or_change_gpus() -> None:
    job = make_job(spec={"workers": {"gpusPerWorker": 1}})
    more = {"podTemplate": {"spec": {"containers": [{"name": "trainer", "resources": {
        "limits": {"nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}}]}}}
    found = refusals(job, more)
    assert len(found) == 2 and all("the worker pod's containers ask for 8 nvidia.com/gpu, not the job's 1" in r
                                   for r in found)
    cpu = make_job(spec={"workers": {"gpusPerWorker": 0}})
    assert refusals(cpu, more)  # a CPU job's pod gets no GPU through its runtime either


def test_a_pod_is_measured_as_the_scheduler_measures_it() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}}},
                           {"resources": {"requests": {"cpu": "500m"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "8"}}},
                               {"restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}],
            "overhead": {"cpu": "250m"}}
    requests = pod_requests(spec)
    # An init container alone (8) over the containers and the sidecar (3.5); then the overhead.
    assert requests["cpu"] == 8.25 and requests["memory"] == 4 * 2**30
    pod_level = {**spec, "resources": {"limits": {"cpu": "96", "memory": "8Gi"}}}
    # A pod-level limit without a request: the containers' requests (cpu, overcommittable), else the limit (memory
    # requested by a limit only is still a request of the containers'): as the API server defaults it.
    assert defaulted_pod_resources(pod_level) == {"requests": {"cpu": "8", "memory": "4Gi"},
                                                  "limits": {"cpu": "96", "memory": "8Gi"}}
    assert defaulted_pod_resources({"containers": [{}], "resources": {"limits": {"cpu": "96"}}}) == \
        {"requests": {"cpu": "96"}, "limits": {"cpu": "96"}}
    assert pod_limits(pod_level)["cpu"] == 96


# ------------------------------------------------------------------------------- Kueue


def _queued(spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> RLTrainingJob:
    job = make_job(spec=spec)
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"labels": labels or {}})})


def test_the_workload_is_charged_the_built_pods_pod_level_resources_and_claims() -> None:
    shape = {"podTemplate": {"spec": {
        "resources": {"limits": {"cpu": "96", "memory": "512Gi"}},
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
        "containers": [{"name": "trainer", "resources": {"claims": [{"name": "gpus"}]}}]}}}
    job = _queued({"workers": {"gpusPerWorker": 0}}, {"kueue.x-k8s.io/queue-name": "team-a"})
    worker = desired_worker_pod(job, 0, 0, runtime=on_runtime(job, shape))
    template = desired_workload(job, 2, None, worker)["spec"]["podSets"][0]["template"]["spec"]
    assert template["resources"] == {"requests": {"cpu": "96", "memory": "512Gi"},
                                     "limits": {"cpu": "96", "memory": "512Gi"}}
    assert template["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
    assert template["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]
    assert pod_requests(template)["cpu"] == 96  # what Kueue counts per pod (component-helpers' PodRequests)


def test_claims_in_a_queued_job_are_refused_unless_the_platforms_kueue_counts_them() -> None:
    job = _queued(labels={"kueue.x-k8s.io/queue-name": "team-a"})
    claims = {"podTemplate": {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"}]}}}
    worker = desired_worker_pod(job, 0, 0, runtime=on_runtime(job, claims))
    assert KUEUE.violations(job, QueueView(worker=worker)) == [
        "spec.podTemplate.spec.resourceClaims[0]: this platform's Kueue does not count DRA claims (Kueue needs its "
        "feature gate DynamicResourceAllocation and a resources.deviceClassMappings entry for the template's "
        "DeviceClass; then set the operator's kueue_counts_resource_claims, chart kueue.countsResourceClaims): the "
        "quota would never see these devices"]
    assert KUEUE.violations(job, QueueView(worker=worker, counts_claims=True)) == []
    shared = {"podTemplate": {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "pool"}]}}}
    worker = desired_worker_pod(job, 0, 0, runtime=on_runtime(job, shared))
    assert KUEUE.violations(job, QueueView(worker=worker, counts_claims=True)) == [
        "spec.podTemplate.spec.resourceClaims[0].resourceClaimName: Kueue charges no pre-made ResourceClaim to a "
        "queue; a queued job's claims come from a resourceClaimTemplateName"]
    unqueued = _queued()
    assert KUEUE.violations(unqueued, QueueView(worker=worker)) == []  # no quota to charge


def test_the_runtimes_queue_is_the_jobs_when_it_names_none_and_its_label_wins() -> None:
    team = {"queue": {"name": "team-b"}}
    job = _queued()
    client = KueueClient(None, True, OperatorSettings())  # type: ignore[arg-type]
    client.served = lambda: False  # type: ignore[method-assign]  # no Kueue: what matters is that it governs
    gated = client.observe(job, UID, runtime=on_runtime(job, team))
    assert gated is not None and KUEUE.queue(job, gated.view) == "team-b"
    plan = plan_reconcile(job, [], NOW, profile=PROFILE, gates=(gated,), runtime=on_runtime(job, team))
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "KueueUnavailable" and not plan.create_pods
    assert desired_workload(job, 2, None, queue=gated.view.default_queue)["spec"]["queueName"] == "team-b"
    labelled = _queued(labels={"kueue.x-k8s.io/queue-name": "mine"})
    assert KUEUE.queue(labelled, QueueView(default_queue=resolve(labelled, runtime(team)).queue)) == "mine"
    assert client.observe(job, UID, runtime=on_runtime(job)) is None  # a runtime with no queue: not queued


def test_a_runtime_requiring_a_queue_holds_a_job_that_names_none() -> None:
    job = _queued()
    client = KueueClient(None, True, OperatorSettings())  # type: ignore[arg-type]
    gated = client.observe(job, UID, runtime=on_runtime(job, {"queue": {"required": True}}))
    assert gated is not None and gated.view.required
    plan = plan_reconcile(job, [], NOW, profile=PROFILE, gates=(gated,), runtime=on_runtime(job))
    assert plan.status["reason"] == QUEUE_REQUIRED and not plan.create_pods
    assert plan.status["message"] == (
        "metadata.labels[kueue.x-k8s.io/queue-name]: its runtime ClusterRLTrainingRuntime/rljob-tests requires a Kueue "
        "LocalQueue (spec.queue.required); label the job with its team's queue")


# ------------------------------------------------------------------------ snapshots


def test_a_snapshot_reads_back_as_the_runtime_it_was_and_nothing_else_passes_for_it() -> None:
    rt = runtime({"podTemplate": {"spec": {"serviceAccountName": "trainer"}}, "limits": {"replicas": {"max": 4}}},
                 generation=3)
    record = runtime_record(rt)
    assert (record.kind, record.name, record.generation) == ("ClusterRLTrainingRuntime", "gpu", 3)
    back = read_snapshot(snapshot(rt), record)
    assert isinstance(back, TrainingRuntime) and runtime_hash(back) == record.hash and back.generation == 3
    forged = json.loads(snapshot(rt))
    forged["spec"]["podTemplate"]["spec"]["serviceAccountName"] = "cluster-admin-sa"
    assert "is not the runtime status.runtime records (ClusterRLTrainingRuntime/gpu" in \
        str(read_snapshot(json.dumps(forged), record))
    assert read_snapshot(None, record) == "the job's ConfigMap key runtime.json is missing"
    assert "is not JSON" in str(read_snapshot("{", record))
    marked = parse_runtime({**runtime_manifest("gpu", {"podTemplate": {"spec": {"serviceAccountName": "trainer"}},
                                                        "limits": {"replicas": {"max": 4}}}, default=True)})
    assert runtime_hash(marked) == record.hash  # the default marker is no change of the pods


def _started(rt: TrainingRuntime, **status: Any) -> RLTrainingJob:
    """A job whose gang 0 was built from ``rt`` and runs."""
    return make_job(status={"phase": "Running", "gangGeneration": 0, "gangStartTime": rfc3339(NOW),
                            "runtime": runtime_record(rt).model_dump(by_alias=True), **status})


def test_a_new_gang_records_its_runtime_and_its_configmap_keeps_it() -> None:
    rt = runtime(generation=2)
    job = make_job()
    use = runtime_in_use(job, False, rt, None)
    plan = plan_reconcile(job, [], NOW, profile=PROFILE, runtime=resolve(job, use.runtime), runtime_in_use=use)
    assert len(plan.create_pods) == 2
    assert plan.status["runtime"] == runtime_record(rt).model_dump(by_alias=True)
    assert json.loads(plan.configmap["data"][SNAPSHOT_KEY])["metadata"]["generation"] == 2  # type: ignore[index]
    [cond] = [c for c in plan.status["conditions"] if c["type"] == CONDITION]
    assert (cond["status"], cond["reason"]) == ("True", "UpToDate")


def test_an_edited_runtime_applies_from_the_next_gang_and_a_replaced_worker_keeps_its_gangs() -> None:
    old = runtime(generation=1)
    new = runtime({"image": "registry.invalid/rljob-trainer:new"}, generation=2)
    job = _started(old, phase="Pending", reason="WorkersPending")  # gang 0 started: worker 1 still to create
    assert wants_snapshot(job, new) and not wants_snapshot(job, old)
    use = runtime_in_use(job, True, new, None, old)
    assert use.runtime is old and use.stale is not None and use.stale.reason == CHANGED
    assert use.stale.message == ("the running gang was built from ClusterRLTrainingRuntime/gpu generation 1; the job's "
                                 "runtime is now ClusterRLTrainingRuntime/gpu at generation 2: generation 2 applies "
                                 "from the next gang start")
    # Worker 1 is created now (or replaced in place): as its peer was built (never a mixed gang).
    plan = plan_reconcile(job, observe(job, pod_json(job, 0)), NOW, profile=PROFILE,
                          runtime=resolve(job, use.runtime), runtime_in_use=use)
    [created] = plan.create_pods
    assert created["spec"]["containers"][0]["image"] == "registry.invalid/rljob-trainer:test"
    assert plan.status["runtime"]["generation"] == 1
    [cond] = [c for c in plan.status["conditions"] if c["type"] == CONDITION]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", CHANGED, use.stale.message)
    assert [(e.type, e.reason) for e in plan.events if e.reason == CHANGED] == [("Normal", CHANGED)]
    again = plan_reconcile(_started(old, phase="Pending", conditions=plan.status["conditions"]),
                           observe(job, pod_json(job, 0)), NOW,
                           profile=PROFILE, runtime=resolve(job, use.runtime), runtime_in_use=use)
    assert not [e for e in again.events if e.reason == CHANGED]  # said once
    # The next gang (a restart: generation 1, not started yet) is built from the runtime as it is now.
    restarting = _started(old, phase="Restarting", gangGeneration=1, gangStartTime=None)
    fresh = runtime_in_use(restarting, False, new, None, old)
    assert fresh.runtime is new and fresh.stale is None
    plan = plan_reconcile(restarting, [], NOW, profile=PROFILE, runtime=resolve(restarting, new), runtime_in_use=fresh)
    assert {p["spec"]["containers"][0]["image"] for p in plan.create_pods} == {"registry.invalid/rljob-trainer:new"}
    assert plan.status["runtime"]["generation"] == 2


def test_a_deleted_runtime_keeps_the_running_gang_and_a_restart_runs_on_its_snapshot_saying_so() -> None:
    old = runtime(generation=4)
    job = _started(old)
    missing = "spec.runtimeRef: ClusterRLTrainingRuntime 'gpu' does not exist: create it, or name another"
    use = runtime_in_use(job, True, None, missing, old)
    assert use.runtime is old and use.missing is None and use.stale is not None and use.stale.reason == DELETED
    assert "the running gang keeps it" in use.stale.message
    running = plan_reconcile(job, observe(job, pod_json(job, 0), pod_json(job, 1)), NOW, profile=PROFILE,
                             runtime=resolve(job, old), runtime_in_use=use)
    assert running.status["phase"] == "Running" and not running.delete_pods
    assert [(e.type, e.reason) for e in running.events if e.reason.startswith("Runtime")] == [("Warning", DELETED)]
    restarting = _started(old, phase="Restarting", gangGeneration=1, gangStartTime=None)
    restart = runtime_in_use(restarting, False, None, missing, old)
    assert restart.stale is not None and restart.stale.message == (
        f"{missing}; the job runs on its snapshot of ClusterRLTrainingRuntime/gpu generation 4 (its ConfigMap's "
        "runtime.json): the new gang is built from it, until the runtime is there again")
    plan = plan_reconcile(restarting, [], NOW, profile=PROFILE, runtime=resolve(restarting, old),
                          runtime_in_use=restart)
    assert len(plan.create_pods) == 2 and plan.status["runtime"]["generation"] == 4
    assert f"gang generation 1 is built from the runtime's snapshot: {restart.stale.message}" in \
        [e.message for e in plan.events if e.reason == DELETED]


def test_a_job_without_a_usable_snapshot_waits_runtime_not_found() -> None:
    missing = "spec.runtimeRef: ClusterRLTrainingRuntime 'gpu' does not exist: create it, or name another"
    assert runtime_in_use(make_job(), False, None, missing).missing == missing  # it never ran
    forged = runtime_in_use(_started(runtime()), True, None, missing, "the job's ConfigMap key runtime.json is missing")
    assert forged.runtime is None and forged.missing == (
        f"{missing}; no snapshot of ClusterRLTrainingRuntime/gpu to run on (the job's ConfigMap key runtime.json is "
        "missing)")


def test_a_changed_runtime_whose_snapshot_cannot_be_read_builds_from_now_on_from_the_runtime_as_it_is() -> None:
    new = runtime({"image": "registry.invalid/rljob-trainer:new"}, generation=2)
    use = runtime_in_use(_started(runtime()), True, new, None, "the job's ConfigMap key runtime.json is missing")
    assert use.runtime is new and use.stale is not None and use.stale.reason == CHANGED
    assert "its snapshot cannot be read (the job's ConfigMap key runtime.json is missing)" in use.stale.message


# ------------------------------------------------------------------ namespaceSelector


def test_a_job_outside_its_runtimes_namespace_selector_fails_naming_the_selector() -> None:
    rt = runtime({"namespaceSelector": {"matchLabels": {"team": "a"},
                                        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}})
    job = make_job()
    use = runtime_in_use(job, False, rt, None, namespace_labels={"team": "b", "tier": "gpu"})
    assert use.not_allowed == ("spec.runtimeRef: ClusterRLTrainingRuntime/gpu serves only the namespaces its "
                               "spec.namespaceSelector selects (team=a,tier in (gpu)), and namespace team-a is not one "
                               "of them: name another runtime, or ask the platform team to label the namespace")
    running = make_job(status={"phase": "Running", "gangGeneration": 0, "gangStartTime": rfc3339(NOW)})
    plan = plan_reconcile(running, observe(running, pod_json(running, 0), pod_json(running, 1)), NOW,
                          profile=PROFILE, runtime=resolve(running, rt), runtime_in_use=use)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", NOT_ALLOWED)
    assert plan.status["message"] == use.not_allowed and not plan.create_pods
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"]
    assert runtime_in_use(job, False, rt, None, namespace_labels={"team": "a", "tier": "gpu"}).not_allowed is None
    mine = runtime(kind=NAMESPACED_KIND, namespace="team-a")  # a namespace's own runtime has no selector
    assert runtime_in_use(job, False, mine, None, namespace_labels={}).not_allowed is None


def test_a_runtime_requiring_a_queue_serves_no_job_where_the_operator_runs_none_through_kueue() -> None:
    rt = runtime({"queue": {"name": "team-q", "required": True}})
    job = make_job()
    use = runtime_in_use(job, False, rt, None, queues=False)
    assert use.not_allowed == (
        "spec.runtimeRef: ClusterRLTrainingRuntime/gpu requires a Kueue LocalQueue (its spec.queue.required), and this "
        "operator does not run jobs through Kueue (its setting kueue, the chart's kueue.enabled, is false): the job "
        "would run unqueued; name another runtime, or ask the platform team to enable Kueue")
    plan = plan_reconcile(job, [], NOW, profile=PROFILE, runtime=resolve(job, rt), runtime_in_use=use)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", NOT_ALLOWED) and not plan.create_pods
    assert runtime_in_use(job, False, rt, None, queues=True).not_allowed is None  # Kueue's gate holds it instead
    optional = runtime({"queue": {"name": "team-q"}})
    assert runtime_in_use(job, False, optional, None, queues=False).not_allowed is None  # the queue a mere default


def test_a_job_failed_for_its_namespace_is_looked_at_again_once_edited() -> None:
    failed = make_job(status={"phase": "Failed", "reason": NOT_ALLOWED, "observedGeneration": 1}, generation=2)
    plan = plan_reconcile(failed, [], NOW, profile=PROFILE, runtime=resolve(failed, runtime()))
    assert plan.status["phase"] == "Pending" and len(plan.create_pods) == 2


@pytest.mark.parametrize("labels, chosen", [({"team": "a"}, "team-a-default"), ({"team": "c"}, "newest")])
def test_the_default_cluster_runtime_is_the_newest_that_selects_the_namespace(labels: dict[str, str],
                                                                              chosen: str) -> None:
    from tests.operator.test_runtimes import stored

    team = runtime_manifest("team-a-default", {"namespaceSelector": {"matchLabels": {"team": "a"}}}, default=True)
    team["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"
    newest = runtime_manifest("newest", {"namespaceSelector": {"matchLabels": {"team": "b"}}}, default=True)
    newest["metadata"]["creationTimestamp"] = "2030-02-01T00:00:00Z"
    found, _ = stored(team, newest).lookup(make_job(), labels)
    assert found is not None and found.metadata.name == chosen  # none selects team c: the newest, which refuses it


# ------------------------------------------------------------------------ the watches


def test_a_runtime_event_queues_the_jobs_built_from_it_and_a_relabelled_namespace_its_jobs() -> None:
    from rljob_operator.cluster.namespaces import NamespaceEvents, NamespaceStore
    from rljob_operator.cluster.workqueue import JobKey

    from tests.operator.test_runtimes import subscribers

    _, jobs, queue, cluster, _ = subscribers()
    built = runtime_record(runtime(name="gpu")).model_dump(by_alias=True)
    keys = {name: JobKey(ns, name) for ns, name in (("team-a", "on-gpu"), ("team-a", "on-cpu"), ("team-b", "other"))}
    for name, key in keys.items():
        status = {"runtime": {**built, "name": "cpu"}} if name == "on-cpu" else {"runtime": built}
        jobs.seen(key, {"metadata": {"name": key.name, "namespace": key.namespace, "resourceVersion": "1"},
                        "status": status})
    cluster.event(None, "MODIFIED", runtime_manifest("gpu"))
    assert sorted(k.name for k in queue.added) == ["on-gpu", "other"]  # a cluster runtime serves every namespace

    store, queue.added = NamespaceStore(), []
    labels = NamespaceEvents(store, jobs, queue)
    labels.event(None, None, {"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    assert not store.synced() and queue.added == []  # the first listing queues nothing
    labels.listed(None)
    labels.event(None, "MODIFIED", {"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    assert queue.added == []  # no change of labels
    labels.event(None, "MODIFIED", {"metadata": {"name": "team-a", "labels": {"team": "b"}}})
    assert store.synced() and store.labels("team-a") == {"team": "b"}
    assert sorted(k.name for k in queue.added) == ["on-cpu", "on-gpu"]
