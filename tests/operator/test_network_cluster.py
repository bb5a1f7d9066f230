"""Network isolation and adoption on the real control plane (issue #14, point 6).

* Every job gets a NetworkPolicy ``<job>-workers``, owned by the job. The test cluster has no
  network plugin enforcing policies, so the tests check what a plugin would enforce: the
  policy's selectors, evaluated against the labels of the real pods of two jobs, select exactly
  that job's pods, and only the platform's Prometheus may reach the metrics port besides them.
* The chart's and kustomize's policies for the operator are accepted by the API server
  (``kubectl apply --dry-run=server``).
* A ConfigMap, Service or NetworkPolicy with a job's child's name and the job's labels, but not
  the operator's marker for this job's uid, is never adopted: the job reports ChildConflict and
  no pod is created (its config is never mounted). A child the operator did create for the job
  (its marker) and that lost its ownerReference is adopted again.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
import yaml

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.delivery.test_chart import PROMETHEUS, helm_template, kustomize_build
from tests.support.operator_process import (
    QUICK_EXIT,
    annotate_pod,
    create_job,
    events_for,
    get_job,
    job_manifest,
    job_pods,
    patch_spec,
    wait_gang,
    wait_phase,
)

pytestmark = pytest.mark.cluster
MARKER = "rljob.dev/created-for-uid"
NETWORK_ENV = {"RLJOB_OPERATOR_TRAINER_METRICS_FROM": json.dumps([PROMETHEUS])}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector matches ``labels`` ({} matches everything)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def policy_path(kube: Any, namespace: str, name: str = "") -> str:
    return f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies" + (f"/{name}" if name else "")


def _pods_of(kube: Any, namespace: str, counts: dict[str, int]) -> list[dict[str, Any]]:
    """Every pod of the namespace, once each job of ``counts`` has its pods."""
    def ready() -> list[dict[str, Any]] | None:
        pods = kube.list_pods(namespace, "")
        have = {job: sum(1 for p in pods if p["metadata"]["labels"].get("rljob.dev/job") == job) for job in counts}
        return pods if have == counts else None

    return wait_for(ready, 60, message=f"pods of {counts}")


def test_every_job_gets_a_network_policy_admitting_only_its_own_pods(kube: Any, namespace: str,
                                                                     operator: Any) -> None:
    from rljob_contract.job import parse_job
    from rljob_operator.decisions.children import JobNetwork, desired_network_policy
    from rljob_operator.decisions.egress import METADATA_CIDRS, Egress

    op = operator(env=NETWORK_ENV)
    create_job(kube, namespace, job_manifest("net-a", replicas=2))
    create_job(kube, namespace, job_manifest("net-b", replicas=1))
    pods = _pods_of(kube, namespace, {"net-a": 2, "net-b": 1})
    for job_name in ("net-a", "net-b"):
        job = get_job(kube, namespace, job_name)
        policy = kube.request("GET", policy_path(kube, namespace, f"{job_name}-workers"))
        owner = next(r for r in policy["metadata"]["ownerReferences"] if r.get("controller"))
        assert (owner["kind"], owner["name"], owner["uid"]) == ("RLTrainingJob", job_name, job["metadata"]["uid"])
        assert policy["metadata"]["annotations"][MARKER] == job["metadata"]["uid"]
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]  # egress restricted by default
        own = {p["metadata"]["name"] for p in pods if p["metadata"]["labels"]["rljob.dev/job"] == job_name}
        # The policy isolates exactly this job's pods...
        assert {p["metadata"]["name"] for p in pods if selects(spec["podSelector"], p["metadata"]["labels"])} == own
        (everything,) = [r for r in spec["ingress"] if not r.get("ports")]
        (metrics,) = [r for r in spec["ingress"] if r.get("ports")]
        # ...admits on every port (rendezvous, NCCL) only pods of its own namespace that are this job's...
        for peer in everything["from"]:
            assert set(peer) == {"podSelector"}, peer  # no namespaceSelector: this namespace only
        admitted = {p["metadata"]["name"] for p in pods
                    if any(selects(peer["podSelector"], p["metadata"]["labels"]) for peer in everything["from"])}
        assert admitted == own
        # ...and on the metrics port only the platform's Prometheus besides.
        assert metrics == {"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 9400}]}
        # Egress: the API server accepted the metadata endpoints cut out of the ranges object storage may use
        # (what a network plugin then enforces: tests/operator/test_egress.py evaluates the rules).
        blocks = [p["ipBlock"] for r in spec["egress"] for p in r["to"] if "ipBlock" in p]
        assert blocks == [{"cidr": "0.0.0.0/0", "except": [c for c in METADATA_CIDRS if ":" not in c]},
                          {"cidr": "::/0", "except": [c for c in METADATA_CIDRS if ":" in c]}]
        # Stored as built: bringing it up to date later patches nothing.
        egress = Egress(status_namespace=namespace, status_port=op.status_port)
        assert spec == desired_network_policy(parse_job(job, job_name), JobNetwork((PROMETHEUS,), egress))["spec"]
    # Deleted with its job, by the real garbage collector.
    kube.request("DELETE", kube.job_path(namespace, "net-b"))
    wait_for(lambda: all(p["metadata"]["name"] != "net-b-workers"
                         for p in kube.request("GET", policy_path(kube, namespace))["items"]), 60,
             message="net-b's NetworkPolicy deleted with the job")


def test_no_network_policy_when_the_platform_turns_them_off(kube: Any, namespace: str, operator: Any) -> None:
    operator(env={"RLJOB_OPERATOR_NETWORK_POLICY": "false"})
    create_job(kube, namespace, job_manifest("open", replicas=1))
    _pods_of(kube, namespace, {"open": 1})
    assert kube.request("GET", policy_path(kube, namespace))["items"] == []


def _planted(kind: str, job_name: str, namespace: str, marker: str | None) -> dict[str, Any]:
    """A child-named object with every label of the job's children: what a user could pre-create."""
    labels = {"rljob.dev/job": job_name, "app.kubernetes.io/name": "rljob", "app.kubernetes.io/instance": job_name,
              "app.kubernetes.io/managed-by": "rljob-operator"}
    meta: dict[str, Any] = {"namespace": namespace, "labels": labels,
                            "annotations": {MARKER: marker} if marker is not None else {}}
    if kind == "ConfigMap":
        return {"apiVersion": "v1", "kind": kind, "metadata": {**meta, "name": f"{job_name}-config"},
                "data": {"trainer.yaml": "model: attacker/model\n"}}
    if kind == "Service":
        return {"apiVersion": "v1", "kind": kind, "metadata": {**meta, "name": job_name},
                "spec": {"clusterIP": "None", "selector": {"app": "attacker"}, "ports": [{"port": 29500}]}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": kind, "metadata": {**meta, "name": f"{job_name}-workers"},
            "spec": {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}}


def _collection(kube: Any, obj: dict[str, Any]) -> str:
    namespace = obj["metadata"]["namespace"]
    if obj["kind"] == "NetworkPolicy":
        return policy_path(kube, namespace)
    return str(kube.core_path(namespace, obj["kind"].lower() + "s"))


@pytest.mark.parametrize("kind,marker", [("ConfigMap", None), ("Service", None), ("NetworkPolicy", None),
                                         ("ConfigMap", "a-deleted-job-of-the-same-name")],
                         ids=["configmap", "service", "networkpolicy", "configmap-of-an-earlier-job"])
def test_a_child_the_operator_did_not_create_for_the_job_is_not_adopted(kind: str, marker: str | None, kube: Any,
                                                                         namespace: str, operator: Any) -> None:
    operator(env=NETWORK_ENV)
    planted = _planted(kind, "victim", namespace, marker)
    before = kube.request("POST", _collection(kube, planted), planted)
    create_job(kube, namespace, job_manifest("victim", replicas=2))

    def conflict() -> dict[str, Any] | None:
        status = get_job(kube, namespace, "victim").get("status") or {}
        return status if status.get("reason") == "ChildConflict" else None

    status = wait_for(conflict, 60, message="victim reports ChildConflict")
    assert f"{kind} {namespace}/{before['metadata']['name']} exists" in status["message"]
    assert "delete or rename" in status["message"]
    wait_for(lambda: any(e["reason"] == "ChildConflict" and e["type"] == "Warning"
                         for e in events_for(kube, namespace, "victim")), 20, message="a ChildConflict Warning")
    time.sleep(4)  # past a resync (3 s in tests) and the conflict's requeue: still nothing
    assert job_pods(kube, namespace, "victim") == []
    after = kube.request("GET", _collection(kube, planted) + f"/{before['metadata']['name']}")
    assert not after["metadata"].get("ownerReferences")
    assert after.get("data") == before.get("data") and after.get("spec") == before.get("spec")


def test_an_orphaned_child_the_operator_created_for_the_job_is_adopted(kube: Any, namespace: str,
                                                                        operator: Any) -> None:
    """Its ownerReference removed (an orphaning delete, a hand edit): the marker names this job's uid."""
    operator(env=NETWORK_ENV)
    create_job(kube, namespace, job_manifest("orphan", replicas=2, spec={"runPolicy": {"suspend": True}}))
    uid = wait_phase(kube, namespace, "orphan", "Suspended")["metadata"]["uid"]
    planted = _planted("ConfigMap", "orphan", namespace, uid)
    kube.request("POST", _collection(kube, planted), planted)
    patch_spec(kube, namespace, "orphan", {"runPolicy": {"suspend": False}})
    _pods_of(kube, namespace, {"orphan": 2})
    cm = kube.request("GET", _collection(kube, planted) + "/orphan-config")
    assert [(r["uid"], r["controller"]) for r in cm["metadata"]["ownerReferences"]] == [(uid, True)]
    assert cm["data"]["trainer.yaml"] != planted["data"]["trainer.yaml"]  # the operator's config, not the stale one


def test_children_deleted_under_a_running_gang_are_made_again_for_the_next_generation(
        kube: Any, namespace: str, operator: Any) -> None:
    """The operator checks a job's ConfigMap, Service and NetworkPolicy once per gang generation
    (looking them up first once they were made): a restarted gang never starts without them."""
    operator(env=NETWORK_ENV)
    quick = {**QUICK_EXIT, "runPolicy": {"backoffBaseSeconds": 0}}
    create_job(kube, namespace, job_manifest("again", replicas=2, spec=quick))
    uid = wait_gang(kube, namespace, "again", 0)["metadata"]["uid"]
    children = [("ConfigMap", str(kube.core_path(namespace, "configmaps", "again-config"))),
                ("Service", str(kube.core_path(namespace, "services", "again"))),
                ("NetworkPolicy", policy_path(kube, namespace, "again-workers"))]
    before = {kind: kube.request("GET", path) for kind, path in children}
    for _, path in children:
        kube.request("DELETE", path)
    annotate_pod(kube, namespace, "again-worker-1", fake_pods.exit_annotations(1))
    wait_gang(kube, namespace, "again", 1)
    for kind, path in children:
        made = kube.request("GET", path)
        assert made["metadata"]["uid"] != before[kind]["metadata"]["uid"], kind  # made again, not left gone
        assert [(r["uid"], r["controller"]) for r in made["metadata"]["ownerReferences"]] == [(uid, True)], kind
        assert made.get("data") == before[kind].get("data") or kind != "ConfigMap"
        if kind == "NetworkPolicy":
            assert made["spec"] == before[kind]["spec"]


@pytest.mark.parametrize("source", ["chart", "chart-watch-namespaces", "kustomize-cluster-wide",
                                    "kustomize-single-namespace"])
def test_the_operators_network_policy_is_accepted_by_the_api_server(source: str, control_plane: Any,
                                                                     namespace: str) -> None:
    docs = {
        "chart": lambda: helm_template(),
        "chart-watch-namespaces": lambda: helm_template(
            "--set", "watchNamespaces={ml-a}", "--set-json",
            'networkPolicy.statusAPIFrom=[{"namespaceSelector":{"matchLabels":{"team":"ui"}}},'
            '{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}}]'),
        "kustomize-cluster-wide": lambda: kustomize_build("cluster-wide"),
        "kustomize-single-namespace": lambda: kustomize_build("single-namespace"),
    }[source]()
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert len(policies) == 1
    for policy in policies:
        policy["metadata"]["namespace"] = namespace
    result = subprocess.run(
        [str(control_plane.bin / "kubectl"), "--kubeconfig", str(control_plane.admin_kubeconfig), "apply",
         "--dry-run=server", "-o", "json", "-f", "-"],
        input=yaml.safe_dump_all(policies), capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spec"] == policies[0]["spec"]
