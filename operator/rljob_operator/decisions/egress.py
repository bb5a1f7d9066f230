"""Where a job's pods may connect to: the egress half of the job's NetworkPolicy (pure).

A trainer needs DNS, its gang's other pods (rendezvous, NCCL/Gloo on any port), the operator's
status API (heartbeats) and object storage (models, datasets, checkpoints); nothing downloads from a
hub at run time. Everything else is denied once a policy with policyType Egress selects the pods,
and the link-local ranges and the clouds' metadata and node-credential endpoints (``METADATA_CIDRS``,
the setting ``trainer_egress_metadata`` by default; on most clouds the node's IAM role or its agent's
certificates) are cut out of every address range allowed, as are the platform's own exceptions (the API
server's address, the Service range). A job's own code (its reward function) runs in those pods, so this
is what stops it from borrowing the node's identity. ``docs/egress.md`` lists each range per cloud and
says how to change the list. The rules are written as the API server stores them (protocols explicit),
so comparing them with the stored policy is exact. Enforcement is the network plugin's.
"""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import dataclass, field
from typing import Any

#: What trainers may never reach by default: link-local addresses, where every cloud serves its instance
#: metadata and node credentials, and the endpoints of that kind outside link-local (``docs/egress.md``: which
#: cloud, which service, where it is documented).
METADATA_CIDRS = (
    "169.254.0.0/16",     # IPv4 link-local: 169.254.169.254 (AWS, GCP, Azure, Oracle, OpenStack, DigitalOcean, ...),
                          # AWS ECS task credentials 169.254.170.2, EKS Pod Identity 169.254.170.23, Scaleway
                          # 169.254.42.42, Tencent 169.254.0.23
    "168.63.129.16/32",   # Azure WireServer (VM agent, certificates, extensions)
    "100.100.100.200/32",  # Alibaba Cloud ECS metadata (RAM role credentials)
    "192.0.0.192/32",     # Oracle Cloud Infrastructure Classic, Compute Cloud@Customer
    "fe80::/10",          # IPv6 link-local: OpenStack fe80::a9fe:a9fe
    "fd00:ec2::/32",      # AWS: IMDS fd00:ec2::254, EKS Pod Identity fd00:ec2::23, DNS, NTP
    "fd20:ce::254/128",   # Google Cloud over IPv6
    "fd00:c1::a9fe:a9fe/128",  # Oracle Cloud Infrastructure over IPv6
    "fd00:42::42/128",    # Scaleway over IPv6
)
#: The cluster DNS as kubeadm, kops, EKS, GKE and AKS deploy it.
KUBE_DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
NAMESPACE_NAME = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Egress:
    """The platform's egress settings for trainer pods (``OperatorSettings.trainer_*``)."""

    status_namespace: str
    """The operator's namespace: its pods' status API port is allowed."""
    status_port: int = 8443
    dns_to: tuple[dict[str, Any], ...] = (KUBE_DNS,)
    cidrs: tuple[str, ...] = ("0.0.0.0/0", "::/0")
    """Address ranges allowed on ``ports`` (object storage), less ``metadata_cidrs`` and ``except_cidrs`` (those
    inside each range: a range inside an excepted one, ``169.254.170.23/32`` say, is allowed whole)."""
    metadata_cidrs: tuple[str, ...] = METADATA_CIDRS
    except_cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = (443, 80)
    to: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """More NetworkPolicyPeers allowed on ``ports`` (an in-cluster object store, by its pods' labels)."""


def _ip_block(cidr: str, excepted: tuple[str, ...]) -> dict[str, Any]:
    """``cidr`` less every excepted range inside it (the API server refuses an except outside its cidr)."""
    network = ipaddress.ip_network(cidr, strict=False)
    inside = [e for e in excepted if (n := ipaddress.ip_network(e, strict=False)).version == network.version
              and n != network and n.subnet_of(network)]  # type: ignore[arg-type]
    return {"ipBlock": {"cidr": cidr, **({"except": inside} if inside else {})}}


def egress_rules(own: dict[str, Any], egress: Egress) -> list[dict[str, Any]]:
    """The egress rules of a job's NetworkPolicy; ``own`` selects the job's pods."""
    excepted = tuple(dict.fromkeys((*egress.metadata_cidrs, *egress.except_cidrs)))
    storage = [_ip_block(c, excepted) for c in egress.cidrs] + [copy.deepcopy(p) for p in egress.to]
    rules: list[dict[str, Any]] = [
        {"to": [{"podSelector": copy.deepcopy(own)}]},
        {"to": [copy.deepcopy(p) for p in egress.dns_to],
         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: egress.status_namespace}}}],
         "ports": [{"protocol": "TCP", "port": egress.status_port}]},
    ]
    if storage:
        rules.append({"to": storage, "ports": [{"protocol": "TCP", "port": p} for p in egress.ports]})
    return rules


def check_cidrs(cidrs: list[str], where: str) -> None:
    """Raise ValueError naming ``where`` unless every item is an IPv4 or IPv6 range (``10.0.0.0/8``)."""
    for i, cidr in enumerate(cidrs):
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError as e:
            raise ValueError(f"{where}[{i}]: {cidr!r} is not an address range (CIDR): {e}") from None


def check_ports(ports: list[str], where: str) -> list[int]:
    """The ports as numbers; ValueError naming ``where`` for one that is not 1–65535."""
    out = []
    for i, port in enumerate(ports):
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{where}[{i}]: {port!r} is not a port number (1-65535)")
        out.append(int(port))
    return out
