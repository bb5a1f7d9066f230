"""Kueue on the real control plane: the real Kueue manager (tests/cluster/kueue.py) admits,
queues and preempts the gangs of labelled jobs; the operator follows (integrations/kueue/).

Each test gets its own GPU nodes (labelled and tainted with a pool only this test uses), a
ResourceFlavor that selects and tolerates them, a ClusterQueue with the quota under test and a
LocalQueue in its namespace. Fake pods (kwok) play the workers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_operator.names import CONFIG_KEY

from tests.cluster.kueue import DEVICE_CLASS, DRA_RESOURCE
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    QUICK_EXIT,
    annotate_pod,
    create_job,
    deep_update,
    get_job,
    job_manifest,
    job_pods,
    on_namespaced_runtime,
    patch_spec,
    wait_for_events,
    wait_phase,
)

pytestmark = pytest.mark.cluster

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
POOL = "rljob.dev/test-pool"
REPO = Path(__file__).resolve().parents[2]


class Queues:
    """A test's pool of GPU nodes and the Kueue objects that hand out its GPUs."""

    def __init__(self, kube: Any, namespace: str, fake_gpu_nodes: Any) -> None:
        self.kube, self.namespace, self.nodes = kube, namespace, fake_gpu_nodes
        self.pool = f"p{uuid.uuid4().hex[:8]}"
        self.flavor, self.cluster_queue = f"{self.pool}-flavor", f"{self.pool}-cq"
        self.cluster_objects: list[str] = []

    def create(self, gpus: int, *, preemption: bool = False, nodes: int = 2, cpu: str = "64",
               devices: int | None = None) -> None:
        """Nodes of 8 GPUs (more than the quota: the quota is what limits), the flavor, the queues; ``devices``:
        a quota of DRA devices too (what Kueue counts claims of the tests' DeviceClass as)."""
        for name in self.nodes.add(nodes, gpus=8, labels={POOL: self.pool}):
            node = self.kube.request("GET", f"/api/v1/nodes/{name}")
            taints = [*(node["spec"].get("taints") or []), {"key": POOL, "value": self.pool, "effect": "NoSchedule"}]
            self.kube.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints}},
                              content_type="application/merge-patch+json")
        self._post("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": self.flavor}, "spec": {
            "nodeLabels": {POOL: self.pool},
            "tolerations": [{"key": POOL, "operator": "Equal", "value": self.pool, "effect": "NoSchedule"}]}})
        quotas = {"cpu": cpu, "memory": "256Gi", "nvidia.com/gpu": gpus,
                  **({DRA_RESOURCE: devices} if devices is not None else {})}
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "resourceGroups": [{"coveredResources": list(quotas), "flavors": [
                {"name": self.flavor, "resources": [{"name": k, "nominalQuota": v} for k, v in quotas.items()]}]}],
        }
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        self._post("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": self.cluster_queue}, "spec": spec})
        self.kube.request("POST", f"{KUEUE_API}/namespaces/{self.namespace}/localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
            "spec": {"clusterQueue": self.cluster_queue}})

    def priority_class(self, name: str, value: int) -> str:
        full = f"{self.pool}-{name}"
        self._post("workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": full},
                                               "value": value})
        return full

    def _post(self, plural: str, body: dict[str, Any]) -> None:
        self.kube.request("POST", f"{KUEUE_API}/{plural}", {"apiVersion": "kueue.x-k8s.io/v1beta2", **body})
        self.cluster_objects.append(f"{plural}/{body['metadata']['name']}")

    def cleanup(self) -> None:
        for obj in reversed(self.cluster_objects):  # Kueue's finalizers let go once the namespace is gone
            try:
                self.kube.request("DELETE", f"{KUEUE_API}/{obj}")
            except Exception as error:  # noqa: BLE001 - best effort, never masks the test's own failure
                print(f"cleanup of {obj}: {error}")

    def job(self, name: str, priority: str | None = None, *, queue: str | None = "lq", user: Any = None,
            storage: str | None = None, **spec: Any) -> dict[str, Any]:
        """2 workers × 2 GPUs in the LocalQueue ``queue``; workers stop within 1 s of SIGTERM (``QUICK_RUNTIME``,
        or a runtime of the namespace like it whose checkpoints go to ``storage``). Created by ``user`` (a
        tenant's client; default the admin)."""
        labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
        if priority:
            labels["kueue.x-k8s.io/priority-class"] = priority
        runtime = on_namespaced_runtime(self.kube, self.namespace, f"{name}-storage", {
            "checkpoint": {"storage": storage}}) if storage else QUICK_EXIT
        doc = job_manifest(name, 2, deep_update({"workers": {"gpusPerWorker": 2}, "runPolicy": {"backoffBaseSeconds": 0},
                                                 **runtime}, spec))
        doc["metadata"]["labels"] = labels
        return create_job(user or self.kube, self.namespace, doc)

    def workloads(self, job: str | None = None) -> list[dict[str, Any]]:
        selector = f"rljob.dev/job={job}" if job else "rljob.dev/job"
        out = self.kube.request("GET", f"{KUEUE_API}/namespaces/{self.namespace}/workloads",
                                query={"labelSelector": selector})
        return list(out.get("items") or [])


@pytest.fixture
def queues(kube: Any, namespace: str, kueue: Any, fake_gpu_nodes: Any) -> Iterator[Queues]:
    q = Queues(kube, namespace, fake_gpu_nodes)
    try:
        yield q
    finally:
        q.cleanup()


def _live_pods(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in job_pods(kube, namespace, name) if not p["metadata"].get("deletionTimestamp")]


def _running(kube: Any, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    return wait_phase(kube, namespace, name, "Running", timeout)


def _phases(kube: Any, namespace: str, names: list[str]) -> dict[str, str]:
    return {n: (get_job(kube, namespace, n).get("status") or {}).get("phase", "") for n in names}


def _assert_on_flavor(queues: Queues, pods: list[dict[str, Any]]) -> None:
    """The pods carry the assigned flavor's node label and toleration, and run on its nodes."""
    for pod in pods:
        assert pod["spec"]["nodeSelector"][POOL] == queues.pool
        assert {"key": POOL, "operator": "Equal", "value": queues.pool, "effect": "NoSchedule"} \
            in pod["spec"]["tolerations"]
        assert pod["spec"]["nodeName"] in queues.nodes.added


def _ok_reconciles(operator: Any) -> float:
    for line in operator.metrics_text().splitlines():
        if line.startswith('rljob_operator_reconciles_total{result="ok"}'):
            return float(line.split()[-1])
    return 0.0


def _finish(kube: Any, namespace: str, name: str) -> None:
    """Worker 0 exits 0 (the others would follow): the job succeeds."""
    for pod in _live_pods(kube, namespace, name):
        annotate_pod(kube, namespace, pod["metadata"]["name"], {"rljob.dev/fake-exit-code": "0"})
    wait_phase(kube, namespace, name, "Succeeded", 60)


def test_quota_of_two_gangs_queues_the_third_until_the_first_finishes(kube: Any, namespace: str, queues: Queues,
                                                                      operator: Any) -> None:
    queues.create(gpus=8)
    operator()
    names = ["q-a", "q-b", "q-c"]
    for name in names:  # one at a time: Kueue's queue is first come, first served
        queues.job(name)
        wait_for(lambda name=name: queues.workloads(name), 30, message=f"{name}'s Workload")
    wait_for(lambda: sorted(_phases(kube, namespace, names).values()) == ["Queued", "Running", "Running"], 90,
             message="two jobs running, one queued")
    queued = next(n for n, phase in _phases(kube, namespace, names).items() if phase == "Queued")
    assert queued == "q-c"
    status = get_job(kube, namespace, queued)["status"]
    # Kueue's own words: the gang (4 GPUs) does not fit in the 0 GPUs left.
    assert status["reason"] == "Pending" and "nvidia.com/gpu" in status["message"], status
    assert job_pods(kube, namespace, queued) == []  # all or nothing: not one worker of it exists
    reconciling = next(c for c in status["conditions"] if c["type"] == "Reconciling")
    assert reconciling["status"] == "True" and reconciling["reason"] == "Pending"
    [wl] = queues.workloads(queued)
    assert wl["spec"]["podSets"][0]["count"] == 2 and wl["spec"]["queueName"] == "lq"
    for name in ("q-a", "q-b"):
        _assert_on_flavor(queues, _live_pods(kube, namespace, name))

    _finish(kube, namespace, "q-a")
    # The reconcile that writes Succeeded then marks the Workload Finished (status first, then the queue).
    wait_for(lambda: any(c["type"] == "Finished" and c["status"] == "True"
                         for w in queues.workloads("q-a") for c in (w.get("status") or {}).get("conditions") or []),
             30, message="q-a's Workload Finished")
    _running(kube, namespace, "q-c")
    _assert_on_flavor(queues, _live_pods(kube, namespace, "q-c"))
    assert (get_job(kube, namespace, "q-c")["status"].get("restarts") or 0) == 0


def test_a_higher_priority_job_preempts_the_gang_which_queues_again_and_resumes(
        kube: Any, namespace: str, queues: Queues, operator: Any) -> None:
    queues.create(gpus=4, preemption=True)
    low, high = queues.priority_class("low", 100), queues.priority_class("high", 1000)
    operator()
    queues.job("low", priority=low, storage="s3://checkpoints", checkpoint={"everySteps": 10})
    running = _running(kube, namespace, "low")
    generation = running["status"]["gangGeneration"]
    first_gang = {p["metadata"]["uid"] for p in _live_pods(kube, namespace, "low")}
    config_before = kube.request("GET", kube.core_path(namespace, "configmaps", "low-config"))["data"]

    queues.job("high", priority=high)
    status = wait_phase(kube, namespace, "low", "Queued", 90)["status"]
    assert status["reason"] == "Preempted", status
    assert (status.get("restarts") or 0) == 0 and (status.get("disruptions") or 0) == 0
    assert status["gangGeneration"] == generation + 1  # the next gang is a new one, not a restart
    wait_for(lambda: not job_pods(kube, namespace, "low"), 60, message="the preempted gang gone")
    _running(kube, namespace, "high")
    [evicted] = queues.workloads("low")
    # The operator gave the quota back as Kueue's jobframework does: admission cleared, requeued.
    assert not evicted["status"].get("admission")
    conds = {c["type"]: c for c in evicted["status"]["conditions"]}
    assert conds["QuotaReserved"]["status"] == "False" and conds["Requeued"]["status"] == "True"
    assert get_job(kube, namespace, "low")["status"]["phase"] == "Queued"
    events = wait_for_events(kube, namespace, "low", "Evicted")
    assert not [e for e in events if e["reason"] == "ForceDeleted"]

    _finish(kube, namespace, "high")
    resumed = _running(kube, namespace, "low")
    assert resumed["status"]["gangGeneration"] == generation + 1
    assert (resumed["status"].get("restarts") or 0) == 0
    pods = _live_pods(kube, namespace, "low")
    assert first_gang.isdisjoint(p["metadata"]["uid"] for p in pods)
    # The new gang resumes from the newest checkpoint the stopped one saved (the trainer's resume
    # path): it is told the same checkpoint location.
    config_after = kube.request("GET", kube.core_path(namespace, "configmaps", "low-config"))["data"]
    before, after = (yaml.safe_load(c[CONFIG_KEY]) for c in (config_before, config_after))
    assert after["checkpoint"] == before["checkpoint"]
    assert after["checkpoint"]["storage"] == f"s3://checkpoints/{namespace}/low"


def test_operator_restart_while_queued_duplicates_nothing_and_suspend_releases_quota(
        kube: Any, namespace: str, queues: Queues, operator: Any) -> None:
    queues.create(gpus=4)
    first = operator()
    queues.job("r-a")
    _running(kube, namespace, "r-a")
    queues.job("r-b")
    wait_phase(kube, namespace, "r-b", "Queued", 60)
    gang = sorted(p["metadata"]["uid"] for p in _live_pods(kube, namespace, "r-a"))

    first.kill()
    second = operator()
    # Each job reconciled by the new leader at least three times (its start, then resyncs every 3 s):
    # anything it would duplicate, it has by then.
    wait_for(lambda: _ok_reconciles(second) >= 6, 90, message="the new operator's reconciles")
    assert sorted(p["metadata"]["uid"] for p in _live_pods(kube, namespace, "r-a")) == gang
    assert job_pods(kube, namespace, "r-b") == []
    assert len(queues.workloads("r-a")) == 1 and len(queues.workloads("r-b")) == 1

    patch_spec(kube, namespace, "r-a", {"runPolicy": {"suspend": True}})
    _running(kube, namespace, "r-b")  # the suspended job's quota went at once
    assert queues.workloads("r-a") == [] or all(w["metadata"].get("deletionTimestamp")
                                                for w in queues.workloads("r-a"))
    patch_spec(kube, namespace, "r-a", {"runPolicy": {"suspend": False}})
    wait_phase(kube, namespace, "r-a", "Queued", 60)
    _finish(kube, namespace, "r-b")
    _running(kube, namespace, "r-a")
    assert len([w for w in queues.workloads("r-a") if not w["metadata"].get("deletionTimestamp")]) == 1


def test_a_workload_kueue_refuses_is_named_on_the_job(kube: Any, namespace: str, queues: Queues,
                                                      operator: Any) -> None:
    proc = operator()
    doc = job_manifest("refused", 2, {"workers": {"gpusPerWorker": 2}})
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "Not_A_Queue"}  # a label value, not a name
    create_job(kube, namespace, doc)
    status = wait_phase(kube, namespace, "refused", "Queued", 60, reason="WorkloadRejected")["status"]
    assert "queueName" in status["message"], status
    assert job_pods(kube, namespace, "refused") == [] and queues.workloads("refused") == []
    before = _ok_reconciles(proc)
    wait_for(lambda: _ok_reconciles(proc) > before, 60, message="another reconcile")
    assert get_job(kube, namespace, "refused")["status"]["reason"] == "WorkloadRejected" and proc.alive()


def test_the_kueue_examples_apply_to_a_cluster_with_kueue(kube: Any, kueue: Any, namespace: str) -> None:
    """examples/kueue: the platform's objects are accepted by Kueue's webhooks; the job by the CRD."""
    docs = list(yaml.safe_load_all((REPO / "examples" / "kueue" / "queues.yaml").read_text()))
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
              "WorkloadPriorityClass": "workloadpriorityclasses"}
    for doc in docs:
        path = f"{KUEUE_API}/{plural[doc['kind']]}"
        if doc["kind"] == "LocalQueue":
            path = f"{KUEUE_API}/namespaces/{namespace}/localqueues"
            doc["metadata"]["namespace"] = namespace
        kube.request("POST", path, doc, query={"dryRun": "All", "fieldValidation": "Strict"})
    job = yaml.safe_load((REPO / "examples" / "kueue" / "job.yaml").read_text())
    job["metadata"]["namespace"] = namespace
    kube.request("POST", kube.job_path(namespace), job, query={"dryRun": "All", "fieldValidation": "Strict"})
    with pytest.raises(Exception, match="nominalQuota|Invalid|invalid"):  # the webhook does check
        bad = yaml.safe_load(yaml.safe_dump(docs[1]))
        bad["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = -1
        kube.request("POST", f"{KUEUE_API}/clusterqueues", bad, query={"dryRun": "All"})


# ----------------------------------------------------- quota that holds, queues that stay (#43 points 1, 2)


def _workload_finished(queues: Queues, job: str) -> bool:
    return any(c["type"] == "Finished" and c["status"] == "True"
               for w in queues.workloads(job) for c in (w.get("status") or {}).get("conditions") or [])


def test_a_finished_jobs_worker_that_will_not_stop_is_deleted_and_keeps_the_quota_until_it_is_gone(
        kube: Any, namespace: str, queues: Queues, operator: Any, tenant: Any) -> None:
    """A tenant's reward module makes worker 0 exit 0 and worker 1 sleep on. The job succeeds, worker 1 is
    deleted, and its GPUs stay counted against the quota (the Workload not Finished, the next job queued)
    until it is gone: here its kubelet never confirms, so it is force-deleted past its grace period."""
    queues.create(gpus=4)
    operator(env={"RLJOB_OPERATOR_FORCE_DELETE_AFTER_SECONDS": "8"})
    queues.job("greedy", user=tenant)  # the whole quota
    _running(kube, namespace, "greedy")
    queues.job("next", user=tenant)
    wait_phase(kube, namespace, "next", "Queued", 60)

    annotate_pod(kube, namespace, "greedy-worker-1", {"rljob.dev/fake-stuck-terminating": "true"})
    annotate_pod(kube, namespace, "greedy-worker-0", {"rljob.dev/fake-exit-code": "0"})
    wait_phase(kube, namespace, "greedy", "Succeeded", 60)

    def worker_1_terminating() -> bool:
        return any(p["metadata"]["name"] == "greedy-worker-1" and p["metadata"].get("deletionTimestamp")
                   for p in job_pods(kube, namespace, "greedy"))

    wait_for(worker_1_terminating, 30, message="the sleeping worker deleted")
    assert not _workload_finished(queues, "greedy"), "the quota went while worker 1 still held its GPUs"
    assert _phases(kube, namespace, ["next"]) == {"next": "Queued"} and job_pods(kube, namespace, "next") == []

    wait_for_events(kube, namespace, "greedy", "ForceDeleted", timeout=60)
    wait_for(lambda: _workload_finished(queues, "greedy"), 30, message="greedy's Workload Finished")
    assert not [p for p in job_pods(kube, namespace, "greedy") if p["metadata"]["name"] == "greedy-worker-1"]
    _running(kube, namespace, "next")


def test_a_failed_job_revived_by_a_patch_that_drops_its_queue_runs_only_through_its_workload(
        kube: Any, namespace: str, queues: Queues, operator: Any, tenant: Any) -> None:
    """Issue #43 point 2, without the admission policies (the operator alone holds): a job fails on its spec
    (PolicyViolation) while labelled; one patch by the tenant removes the label and fixes the spec. The
    status remembers the queue: the revived job waits for a Workload in it, behind the job holding the quota."""
    queues.create(gpus=4)
    proc = operator()
    queues.job("holder")
    _running(kube, namespace, "holder")
    queues.job("sneaky", user=tenant, training={"trl": {"trust_remote_code": True}})
    failed = wait_phase(kube, namespace, "sneaky", "Failed", 60, reason="PolicyViolation")["status"]
    assert failed["queue"] == "lq"

    tenant.request("PATCH", tenant.job_path(namespace, "sneaky"), {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": None}},
        "spec": {"training": {"trl": None}}}, content_type="application/merge-patch+json")
    status = wait_phase(kube, namespace, "sneaky", "Queued", 60)["status"]
    assert status["queue"] == "lq" and "kueue.x-k8s.io/queue-name" not in get_job(kube, namespace, "sneaky")[
        "metadata"].get("labels", {})
    [workload] = [w for w in queues.workloads("sneaky") if not w["metadata"].get("deletionTimestamp")]
    assert workload["spec"]["queueName"] == "lq"
    before = _ok_reconciles(proc)
    wait_for(lambda: _ok_reconciles(proc) >= before + 3, 60, message="more reconciles")
    assert job_pods(kube, namespace, "sneaky") == [], "the revived job ran outside its queue"

    _finish(kube, namespace, "holder")
    _running(kube, namespace, "sneaky")


def test_where_a_queue_is_required_a_job_naming_none_waits_until_it_is_labelled(
        kube: Any, namespace: str, queues: Queues, operator: Any, tenant: Any) -> None:
    """The operator's own require_queue, whatever the admission policies say (none here)."""
    queues.create(gpus=4)
    operator(env={"RLJOB_OPERATOR_REQUIRE_QUEUE": "true"})
    queues.job("loose", queue=None, user=tenant)
    status = wait_phase(kube, namespace, "loose", "Queued", 60, reason="QueueRequired")["status"]
    assert "metadata.labels[kueue.x-k8s.io/queue-name]" in status["message"]
    assert job_pods(kube, namespace, "loose") == [] and queues.workloads("loose") == []
    tenant.request("PATCH", tenant.job_path(namespace, "loose"), {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "lq"}}}, content_type="application/merge-patch+json")
    _running(kube, namespace, "loose")
    assert get_job(kube, namespace, "loose")["status"]["queue"] == "lq"


def test_kueue_is_charged_the_built_pods_pod_level_resources_and_claims(kube: Any, namespace: str, queues: Queues,
                                                                       operator: Any, tenant: Any) -> None:
    """A runtime whose pods reserve 96 CPUs at pod level and two DRA devices each: the ClusterQueue's usage shows
    2 × 96 CPUs and 2 × 2 devices, not the trainer container's 1 CPU and no device (issue #42's third escape)."""
    queues.create(gpus=8, cpu="256", devices=8)
    kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "two-gpus"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 2}}]}}}})
    big = on_namespaced_runtime(kube, namespace, "big", {
        "limits": {"cpuPerWorker": {"default": "1"}},  # the trainer container's request: 1 CPU
        "podTemplate": {"spec": {
            "resources": {"requests": {"cpu": "96", "memory": "64Gi"}, "limits": {"cpu": "96", "memory": "64Gi"}},
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
            "containers": [{"name": "trainer", "resources": {"claims": [{"name": "gpus"}]}}]}}})
    operator(env={"RLJOB_OPERATOR_KUEUE_COUNTS_RESOURCE_CLAIMS": "true"})
    queues.job("wide", user=tenant, workers={"gpusPerWorker": 0}, **big)

    def admitted() -> dict[str, Any] | None:
        found = [w for w in queues.workloads("wide") if (w.get("status") or {}).get("admission")]
        return found[0] if found else None

    workload = wait_for(admitted, 60, message="wide's Workload admitted")
    [assignment] = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["resourceUsage"]["cpu"] == "192" and assignment["resourceUsage"][DRA_RESOURCE] == "4", assignment
    template = workload["spec"]["podSets"][0]["template"]["spec"]
    assert template["resources"]["requests"] == {"cpu": "96", "memory": "64Gi"}  # as the API server defaults the pod's

    def usage() -> dict[str, str]:
        cq = kube.request("GET", f"{KUEUE_API}/clusterqueues/{queues.cluster_queue}")
        return {r["name"]: r["total"] for f in (cq.get("status") or {}).get("flavorsReservation") or []
                for r in f.get("resources") or []}

    totals = wait_for(lambda: usage() if usage().get("cpu") == "192" else None, 30,
                      message="the ClusterQueue's reservation of the whole gang")
    assert totals[DRA_RESOURCE] == "4" and totals["memory"] == "128Gi", totals
    pods = wait_for(lambda: job_pods(kube, namespace, "wide") or None, 60, message="wide's pods")
    for pod in pods:  # the pods reserve what the Workload was charged
        assert pod["spec"]["resources"]["requests"]["cpu"] == "96"
        assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
