"""Fake GPU nodes: what a DGX/HGX H100 node looks like to the scheduler.

The labels are the ones NVIDIA's GPU feature discovery puts on real nodes, and
the taint is the one GPU node pools carry, so pods need the toleration and the
``nvidia.com/gpu`` request exactly as on a real cluster. kwok manages only nodes
with the ``kwok.x-k8s.io/node: fake`` annotation.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
# Node annotation read by the kwok stages: no heartbeats, as if the kubelet were lost.
UNREACHABLE_ANNOTATION = "rljob.dev/fake-node-unreachable"
FAKE_NODE_LABEL = "rljob.dev/fake-node"


@dataclass(frozen=True)
class GpuNodeShape:
    """Capacity and identity of one fake GPU node (defaults: an 8×H100 machine)."""

    gpus: int = 8
    cpu: str = "96"
    memory: str = "1Ti"
    pods: int = 110
    ephemeral_storage: str = "2Ti"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    instance_type: str = "p5.48xlarge"
    zone: str = "fake-zone-a"
    extra_labels: dict[str, str] = field(default_factory=dict)


def node_internal_ip(name: str) -> str:
    """A stable, distinct InternalIP per node name (the pods' hostIP)."""
    n = zlib.crc32(name.encode()) % (254 * 254)
    return f"10.250.{n // 254}.{n % 254 + 1}"


def gpu_node_manifest(name: str, shape: GpuNodeShape = GpuNodeShape(), *, kubelet_version: str = "") -> dict:
    """The Node object to create for a fake GPU node called ``name``.

    ``kubelet_version`` is what the node reports (use the apiserver's version).
    """
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        "ephemeral-storage": shape.ephemeral_storage,
        GPU_RESOURCE: str(shape.gpus),
    }
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": shape.instance_type,
        "topology.kubernetes.io/zone": shape.zone,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": shape.gpu_product,
        "nvidia.com/gpu.count": str(shape.gpus),
        "nvidia.com/gpu.memory": str(shape.gpu_memory_mib),
        FAKE_NODE_LABEL: "true",
        "type": "kwok",
        **shape.extra_labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_NODE_ANNOTATION: "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {"taints": [dict(GPU_TAINT)] if shape.gpus else []},
        # The apiserver keeps status on Node create; kwok's node-initialize stage
        # then keeps these figures and adds conditions.
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "addresses": [
                {"type": "InternalIP", "address": node_internal_ip(name)},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": kubelet_version,
                "containerRuntimeVersion": "containerd://fake",
                "kernelVersion": "fake",
                "osImage": "kwok fake GPU node",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        },
    }


def node_is_ready(node) -> bool:
    """Whether a V1Node (kubernetes client model) reports Ready=True."""
    for condition in (node.status.conditions or []) if node.status else []:
        if condition.type == "Ready":
            return condition.status == "True"
    return False
