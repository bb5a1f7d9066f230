"""Operator settings: defaults, overridden by ``RLJOB_OPERATOR_*`` environment variables, then flags.

Every setting is declared once, below, with :func:`setting`: its type and default (the field's), a
description, and where it has them its ``rljob operator`` flag and the Helm chart value that sets it.
The flags are built from these declarations (``rljob.cli``), the table of docs/reference/operator-settings.md
is generated from them (``make generate``), and tests check the chart's and kustomize's deployment env against them.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rljob_operator.decisions.egress import KUBE_DNS, METADATA_CIDRS, Egress, check_cidrs, check_ports
from rljob_operator.names import TOKEN_AUDIENCE

ENV_PREFIX = "RLJOB_OPERATOR_"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: ``chart=`` of a setting the chart and the kustomize base set without a value of their own
#: (the pod's namespace or name, the release's names, the TLS source).
BY_CHART = "(set by the chart)"


def _own_namespace() -> str | None:
    try:
        return Path(SA_NAMESPACE_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return os.environ.get("POD_NAMESPACE")


class Flag(NamedTuple):
    """The ``rljob operator`` flag that overrides a setting (its help as ``--help`` prints it)."""

    name: str
    help: str


@dataclass(frozen=True)
class SettingInfo:
    """What :func:`setting` records beside a field's type and default."""

    help: str
    flag: Flag | None = None
    chart: str | None = None
    """The chart's values path that sets the variable, :data:`BY_CHART`, or None: the deployments leave it
    at its default (``operator.extraEnv`` sets it)."""
    shown_default: str | None = None
    """The default as the settings table shows it, where it is not a constant."""


def setting(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, help: str,
            flag: Flag | None = None, chart: str | None = None, shown_default: str | None = None) -> Any:
    """One setting: a dataclass field whose metadata holds its :class:`SettingInfo`."""
    info = {"setting": SettingInfo(help, flag, chart, shown_default)}
    if factory is not None:
        return field(default_factory=factory, metadata=info)
    return field(default=default, metadata=info)


def env_name(name: str) -> str:
    """The environment variable of the setting ``name``."""
    return ENV_PREFIX + name.upper()


def env_text(value: Any) -> str:
    """``value`` as its variable spells it (what ``from_env`` reads back): lists of names comma-separated,
    lists of objects as JSON, booleans in lower case, None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        if any(isinstance(v, dict) for v in value):
            return json.dumps(value, separators=(",", ":"))
        return ",".join(str(v) for v in value)
    return str(value)


def setting_infos() -> dict[str, SettingInfo]:
    """Every setting's name → its :class:`SettingInfo`, in declaration order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(OperatorSettings)}


#: The least ``capacity_refresh_seconds`` may be: a tenant's Capacity jobs decide how often they look, the
#: platform how often the operator reads every pod of the cluster for them (issue #43 point 4).
MIN_CAPACITY_REFRESH_SECONDS = 10.0


@dataclass
class OperatorSettings:
    """How one operator replica runs."""

    kubeconfig: str | None = setting(
        None, help="Kubeconfig file (default: in-cluster service account, then ~/.kube/config).",
        flag=Flag("--kubeconfig", "kubeconfig file (default: in-cluster, then ~/.kube/config)"))
    namespaces: list[str] = setting(
        factory=list, help="Namespaces to watch (comma-separated); empty watches the whole cluster.",
        flag=Flag("--namespace", "watch only this namespace (repeatable; default: all)"), chart="watchNamespaces")
    operator_namespace: str = setting(
        "", help="Where the operator runs (its Lease, its TLS Secret, its Service). Default: the pod's "
        "namespace in a cluster, else the first watched namespace, else rljob-system.",
        flag=Flag("--operator-namespace", "namespace of the operator's Lease, Secret and Service; must exist "
                  "(default: its pod's, else the first --namespace, else rljob-system)"), chart=BY_CHART)
    service_name: str = setting(
        "rljob-operator", help="The operator's Service: trainers reach the status API at "
        "https://<service>.<namespace>.svc.", chart=BY_CHART)
    status_host: str = setting("0.0.0.0", help="Address the status API listens on.")
    status_port: int = setting(
        8443, help="HTTPS port of the status API (trainers' heartbeats).",
        flag=Flag("--status-port", "status API HTTPS port (default 8443)"), chart="statusAPI.port")
    status_url: str | None = setting(
        None, help="Base URL trainers send heartbeats to (default: https://<service>.<operator namespace>.svc:<port>).",
        flag=Flag("--status-url", "base URL trainers send heartbeats to"), chart="statusAPI.url")
    token_audience: str = setting(
        TOKEN_AUDIENCE, help="Audience of the projected service-account tokens trainers authenticate with.")
    status_max_in_flight: int = setting(
        64, help="Status API requests handled at once; more are answered 429 (Retry-After: 1) right away.",
        chart="statusAPI.limits.maxInFlight")
    status_rate_per_client: float = setting(
        10.0, help="Status API requests per second one client address may send on average (a token bucket); "
        "beyond it 429 with Retry-After. A trainer sends about one heartbeat per step.",
        chart="statusAPI.limits.ratePerClient")
    status_burst_per_client: int = setting(
        40, help="Status API requests one client address may send at once before the rate applies.",
        chart="statusAPI.limits.burstPerClient")
    status_review_threads: int = setting(
        4, help="Threads for the status API's TokenReviews, SubjectAccessReviews and reads, apart from the "
        "reconcile workers and the Lease's thread, so slow reviews cannot delay either.",
        chart="statusAPI.limits.reviewThreads")
    status_negative_cache_seconds: float = setting(
        10.0, help="A token the API server rejected is answered 401 from memory this long (0: never), so "
        "repeating a junk token costs no TokenReview.", chart="statusAPI.limits.negativeCacheSeconds")
    status_rate_per_job: float = setting(
        5.0, help="Heartbeats per second one job's workers may send on average (a token bucket per job, after "
        "the token is checked; fair between jobs whatever their addresses); beyond it 429 with Retry-After, "
        "which the trainer honours. A trainer sends about one heartbeat per logged step.",
        chart="statusAPI.limits.ratePerJob")
    status_burst_per_job: int = setting(
        20, help="Heartbeats one job's workers may send at once before the per-job rate applies (a trainer sends "
        "one at a time; kept well under ``status_max_in_flight``, so a job's burst leaves most slots to others).",
        chart="statusAPI.limits.burstPerJob")
    tls_cert_file: str | None = setting(
        None, help="Serving certificate of the status API (default: self-signed, see ``tls_secret``).",
        flag=Flag("--tls-cert-file", "status API certificate (default: self-signed)"), chart=BY_CHART)
    tls_key_file: str | None = setting(
        None, help="Private key of ``tls_cert_file``.",
        flag=Flag("--tls-key-file", "status API private key"), chart=BY_CHART)
    tls_ca_file: str | None = setting(
        None, help="CA trainers should trust when the serving certificate comes from files (default: the "
        "certificate).", chart=BY_CHART)
    tls_secret: str | None = setting(
        None, help="NAMESPACE/NAME of a Secret that shares one self-signed certificate between replicas and "
        "restarts (the CA trainers were given stays valid). Default in a cluster: "
        "<operator namespace>/<service name>-tls; outside one, a certificate per process.",
        flag=Flag("--tls-secret", "NAMESPACE/NAME: share one self-signed certificate between replicas"),
        chart="statusAPI.tls.secretName")
    metrics_host: str = setting("0.0.0.0", help="Address /metrics, /healthz and /readyz listen on.")
    metrics_port: int = setting(
        8080, help="Port of /metrics, /healthz and /readyz.",
        flag=Flag("--metrics-port", "/metrics, /healthz, /readyz port (default 8080)"), chart="metrics.port")
    leader_elect: bool = setting(
        True, help="Hold a Lease so only one replica reconciles. Default: on in a cluster; off outside one (a "
        "developer's single replica, whose kubeconfig may point at a cluster without rljob-system).",
        flag=Flag("--leader-elect", "hold a Lease so only one replica reconciles (default: on in a cluster; off "
                  "outside one, where a developer runs a single replica)"), chart="leaderElection.enabled")
    lease_name: str = setting("rljob-operator", help="Name of the leader-election Lease.", chart=BY_CHART)
    lease_namespace: str | None = setting(None, help="Namespace of the Lease (default: ``operator_namespace``).")
    identity: str = setting(
        factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
        help="This replica's Lease holder identity (default: hostname-random; the chart: the pod's name).",
        flag=Flag("--identity", "this replica's Lease holder identity (default: hostname-random)"), chart=BY_CHART,
        shown_default="<hostname>-<random>")
    lease_seconds: float = setting(
        15.0, help="Seconds without renewal after which another replica may take the Lease over.",
        chart="leaderElection.leaseDurationSeconds")
    renew_seconds: float = setting(5.0, help="Seconds between renewals of the Lease by its holder.",
                                   chart="leaderElection.renewSeconds")
    retry_seconds: float = setting(2.0, help="Seconds between attempts of a standby replica to acquire the Lease.",
                                   chart="leaderElection.retrySeconds")
    resync_seconds: float = setting(300.0, help="Every job is reconciled at least this often, events or not.",
                                    chart="operator.resyncSeconds")
    workers: int = setting(
        32, help="Jobs reconciled at once, each in a thread of its own; their concurrent requests get twice as many.",
        chart="operator.workers")
    heartbeat_flush_seconds: float = setting(
        2.0, help="Heartbeats of one job are written to its status at most this often.",
        chart="operator.heartbeatFlushSeconds")
    force_delete_after_seconds: float = setting(
        60.0, help="A worker pod still Terminating this long past its grace period is force-deleted (its node "
        "is gone).")
    watch_nodes: bool = setting(
        True, help="Watch Nodes (needs list and watch on nodes, cluster-wide): a gang with a worker on a Node "
        "that is deleted is restarted at once, its pods there force-deleted, rather than once the pod garbage "
        "collector removes them (40 s later). Without the permission it is off, with one warning.")
    capacity_refresh_seconds: float = setting(
        30.0, help="Jobs with ``autoscaling.policy: Capacity`` share one look at the cluster's nodes and bound pods "
        "(every pod of the cluster, read in pages) for this long, whatever their ``checkIntervalSeconds``; the "
        "Node watch (``watch_nodes``) renews it when a node comes, goes or changes what it offers. At least "
        f"{MIN_CAPACITY_REFRESH_SECONDS:g}: each look reads every pod of the cluster.")
    network_policy: bool = setting(
        True, help="Give every job a NetworkPolicy ``<job>-workers``: its pods accept traffic only from the job's "
        "own pods, and metrics scrapes from ``trainer_metrics_from``. Needs get, create, patch on "
        "networkpolicies.", chart="networkPolicy.enabled")
    trainer_metrics_from: list[dict[str, Any]] = setting(
        factory=list, help="NetworkPolicyPeers (JSON list) that may reach the trainers' metrics port, for example "
        '``[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, '
        '"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]``. Empty: none.',
        chart="networkPolicy.monitoring")
    trainer_egress: bool = setting(
        True, help="With ``network_policy``, restrict where a job's pods may connect to (policyType Egress): DNS "
        "(``trainer_dns_to``), the job's own pods, the status API (``status_port`` in the operator's namespace), "
        "and ``trainer_egress_cidrs`` and ``trainer_egress_to`` on ``trainer_egress_ports`` (object storage), "
        "never ``trainer_egress_metadata`` nor ``trainer_egress_except``.", chart="networkPolicy.trainerEgress.enabled")
    trainer_dns_to: list[dict[str, Any]] = setting(
        factory=lambda: [copy.deepcopy(KUBE_DNS)], help="NetworkPolicyPeers (JSON list) of the cluster DNS (UDP "
        "and TCP 53); default kube-system's kube-dns pods. With NodeLocal DNSCache add "
        '``{"ipBlock": {"cidr": "169.254.20.10/32"}}``.', chart="networkPolicy.trainerEgress.dns")
    trainer_egress_cidrs: list[str] = setting(
        factory=lambda: ["0.0.0.0/0", "::/0"], help="Address ranges (comma-separated) trainers may reach on "
        "``trainer_egress_ports``: object storage.", chart="networkPolicy.trainerEgress.cidrs")
    trainer_egress_metadata: list[str] = setting(
        factory=lambda: list(METADATA_CIDRS), help="Ranges (comma-separated) cut out of ``trainer_egress_cidrs``: "
        "link-local (169.254.0.0/16, fe80::/10) and the clouds' metadata and node-credential endpoints outside it "
        "(``decisions.egress.METADATA_CIDRS``; docs/egress.md lists them per cloud). Replace it only to drop an "
        "entry; to let trainers reach one endpoint inside it (EKS Pod Identity's 169.254.170.23/32), add that "
        "endpoint to ``trainer_egress_cidrs``.", chart="networkPolicy.trainerEgress.metadataCIDRs")
    trainer_egress_except: list[str] = setting(
        factory=list, help="Ranges cut out of those besides ``trainer_egress_metadata``: the API server's address, "
        "the Service range.", chart="networkPolicy.trainerEgress.exceptCIDRs")
    trainer_egress_ports: list[str] = setting(
        factory=lambda: ["443", "80"], help="TCP ports (comma-separated) of object storage.",
        chart="networkPolicy.trainerEgress.ports")
    trainer_egress_to: list[dict[str, Any]] = setting(
        factory=list, help="More NetworkPolicyPeers (JSON list) allowed on those ports, e.g. an in-cluster object "
        "store's pods.", chart="networkPolicy.trainerEgress.to")
    kueue: bool = setting(
        True, help="Honour the label ``kueue.x-k8s.io/queue-name``: such a job's gang waits for Kueue to admit "
        "its Workload (docs/guides/kueue.md). Needs Kueue's API; where it is not served, labelled "
        "jobs wait with reason KueueUnavailable. False: the label is ignored and such jobs run at once.",
        chart="kueue.enabled")
    require_queue: bool = setting(
        False, help="Every job runs through a Kueue LocalQueue: a job that names none (label "
        "``kueue.x-k8s.io/queue-name``) waits, phase Queued, reason QueueRequired, and a running one is stopped, "
        "until it is labelled. The operator's own check, whatever the admission policies say (the chart's "
        "``<release>-queues`` policy refuses such a job at ``kubectl apply`` with the same value). A job once queued "
        "runs only through its queue in any case (``status.queue``). Needs ``kueue``.", chart="kueue.requireQueue")
    kueue_counts_resource_claims: bool = setting(
        False, help="The platform's Kueue counts DRA claims: its feature gate DynamicResourceAllocation is on and "
        "every DeviceClass the runtimes' ResourceClaimTemplates use is in its ``resources.deviceClassMappings``. "
        "False: a queued job whose pods would carry ``resourceClaims`` fails (PolicyViolation), since its quota "
        "would never see those devices. A pre-made ResourceClaim (``resourceClaimName``) is refused in a queued job "
        "either way: Kueue never counts one.", chart="kueue.countsResourceClaims")
    admission_policies: list[str] = setting(
        factory=lambda: ["rljob-job-references", "rljob-queues", "rljob-runtime-use", "rljob-runtime-references",
                         "rljob-worker-pods"],
        help="ValidatingAdmissionPolicies (comma-separated names) that must be in force, each bound with "
        "validationActions Deny: they refuse a job naming an object its creator may not use or running on a "
        "runtime its creator may not use, an RLTrainingRuntime naming a Secret, ConfigMap, PersistentVolumeClaim "
        "or ServiceAccount its writer may not use, a queued job's loss of its queue label, and a pod claiming to be "
        "a job's worker (an ownerReference to an RLTrainingJob) from anyone who may not patch that job's status, "
        "which the operator cannot check itself (it never sees who wrote a job or a pod). Missing or not of this "
        "version: the operator refuses to start (exit 2); gone later: /readyz answers 503 and reconciles pause "
        "until they are back (docs/security-policies.md). Needs get on validatingadmissionpolicies and list on "
        "their bindings.",
        chart=BY_CHART,
        shown_default="rljob-job-references,rljob-queues,rljob-runtime-use,rljob-runtime-references,"
        "rljob-worker-pods")
    without_admission_policies: bool = setting(
        False, help="Run with no admission policy checked. Any job creator can then name every Secret, ConfigMap, "
        "PersistentVolumeClaim and ServiceAccount of their namespace through the operator, and take a queued job "
        "out of its queue, and anyone who may create pods in a namespace can make one that counts as a job's worker "
        "and reports its progress: only for a cluster that enforces the same rules another way (Kyverno, Gatekeeper) or a "
        "throwaway one. Logged as an ERROR at start; rljob_operator_admission_policies_in_force stays 0.",
        flag=Flag("--without-admission-policies", "run although no admission policy checks what job creators "
                  "name (only where the same rules are enforced another way; see docs/security-policies.md)"),
        chart="admissionPolicies.acknowledgeDisabled")
    admission_recheck_seconds: float = setting(
        30.0, help="How often every replica asks again whether the admission policies are in force (its "
        "readiness; the leader pauses while they are not).")
    log_level: str = setting(
        "INFO", help="Log level: DEBUG, INFO, WARNING or ERROR.",
        flag=Flag("--log-level", "DEBUG, INFO, WARNING (default INFO)"), chart="operator.logLevel")
    # The platform's pod profile (``decisions.policy.PodProfile``): what a job's pods may ask for.
    pod_profile: str = setting(
        "restricted", help="Pod Security level of every pod the operator builds: restricted, baseline or "
        "privileged.", chart="podProfile.profile")
    allowed_images: list[str] = setting(
        factory=list, help="Glob patterns a job's images must match (comma-separated); empty: rljob's trainer "
        "image (ghcr.io/rljob/trainer, any tag or digest); ``*`` allows any image.",
        chart="podProfile.allowedImages")
    allowed_service_accounts: list[str] = setting(
        factory=list, help="ServiceAccounts a job may name besides the namespace's ``default`` "
        "(comma-separated).", chart="podProfile.allowedServiceAccounts")
    allow_secret_references: bool = setting(
        True, help="Jobs may name Secrets (credentialsSecret, secretKeyRef, secret volumes); the chart's "
        "admission policies check that the job's creator may read them.",
        chart="podProfile.allowSecretReferences")
    allow_trust_remote_code: bool = setting(
        False, help="Jobs may set trust_remote_code (run Python code shipped with a model).",
        chart="podProfile.allowTrustRemoteCode")

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
            check_peers(getattr(self, name), env_name(name))
        for name in ("trainer_egress_cidrs", "trainer_egress_metadata", "trainer_egress_except"):
            check_cidrs(getattr(self, name), env_name(name))
        check_ports(self.trainer_egress_ports, env_name("trainer_egress_ports"))

    def check_queue(self) -> None:
        """Raise ValueError when a queue is required but Kueue's label is ignored: no job could run."""
        if self.require_queue and not self.kueue:
            raise ValueError(f"{env_name('require_queue')}=true needs {env_name('kueue')}=true: with Kueue's label "
                             "ignored no job could ever be queued")

    def egress(self) -> Egress | None:
        """Where every job's pods may connect to (None: anywhere; its NetworkPolicy restricts ingress only)."""
        if not self.trainer_egress:
            return None
        return Egress(
            status_namespace=self.operator_namespace, status_port=self.status_port, dns_to=tuple(self.trainer_dns_to),
            cidrs=tuple(self.trainer_egress_cidrs), metadata_cidrs=tuple(self.trainer_egress_metadata),
            except_cidrs=tuple(self.trainer_egress_except),
            ports=tuple(check_ports(self.trainer_egress_ports, env_name("trainer_egress_ports"))),
            to=tuple(self.trainer_egress_to),
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> OperatorSettings:
        """Defaults ← ``RLJOB_OPERATOR_*`` ← ``overrides`` (those not None)."""
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(env_name(f.name))
            if raw is not None:
                try:
                    values[f.name] = _convert(f.type, raw)
                except ValueError as e:  # name the variable: the error alone does not say which one
                    raise ValueError(f"{env_name(f.name)}={raw!r}: {e}") from None
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
        settings.check_queue()
        if settings.capacity_refresh_seconds < MIN_CAPACITY_REFRESH_SECONDS:
            raise ValueError(f"{env_name('capacity_refresh_seconds')}={settings.capacity_refresh_seconds:g}: at least "
                             f"{MIN_CAPACITY_REFRESH_SECONDS:g} (each look at capacity reads every pod of the cluster)")
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
