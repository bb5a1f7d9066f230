"""Faults on a real control plane (kwok plays the kubelet): each one ends as it should.

Crashes, OOM kills and stuck pods come from the annotations in ``tests.cluster.fake_pods``;
node loss from ``fake_gpu_nodes``; stalls from heartbeats that stop (written to status as
the status API writes them). The operator runs as ``rljob operator`` in a child process.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    QUICK_EXIT,
    OperatorProcess,
    annotate_pod,
    create_job,
    events_for,
    get_job,
    job_manifest,
    job_pods,
    on_namespaced_runtime,
    wait_gang,
    wait_phase,
)

pytestmark = pytest.mark.cluster



def _policy(**policy: Any) -> dict[str, Any]:
    return {**QUICK_EXIT, "runPolicy": policy}


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _warnings(kube: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(kube, namespace, name) if e["reason"] == reason and e["type"] == "Warning"]


def _crash(kube: Any, namespace: str, pod: str, code: int, **kw: Any) -> None:
    annotate_pod(kube, namespace, pod, fake_pods.exit_annotations(code, **kw))


def test_worker_crash_restarts_whole_gang_then_succeeds(kube, namespace, operator) -> None:
    op = operator()
    create_job(kube, namespace, job_manifest("crash", spec=_policy(backoffBaseSeconds=1)))
    wait_gang(kube, namespace, "crash", 0)
    _crash(kube, namespace, "crash-worker-1", 1, message="RuntimeError: NCCL timeout")
    job = wait_gang(kube, namespace, "crash", 1)
    status = job["status"]
    assert status["restarts"] == 1 and status["disruptions"] == 0
    failure = status["lastFailure"]
    assert (failure["worker"], failure["reason"], failure["exitCode"]) == ("crash-worker-1", "WorkerFailed", 1)
    assert "NCCL timeout" in failure["message"]
    assert _warnings(kube, namespace, "crash", "WorkerFailed")
    metrics = op.metrics_text()
    assert 'rljob_operator_gang_restarts_total{reason="WorkerFailed"} 1.0' in metrics
    assert f'rljob_operator_job_phase{{job="crash",namespace="{namespace}",phase="Running"}} 1.0' in metrics
    for i in (1, 0):
        _crash(kube, namespace, f"crash-worker-{i}", 0)
    done = wait_phase(kube, namespace, "crash", "Succeeded", reason="Completed")
    assert done["status"]["restarts"] == 1


def test_permanent_exit_fails_at_once_without_retry(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("perm", spec=_policy(backoffBaseSeconds=0)))
    wait_gang(kube, namespace, "perm", 0)
    _crash(kube, namespace, "perm-worker-0", 78, message="spec.training.dataset: not found")
    job = wait_phase(kube, namespace, "perm", "Failed", reason="PermanentError")
    time.sleep(2)  # a retry, if there were one, would show by now
    job = get_job(kube, namespace, "perm")
    assert job["status"]["restarts"] == 0 and job["status"]["gangGeneration"] == 0
    assert all(p["metadata"]["labels"]["rljob.dev/gang-generation"] == "0" for p in job_pods(kube, namespace, "perm"))


def test_backoff_spacing_doubles_until_the_limit_fails_the_job(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("flaky", spec=_policy(backoffLimit=2, backoffBaseSeconds=2)))
    wait_gang(kube, namespace, "flaky", 0)
    gaps = []
    for generation, delay in ((1, 2), (2, 4)):
        _crash(kube, namespace, "flaky-worker-0", 137)
        job = wait_gang(kube, namespace, "flaky", generation)
        failed_at = _time(job["status"]["lastFailure"]["time"])
        created = min(_time(p["metadata"]["creationTimestamp"]) for p in job_pods(kube, namespace, "flaky"))
        gaps.append((created - failed_at).total_seconds())
        assert gaps[-1] >= delay - 1, gaps  # timestamps have whole seconds
        assert job["status"]["restarts"] == generation
    _crash(kube, namespace, "flaky-worker-0", 137)
    job = wait_phase(kube, namespace, "flaky", "Failed", reason="BackoffLimitExceeded")
    assert job["status"]["restarts"] == 2 and "backoffLimit (2)" in job["status"]["message"]
    print(f"observed backoff gaps (s): {gaps}")


def test_oom_killed_worker_restarts_with_half_batch_and_twice_accumulation(kube, namespace, operator) -> None:
    operator()
    create_job(kube, namespace, job_manifest("oom", spec=_policy(backoffBaseSeconds=0)))
    wait_gang(kube, namespace, "oom", 0)
    _crash(kube, namespace, "oom-worker-1", 137, reason="OOMKilled")
    job = wait_gang(kube, namespace, "oom", 1)
    assert job["status"]["oomRecovery"] == {"batchSize": 2, "gradientAccumulationSteps": 2}
    assert job["status"]["lastFailure"]["reason"] == "OOMKilled"
    config = kube.request("GET", kube.core_path(namespace, "configmaps", "oom-config"))
    training = yaml.safe_load(config["data"]["trainer.yaml"])["training"]
    assert (training["batchSize"], training["gradientAccumulationSteps"]) == (2, 2)
    assert _warnings(kube, namespace, "oom", "OOMRecovery")


def test_stalled_heartbeats_set_stalled_then_restart_the_gang(kube, namespace, operator) -> None:
    operator()
    spec = _policy(stallTimeoutSeconds=3, checkIntervalSeconds=1, backoffBaseSeconds=3)
    create_job(kube, namespace, job_manifest("hung", spec=spec))
    wait_gang(kube, namespace, "hung", 0)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.patch_job_status(namespace, "hung", {"progress": {"step": 5, "lastHeartbeat": now}})  # then silence

    def stalled() -> dict[str, Any] | None:
        job = get_job(kube, namespace, "hung")
        conditions = {c["type"]: c for c in job["status"].get("conditions") or []}
        return job if conditions.get("Stalled", {}).get("status") == "True" else None

    job = wait_for(stalled, 30, interval=0.2, message="Stalled condition")
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Restarting", "HeartbeatTimeout")
    stalled_condition = next(c for c in job["status"]["conditions"] if c["type"] == "Stalled")
    assert "stallTimeoutSeconds=3" in stalled_condition["message"]
    # Events are posted after the status is written: wait for it rather than race it.
    wait_for(lambda: _warnings(kube, namespace, "hung", "HeartbeatTimeout"), 20, message="HeartbeatTimeout event")
    job = wait_gang(kube, namespace, "hung", 1)
    assert job["status"]["restarts"] == 1
    assert {c["type"]: c["status"] for c in job["status"]["conditions"]}["Stalled"] == "False"


def test_pod_stuck_terminating_is_force_deleted(kube, namespace, operator) -> None:
    operator(env={"RLJOB_OPERATOR_FORCE_DELETE_AFTER_SECONDS": "2"})
    create_job(kube, namespace, job_manifest("stuck", spec=_policy(backoffBaseSeconds=0)))
    wait_gang(kube, namespace, "stuck", 0)
    annotate_pod(kube, namespace, "stuck-worker-1", {fake_pods.STUCK_TERMINATING: "true"})
    _crash(kube, namespace, "stuck-worker-0", 1)
    wait_gang(kube, namespace, "stuck", 1, timeout=60)
    forced = _warnings(kube, namespace, "stuck", "ForceDeleted")
    assert forced and "stuck-worker-1" in forced[0]["message"]


def test_operator_down_while_a_worker_fails_handles_it_once(kube, namespace, operator) -> None:
    first = operator()
    create_job(kube, namespace, job_manifest("down", spec=_policy(backoffBaseSeconds=0)))
    wait_gang(kube, namespace, "down", 0)
    first.kill()
    _crash(kube, namespace, "down-worker-1", 1)
    wait_for(lambda: any((p.get("status") or {}).get("phase") == "Failed" for p in job_pods(kube, namespace, "down")),
             30, message="worker 1 failed while no operator ran")
    operator()
    job = wait_gang(kube, namespace, "down", 1)
    time.sleep(3)  # several resyncs later: still one restart
    job = get_job(kube, namespace, "down")
    assert job["status"]["restarts"] == 1 and job["status"]["gangGeneration"] == 1
    assert len(_warnings(kube, namespace, "down", "WorkerFailed")) == 1


def test_node_deleted_gang_replaced_on_other_nodes_without_consuming_the_limit(
        kube, namespace, operator, fake_gpu_nodes) -> None:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    doomed = fake_gpu_nodes.add(1, gpus=2, labels={"rljob.dev/test-pool": pool})
    operator()
    spec = {**_policy(backoffLimit=0, backoffBaseSeconds=0), **on_namespaced_runtime(
        kube, namespace, "pool", {"podTemplate": {"spec": {"nodeSelector": {"rljob.dev/test-pool": pool}}}})}
    create_job(kube, namespace, job_manifest("lost", spec=spec))
    wait_gang(kube, namespace, "lost", 0)
    spare = fake_gpu_nodes.add(1, gpus=2, labels={"rljob.dev/test-pool": pool})
    removed = time.monotonic()
    fake_gpu_nodes.remove(doomed[0])
    # kwok forgets the node's pods, and the pod garbage collector would delete them only after its 40 s
    # quarantine: the operator's Node watch sees the node go and replaces the gang well before that.
    job = wait_gang(kube, namespace, "lost", 1, timeout=120)
    assert time.monotonic() - removed < 30, "the gang was replaced only after the pod garbage collector's 40 s"
    status = job["status"]
    assert (status["restarts"], status["disruptions"]) == (0, 1)
    assert (status["lastFailure"]["reason"], status["lastFailure"]["disruption"]) == ("WorkerLost", True)
    assert {p["spec"]["nodeName"] for p in job_pods(kube, namespace, "lost")} == set(spare)
    # Its pods there were force-deleted (no kubelet would confirm a graceful deletion), each named.
    forced = sorted(e["message"] for e in _warnings(kube, namespace, "lost", "ForceDeleted"))
    assert forced == [f"lost-worker-{i} was bound to node {doomed[0]}, which was deleted: force-deleted it"
                      for i in range(2)], forced


def test_nodes_are_watched_only_where_the_operator_may_list_and_watch_them(
        control_plane, kube, namespace, caplog) -> None:
    from rljob_operator.cluster.kube import Kube, load_api_client
    from rljob_operator.cluster.runner import nodes_watchable
    from rljob_operator.settings import OperatorSettings

    caplog.set_level(logging.INFO, "rljob")
    admin = OperatorSettings()
    assert nodes_watchable(admin, kube)
    assert not nodes_watchable(OperatorSettings(watch_nodes=False), kube)
    assert "cannot list and watch nodes" not in caplog.text
    # A service account with no rights at all: refused, and the operator says what it needs.
    nobody = Kube(load_api_client(str(control_plane.service_account_kubeconfig(namespace, "nobody"))))
    assert not nodes_watchable(admin, nobody)
    assert "cannot list and watch nodes" in caplog.text and "rbac.capacityAutoscaling" in caplog.text


def test_node_not_ready_evicted_pods_force_deleted_and_gang_replaced(
        kube, namespace, operator, fake_gpu_nodes) -> None:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    silent = fake_gpu_nodes.add(1, gpus=2, labels={"rljob.dev/test-pool": pool})
    operator(env={"RLJOB_OPERATOR_FORCE_DELETE_AFTER_SECONDS": "2"})
    # Evicted 1 s after the node turns NotReady rather than the harness's default 10 s: what a platform
    # that wants a fast fail-over sets (the API server adds the default only where none is given).
    tolerations = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 1} for taint in ("unreachable", "not-ready")]
    spec = {**_policy(backoffLimit=0, backoffBaseSeconds=0), **on_namespaced_runtime(
        kube, namespace, "pool", {"podTemplate": {"spec": {"nodeSelector": {"rljob.dev/test-pool": pool},
                                                           "tolerations": tolerations}}})}
    create_job(kube, namespace, job_manifest("unreach", spec=spec))
    wait_gang(kube, namespace, "unreach", 0)
    spare = fake_gpu_nodes.add(1, gpus=2, labels={"rljob.dev/test-pool": pool})
    fake_gpu_nodes.set_ready(silent[0], False, wait=False)
    # NotReady after the monitor grace, evicted after the toleration; no kubelet confirms: force-deleted.
    job = wait_gang(kube, namespace, "unreach", 1, timeout=120)
    assert (job["status"]["restarts"], job["status"]["disruptions"]) == (0, 1)
    assert {p["spec"]["nodeName"] for p in job_pods(kube, namespace, "unreach")} == set(spare)
    assert _warnings(kube, namespace, "unreach", "ForceDeleted")
    assert {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 1} in job_pods(kube, namespace, "unreach")[0]["spec"]["tolerations"]
    # As a cluster does it (the harness's node lifecycle controller): Ready Unknown, then the taint that
    # evicted the pods.
    node = kube.request("GET", f"/api/v1/nodes/{silent[0]}")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
    assert {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"} in [
        {k: t[k] for k in ("key", "effect")} for t in node["spec"].get("taints", [])]


def test_a_worker_replaced_in_place_is_looked_up_by_name_not_by_listing_the_gang(
        kube: Any, namespace: str, control_plane: Any, crd_installed: Any, tmp_path: Path) -> None:
    """Issue #48, point 3: before it replaces a worker in place the operator checks that the watch shows the
    API server's truth, with a GET of that worker, not a LIST of the whole gang (which grew with the gang:
    1,000 pods decoded per failure), so a failure costs the same requests and CPU whatever the gang's size.

    Judged up to the replacement's create. After it, a reconcile that runs while the watch has shown the
    old pod's deletion but not yet the new pod lists the gang before it would create that worker again
    (``Reconciler._unseen_creates``): a race with the watch, 2 runs in 15 here (2026-12-05)."""
    user = f"rljob-operator-{uuid.uuid4().hex[:6]}"
    kubeconfig = control_plane.client_kubeconfig(user, groups=("system:masters", "rljob:audited"))
    op = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log").start()
    try:
        op.wait_leader()
        durable = on_namespaced_runtime(kube, namespace, "durable", {"checkpoint": {"storage": "s3://ckpt"}})
        create_job(kube, namespace, job_manifest("lookup", 4, spec={**_policy(backoffBaseSeconds=0), **durable}))
        wait_for(lambda: ((get_job(kube, namespace, "lookup").get("status") or {}).get("workers") or {}).get("ready") == 4,
                 60, message="4 workers ready")
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "lookup")}
        failed_at = datetime.now(UTC)
        _crash(kube, namespace, "lookup-worker-2", 1, message="boom")

        def replaced() -> dict[str, str] | None:
            now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "lookup")
                   if not p["metadata"].get("deletionTimestamp")}
            return now if len(now) == 4 and now["lookup-worker-2"] != before["lookup-worker-2"] else None

        after = wait_for(replaced, 60, message="worker 2 created again")
        assert all(after[n] == before[n] for n in before if n != "lookup-worker-2")  # the others kept
        assert get_job(kube, namespace, "lookup")["status"]["gangGeneration"] == 0
        time.sleep(1)  # the audit log's writer flushes in batches
    finally:
        op.stop()
    events = [e for e in control_plane.audit_events()
              if (e.get("user") or {}).get("username") == user and (e.get("objectRef") or {}).get("resource") == "pods"
              and _time(e["requestReceivedTimestamp"]) >= failed_at]
    recreated = min(_time(e["requestReceivedTimestamp"]) for e in events
                    if e.get("verb") == "create" and e["objectRef"].get("name") == "lookup-worker-2")
    pod_reads = [e for e in events if e.get("verb") in ("get", "list") and _time(e["requestReceivedTimestamp"]) < recreated]
    lists = [e["requestURI"] for e in pod_reads if e["verb"] == "list"]
    gets = [e["objectRef"].get("name") for e in pod_reads if e["verb"] == "get"]
    assert lists == [], lists
    assert "lookup-worker-2" in gets, gets
    assert set(gets) <= {"lookup-worker-2"}, gets  # only the worker replaced

