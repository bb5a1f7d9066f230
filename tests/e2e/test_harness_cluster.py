"""The test control plane behaves like a real cluster with GPU nodes.

These tests prove the harness the operator's integration tests stand on: the
real scheduler, garbage collector, node lifecycle and pod GC controllers run,
and kwok makes pods on fake GPU nodes run, fail and disappear as asked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import fake_pods
from tests.cluster.binaries import REPO_ROOT
from tests.cluster.controlplane import ClusterConfig, ControlPlane
from tests.cluster.nodes import GPU_RESOURCE, GPU_TAINT, node_is_ready
from tests.cluster.processes import is_running, reap_stale
from tests.cluster.waiting import wait_for

pytestmark = pytest.mark.cluster

PINNED_KUBERNETES = "v1.37.2"


def gpu_pod(
    name: str,
    gpus: int = 1,
    *,
    annotations: dict[str, str] | None = None,
    node_name_label: str | None = None,
) -> dict:
    """A worker-like pod asking for ``gpus`` GPUs, tolerating the GPU taint."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{**GPU_TAINT, "operator": "Equal"}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.invalid/rljob-trainer:test",
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }
    if node_name_label:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name_label}
    return pod


def read_pod_or_none(core_v1, namespace: str, name: str):
    """The pod, or None once it is gone."""
    try:
        return core_v1.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def wait_running(core_v1, namespace: str, name: str, timeout: float = 60):
    """Wait until the pod is Running and Ready with an IP; return it."""

    def running():
        pod = core_v1.read_namespaced_pod(name, namespace)
        ok = pod.status.phase == "Running" and fake_pods.pod_is_ready(pod) and pod.status.pod_ip
        return pod if ok else None

    return wait_for(running, timeout, message=f"pod {namespace}/{name} Running and Ready")


def test_server_and_kubectl_report_the_pinned_version(control_plane):
    assert control_plane.server_version() == PINNED_KUBERNETES
    out = subprocess.run(
        [
            str(control_plane.bin / "kubectl"),
            "version",
            "-o",
            "json",
            f"--kubeconfig={control_plane.admin_kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    versions = json.loads(out)
    assert versions["clientVersion"]["gitVersion"] == PINNED_KUBERNETES
    assert versions["serverVersion"]["gitVersion"] == PINNED_KUBERNETES


def test_default_gpu_nodes_are_ready_with_eight_gpus(core_v1):
    default_nodes = [n for n in core_v1.list_node().items if n.metadata.name.startswith("gpu-node-")]
    assert sorted(n.metadata.name for n in default_nodes) == [f"gpu-node-{i}" for i in range(4)]
    for node in default_nodes:
        assert node_is_ready(node)
        assert node.status.allocatable[GPU_RESOURCE] == "8"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in node.spec.taints
        ]


def test_one_gpu_pod_is_bound_by_the_scheduler_and_runs_with_an_ip(core_v1, namespace):
    core_v1.create_namespaced_pod(namespace, gpu_pod("worker-0", gpus=1))
    pod = wait_running(core_v1, namespace, "worker-0")
    assert pod.spec.node_name.startswith("gpu-node-")
    assert pod.status.pod_ip.startswith("10.128.")
    assert pod.status.container_statuses[0].state.running is not None


def test_pod_without_the_gpu_toleration_is_not_scheduled_on_gpu_nodes(core_v1, namespace):
    pod = gpu_pod("no-toleration")
    del pod["spec"]["tolerations"]
    core_v1.create_namespaced_pod(namespace, pod)
    wait_for(
        lambda: any(
            e.reason == "FailedScheduling" and "untolerated taint" in (e.message or "")
            for e in core_v1.list_namespaced_event(
                namespace, field_selector="involvedObject.name=no-toleration"
            ).items
        ),
        60,
        message="FailedScheduling for the untolerated GPU taint",
    )


def test_nine_gpu_pod_stays_pending_with_failed_scheduling(core_v1, namespace):
    core_v1.create_namespaced_pod(namespace, gpu_pod("too-big", gpus=9))

    def failed_scheduling():
        events = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.name=too-big").items
        return [e for e in events if e.reason == "FailedScheduling"]

    events = wait_for(failed_scheduling, 60, message="a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in events[0].message
    pod = core_v1.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending" and pod.spec.node_name is None


def test_garbage_collector_deletes_owned_child(core_v1, namespace):
    parent = core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "parent"}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": parent.metadata.uid}
    core_v1.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [owner]}}
    )
    core_v1.delete_namespaced_config_map("parent", namespace)

    def child_gone() -> bool:
        try:
            core_v1.read_namespaced_config_map("child", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(child_gone, 60, message="the garbage collector to delete the child")


@pytest.mark.parametrize(
    ("exit_code", "reason", "message", "phase", "expected_reason"),
    [
        (0, None, None, "Succeeded", "Completed"),
        (3, None, "reward function import error", "Failed", "Error"),
        (137, "OOMKilled", None, "Failed", "OOMKilled"),
    ],
    ids=["success", "error-with-message", "oom-killed"],
)
def test_pod_exits_as_annotated(core_v1, namespace, exit_code, reason, message, phase, expected_reason):
    annotations = fake_pods.exit_annotations(exit_code, reason=reason, message=message)
    core_v1.create_namespaced_pod(namespace, gpu_pod("worker-0", annotations=annotations))

    pod = wait_for(
        lambda: (p := core_v1.read_namespaced_pod("worker-0", namespace)).status.phase == phase and p,
        60,
        message=f"pod phase {phase}",
    )
    assert fake_pods.container_termination(pod) == {
        "exit_code": exit_code,
        "reason": expected_reason,
        "message": message,
    }
    assert not fake_pods.pod_is_ready(pod)


def test_running_pod_fails_when_annotated_later(core_v1, namespace):
    core_v1.create_namespaced_pod(namespace, gpu_pod("worker-0"))
    wait_running(core_v1, namespace, "worker-0")
    core_v1.patch_namespaced_pod(
        "worker-0",
        namespace,
        {"metadata": {"annotations": fake_pods.exit_annotations(1, message="NCCL timeout")}},
    )
    pod = wait_for(
        lambda: (p := core_v1.read_namespaced_pod("worker-0", namespace)).status.phase == "Failed" and p,
        60,
        message="pod Failed",
    )
    assert fake_pods.container_termination(pod)["message"] == "NCCL timeout"


def test_pod_turns_not_ready_and_back(core_v1, namespace):
    core_v1.create_namespaced_pod(namespace, gpu_pod("worker-0"))
    wait_running(core_v1, namespace, "worker-0")

    def ready_is(value: bool):
        pod = core_v1.read_namespaced_pod("worker-0", namespace)
        return fake_pods.pod_is_ready(pod) == value and pod.status.phase == "Running"

    for value in (False, True):
        core_v1.patch_namespaced_pod(
            "worker-0",
            namespace,
            {"metadata": {"annotations": {fake_pods.READY: str(value).lower()}}},
        )
        wait_for(lambda value=value: ready_is(value), 30, message=f"Ready={value}")


def test_stuck_terminating_pod_stays_until_force_deleted(core_v1, namespace):
    core_v1.create_namespaced_pod(
        namespace, gpu_pod("stuck", annotations={fake_pods.STUCK_TERMINATING: "true"})
    )
    core_v1.create_namespaced_pod(namespace, gpu_pod("normal"))
    wait_running(core_v1, namespace, "stuck")
    wait_running(core_v1, namespace, "normal")

    core_v1.delete_namespaced_pod("stuck", namespace)
    core_v1.delete_namespaced_pod("normal", namespace)
    # The un-annotated pod deleted at the same moment is the clock: once it is
    # gone, kwok has had its chance to confirm the other deletion too.
    wait_for(
        lambda: read_pod_or_none(core_v1, namespace, "normal") is None,
        60,
        message="normal pod gone",
    )
    stuck = read_pod_or_none(core_v1, namespace, "stuck")
    assert stuck is not None and stuck.metadata.deletion_timestamp is not None

    core_v1.delete_namespaced_pod("stuck", namespace, grace_period_seconds=0)
    wait_for(
        lambda: read_pod_or_none(core_v1, namespace, "stuck") is None,
        30,
        message="force-deleted pod gone",
    )


def test_kwok_confirms_a_deletion_by_uid_never_deleting_a_namesake_created_meanwhile(
    control_plane, core_v1, namespace
):
    """A kubelet confirms a graceful delete with the pod's UID as precondition; kwok 0.8 deletes by
    name (tools/kwok/delete-by-uid.patch adds the UID). Here kwok lags (SIGSTOP) while a pod is
    deleted and a new pod takes its name, as an operator recreating a gang under the same names
    does: caught up, kwok must leave the new pod alone."""
    core_v1.create_namespaced_pod(namespace, gpu_pod("reused"))
    wait_running(core_v1, namespace, "reused")
    kwok = next(p for p in control_plane.processes if p.name == "kwok")
    os.kill(kwok.pid, signal.SIGSTOP)
    try:
        core_v1.delete_namespaced_pod("reused", namespace)  # graceful: waits for kwok to confirm
        # kwok is stopped: a grace period of 0 removes the old pod without it, as a force delete does.
        try:
            core_v1.delete_namespaced_pod("reused", namespace, grace_period_seconds=0)
        except ApiException as e:  # kwok confirmed the graceful delete before SIGSTOP took hold (a loaded machine)
            if e.status != 404:
                raise
        wait_for(lambda: read_pod_or_none(core_v1, namespace, "reused") is None, 30, message="old pod gone")
        new_uid = core_v1.create_namespaced_pod(namespace, gpu_pod("reused")).metadata.uid
    finally:
        os.kill(kwok.pid, signal.SIGCONT)
    wait_running(core_v1, namespace, "reused")  # kwok has caught up with everything before it
    core_v1.create_namespaced_pod(namespace, gpu_pod("clock"))
    wait_running(core_v1, namespace, "clock")  # and with a pod created after it
    pod = read_pod_or_none(core_v1, namespace, "reused")
    assert pod is not None and pod.metadata.uid == new_uid and pod.metadata.deletion_timestamp is None


def test_apiserver_restart_keeps_objects(control_plane, core_v1, namespace):
    core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "survivor"}, "data": {"k": "v"}})
    old_pid = next(p.pid for p in control_plane.processes if p.name == "kube-apiserver")

    control_plane.restart_apiserver()

    new_pid = next(p.pid for p in control_plane.processes if p.name == "kube-apiserver")
    assert new_pid != old_pid and not is_running(old_pid)
    config_map = wait_for(
        lambda: core_v1.read_namespaced_config_map("survivor", namespace),
        30,
        message="configmap readable after restart",
        ignore=(ApiException, urllib3.exceptions.HTTPError),
    )
    assert config_map.data == {"k": "v"}
    # The controllers reconnect: a new pod still gets scheduled and run.
    core_v1.create_namespaced_pod(namespace, gpu_pod("after-restart"))
    wait_running(core_v1, namespace, "after-restart")



def test_a_crashed_scheduler_is_started_again_and_schedules(control_plane, core_v1, namespace):
    """As a kubelet restarts a crashed static pod: a kube-scheduler that exited is started again."""
    old = next(p for p in control_plane.processes if p.name == "kube-scheduler")
    os.kill(old.pid, signal.SIGKILL)
    wait_for(lambda: not is_running(old.pid, old.exe), 10, message="kube-scheduler gone")
    assert control_plane.revive_crashed() == ["kube-scheduler"]
    assert control_plane.revive_crashed() == []  # running again: nothing to do
    core_v1.create_namespaced_pod(namespace, gpu_pod("after-scheduler-crash"))
    wait_running(core_v1, namespace, "after-scheduler-crash")

def test_token_request_token_passes_token_review_and_rbac_applies(
    control_plane, api_client, namespace, service_account_kubeconfig
):
    kubeconfig = service_account_kubeconfig("rljob-operator")
    as_operator = control_plane.api_client(kubeconfig)
    try:
        token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
        review = client.AuthenticationV1Api(api_client).create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
        )
        assert review.status.authenticated
        assert review.status.user.username == f"system:serviceaccount:{namespace}:rljob-operator"

        operator_core = client.CoreV1Api(as_operator)
        with pytest.raises(ApiException) as denied:
            operator_core.list_namespaced_pod(namespace)
        assert denied.value.status == 403

        rbac = client.RbacAuthorizationV1Api(api_client)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "operator-reads-pods"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "rljob-operator", "namespace": namespace}],
            },
        )
        wait_for(
            lambda: operator_core.list_namespaced_pod(namespace) is not None,
            30,
            message="RBAC grant to take effect",
            ignore=(ApiException,),
        )
    finally:
        as_operator.close()


# A deleted node's pods removed by pod GC after its 40 s quarantine, and an unreachable node marked
# NotReady, tainted and its pods evicted by the taint manager: the harness does both as a cluster
# does, and tests/operator/test_fault_cluster.py checks them where the operator depends on them
# (test_node_deleted_..., test_node_not_ready_...), rather than waiting out those timers twice.


def test_stop_leaves_no_process_and_no_directory():
    plane = ControlPlane(config=ClusterConfig(gpu_nodes=1)).start(build_binaries=False)
    processes, workdir = plane.processes, plane.workdir
    assert len(processes) == 5 and all(is_running(p.pid, p.exe) for p in processes)

    plane.stop()

    assert not [p.name for p in processes if is_running(p.pid)]
    assert not workdir.exists()


def test_killed_owner_leaves_nothing_after_the_next_start():
    # A pytest run killed with SIGKILL runs no atexit handler: the kernel stops
    # the components (PDEATHSIG) and the next start's reaper removes the rest.
    script = (
        "import json, sys, time\n"
        "from tests.cluster.controlplane import ClusterConfig, ControlPlane\n"
        "cp = ControlPlane(config=ClusterConfig(gpu_nodes=0)).start(build_binaries=False)\n"
        "print(json.dumps({'workdir': str(cp.workdir), "
        "'pids': [[p.pid, p.exe] for p in cp.processes]}), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        started = json.loads(owner.stdout.readline())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    wait_for(
        lambda: not any(is_running(pid, exe) for pid, exe in started["pids"]),
        30,
        message="components to die with their owner",
    )
    assert Path(started["workdir"]).exists()  # nothing ran the owner's cleanup...

    assert started["workdir"] in reap_stale()  # ...until the next start reaps it
    assert not Path(started["workdir"]).exists()


def test_the_registry_starts_with_the_control_plane_takes_a_chart_and_stops_with_it(tmp_path):
    """``ClusterConfig.registry`` (``make dev-cluster REGISTRY=1``): distribution on loopback, plain HTTP, which
    ``helm push`` reaches as ``make release`` does; one of the plane's processes, so stopped with it."""
    from tests.cluster import registry

    plane = ControlPlane(config=ClusterConfig(gpu_nodes=0, registry=True)).start(build_binaries=False)
    try:
        address = plane.registry_address
        assert address and address.startswith("127.0.0.1:") and registry.answers(address)
        env = {**os.environ, **{f"HELM_{kind}_HOME": str(tmp_path / kind) for kind in ("CACHE", "CONFIG", "DATA")}}
        helm = [str(plane.bin / "helm")]
        subprocess.run([*helm, "package", str(REPO_ROOT / "charts" / "rljob"), "--version", "0.0.1-harness",
                        "--destination", str(tmp_path)], check=True, capture_output=True, env=env)
        pushed = subprocess.run([*helm, "push", str(tmp_path / "rljob-0.0.1-harness.tgz"),
                                 f"oci://{address}/harness/charts", "--plain-http"],
                                check=True, capture_output=True, text=True, env=env)
        assert "Digest: sha256:" in pushed.stdout + pushed.stderr
        shown = subprocess.run([*helm, "show", "chart", f"oci://{address}/harness/charts/rljob",
                                "--version", "0.0.1-harness", "--plain-http"],
                               check=True, capture_output=True, text=True, env=env).stdout
        assert yaml.safe_load(shown)["version"] == "0.0.1-harness"
        (process,) = [p for p in plane.processes if p.name == "registry"]
    finally:
        plane.stop()
    assert not is_running(process.pid, process.exe) and not registry.answers(address)
