"""A real Kubernetes control plane with fake GPU nodes, for tests and `make dev-cluster`.

``ControlPlane`` runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok from pinned, cached binaries (``tools/build-binaries.sh``);
``fixtures`` exposes it to pytest; ``fake_pods`` documents how a test chooses
what a pod on a fake node does.
"""

from tests.cluster.controlplane import ClusterConfig, ControlPlane, ControlPlaneError
from tests.cluster.nodes import GpuNodeShape
from tests.cluster.waiting import wait_for

__all__ = ["ClusterConfig", "ControlPlane", "ControlPlaneError", "GpuNodeShape", "wait_for"]
