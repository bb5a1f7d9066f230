from __future__ import annotations
import random, time
from typing import Any
import pytest
from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.support.operator_process import QUICK_EXIT, annotate_pod, create_job, get_job, job_manifest, job_pods, on_namespaced_runtime
from concurrent.futures import ThreadPoolExecutor

pytestmark = pytest.mark.cluster
N = 100

def test_burst(kube: Any, namespace: str, operator: Any) -> None:
    op = operator()
    durable = on_namespaced_runtime(kube, namespace, "durable", {"checkpoint": {"storage": "s3://ckpt"}}, quick=False)
    spec = {"runPolicy": {"backoffBaseSeconds": 0, "backoffLimit": 20}, "workers": {"replicas": N, "procsPerWorker": 1, "gpusPerWorker": 0}, **durable}
    create_job(kube, namespace, job_manifest("burst", N, spec=spec))
    wait_for(lambda: ((get_job(kube, namespace, "burst").get("status") or {}).get("workers") or {}).get("ready") == N, 120, message="ready")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "burst")}
    victims = [f"burst-worker-{i}" for i in random.Random(0).sample(range(1, N), 10)]
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda v: annotate_pod(kube, namespace, v, fake_pods.exit_annotations(1)), victims))
    def replaced():
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(kube, namespace, "burst") if not p["metadata"].get("deletionTimestamp")}
        return now if all(v in now and now[v] != before[v] for v in victims) else None
    try:
        wait_for(replaced, 60, message="all replaced")
    finally:
        st = get_job(kube, namespace, "burst")["status"]
        print({k: v for k, v in st.items() if k not in ("createdPods", "conditions")})
        now = {p["metadata"]["name"]: (p["metadata"]["uid"][:6], p["status"].get("phase"), bool(p["metadata"].get("deletionTimestamp"))) for p in job_pods(kube, namespace, "burst")}
        print("victims:", {v: now.get(v) for v in victims})
        print("missing:", sorted(set(before) - set(now)))
        print("\n".join(op.log_tail(40).splitlines()[-40:]))
