"""Operator settings: defaults, overridden by ``RLJOB_OPERATOR_*`` environment variables, then flags.

Every field's environment variable is its name in upper case with the prefix, for example
``RLJOB_OPERATOR_RESYNC_SECONDS=5`` (tests shorten the intervals this way);
``RLJOB_OPERATOR_NAMESPACES`` is comma-separated, ``RLJOB_OPERATOR_TRAINER_METRICS_FROM`` is JSON.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rljob_operator.decisions.egress import KUBE_DNS, Egress, check_cidrs, check_ports
from rljob_operator.names import TOKEN_AUDIENCE

ENV_PREFIX = "RLJOB_OPERATOR_"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _own_namespace() -> str | None:
    try:
        return Path(SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return os.environ.get("POD_NAMESPACE")


@dataclass
class OperatorSettings:
    """How one operator replica runs."""

    kubeconfig: str | None = None
    """Kubeconfig file (default: in-cluster service account, then ~/.kube/config)."""
    namespaces: list[str] = field(default_factory=list)
    """Namespaces to watch; empty watches the whole cluster."""
    operator_namespace: str = ""
    """Where the operator runs (its Lease, its TLS Secret, its Service). Default: the pod's
    namespace in a cluster, else the first watched namespace, else rljob-system."""
    service_name: str = "rljob-operator"
    """The operator's Service: trainers reach the status API at https://<service>.<namespace>.svc."""
    status_host: str = "0.0.0.0"
    status_port: int = 8443
    status_url: str | None = None
    """Base URL trainers send heartbeats to (default: https://<service>.<operator namespace>.svc:<port>)."""
    token_audience: str = TOKEN_AUDIENCE
    status_max_in_flight: int = 64
    """Status API requests handled at once; more are answered 429 (Retry-After: 1) right away."""
    status_rate_per_client: float = 10.0
    """Status API requests per second one client address may make on average (a token bucket);
    beyond it 429 with Retry-After. A trainer sends about one heartbeat per step."""
    status_burst_per_client: int = 40
    """Status API requests one client address may make at once before the rate applies."""
    status_review_threads: int = 4
    """Threads for the status API's TokenReviews, SubjectAccessReviews and reads, apart from the
    reconcile workers and the Lease's thread, so slow reviews cannot delay either."""
    status_negative_cache_seconds: float = 10.0
    """A token the API server rejected is answered 401 from memory this long (0: never), so
    repeating a junk token costs no TokenReview."""
    status_rate_per_job: float = 5.0
    """Heartbeats per second one job's workers may send on average (a token bucket per job, after
    the token is checked; fair between jobs whatever their addresses); beyond it 429 with
    Retry-After, which the trainer honours. A trainer sends about one heartbeat per logged step."""
    status_burst_per_job: int = 20
    """Heartbeats one job's workers may send at once before the per-job rate applies (a trainer sends
    one at a time; kept well under ``status_max_in_flight``, so a job's burst leaves most slots to others)."""
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    """CA trainers should trust when the serving certificate comes from files (default: the certificate)."""
    tls_secret: str | None = None
    """NAMESPACE/NAME of a Secret that shares one self-signed certificate between replicas and
    restarts (the CA trainers were given stays valid). Default in a cluster:
    <operator namespace>/<service name>-tls; outside one, a certificate per process."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080
    """/metrics, /healthz and /readyz."""
    leader_elect: bool = True
    """Hold a Lease so only one replica reconciles. Default: on in a cluster; off outside one (a
    developer's single replica, whose kubeconfig may point at a cluster without rljob-system)."""
    lease_name: str = "rljob-operator"
    lease_namespace: str | None = None
    """Default: operator_namespace."""
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
    lease_seconds: float = 15.0
    renew_seconds: float = 5.0
    retry_seconds: float = 2.0
    resync_seconds: float = 300.0
    """Every job is reconciled at least this often, events or not."""
    workers: int = 16
    """Jobs reconciled at once, each in a thread of its own; their concurrent requests get twice as many."""
    heartbeat_flush_seconds: float = 2.0
    """Heartbeats of one job are written to its status at most this often."""
    force_delete_after_seconds: float = 60.0
    """A worker pod still Terminating this long past its grace period is force-deleted (its node is gone)."""
    watch_nodes: bool = True
    """Watch Nodes (needs list and watch on nodes, cluster-wide): a gang with a worker on a Node that is
    deleted is restarted at once, its pods there force-deleted, rather than once the pod garbage
    collector removes them (40 s later). Without the permission it is off, with one warning."""
    network_policy: bool = True
    """Give every job a NetworkPolicy ``<job>-workers``: its pods accept traffic only from the job's own
    pods, and metrics scrapes from ``trainer_metrics_from``. Needs get, create, patch on networkpolicies."""
    trainer_metrics_from: list[dict[str, Any]] = field(default_factory=list)
    """NetworkPolicyPeers (JSON list) that may reach the trainers' metrics port, for example
    ``[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]``. Empty: none."""
    trainer_egress: bool = True
    """With ``network_policy``, restrict where a job's pods may connect to (policyType Egress): DNS
    (``trainer_dns_to``), the job's own pods, the status API (``status_port`` in the operator's namespace),
    and ``trainer_egress_cidrs`` and ``trainer_egress_to`` on ``trainer_egress_ports`` (object storage),
    never the cloud metadata endpoints (``decisions.egress.METADATA_ENDPOINTS``) nor ``trainer_egress_except``."""
    trainer_dns_to: list[dict[str, Any]] = field(default_factory=lambda: [copy.deepcopy(KUBE_DNS)])
    """NetworkPolicyPeers (JSON list) of the cluster DNS (UDP and TCP 53); default kube-system's kube-dns pods.
    With NodeLocal DNSCache add ``{"ipBlock": {"cidr": "169.254.20.10/32"}}``."""
    trainer_egress_cidrs: list[str] = field(default_factory=lambda: ["0.0.0.0/0", "::/0"])
    """Address ranges (comma-separated) trainers may reach on ``trainer_egress_ports``: object storage."""
    trainer_egress_except: list[str] = field(default_factory=list)
    """Ranges cut out of those besides the metadata endpoints: the API server's address, the Service range."""
    trainer_egress_ports: list[str] = field(default_factory=lambda: ["443", "80"])
    """TCP ports (comma-separated) of object storage."""
    trainer_egress_to: list[dict[str, Any]] = field(default_factory=list)
    """More NetworkPolicyPeers (JSON list) allowed on those ports, e.g. an in-cluster object store's pods."""
    kueue: bool = True
    """Honour the label ``kueue.x-k8s.io/queue-name``: such a job's gang waits for Kueue to admit its
    Workload (see the README's Kueue section). Needs Kueue's API; where it is not served, labelled
    jobs wait with reason KueueUnavailable. False: the label is ignored and such jobs run at once."""
    log_level: str = "INFO"
    # The platform's pod profile (``decisions.policy.PodProfile``): what a job's pods may ask for.
    pod_profile: str = "restricted"
    """Pod Security level of every pod the operator builds: restricted, baseline or privileged."""
    allowed_images: list[str] = field(default_factory=list)
    """Glob patterns a job's images must match (comma-separated); empty: rljob's trainer image
    (ghcr.io/rljob/trainer, any tag or digest); ``*`` allows any image."""
    allowed_service_accounts: list[str] = field(default_factory=list)
    """ServiceAccounts a job may name besides the namespace's ``default`` (comma-separated)."""
    allow_secret_references: bool = True
    """Jobs may name Secrets (credentialsSecret, secretKeyRef, secret volumes); the chart's admission
    policies check that the job's creator may read them."""
    allow_trust_remote_code: bool = False
    """Jobs may set trust_remote_code (run Python code shipped with a model)."""

    @property
    def effective_status_url(self) -> str:
        if self.status_url:
            return self.status_url.rstrip("/")
        return f"https://{self.service_name}.{self.operator_namespace}.svc:{self.status_port}"

    @property
    def effective_lease_namespace(self) -> str:
        return self.lease_namespace or self.operator_namespace

    def check_network(self) -> None:
        """Raise ValueError naming the variable of a NetworkPolicy setting the API server would refuse (checked at
        start: otherwise only when a job needs its policy)."""
        for name in ("trainer_metrics_from", "trainer_dns_to", "trainer_egress_to"):
            check_peers(getattr(self, name), ENV_PREFIX + name.upper())
        for name in ("trainer_egress_cidrs", "trainer_egress_except"):
            check_cidrs(getattr(self, name), ENV_PREFIX + name.upper())
        check_ports(self.trainer_egress_ports, ENV_PREFIX + "TRAINER_EGRESS_PORTS")

    def egress(self) -> Egress | None:
        """Where every job's pods may connect to (None: anywhere; its NetworkPolicy restricts ingress only)."""
        if not self.trainer_egress:
            return None
        return Egress(
            status_namespace=self.operator_namespace, status_port=self.status_port, dns_to=tuple(self.trainer_dns_to),
            cidrs=tuple(self.trainer_egress_cidrs), except_cidrs=tuple(self.trainer_egress_except),
            ports=tuple(check_ports(self.trainer_egress_ports, ENV_PREFIX + "TRAINER_EGRESS_PORTS")),
            to=tuple(self.trainer_egress_to),
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> OperatorSettings:
        """Defaults ← ``RLJOB_OPERATOR_*`` ← ``overrides`` (those not None)."""
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                try:
                    values[f.name] = _convert(f.type, raw)
                except ValueError as e:  # name the variable: the error alone does not say which one
                    raise ValueError(f"{ENV_PREFIX + f.name.upper()}={raw!r}: {e}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        in_cluster = _own_namespace()
        if values.get("leader_elect") is None and not in_cluster:
            values["leader_elect"] = False
        if not values.get("operator_namespace"):
            values["operator_namespace"] = (
                in_cluster or next(iter(values.get("namespaces") or []), None) or "rljob-system"
            )
        settings = cls(**values)
        settings.check_network()
        if settings.tls_secret is None and in_cluster and not settings.tls_cert_file:
            settings.tls_secret = f"{settings.operator_namespace}/{settings.service_name}-tls"
        return settings


#: What a NetworkPolicyPeer may hold, and what each of its selectors may hold.
_PEER_KEYS = {"podSelector", "namespaceSelector", "ipBlock"}
_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}


def check_peers(peers: Any, where: str) -> None:
    """Raise ValueError naming ``where`` unless ``peers`` is a list of NetworkPolicyPeer objects.

    Checked at start: the API server would refuse the policy only when a job needs it.
    """
    if not isinstance(peers, list):
        raise ValueError(f"{where}: expected a JSON list of NetworkPolicyPeer objects, got {type(peers).__name__}")
    for i, peer in enumerate(peers):
        if not isinstance(peer, dict) or not peer or set(peer) - _PEER_KEYS:
            raise ValueError(f"{where}[{i}]: a NetworkPolicyPeer has only {sorted(_PEER_KEYS)}, got {peer!r}")
        for key in ("podSelector", "namespaceSelector"):
            selector = peer.get(key, {})
            if not isinstance(selector, dict) or set(selector) - _SELECTOR_KEYS:
                raise ValueError(f"{where}[{i}].{key}: a label selector has only {sorted(_SELECTOR_KEYS)}, "
                                 f"got {selector!r}")


def _convert(kind: Any, raw: str) -> Any:
    kind = str(kind)
    if kind.startswith("list[dict"):
        return json.loads(raw) if raw.strip() else []
    if kind.startswith("list"):
        return [p.strip() for p in raw.split(",") if p.strip()]
    if kind == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw
