"""One tenant cannot run the operator out of memory (issue #43 point 4), on the real API server.

Two attacks from the issue, each by an ordinary tenant (``edit`` in its namespace) against the real operator
process, whose resident memory is read from ``/proc`` before and after:

* a job of about 1 MB whose annotations the tenant edits 500 times (``kubectl annotate``): every edit was a new
  key of the policy-verdict cache holding the whole spec (4,096 kept), so 500 edits held ~500 MB;
* a job with ``autoscaling.policy: Capacity`` and ``checkIntervalSeconds: 1`` while the tenant's pods fill the
  cluster: each look at capacity listed every pod of the cluster, whole and in one answer, up to once a
  second (about 39 KiB a pod decoded).

The bounds are what the fixed operator needs with room for the noise of a busy machine; the operator before the
fix measured far beyond them (figures in ``docs/architecture.md``, tenant isolation). Speed is not asserted.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.waiting import wait_for
from tests.operator.test_scaling_cluster import _pool_nodes, _running_at, _spec
from tests.support.operator_process import get_job, job_manifest

pytestmark = pytest.mark.cluster

MIB = 1024 * 1024
#: The issue's sizes: a job of about 1 MB, edited 500 times; pods of about 39 KiB.
JOB_BYTES, EDITS = 1_000_000, 500
POD_BYTES, PODS = 39 * 1024, 800


def memory(pid: int) -> dict[str, int]:
    """The process's resident memory now (VmRSS) and at its highest (VmHWM), in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) * 1024 for name in ("VmRSS", "VmHWM")}


def reconciles(op: Any) -> float:
    """The operator's reconciles so far (``rljob_operator_reconciles_total``, every result)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in op.metrics_text().splitlines()
               if line.startswith("rljob_operator_reconciles_total{"))


def test_500_edits_of_a_1_mb_job_do_not_grow_the_operators_memory(kube, namespace, operator, tenant_kube) -> None:
    op = operator()
    assert op.proc is not None
    # A suspended job (no pods) whose spec is ~1 MB: a custom reward's options, which the models keep as given.
    big = job_manifest("big", 1, {"runPolicy": {"suspend": True}, "training": {"rewards": [
        {"name": "tenant_rewards.scoring:score", "kwargs": {"table": "x" * JOB_BYTES}}]}})
    tenant_kube.request("POST", kube.job_path(namespace), {**big, "metadata": {"name": "big", "namespace": namespace}})
    wait_for(lambda: (get_job(kube, namespace, "big").get("status") or {}).get("phase") == "Suspended", 60,
             message="the big job reconciled")
    path = kube.job_path(namespace, "big")

    def annotate(i: int) -> None:
        """One ``kubectl annotate --overwrite``, then wait until the operator has reconciled the job again."""
        before = reconciles(op)
        tenant_kube.request("PATCH", path, {"metadata": {"annotations": {"edit": str(i)}}},
                            content_type="application/merge-patch+json")
        wait_for(lambda: reconciles(op) > before, 30, interval=0.02, message=f"edit {i} reconciled")

    for i in range(20):  # the allocator's and the caches' first rounds
        annotate(i)
    start = memory(op.proc.pid)
    for i in range(20, 20 + EDITS):
        annotate(i)
    end = memory(op.proc.pid)
    grown = (end["VmRSS"] - start["VmRSS"]) / MIB
    print(f"\noperator RSS {start['VmRSS'] / MIB:.0f} MiB before {EDITS} edits of a {JOB_BYTES / 1e6:.1f} MB job, "
          f"{end['VmRSS'] / MIB:.0f} MiB after (+{grown:.0f} MiB); peak {end['VmHWM'] / MIB:.0f} MiB")
    assert grown < 64, f"the operator grew by {grown:.0f} MiB"
    assert op.alive()


def _bound_pods(tenant: Any, kube: Any, namespace: str, node: str, count: int) -> None:
    """``count`` pods of the tenant bound to ``node`` (set by the tenant, as any pod creator may), each about
    ``POD_BYTES`` as JSON: pods that hold capacity, for as long as the test runs (they tolerate every taint)."""
    def create(i: int) -> None:
        tenant.request("POST", kube.core_path(namespace, "pods"), {
            "metadata": {"name": f"filler-{i}", "annotations": {"notes": "n" * (POD_BYTES - 1024)}},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "registry.invalid/filler:1",
                                     "resources": {"requests": {"cpu": "1m"}}}]}})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(count)))


@pytest.fixture
def ghost_node(kube) -> Any:
    """A Node no kubelet (and no kwok) runs: pods bound to it stay Pending, and count as bound."""
    name = f"ghost-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {"rljob.test/ghost": "true"}}})
    yield name
    kube.request("DELETE", f"/api/v1/nodes/{name}")


def test_a_capacity_job_looking_every_second_while_a_tenant_fills_the_cluster_costs_one_page_of_memory(
        kube, namespace, operator, tenant_kube, fake_gpu_nodes, ghost_node) -> None:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    _pool_nodes(kube, fake_gpu_nodes, pool, 1)
    op = operator(env={"RLJOB_OPERATOR_CAPACITY_REFRESH_SECONDS": "10"})  # the least allowed: the most looks
    assert op.proc is not None
    spec = _spec(kube, namespace, pool, policy="Capacity")
    spec["workers"].update(minReplicas=1, maxReplicas=2)
    tenant_kube.request("POST", kube.job_path(namespace), {**job_manifest("looker", 1, spec),
                                                           "metadata": {"name": "looker", "namespace": namespace}})
    _running_at(kube, namespace, "looker", 1)
    start = memory(op.proc.pid)
    _bound_pods(tenant_kube, kube, namespace, ghost_node, PODS)
    time.sleep(25)  # a look every second before the fix; now two or three, each in pages of 100 pods
    end = memory(op.proc.pid)
    peak = (end["VmHWM"] - start["VmHWM"]) / MIB
    print(f"\noperator peak {start['VmHWM'] / MIB:.0f} MiB before the tenant's {PODS} pods of "
          f"{POD_BYTES // 1024} KiB, {end['VmHWM'] / MIB:.0f} MiB after 25 s (+{peak:.0f} MiB); "
          f"RSS {end['VmRSS'] / MIB:.0f} MiB")
    assert peak < 32, f"the operator's peak grew by {peak:.0f} MiB"
    assert (get_job(kube, namespace, "looker")["status"]["phase"]) == "Running" and op.alive()


def test_capacity_is_read_in_pages_and_one_look_serves_every_reconcile_until_a_node_changes(
        kube, namespace, tenant_kube, ghost_node) -> None:
    """In-process against the real API server: ``Kube.list_bound_pods`` follows ``continue`` tokens (pages of
    ``LIST_PAGE``), the snapshot serves every reconcile of ``capacity_max_age`` whatever they ask, and only a node
    that changes what it offers (its taints here) renews it."""
    from rljob_operator.cluster.kube import LIST_PAGE, Kube
    from rljob_operator.cluster.reconciler import Reconciler

    _bound_pods(tenant_kube, kube, namespace, ghost_node, 2 * LIST_PAGE + 50)
    pages: list[dict[str, Any]] = []

    class Counting(Kube):
        def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                    **kw: Any) -> Any:
            if path == "/api/v1/pods":
                pages.append(dict(query or {}))
            return super().request(method, path, body, query, **kw)

    reconciler = Reconciler(Counting(kube.api_client), capacity_max_age=3600)
    try:
        snapshot = reconciler.capacity()
        assert snapshot is not None
        mine = [p for p in snapshot.pods if p.namespace == namespace]
        assert len(mine) == 2 * LIST_PAGE + 50 and {p.node for p in mine} == {ghost_node}
        assert len(pages) >= 3 and all(q["limit"] == LIST_PAGE for q in pages)
        assert "continue" not in pages[0] and all(q.get("continue") for q in pages[1:])
        # The node as it is at a look (the node controller taints a node no kubelet runs, a while after):
        node = kube.request("GET", f"/api/v1/nodes/{ghost_node}")
        reconciler.forget_capacity()
        snapshot, looked = reconciler.capacity(), len(pages)
        for _ in range(50):  # every reconcile of every Capacity job, each second or less
            assert reconciler.capacity() is snapshot
        reconciler.node_changed("MODIFIED", node)  # an event that changes nothing capacity reads (a heartbeat)
        assert reconciler.capacity() is snapshot and len(pages) == looked
        node = kube.request("PATCH", f"/api/v1/nodes/{ghost_node}", {"spec": {"unschedulable": True}},
                            content_type="application/merge-patch+json")
        reconciler.node_changed("MODIFIED", node)  # cordoned: capacity changed, the next reconcile looks again
        assert reconciler.capacity() is not snapshot and len(pages) > looked
    finally:
        reconciler.close()
