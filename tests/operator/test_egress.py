"""Where a job's pods may connect to (``decisions.egress``), evaluated as a network plugin evaluates a
NetworkPolicy's egress rules to addresses; and the settings refused at start, naming the variable.

The test control plane runs no network plugin that enforces NetworkPolicies, so enforcement itself is
not tested here: the API server's acceptance of the policy is (``tests/operator/test_network_cluster.py``), and
these tests check what the rules allow.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from rljob_operator.decisions.egress import METADATA_CIDRS, Egress, egress_rules
from rljob_operator.settings import OperatorSettings


def allowed(spec: dict[str, Any], address: str, port: int, protocol: str = "TCP") -> bool:
    """Whether an egress rule of ``spec`` admits a connection to ``address:port`` by its ipBlocks."""
    ip = ipaddress.ip_address(address)
    for rule in spec.get("egress") or []:
        ports = rule.get("ports")
        if ports and not any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports):
            continue
        for peer in rule.get("to") or []:
            block = peer.get("ipBlock")
            if block is None or ip.version != ipaddress.ip_network(block["cidr"]).version:
                continue
            if ip in ipaddress.ip_network(block["cidr"]) and not any(
                    ip in ipaddress.ip_network(e) for e in block.get("except", [])):
                return True
    return False


OWN = {"matchLabels": {"rljob.dev/job": "st"}}


def test_the_rules_allow_dns_peers_status_api_and_storage_only() -> None:
    rules = egress_rules(OWN, Egress(status_namespace="rljob-system", status_port=8443))
    spec = {"egress": rules}
    assert rules[0] == {"to": [{"podSelector": OWN}]}  # the gang's own pods, every port (NCCL)
    assert rules[1]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert rules[2]["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert [p["port"] for p in rules[3]["ports"]] == [443, 80]
    assert allowed(spec, "8.8.8.8", 443) and allowed(spec, "2001:db8::1", 80)
    assert not allowed(spec, "8.8.8.8", 22) and not allowed(spec, "8.8.8.8", 53, "UDP")  # DNS only to the peers
    for address in METADATA_ENDPOINTS:
        assert not allowed(spec, address, 80) and not allowed(spec, address, 443), address


#: Every metadata and node-credential endpoint ``docs/egress.md`` names, and more link-local addresses.
METADATA_ENDPOINTS = (
    "169.254.169.254", "169.254.170.2", "169.254.170.23", "169.254.42.42", "169.254.0.23", "169.254.1.1",
    "168.63.129.16", "100.100.100.200", "192.0.0.192",
    "fd00:ec2::254", "fd00:ec2::23", "fd20:ce::254", "fd00:c1::a9fe:a9fe", "fd00:42::42", "fe80::a9fe:a9fe",
    "fe80::1",
)


def test_link_local_and_every_clouds_metadata_endpoint_are_excepted_by_default_and_nothing_near_them() -> None:
    spec = {"egress": egress_rules(OWN, Egress(status_namespace="ops"))}
    assert spec["egress"][3]["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "168.63.129.16/32", "100.100.100.200/32",
                                                     "192.0.0.192/32"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::/32", "fd20:ce::254/128",
                                                "fd00:c1::a9fe:a9fe/128", "fd00:42::42/128"]}}]
    assert {str(ipaddress.ip_network(c)) for c in METADATA_CIDRS} == set(METADATA_CIDRS)  # written as stored
    for address in METADATA_ENDPOINTS:
        assert any(ipaddress.ip_address(address) in ipaddress.ip_network(c) for c in METADATA_CIDRS), address
    # Only those: the neighbours of the /32s and /128s stay reachable object storage.
    for address in ("168.63.129.17", "100.100.100.201", "169.253.255.255", "169.255.0.0", "fd20:ce::253",
                    "fd00:ec3::254", "fec0::1"):
        assert allowed(spec, address, 443), address


def test_one_endpoint_inside_the_list_is_reached_by_adding_it_to_cidrs() -> None:
    """EKS Pod Identity (169.254.170.23, fd00:ec2::23) serves a pod its own role: a platform that uses it lists
    it among the ranges allowed, where it is a peer of its own, and the rest of link-local stays cut out."""
    egress = Egress(status_namespace="ops", cidrs=("0.0.0.0/0", "::/0", "169.254.170.23/32", "fd00:ec2::23/128"))
    spec = {"egress": egress_rules(OWN, egress)}
    assert allowed(spec, "169.254.170.23", 80) and allowed(spec, "fd00:ec2::23", 80)
    assert not allowed(spec, "169.254.169.254", 80) and not allowed(spec, "fd00:ec2::254", 80)
    # And the list itself is a setting: replaced whole, as the platform writes it.
    settings = OperatorSettings.from_env({"RLJOB_OPERATOR_TRAINER_EGRESS_METADATA": "169.254.169.254/32"})
    egress = settings.egress()
    assert egress is not None and egress.metadata_cidrs == ("169.254.169.254/32",)
    assert OperatorSettings().trainer_egress_metadata == list(METADATA_CIDRS)


def test_an_exception_outside_a_range_is_left_out_of_it_and_extra_peers_share_the_ports() -> None:
    minio = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "minio"}}}
    rules = egress_rules(OWN, Egress(status_namespace="ops", cidrs=("52.216.0.0/15",),
                                     except_cidrs=("10.96.0.0/12", "52.216.0.1/32"), ports=(9000,), to=(minio,)))
    # The API server refuses an except outside its cidr: only those inside are written.
    assert rules[3] == {"to": [{"ipBlock": {"cidr": "52.216.0.0/15", "except": ["52.216.0.1/32"]}}, minio],
                        "ports": [{"protocol": "TCP", "port": 9000}]}


@pytest.mark.parametrize("variable,value,message", [
    ("TRAINER_EGRESS_CIDRS", "10.0.0.0/33", "is not an address range"),
    ("TRAINER_EGRESS_CIDRS", "10.0.0.1/8", "is not an address range"),  # host bits set: the API server refuses it
    ("TRAINER_EGRESS_EXCEPT", "metadata", "is not an address range"),
    ("TRAINER_EGRESS_METADATA", "169.254.169.254/32,imds", "is not an address range"),
    ("TRAINER_EGRESS_METADATA", "169.254.0.0/8", "is not an address range"),
    ("TRAINER_EGRESS_PORTS", "443,0", "is not a port number"),
    ("TRAINER_EGRESS_PORTS", "https", "is not a port number"),
    ("TRAINER_DNS_TO", '[{"service": "kube-dns"}]', "a NetworkPolicyPeer has only"),
    ("TRAINER_EGRESS_TO", '{"ipBlock": {}}', "expected a JSON list"),
])
def test_bad_egress_settings_are_refused_at_start_naming_the_variable(variable: str, value: str,
                                                                      message: str) -> None:
    with pytest.raises(ValueError, match=f"RLJOB_OPERATOR_{variable}.*{message}"):
        OperatorSettings.from_env({f"RLJOB_OPERATOR_{variable}": value})


def test_egress_follows_the_settings() -> None:
    settings = OperatorSettings.from_env({"RLJOB_OPERATOR_OPERATOR_NAMESPACE": "ops",
                                          "RLJOB_OPERATOR_TRAINER_EGRESS_PORTS": "443,9000"})
    egress = settings.egress()
    assert egress is not None and egress.status_namespace == "ops" and egress.ports == (443, 9000)
    assert OperatorSettings.from_env({"RLJOB_OPERATOR_TRAINER_EGRESS": "false"}).egress() is None
