"""pytest plugin: a real control plane per session, a fresh namespace per test.

Load it from ``tests/conftest.py`` with ``pytest_plugins = ["tests.cluster.fixtures"]``
and mark cluster tests ``@pytest.mark.cluster``. Fixtures:

``control_plane`` (session) -> ``ControlPlane``
    etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and 4
    fake nodes × 8 ``nvidia.com/gpu`` (``gpu-node-0..3``, tainted
    ``nvidia.com/gpu=present:NoSchedule``). Shared: do not break its default
    nodes; use ``fake_gpu_nodes`` for node faults.
``admin_kubeconfig`` (session) -> ``Path`` of a system:masters kubeconfig.
``api_client`` (session) -> admin ``kubernetes.client.ApiClient``.
``core_v1`` (session) -> ``kubernetes.client.CoreV1Api`` on ``api_client``.
``namespace`` (function) -> ``str``: a new namespace whose ``default`` service
    account exists; its pods are force-deleted and it is deleted afterwards.
``service_account_kubeconfig`` (function) -> ``make(name, namespace=None) -> Path``:
    kubeconfig acting as that service account (created if missing; default
    namespace: the test's), with a TokenRequest token, for RBAC tests.
``fake_gpu_nodes`` (function) -> ``FakeGpuNodes``: ``add(count=1, *, gpus=8,
    labels=None) -> list[str]``, ``remove(name)``, ``set_ready(name, ready)``;
    nodes it added are deleted after the test.

``kueue`` (session) -> ``ControlPlane`` with Kueue's CRDs, webhooks and manager running
    (``ControlPlane.start_kueue``), started once, for the tests that ask for it.

``wait_for(predicate, timeout)`` (``tests.cluster.waiting``) is the polling helper;
``tests.cluster.fake_pods`` documents the annotations that decide a pod's fate.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.binaries import BinariesUnavailable
from tests.cluster.controlplane import ClusterConfig, ControlPlane
from tests.cluster.nodes import GpuNodeShape
from tests.cluster.waiting import wait_for


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``cluster`` marker."""
    config.addinivalue_line("markers", "cluster: needs the local Kubernetes control plane (tests/cluster)")


def real_node_selected(config: pytest.Config) -> bool:
    """``-m realnode`` (``make e2e``): the real-node tests run (``tests/conftest.py`` deselects them
    otherwise), and the session's control plane has the real node."""
    return "realnode" in (config.getoption("markexpr", "") or "")


#: Images the real node's containerd gets from the local podman storage besides the base image: none. The
#: trainer and the operator reach it through the session's registry (``tests/e2e/test_real_node_jobs_cluster.py``
#: pushes the trainer of ``make images``; ``test_real_node_install_path_cluster.py`` runs ``make release``).
REAL_NODE_IMAGES: tuple[str, ...] = ()


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest):
    """The session's control plane; stopped (nothing left behind) at session end. With ``-m realnode``
    (``make e2e``) it has the real node too, and a registry it pulls from."""
    real = real_node_selected(request.config)
    plane = ControlPlane(config=ClusterConfig(real_node=real, real_node_images=REAL_NODE_IMAGES if real else (),
                                              registry=real))
    try:
        # Never build here: a cold build takes far longer than a test timeout.
        plane.start(build_binaries=False)
    except BinariesUnavailable as error:
        pytest.fail(f"{error}\nBuild them first: `make binaries` (tools/build-binaries.sh).")
    if real:
        steps = ", ".join(f"{step} {seconds:.1f}s" for step, seconds in plane.real_node_start_seconds.items())
        print(f"real node up ({steps}); images imported {plane.real_node_images['imported']}, "
              f"kept from an earlier node {plane.real_node_images['kept']}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kueue(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with Kueue running (started on first use, kept for the session)."""
    if not control_plane.kueue_running:
        seconds = control_plane.start_kueue()
        print(f"Kueue ready to admit in {seconds:.1f}s")
    return control_plane


@pytest.fixture(scope="session")
def admin_kubeconfig(control_plane: ControlPlane) -> Path:
    """Path of a kubeconfig with cluster-admin (system:masters) rights."""
    return control_plane.admin_kubeconfig


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane):
    """Admin ``kubernetes.client.ApiClient``."""
    client = control_plane.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def core_v1(api_client):
    """Admin ``CoreV1Api``."""
    from kubernetes import client

    return client.CoreV1Api(api_client)


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"{slug or 't'}-{uuid.uuid4().hex[:5]}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1, control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default service account exists)."""
    for revived in control_plane.revive_crashed():  # one test's crash must not cascade into the next
        print(f"{revived} had exited: started it again")
    name = _namespace_name(request.node.name)
    core_v1.create_namespace({"metadata": {"name": name, "labels": {"rljob.dev/test": "true"}}})
    wait_for(
        lambda: core_v1.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        60,
        message=f"service account {name}/default",
    )
    yield name
    # Force-delete pods so stuck-Terminating ones cannot hold the namespace.
    core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core_v1.delete_namespace(name)


@pytest.fixture
def service_account_kubeconfig(control_plane: ControlPlane, namespace: str):
    """Factory ``make(name, namespace=None) -> Path`` of a service-account kubeconfig."""
    test_namespace = namespace

    def make(name: str, namespace: str | None = None) -> Path:
        return control_plane.service_account_kubeconfig(namespace or test_namespace, name)

    return make


class FakeGpuNodes:
    """Per-test fake GPU nodes; whatever a test adds is deleted after it."""

    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane
        self._prefix = f"t{uuid.uuid4().hex[:6]}-gpu-"
        self.added: list[str] = []

    def add(self, count: int = 1, *, gpus: int = 8, labels: dict[str, str] | None = None) -> list[str]:
        """Create ``count`` Ready nodes with ``gpus`` GPUs each; returns their names."""
        shape = GpuNodeShape(gpus=gpus, extra_labels=dict(labels or {}))
        names = self._plane.add_gpu_nodes(count, shape=shape, prefix=self._prefix)
        self.added.extend(names)
        return names

    def remove(self, name: str, *, wait: bool = True) -> None:
        """Delete node ``name`` (its pods are then garbage-collected by pod GC)."""
        self._plane.remove_node(name, wait=wait)
        if name in self.added:
            self.added.remove(name)

    def set_ready(self, name: str, ready: bool, *, wait: bool = True) -> None:
        """Make ``name`` unreachable (NotReady, then pods evicted) or bring it back."""
        self._plane.set_node_ready(name, ready, wait=wait)

    def cleanup(self) -> None:
        """Delete the nodes this test added and still exist."""
        from kubernetes.client.exceptions import ApiException

        for name in list(self.added):
            try:
                self._plane.remove_node(name, wait=False)
            except ApiException as error:
                if error.status != 404:
                    raise
        self.added.clear()


@pytest.fixture
def fake_gpu_nodes(control_plane: ControlPlane):
    """``FakeGpuNodes`` for this test (nodes it adds are removed afterwards)."""
    helper = FakeGpuNodes(control_plane)
    try:
        yield helper
    finally:
        helper.cleanup()
