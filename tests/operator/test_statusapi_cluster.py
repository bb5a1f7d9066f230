"""The status API with real tokens from the TokenRequest API: 401, 403 and 200/202."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes.client.exceptions import ApiException

from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    WORKER_PODS_POLICY,
    create_job,
    get_job,
    job_claim,
    job_manifest,
    job_pods,
    token_for,
    wait_phase,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def running(kube, namespace, operator, tmp_path: Path) -> dict[str, Any]:
    """An operator, job ``st`` (2 workers) and job ``other`` (1 worker), both Running."""
    op = operator()
    create_job(kube, namespace, job_manifest("st", replicas=2))
    create_job(kube, namespace, job_manifest("other", replicas=1, spec={"training": {"batchSize": 8}}))
    wait_phase(kube, namespace, "st", "Running")
    wait_phase(kube, namespace, "other", "Running")
    cm = kube.request("GET", kube.core_path(namespace, "configmaps", "st-config"))
    ca = tmp_path / "status-ca.crt"
    ca.write_text(cm["data"]["status-ca.crt"])
    pods = {p["metadata"]["name"]: p for p in job_pods(kube, namespace, "st") + job_pods(kube, namespace, "other")}
    base = f"{op.status_url}/api/v1/namespaces/{namespace}/rltrainingjobs"
    return {"op": op, "ca": str(ca), "pods": pods, "base": base}


def _post(env: dict[str, Any], job: str, token: str | None, body: Any = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.post(f"{env['base']}/{job}/heartbeat", json=body or {"step": 1, "reward": 0.5, "loss": 1.0},
                         headers=headers, verify=env["ca"], timeout=10)


def _get(env: dict[str, Any], job: str, token: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{env['base']}/{job}/status", headers=headers, verify=env["ca"], timeout=10)


def test_heartbeats_need_a_token_bound_to_a_worker_of_that_job(kube, namespace, running) -> None:
    pods = running["pods"]
    worker = pods["st-worker-1"]
    missing = _post(running, "st", None)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert _post(running, "st", "not-a-token").status_code == 401
    # The API server's own audience is not the status API's: such a token is refused.
    api_token = token_for(kube, namespace, "default", None, pod=worker)
    assert _post(running, "st", api_token).status_code == 401
    # Right audience, but not bound to a pod (not what a kubelet projects).
    unbound = token_for(kube, namespace, "default", "rljob-status")
    assert _post(running, "st", unbound).status_code == 403
    # Bound to a worker of another job.
    foreign = token_for(kube, namespace, "default", "rljob-status", pod=pods["other-worker-0"])
    response = _post(running, "st", foreign)
    assert response.status_code == 403 and "not a worker of" in response.json()["error"]

    token = token_for(kube, namespace, "default", "rljob-status", pod=worker)
    assert _post(running, "st", token, {"reward": 1}).status_code == 400  # no step
    accepted = _post(running, "st", token, {"step": 5, "reward": 0.25, "loss": 0.5, "checkpoint": "checkpoint-4",
                                            "best_checkpoint": "checkpoint-2", "best_metric": 0.75, "pod": "x"})
    assert accepted.status_code == 202

    def progress() -> dict[str, Any] | None:
        value = get_job(kube, namespace, "st")["status"].get("progress") or {}
        return value if value.get("step") == 5 else None

    seen = wait_for(progress, 20, message="progress written")
    assert seen["reward"] == 0.25 and seen["loss"] == 0.5 and seen["checkpoint"] == "checkpoint-4"
    assert seen["bestCheckpoint"] == "checkpoint-2" and seen["bestMetric"] == 0.75
    assert seen["lastHeartbeat"].endswith("Z")
    assert "progress" not in (get_job(kube, namespace, "other")["status"])
    metrics = running["op"].metrics_text()
    assert 'rljob_operator_heartbeats_total{result="accepted"}' in metrics
    assert 'rljob_operator_heartbeats_total{result="forbidden"} 2.0' in metrics


def test_only_pods_the_operator_created_speak_for_a_job_not_a_tenants_pod_that_names_its_uid(
        kube, namespace, running, tenant_kube) -> None:
    """Issue #43 point 3: an ordinary tenant (``edit`` in the namespace) tries a notebook pod controlled by the job
    (its UID is public): the API server refuses it (``rljob-worker-pods``, issue #48). It makes one whose controller
    reference has the job's kind, name and UID under another API group, and one with every worker label (issue #30
    point 5). Neither may report progress (curve points, rewards, best_checkpoint: what experiments rank trials by),
    however many heartbeats it sends, nor throttle the job or move its stall clock. The operator's own workers,
    controlled by the job, may; the job's status lists none of them."""
    job = get_job(kube, namespace, "st")
    worker = running["pods"]["st-worker-0"]
    assert "createdPods" not in job["status"]
    for name in ("st-worker-0", "st-worker-1"):
        [ref] = running["pods"][name]["metadata"]["ownerReferences"]
        assert (ref["apiVersion"], ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "rljob.dev/v1alpha1", "RLTrainingJob", "st", job["metadata"]["uid"], True)

    def tenant_pod(name: str, meta: dict[str, Any]) -> dict[str, Any]:
        spec = {"containers": [{"name": "notebook", "image": "registry.invalid/notebook:1"}],
                "nodeSelector": {"rljob.test/no-such-node": "x"}}  # never runs: only its identity matters
        return tenant_kube.request("POST", kube.core_path(namespace, "pods"),
                                   {"metadata": {"name": name, **meta}, "spec": spec})

    claim = job_claim("st", job["metadata"]["uid"])
    with pytest.raises(ApiException) as refused:
        tenant_pod("st-notebook", {"ownerReferences": [claim]})
    assert refused.value.status == 403 and WORKER_PODS_POLICY in refused.value.body
    owned = tenant_pod("st-notebook", {"ownerReferences": [job_claim("st", job["metadata"]["uid"], "tenant.example/v1")]})
    mine = tenant_kube.request("POST", kube.core_path(namespace, "configmaps"), {"metadata": {"name": "tenant-owner"}})
    labelled = tenant_pod("st-lookalike", {"labels": dict(worker["metadata"]["labels"]), "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "tenant-owner", "uid": mine["metadata"]["uid"],
         "controller": True}]})  # controlled by something, else the operator deletes it as an orphan of the job

    def authenticated(token: str) -> bool:
        """The API server authenticates a token bound to a pod once its own caches hold the pod (a moment
        after the create, longer on a busy machine); asked first, the status API would remember a 401."""
        review = kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": ["rljob-status"]}})
        return bool((review.get("status") or {}).get("authenticated"))

    forged = {"step": 10_000, "reward": 99.0, "loss": 0.0, "best_checkpoint": "s3://tenant/checkpoint-0",
              "best_metric": 99.0, "metrics": {"eval/accuracy": 1.0}, "final": True}
    for pod in (owned, labelled):
        # The token a kubelet would project into the pod (the tenant chose the audience in its pod spec).
        token = token_for(kube, namespace, "default", "rljob-status", pod=pod)
        wait_for(lambda token=token: authenticated(token), 30, message="the tenant pod's token authenticated")
        answers = [_post(running, "st", token, forged) for _ in range(30)]  # more than the job's burst (20)
        assert {r.status_code for r in answers} <= {403, 429} and answers[0].status_code == 403, answers[0].text
        assert "only pods the operator created for the job may speak for it" in answers[0].json()["error"]
    assert owned["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # the job's UID, not its group
    progress = get_job(kube, namespace, "st")["status"].get("progress") or {}
    assert progress.get("step") != 10_000 and "lastThrottled" not in progress  # nothing forged, no throttle written
    # The same request from the operator's own worker is accepted (once this address's bucket, which the
    # refused tokens paid from, has refilled: a token not checked yet pays per address).
    token = token_for(kube, namespace, "default", "rljob-status", pod=worker)
    answer = wait_for(lambda: (r := _post(running, "st", token, {"step": 3, "reward": 0.5})).status_code != 429 and r,
                      20, interval=0.5, message="the address's bucket refilled")
    assert answer.status_code == 202, answer.text


def test_reading_status_needs_permission_to_get_that_job(kube, namespace, running) -> None:
    assert _get(running, "st", None).status_code == 401
    assert _get(running, "st", "not-a-token").status_code == 401
    nobody = token_for(kube, namespace, "nobody")
    denied = _get(running, "st", nobody)
    assert denied.status_code == 403 and "may not get" in denied.json()["error"]

    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + namespace
    kube.request("POST", f"{rbac}/roles", {
        "metadata": {"name": "read-st"},
        "rules": [{"apiGroups": ["rljob.dev"], "resources": ["rltrainingjobs"], "verbs": ["get"],
                   "resourceNames": ["st"]}],
    })
    kube.request("POST", f"{rbac}/rolebindings", {
        "metadata": {"name": "reader-reads-st"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-st"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    })
    reader = token_for(kube, namespace, "reader")
    allowed = wait_for(lambda: (r := _get(running, "st", reader)).status_code == 200 and r, 20,
                       message="RBAC in effect")
    body = allowed.json()
    assert body["kind"] == "RLTrainingJob" and body["metadata"]["name"] == "st"
    assert body["status"]["phase"] == "Running"
    assert _get(running, "other", reader).status_code == 403  # the Role names only "st"
    assert _get(running, "missing", nobody).status_code == 403  # no existence oracle without permission


def test_resume_fallback_warnings_in_a_heartbeat_become_warning_events(kube, namespace, running) -> None:
    """The trainer's pre-flight fell back from a corrupt checkpoint; people see it on the job."""
    token = token_for(kube, namespace, "default", "rljob-status", pod=running["pods"]["st-worker-0"])
    message = "checkpoint s3://b/run/checkpoint-40 failed verification or download, falling back: md5 mismatch"
    assert _post(running, "st", token, {"step": 41, "warnings": [message]}).status_code == 202

    def fallback_events() -> list[dict[str, Any]]:
        events = kube.request("GET", kube.core_path(namespace, "events"))["items"]
        return [e for e in events if e.get("reason") == "CheckpointFallback"
                and e["involvedObject"]["name"] == "st"]

    events = wait_for(fallback_events, 20, message="CheckpointFallback event")
    assert events[0]["type"] == "Warning" and "md5 mismatch" in events[0]["message"]
    # A heartbeat without warnings adds none.
    assert _post(running, "st", token, {"step": 42}).status_code == 202
    assert len(fallback_events()) == 1


def test_a_tracking_server_left_out_by_the_trainer_becomes_a_tracking_unavailable_event(kube, namespace, running) -> None:
    """The trainer's MLflow server did not answer; the run goes on, and people see why it is not tracked."""
    token = token_for(kube, namespace, "default", "rljob-status", pod=running["pods"]["st-worker-0"])
    message = ("tracking: mlflow: MLflow at http://mlflow:5000 did not answer 3 tries (ConnectionError); "
               "training goes on without it")
    assert _post(running, "st", token, {"step": 43, "warnings": [message]}).status_code == 202

    def tracking_events() -> list[dict[str, Any]]:
        events = kube.request("GET", kube.core_path(namespace, "events"))["items"]
        return [e for e in events if e.get("reason") == "TrackingUnavailable" and e["involvedObject"]["name"] == "st"]

    (event,) = wait_for(tracking_events, 20, message="TrackingUnavailable event")
    assert event["type"] == "Warning" and event["message"] == message


def test_heartbeats_build_a_bounded_finite_progress_curve(kube, namespace, running) -> None:
    """Each heartbeat's reward, loss and metrics become a curve point; bad metrics are refused whole."""
    token = token_for(kube, namespace, "default", "rljob-status", pod=running["pods"]["st-worker-0"])
    for step in range(1, 6):
        body = {"step": step, "reward": step / 10, "loss": float("nan") if step == 3 else 1.0,
                "metrics": {"kl": step / 100, "rewards/accuracy/mean": step / 5, "grad_norm": float("inf")}}
        # Raw JSON with NaN (Python's json writes it; requests' json= refuses): a sender the trainer is not.
        response = requests.post(f"{running['base']}/st/heartbeat", data=json.dumps(body), verify=running["ca"],
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                                 timeout=10)
        assert response.status_code == 202, response.text
    # An older trainer's heartbeat (no metrics) still counts; an empty one adds no point.
    assert _post(running, "st", token, {"step": 6, "reward": 0.6}).status_code == 202
    assert _post(running, "st", token, {"step": 6}).status_code == 202

    def curve_at(last: int) -> Any:
        def check() -> list[dict[str, Any]] | None:
            curve = (get_job(kube, namespace, "st")["status"].get("progress") or {}).get("curve") or []
            return curve if curve and curve[-1]["step"] == last else None
        return check

    curve = wait_for(curve_at(6), 20, message="curve up to step 6")
    assert [p["step"] for p in curve] == [1, 2, 3, 4, 5, 6]
    assert curve[1] == {"step": 2, "reward": 0.2, "loss": 1.0, "metrics": {"kl": 0.02, "rewards/accuracy/mean": 0.4}}
    assert "loss" not in curve[2] and curve[2]["reward"] == 0.3  # NaN dropped, the point kept
    assert curve[5] == {"step": 6, "reward": 0.6}

    # Another replica wrote a point since this one last wrote: the next write must build on it, not overwrite it.
    extra = [*curve, {"step": 7, "reward": 0.7}]
    kube.patch_job_status(namespace, "st", {"progress": {"curve": extra}})
    assert _post(running, "st", token, {"step": 8, "reward": 0.8}).status_code == 202
    assert [p["step"] for p in wait_for(curve_at(8), 20, message="curve up to step 8")] == [1, 2, 3, 4, 5, 6, 7, 8]

    # The trainer resumed from the checkpoint of step 4: the abandoned run's later points go.
    assert _post(running, "st", token, {"step": 5, "reward": 0.55, "final": True}).status_code == 202
    curve = wait_for(curve_at(5), 20, message="curve rewound to step 5")
    assert [p["step"] for p in curve] == [1, 2, 3, 4, 5] and curve[-1] == {"step": 5, "reward": 0.55}

    # Hostile metrics: too many, a name that is not a metric's, a value that is not a number → 400, nothing kept.
    for metrics in ({f"m{i}": 1.0 for i in range(33)}, {"a b": 1.0}, {"x" * 65: 1.0}, {"kl": "high"}):
        response = _post(running, "st", token, {"step": 9, "reward": 9.0, "metrics": metrics})
        assert response.status_code == 400 and "metrics" in response.json()["error"], metrics
    assert (get_job(kube, namespace, "st")["status"]["progress"])["step"] == 5


def test_a_heartbeats_evaluation_shows_in_status_with_its_best_and_a_printer_column(kube, namespace, running) -> None:
    """Held-out evaluation (#33): the latest values, the best with its step, `kubectl get`'s Eval column."""
    token = token_for(kube, namespace, "default", "rljob-status", pod=running["pods"]["st-worker-0"])
    evaluation = {"metric": "eval/exact_match", "step": 40, "values": {"eval/exact_match": 0.5, "eval/rougeL": 0.7},
                  "best_step": 20, "best_value": 0.75}
    body = {"step": 40, "metrics": {"eval/exact_match": 0.5}, "evaluation": evaluation, "final": True}
    assert _post(running, "st", token, body).status_code == 202

    def shown() -> dict[str, Any] | None:
        return (get_job(kube, namespace, "st")["status"].get("progress") or {}).get("evaluation")

    got = wait_for(shown, 20, message="status.progress.evaluation")
    assert got == {"metric": "eval/exact_match", "step": 40, "value": 0.5,
                   "values": {"eval/exact_match": 0.5, "eval/rougeL": 0.7}, "bestStep": 20, "bestValue": 0.75}
    crd = kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rltrainingjobs.rljob.dev")
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Eval"] == ".status.progress.evaluation.value"
    # A hostile evaluation (a metric name the status cannot hold) is refused whole.
    bad = {**evaluation, "values": {"a b": 1.0}}
    response = _post(running, "st", token, {"step": 41, "evaluation": bad})
    assert response.status_code == 400 and "evaluation" in response.json()["error"]


def test_health_signals_in_heartbeats_become_status_warnings_and_one_warning_event_each(
        kube, namespace, running) -> None:
    """The issue's DAPO run (#47): its masked batches and collapsed entropy show in the job's status, each told once
    as a Warning Event; a hostile health report is refused whole."""
    token = token_for(kube, namespace, "default", "rljob-status", pod=running["pods"]["st-worker-0"])
    masked = {"signal": "maskedBatch", "step": 5, "last_step": 5, "active": True, "value": 0.97, "threshold": 0.5}
    assert _post(running, "st", token, {"step": 5, "health": [masked]}).status_code == 202
    collapsed = {"signal": "entropyCollapse", "step": 22, "last_step": 22, "active": True, "value": 0.0,
                 "threshold": 0.39}
    for step in (22, 23):  # 23: both still active, nothing new to tell
        reports = [{**masked, "last_step": step}, {**collapsed, "last_step": step}]
        assert _post(running, "st", token, {"step": step, "health": reports, "final": True}).status_code == 202

    def warnings() -> list[dict[str, Any]] | None:
        health = (get_job(kube, namespace, "st")["status"].get("progress") or {}).get("health") or []
        return health if len(health) == 2 and health[0]["lastStep"] == 23 else None

    health = wait_for(warnings, 20, message="status.progress.health")
    assert [(w["signal"], w["step"], w["active"]) for w in health] == [("maskedBatch", 5, True),
                                                                        ("entropyCollapse", 22, True)]
    assert health[1]["message"].startswith("entropyCollapse at step 22: entropy collapsed far below its start")

    def health_events() -> list[dict[str, Any]] | None:
        events = kube.request("GET", kube.core_path(namespace, "events"))["items"]
        mine = [e for e in events if e.get("reason") in ("MaskedBatch", "EntropyCollapse")
                and e["involvedObject"]["name"] == "st"]
        return mine if len(mine) == 2 else None

    events = wait_for(health_events, 20, message="MaskedBatch and EntropyCollapse events")
    assert all(e["type"] == "Warning" and (e.get("count") or 1) == 1 for e in events), events
    # Hostile: an unknown signal, a NaN, a second report of one signal, text for a number → 400, status unchanged.
    for bad in ([{**masked, "signal": "allGood"}], [{**masked, "value": "NaN"}], [masked, masked],
                [{**masked, "threshold": "high"}]):
        response = _post(running, "st", token, {"step": 24, "health": bad})
        assert response.status_code == 400 and "health" in response.json()["error"], bad
    assert get_job(kube, namespace, "st")["status"]["progress"]["step"] == 23
