"""Command lines of the control-plane components, as pure functions of a layout.

Kept apart from process handling so the flags, and why each is there, read in
one place. Every component listens on 127.0.0.1 only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.cluster import nodes, pki, realnode

if TYPE_CHECKING:
    from tests.cluster.controlplane import ClusterConfig

STAGES_FILE = Path(__file__).with_name("kwok_stages.yaml")
AUDIT_POLICY = "audit-policy.yaml"
AUDIT_LOG = "audit.log"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
POD_CIDR = "10.128.0.1/16"
# Client identities: the bootstrap RBAC policy already grants the two system
# users what their components need; admin and kwok act as system:masters.
CLIENT_IDENTITIES = {
    "admin": ("rljob-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
}
APISERVER_NAMES = (
    "127.0.0.1",
    "localhost",
    pki.KUBERNETES_SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Layout:
    """Where one control plane keeps its binaries and files, and its ports."""

    bin: Path
    workdir: Path
    ports: dict[str, int]

    def binary(self, name: str) -> str:
        """Path of one pinned binary."""
        return str(self.bin / name)

    def path(self, *parts: str) -> Path:
        """A path inside the work directory."""
        return self.workdir.joinpath(*parts)

    def cert(self, name: str) -> Path:
        """PEM certificate ``name`` (``ca``, ``apiserver``, ``admin``, ...)."""
        return self.path("pki", f"{name}.crt")

    def key(self, name: str) -> Path:
        """PEM private key ``name`` (``sa`` signs service-account tokens)."""
        return self.path("pki", f"{name}.key")

    def kubeconfig(self, user: str) -> Path:
        """Kubeconfig of a client identity; the admin one is ``<workdir>/kubeconfig``."""
        return self.path("kubeconfig" if user == "admin" else f"{user}.kubeconfig")

    @property
    def server(self) -> str:
        """kube-apiserver URL."""
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        """etcd client URL."""
        return f"http://127.0.0.1:{self.ports['etcd']}"


def write_credentials(layout: Layout) -> None:
    """Create the CA, serving and client certificates, SA keys and kubeconfigs."""
    authority = pki.ClusterPKI(layout.path("pki"))
    authority.issue("apiserver", "kube-apiserver", server_names=APISERVER_NAMES)
    authority.service_account_keys()
    for user, (common_name, organization) in CLIENT_IDENTITIES.items():
        client = authority.issue(user, common_name, organization)
        pki.write_kubeconfig(
            layout.kubeconfig(user), layout.server, authority.ca.cert, user=user, client=client
        )


def etcd_argv(layout: Layout) -> list[str]:
    """etcd: one member, data in ``<workdir>/etcd``."""
    peer = f"http://127.0.0.1:{layout.ports['etcd-peer']}"
    return [
        layout.binary("etcd"),
        "--name=rljob",
        f"--data-dir={layout.path('etcd')}",
        f"--listen-client-urls={layout.etcd_url}",
        f"--advertise-client-urls={layout.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=rljob={peer}",
        # Test data is disposable; fsync on every write only costs time.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


#: The resource kube-apiserver keeps no watch cache of (``apiserver_argv``).
UNCACHED_RESOURCE = "podtemplates"


def apiserver_argv(layout: Layout, config: ClusterConfig) -> list[str]:
    """kube-apiserver: TLS, client certificates, RBAC, service-account tokens."""
    toleration = str(config.eviction_toleration_s)
    return [
        layout.binary("kube-apiserver"),
        f"--etcd-servers={layout.etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={layout.ports['apiserver']}",
        # The kubernetes Service may not point at loopback; fake pods never call it.
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={layout.cert('apiserver')}",
        f"--tls-private-key-file={layout.key('apiserver')}",
        f"--client-ca-file={layout.cert('ca')}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={layout.path('pki', 'sa.pub')}",
        f"--service-account-signing-key-file={layout.key('sa')}",
        f"--service-cluster-ip-range={pki.SERVICE_CLUSTER_IP_RANGE}",
        # DefaultTolerationSeconds gives every pod these NoExecute tolerations.
        f"--default-not-ready-toleration-seconds={toleration}",
        f"--default-unreachable-toleration-seconds={toleration}",
        "--allow-privileged=true",
        # On SIGTERM, end open watches (clients re-list elsewhere, or after the restart) instead of
        # serving them until they end themselves: without it one watch kept a stopping API server up
        # past the harness's 10 s, so every restart and every session's end waited out the SIGKILL.
        "--shutdown-watch-termination-grace-period=2s",
        "--profiling=false",
        # PodTemplates (which nothing here uses) without the watch cache: their watches are served by etcd,
        # so a test can compact etcd's history and see a watch resumed from before it answered 410 Gone.
        f"--watch-cache-sizes={UNCACHED_RESOURCE}#0",
        f"--v={config.log_verbosity}",
        *audit_argv(layout, config),
        *(realnode.apiserver_argv(layout.cert, layout.key) if config.real_node else []),
    ]


def audit_argv(layout: Layout, config: ClusterConfig) -> list[str]:
    """Audit flags: a JSON log, never rotated, of the requests ``audit_policy`` selects."""
    if not config.audit_groups:
        return []
    return [
        f"--audit-policy-file={layout.path(AUDIT_POLICY)}",
        f"--audit-log-path={layout.path(AUDIT_LOG)}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
        # Written as requests complete, so a test reads a request's entry right after its answer.
        "--audit-log-mode=blocking",
    ]


def audit_policy(config: ClusterConfig) -> str:
    """Metadata of every request by a user in ``config.audit_groups``; nothing else."""
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "userGroups": list(config.audit_groups)}, {"level": "None"}],
    }
    return yaml.safe_dump(policy, sort_keys=False)


def controller_manager_argv(layout: Layout, config: ClusterConfig) -> list[str]:
    """kube-controller-manager: every default controller, fast node lifecycle."""
    return [
        layout.binary("kube-controller-manager"),
        f"--kubeconfig={layout.kubeconfig('controller-manager')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports['controller-manager']}",
        f"--cert-dir={layout.path('controller-manager-certs')}",
        # One instance; skipping the election saves up to a lease duration on start.
        "--leader-elect=false",
        "--controllers=*",
        f"--service-account-private-key-file={layout.key('sa')}",
        f"--root-ca-file={layout.cert('ca')}",
        # Each controller acts as its own service account, as in production RBAC.
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={layout.cert('ca')}",
        f"--cluster-signing-key-file={layout.key('ca')}",
        f"--node-monitor-grace-period={config.node_monitor_grace_s}s",
        "--node-monitor-period=1s",
        # Taint a dead node at once instead of at 0.1 nodes/s.
        "--node-eviction-rate=100",
        "--secondary-node-eviction-rate=100",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        f"--v={config.log_verbosity}",
    ]


def scheduler_argv(layout: Layout, config: ClusterConfig) -> list[str]:
    """kube-scheduler with its default profile."""
    return [
        layout.binary("kube-scheduler"),
        f"--kubeconfig={layout.kubeconfig('scheduler')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports['scheduler']}",
        f"--cert-dir={layout.path('scheduler-certs')}",
        "--leader-elect=false",
        f"--v={config.log_verbosity}",
    ]


def kwok_argv(layout: Layout, stages: Path) -> list[str]:
    """kwok, managing only nodes annotated ``kwok.x-k8s.io/node: fake``."""
    return [
        layout.binary("kwok"),
        f"--kubeconfig={layout.kubeconfig('kwok')}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={nodes.KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}",
        # No node leases: kwok would renew them for every node, and a lease counts
        # as a heartbeat, so an "unreachable" node would stay Ready.
        "--node-lease-duration-seconds=0",
        "--node-ip=10.250.255.254",
        f"--config={stages}",
    ]


def kwok_stages(config: ClusterConfig) -> list[dict[str, Any]]:
    """kwok's configuration (``config.kwok_pod_parallelism``) and the stages of ``kwok_stages.yaml``,
    heartbeats spaced to fit the grace period."""
    # kwok v0.8 does not default the options of a configuration it reads from a file: all are given
    # (its own defaults but for the pod parallelism; the command line's flags override the rest).
    options = {"podPlayStageParallelism": config.kwok_pod_parallelism, "nodePlayStageParallelism": 4,
               "nodeLeaseParallelism": 4, "podsOnNodeSyncParallelism": 1, "enablePodsOnNodeSyncListPager": True,
               "enablePodsOnNodeSyncStreamWatch": False, "manageAllNodes": False, "enableDebuggingHandlers": True,
               "enableContentionProfiling": False, "enableProfilingHandler": True}
    settings = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": options}
    stages = [settings, *yaml.safe_load_all(STAGES_FILE.read_text())]
    grace_ms = config.node_monitor_grace_s * 1000
    for stage in stages[1:]:
        if stage["metadata"]["name"] == "node-heartbeat":
            # 4-5 beats per grace period: a slow beat or two never flaps a node.
            stage["spec"]["delay"] = {
                "durationMilliseconds": grace_ms // 5,
                "jitterDurationMilliseconds": grace_ms // 4,
            }
    return stages
