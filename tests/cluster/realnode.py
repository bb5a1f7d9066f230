"""One real node beside the kwok ones: containerd, kubelet, kube-proxy and CoreDNS as host processes.

Opt-in (``ClusterConfig.real_node``): pods scheduled there run for real, in runc containers from
images pulled from the dev cluster's registry (``registry.py``; ``ClusterConfig.registry``) or loaded out
of the local podman storage (``nodeimages.py``), with a pod network on a bridge of
their own, Service routing (kube-proxy, iptables mode), cluster DNS (CoreDNS) so a pod resolves
``<hostname>.<subdomain>.<namespace>.svc``, and kube-apiserver at ``kubernetes.default.svc``.
Everything lives under ``<workdir>/node`` and is undone by :func:`teardown`: processes,
containers, mounts, the bridge, network namespaces, iptables rules and chains, cgroups and the
kernel settings the node agents change.

The host is shared, so some things are global and only one real node may run per machine:
kube-proxy owns the host's ``KUBE-*`` chains, and kubelet sets machine-wide sysctls (restored at
teardown). The network is closed: pods get routes to their bridge and to the Service range only,
no default route and no masquerading, so nothing in a pod reaches beyond this machine.

Machine requirements: ``containerd``, ``runc``, ``containernetworking-plugins`` and ``podman``
(Debian packages; ``tools/real-node-deps.sh`` installs them), and the binaries of
``tools/build-binaries.sh --real-node``.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import ipaddress
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import nodeimages, pki, registry
from tests.cluster.binaries import REPO_ROOT
from tests.cluster.processes import ProcessRecord, is_running, run_dir, stop_component

NODE_NAME = "rljob-real-node"
#: Label of the real node (its pods select it; kwok never manages it: it lacks kwok's annotation).
REAL_NODE_LABEL = "rljob.dev/real-node"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
#: Debian packages the node needs; tools/real-node-deps.sh installs them.
HOST_PACKAGES = ("containerd", "runc", "containernetworking-plugins")
#: The sandbox image, built here from Kubernetes' pause.c (``tools/build-binaries.sh --real-node``).
PAUSE_REPOSITORY = "localhost/rljob-pause"
#: Images of tools/images/build.sh the dev cluster's real node loads when they exist.
DEV_IMAGES = ("localhost/rljob-trainer:dev", "localhost/rljob-operator:dev")
#: The processes of the node, in start order; teardown stops them in reverse.
COMPONENTS = ("containerd", "coredns", "kubelet", "kube-proxy")
#: Machine-wide settings the node changes: kubelet's kernel tunables, kube-proxy's route_localnet.
#: Saved at start, written back at teardown. Not net.ipv4.ip_forward, which the bridge plugin turns
#: on: podman's netavark turns it on too and relies on it, so turning it off could cut off its
#: containers (Docker and podman never turn it off either).
SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/conf/all/route_localnet",
)
#: The cgroup containerd puts the pods' containers in (kubelet runs without QoS cgroups here).
CGROUP_PARENT = "k8s.io"
#: kube-proxy's chain that its ``--cleanup`` leaves (it is the kubelet's too), with its jumps.
FIREWALL_CHAIN = "KUBE-FIREWALL"
#: Host folders kubelet insists on (its container-log symlinks); removed at teardown if it made them.
HOST_LOG_DIR = Path("/var/log/containers")
#: containerd 1.6 puts its shims' sockets here whatever its own state folder.
SHIM_SOCKET_DIR = Path("/run/containerd/s")
#: kubelet's device manager serves its socket here whatever ``--root-dir`` says (the device-plugin API
#: fixes the path); removed at teardown, with the parent, if the node made them.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
#: What the device manager leaves in :data:`DEVICE_PLUGIN_DIR`: its socket and its checkpoint.
DEVICE_PLUGIN_FILES = ("kubelet.sock", "kubelet_internal_checkpoint")


class RealNodeError(RuntimeError):
    """The real node could not start (a missing host package, another real node running, ...)."""


@dataclass
class RealNodeState:
    """What teardown needs, saved in the control plane's run record (so a crashed owner's
    node is torn down by the next start's reaper, as its processes are)."""

    directory: str
    bridge: str
    subnet: str
    kube_proxy: str = ""
    sysctls: dict[str, str] = field(default_factory=dict)
    created_paths: list[str] = field(default_factory=list)
    """Host folders and cgroups absent before the node started: removed at teardown when empty."""
    created_firewall_chain: bool = False
    """``KUBE-FIREWALL`` did not exist before: teardown removes it and its jumps."""
    api_port: int = 0
    """kube-apiserver's port on 127.0.0.1, which pods reach as ``kubernetes.default`` (:func:`forward_api`)."""
    image_root: str = ""
    """containerd's root, kept between nodes for its images (``nodeimages``); empty: one in the node's folder."""
    registry: str = ""
    """``host:port`` of the dev cluster's registry, which containerd pulls from over plain HTTP (its
    ``hosts.toml`` under :attr:`registry_config_path`); empty: none."""

    @property
    def gateway(self) -> str:
        """The bridge's address: the node's InternalIP, kubelet's and CoreDNS's listen address."""
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    def path(self, *parts: str) -> Path:
        """A path inside the node's folder."""
        return Path(self.directory).joinpath(*parts)

    @property
    def socket(self) -> Path:
        """containerd's CRI and API socket."""
        return self.path("containerd.sock")

    @property
    def registry_config_path(self) -> Path:
        """containerd's ``config_path``: one ``<host:port>/hosts.toml`` per registry it may pull from."""
        return self.path("certs.d")

    @property
    def runc_root(self) -> Path:
        """runc's state folder (one subfolder per containerd namespace)."""
        return self.path("containerd", "state", "runc")

    @property
    def containerd_root(self) -> Path:
        """containerd's root: its content store, metadata and snapshots."""
        return Path(self.image_root) if self.image_root else self.path("containerd", "root")


@dataclass(frozen=True)
class NodeBinaries:
    """The node's binaries: Debian's containerd, runc and ctr; ours from ``--real-node``."""

    directory: Path

    def __getitem__(self, name: str) -> str:
        if name in ("containerd", "ctr", "runc"):
            found = shutil.which(name, path=f"/usr/bin:/usr/sbin:{os.environ.get('PATH', '')}")
            if not found:
                raise RealNodeError(f"{name} is missing: apt-get install {' '.join(HOST_PACKAGES)} "
                                    "(tools/real-node-deps.sh)")
            return found
        return str(self.directory / name)

    @property
    def pause_tag(self) -> str:
        """The pause release the binary was built from, e.g. ``3.10.2``."""
        return (self.directory / "pause.tag").read_text().strip()


def real_node_bin_dir(*, build: bool) -> NodeBinaries:
    """The ``--real-node`` binaries (kubelet, kube-proxy, coredns, pause); builds them if ``build``."""
    from tests.cluster.binaries import BUILD_SCRIPT, BinariesUnavailable

    command = [str(BUILD_SCRIPT), "--real-node"] + ([] if build else ["--check"])
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise BinariesUnavailable(f"{' '.join(command[1:])} failed (exit {result.returncode}); "
                                  f"`{BUILD_SCRIPT.relative_to(REPO_ROOT)} --real-node` builds them (~10 min).")
    binaries = NodeBinaries(Path(result.stdout.strip().splitlines()[-1]))
    for name in ("containerd", "ctr", "runc"):
        binaries[name]  # noqa: B018 - fails early, naming the package, when one is missing
    if not (CNI_BIN_DIR / "bridge").exists():
        raise RealNodeError(f"{CNI_BIN_DIR}/bridge is missing: apt-get install containernetworking-plugins")
    return binaries


# ------------------------------------------------------------------------- the host's network
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def claim_network(directory: Path) -> RealNodeState:
    """Pick a free bridge name and /24 (``rljob<n>``, ``10.244.<n>.0/24``) and create the bridge.

    The bridge exists before any pod, because its address is the node's address: kubelet serves
    on it (kube-apiserver dials it for logs and exec) and CoreDNS answers pods there.
    """
    routes = _ip("-4", "route", "show", "table", "all").stdout
    for n in range(256):
        bridge, subnet = f"rljob{n}", f"10.244.{n}.0/24"
        if Path(f"/sys/class/net/{bridge}").exists() or f"10.244.{n}." in routes:
            continue
        state = RealNodeState(str(directory), bridge, subnet)
        _ip("link", "add", "name", bridge, "type", "bridge")
        _ip("addr", "add", f"{state.gateway}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        return state
    raise RealNodeError("no free rljob<n> bridge / 10.244.<n>.0/24 subnet")


def refuse_second_node(own_record: str) -> None:
    """One real node per machine: kube-proxy's chains and kubelet's sysctls are global."""
    for path in run_dir().glob("*.json"):
        if str(path) == own_record:
            continue
        try:
            other = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if other.get("real_node"):
            raise RealNodeError(f"a real node already runs (control plane in {other.get('workdir')}); "
                                "only one per machine: stop it first (`make dev-cluster-down`)")


def save_host_settings(state: RealNodeState) -> None:
    """Remember the sysctls the node agents change, and which host folders did not exist."""
    for name in SYSCTLS:
        with_value = Path("/proc/sys", name)
        if with_value.exists():
            state.sysctls[name] = with_value.read_text().strip()
    cgroups = [hierarchy / CGROUP_PARENT for hierarchy in Path("/sys/fs/cgroup").iterdir() if hierarchy.is_dir()]
    state.created_paths = [str(p) for p in (HOST_LOG_DIR, SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent,
                                            DEVICE_PLUGIN_DIR, DEVICE_PLUGIN_DIR.parent, *cgroups)
                           if not p.exists()]
    chains = subprocess.run(["iptables", "-t", "filter", "-S"], capture_output=True, text=True, check=False).stdout
    state.created_firewall_chain = f"-N {FIREWALL_CHAIN}" not in chains.splitlines()


def _api_rule(state: RealNodeState) -> list[str]:
    return ["PREROUTING", "-i", state.bridge, "-d", pki.KUBERNETES_SERVICE_IP, "-p", "tcp", "--dport", "443",
            "-m", "comment", "--comment", "rljob real node: kubernetes.default to kube-apiserver",
            "-j", "DNAT", "--to-destination", f"127.0.0.1:{state.api_port}"]


def forward_api(state: RealNodeState, port: int) -> None:
    """Pods reach kube-apiserver at ``kubernetes.default.svc`` (10.96.0.1:443), as in-cluster clients do.

    kube-apiserver listens on 127.0.0.1 only and an EndpointSlice may not point at loopback, so
    kube-proxy cannot route this Service: one DNAT rule from the pods' bridge does, with
    ``route_localnet`` on that bridge alone (the kernel drops packets to 127/8 arriving elsewhere).
    """
    state.api_port = port
    Path(f"/proc/sys/net/ipv4/conf/{state.bridge}/route_localnet").write_text("1")
    subprocess.run(["iptables", "-t", "nat", "-I", *_api_rule(state)], capture_output=True, check=True)


def cni_config(state: RealNodeState) -> dict[str, Any]:
    """A bridge with host-local addresses; routes to the bridge and the Service range only."""
    return {
        "cniVersion": "1.0.0",
        "name": "rljob",
        "plugins": [{
            "type": "bridge",
            "bridge": state.bridge,
            "isGateway": True,
            # No NAT and no default route: pods talk to each other, to the node and to Services.
            "ipMasq": False,
            # A pod reaches itself through its own Service (kube-proxy DNATs back to it).
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": state.subnet, "gateway": state.gateway}]],
                "routes": [{"dst": pki.SERVICE_CLUSTER_IP_RANGE}],
                "dataDir": str(state.path("cni", "ipam")),
            },
        }],
    }


# ------------------------------------------------------------------------------- containerd
def containerd_config(state: RealNodeState, binaries: NodeBinaries) -> str:
    """containerd's own root, state and socket; CRI settings this machine needs."""
    return f"""version = 2
root = "{state.containerd_root}"
state = "{state.path('containerd', 'state')}"
# opt would create /opt/containerd; the rest are snapshotters this host has no use for.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{state.socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_REPOSITORY}:{binaries.pause_tag}"
  # No CAP_SYS_RESOURCE here: runc cannot lower a sandbox's oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  # Network namespaces under the state folder, not /var/run/netns (shared with podman).
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # crun refuses this host's hybrid cgroup layout; runc's state stays in our folder.
        BinaryName = "{binaries['runc']}"
        Root = "{state.runc_root}"
        SystemdCgroup = false

  # Registries: a hosts.toml per host (the dev cluster's, plain HTTP); any other host as containerd's defaults.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{state.registry_config_path}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{state.path('cni', 'net.d')}"
    max_conf_num = 1
"""


def ctr(binaries: NodeBinaries, state: RealNodeState, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    """``ctr`` on this node's containerd, in the CRI's ``k8s.io`` namespace."""
    try:
        return subprocess.run([binaries["ctr"], "--address", str(state.socket), "--namespace", "k8s.io", *args],
                              capture_output=True, check=True, **kwargs)
    except subprocess.CalledProcessError as error:
        said = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else str(error.stderr)
        raise RealNodeError(f"ctr {' '.join(args)} failed (exit {error.returncode}): {said[-2000:]}") from error


def pause_image_archive(pause: Path, name: str) -> bytes:
    """An OCI image archive (``ctr images import``) whose one layer is ``/pause``, its entrypoint.

    Built here because registry.k8s.io cannot be reached; byte-for-byte reproducible.
    """
    layer_io = io.BytesIO()
    with tarfile.open(fileobj=layer_io, mode="w", format=tarfile.PAX_FORMAT) as layer:
        info = tarfile.TarInfo("pause")
        info.size, info.mode = pause.stat().st_size, 0o755
        with pause.open("rb") as binary:
            layer.addfile(info, binary)
    diff = layer_io.getvalue()
    compressed = gzip.compress(diff, mtime=0)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(diff).hexdigest()}"]}}
    blobs: dict[str, bytes] = {}

    def blob(media_type: str, data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    manifest_type = "application/vnd.oci.image.manifest.v1+json"
    manifest = {"schemaVersion": 2, "mediaType": manifest_type,
                "config": blob("application/vnd.oci.image.config.v1+json", json.dumps(config).encode()),
                "layers": [blob("application/vnd.oci.image.layer.v1.tar+gzip", compressed)]}
    descriptor = blob(manifest_type, json.dumps(manifest).encode())
    descriptor["annotations"] = {"io.containerd.image.name": name,
                                 "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
             "index.json": json.dumps({"schemaVersion": 2, "manifests": [descriptor]}).encode(),
             **{f"blobs/sha256/{digest}": data for digest, data in blobs.items()}}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


def containerd_ready(binaries: NodeBinaries, state: RealNodeState) -> bool:
    """containerd answers on its socket."""
    if not state.socket.exists():
        return False
    try:
        ctr(binaries, state, "version", timeout=5)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return False
    return True


def import_pause_image(binaries: NodeBinaries, state: RealNodeState) -> None:
    """The sandbox image containerd's ``sandbox_image`` names, from the ``--real-node`` pause binary."""
    name = f"{PAUSE_REPOSITORY}:{binaries.pause_tag}"
    ctr(binaries, state, "images", "import", "-", input=pause_image_archive(Path(binaries["pause"]), name))


def claim_image_root(state: RealNodeState) -> None:
    """containerd's root from the machine's cache, with the images earlier nodes imported (``nodeimages``)."""
    state.image_root = str(nodeimages.claim(nodeimages.image_root(), _unmount_under))


def load_images(binaries: NodeBinaries, state: RealNodeState, images: Iterable[str]) -> tuple[list[str], list[str]]:
    """Import the ``images`` containerd lacks by image ID from the local podman storage: (imported, kept)."""
    def node_ctr(*args: str) -> str:
        return str(ctr(binaries, state, *args, text=True).stdout)

    return nodeimages.load(state.containerd_root, images, node_ctr,
                           lambda image: import_podman_image(binaries, state, image))


def import_podman_image(binaries: NodeBinaries, state: RealNodeState, image: str) -> None:
    """Copy ``image`` from the local podman storage into containerd (``podman save | ctr import``)."""
    if shutil.which("podman") is None:
        raise RealNodeError("podman is missing: the images are loaded from its storage (apt-get install podman)")
    save = subprocess.Popen(["podman", "save", "--quiet", "--format", "docker-archive", image],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ctr(binaries, state, "images", "import", "-", stdin=save.stdout)
    finally:
        assert save.stdout is not None
        save.stdout.close()
        _, error = save.communicate(timeout=600)
    if save.returncode != 0:
        raise RealNodeError(f"podman save {image} failed: {error.decode(errors='replace')[-2000:]}")


def existing_images(images: Iterable[str]) -> tuple[str, ...]:
    """Those of ``images`` the local podman storage has."""
    if shutil.which("podman") is None:
        return ()
    return tuple(image for image in images
                 if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode == 0)


@functools.cache
def base_image() -> str:
    """The Debian + python3 image of ``tools/images/base.sh`` (built there once, then reused)."""
    script = REPO_ROOT / "tools" / "images" / "base.sh"
    return subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]


# -------------------------------------------------------------------------- kubelet, DNS, proxy
def issue_apiserver_kubelet_client(pki_dir: Path) -> pki.CertPair:
    """kube-apiserver's client certificate for the kubelet (logs, exec, port-forward): a
    system:masters user, which the kubelet's webhook authorizer (a SubjectAccessReview) allows."""
    authority = pki.ClusterPKI(pki_dir, existing=True)
    return authority.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")


def node_credentials(authority: pki.ClusterPKI, state: RealNodeState) -> dict[str, pki.CertPair]:
    """The kubelet's client (system:node:<name>) and serving certificates; CoreDNS's and
    kube-proxy's clients. The serving one names the node's address, which kube-apiserver dials."""
    return {
        "kubelet": authority.issue("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
        "kubelet-serving": authority.issue("kubelet-serving", f"system:node:{NODE_NAME}", "system:nodes",
                                           server_names=(state.gateway, NODE_NAME)),
        # The bootstrap policy binds system:node-proxier to this user.
        "kube-proxy": authority.issue("kube-proxy", "system:kube-proxy"),
        # Reads Services, EndpointSlices, Namespaces and Pods cluster-wide; no bootstrap role fits.
        "coredns": authority.issue("coredns", "rljob-coredns", "system:masters"),
    }


def kubelet_config(state: RealNodeState, pki_dir: Path, ports: dict[str, int]) -> dict[str, Any]:
    """KubeletConfiguration for this host: cgroup v1 with cgroupfs, no QoS cgroups (this machine
    cannot create them), webhook authn/authz against kube-apiserver, everything under the node's
    folder."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": state.gateway,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["kubelet-healthz"],
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki_dir / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{state.socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        # No KUBE-IPTABLES-HINT / KUBE-FIREWALL chains from the kubelet: fewer host rules to undo.
        "makeIPTablesUtilChains": False,
        "oomScoreAdj": 0,  # a negative one needs CAP_SYS_RESOURCE
        "clusterDNS": [state.gateway],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",  # the host's resolver settings never reach a pod
        "podLogsDir": str(state.path("pod-logs")),
        "volumePluginDir": str(state.path("volume-plugins")),
        # The host's disk is shared and may be fuller than a dedicated node's: neither evict pods nor
        # delete the imported images (no registry to pull them back from).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "4s",
        "serializeImagePulls": False,
        "rotateCertificates": False,
    }


def kubelet_argv(binaries: NodeBinaries, state: RealNodeState, verbosity: int) -> list[str]:
    """kubelet: the flags that are not in its configuration file."""
    return [
        binaries["kubelet"],
        f"--config={state.path('kubelet.yaml')}",
        f"--kubeconfig={state.path('kubelet.kubeconfig')}",
        f"--root-dir={state.path('kubelet')}",
        f"--cert-dir={state.path('kubelet-certs')}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={state.gateway}",
        f"--node-labels={REAL_NODE_LABEL}=true",
        f"--v={verbosity}",
    ]


def corefile(state: RealNodeState, ports: dict[str, int]) -> str:
    """CoreDNS: the cluster's zones from kube-apiserver, answered on the bridge's address.

    Names outside the cluster are refused (no ``forward``): pods resolve nothing beyond it.
    """
    zones = f"{CLUSTER_DOMAIN} in-addr.arpa ip6.arpa"
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {state.gateway}
    errors
    ready 127.0.0.1:{ports['coredns-ready']}
    kubernetes {zones} {{
        kubeconfig {state.path('coredns.kubeconfig')}
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""


def kube_proxy_config(state: RealNodeState, ports: dict[str, int]) -> dict[str, Any]:
    """kube-proxy in iptables mode; node ports on the bridge only, conntrack sysctls untouched."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(state.path("kube-proxy.kubeconfig"))},
        "hostnameOverride": NODE_NAME,
        "bindAddress": state.gateway,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        "mode": "iptables",
        "clusterCIDR": state.subnet,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{state.gateway}/32"],
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False, "syncPeriod": "30s",
                     "minSyncPeriod": "0s"},
        # 0: leave the host's conntrack table size and timeouts as they are.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                      "udpTimeout": "0s", "udpStreamTimeout": "0s"},
        "oomScoreAdj": 0,
    }


def write_node_files(state: RealNodeState, binaries: NodeBinaries, pki_dir: Path, server: str,
                     ports: dict[str, int]) -> None:
    """Every configuration file of the node under its folder; its certificates beside the cluster's."""
    Path(state.directory).mkdir(parents=True, exist_ok=True)
    authority = pki.ClusterPKI(pki_dir, existing=True)
    pairs = node_credentials(authority, state)
    for user in ("kubelet", "kube-proxy", "coredns"):
        pki.write_kubeconfig(state.path(f"{user}.kubeconfig"), server, authority.ca.cert, user=user,
                             client=pairs[user])
    state.path("containerd.toml").write_text(containerd_config(state, binaries))
    state.registry_config_path.mkdir(parents=True, exist_ok=True)
    if state.registry:
        registry.write_hosts(state.registry_config_path, state.registry)
    for folder in (("cni", "net.d"), ("cni", "ipam"), ("pod-logs",), ("volume-plugins",)):
        state.path(*folder).mkdir(parents=True, exist_ok=True)
    state.path("cni", "net.d", "10-rljob.conflist").write_text(json.dumps(cni_config(state), indent=1))
    state.path("kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(state, pki_dir, ports)))
    state.path("kube-proxy.yaml").write_text(yaml.safe_dump(kube_proxy_config(state, ports)))
    state.path("Corefile").write_text(corefile(state, ports))


def apiserver_argv(layout_cert: Callable[[str], Path], layout_key: Callable[[str], Path]) -> list[str]:
    """kube-apiserver's flags for talking to the kubelet (logs, exec): a client certificate the
    kubelet's webhook authorizes, the CA to check the kubelet's serving one, and the node's
    InternalIP to dial (its Hostname is not in any DNS)."""
    return [
        f"--kubelet-client-certificate={layout_cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={layout_key('apiserver-kubelet-client')}",
        f"--kubelet-certificate-authority={layout_cert('ca')}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


# ---------------------------------------------------------------------------------- teardown
def teardown(state_data: dict[str, Any], processes: Iterable[ProcessRecord]) -> None:
    """Undo everything the real node did, in an order that works even after a crash: agents
    stopped, containers killed, containerd stopped, stray shims killed, mounts undone (network
    namespaces with them), the bridge deleted, kube-proxy's chains removed, sysctls restored."""
    state = RealNodeState(**state_data)
    by_name = {p.name: p for p in processes}
    for name in reversed(COMPONENTS[1:]):  # kube-proxy, kubelet, coredns: nothing restarts a container
        if name in by_name:
            stop_component(by_name[name], timeout=5.0)
    _kill_containers(state)
    images_only = "containerd" in by_name and _forget_pods(state, by_name["containerd"])
    if "containerd" in by_name:
        stop_component(by_name["containerd"], timeout=5.0)
    _kill_shims(state)
    _kill_containers(state, delete=True)
    _unmount_under(Path(state.directory))
    if state.image_root:
        _unmount_under(Path(state.image_root))
        if images_only:
            nodeimages.mark_clean(Path(state.image_root))
    _ip("link", "del", state.bridge, check=False)
    if state.api_port:
        subprocess.run(["iptables", "-t", "nat", "-D", *_api_rule(state)], capture_output=True, check=False)
    if state.kube_proxy and Path(state.kube_proxy).exists():
        subprocess.run([state.kube_proxy, "--cleanup", "--v=0"], capture_output=True, timeout=60, check=False)
    if state.created_firewall_chain:
        _remove_firewall_chain()
    _restore_host(state)


def _forget_pods(state: RealNodeState, containerd: ProcessRecord) -> bool:
    """Leave only images in a kept root (``nodeimages.forget_pods``), while containerd still runs; False
    when it does not run, or fails to: the next node then empties the root."""
    if not state.image_root or not is_running(containerd.pid, containerd.exe):
        return False
    binaries = NodeBinaries(Path(state.kube_proxy).parent)  # containerd's ctr is the host's

    def node_ctr(*args: str) -> str:
        return str(ctr(binaries, state, *args, text=True, timeout=60).stdout)

    try:
        return nodeimages.forget_pods(node_ctr)
    except (OSError, RealNodeError, subprocess.SubprocessError):
        return False


def _remove_firewall_chain() -> None:
    """``KUBE-FIREWALL``, and the INPUT and OUTPUT rules that jump to it."""
    def iptables(*args: str) -> bool:
        return subprocess.run(["iptables", "-t", "filter", *args], capture_output=True, check=False).returncode == 0

    for chain in ("INPUT", "OUTPUT"):
        while iptables("-D", chain, "-j", FIREWALL_CHAIN):
            pass
    if iptables("-F", FIREWALL_CHAIN):
        iptables("-X", FIREWALL_CHAIN)


def _kill_containers(state: RealNodeState, *, delete: bool = False) -> None:
    """SIGKILL every container runc knows in our state folder (``delete``: and forget them)."""
    runc = shutil.which("runc", path="/usr/bin:/usr/sbin") or "runc"
    if not state.runc_root.is_dir():
        return
    for root in state.runc_root.iterdir():  # one per containerd namespace
        for container in (root.iterdir() if root.is_dir() else ()):
            base = [runc, "--root", str(root)]
            subprocess.run([*base, "kill", container.name, "KILL"], capture_output=True, check=False, timeout=30)
            if delete:
                subprocess.run([*base, "delete", "--force", container.name], capture_output=True, check=False,
                               timeout=30)
    if not delete:
        time.sleep(1.0)  # containerd's shims see their tasks exit and are deleted by the CRI


def _kill_shims(state: RealNodeState) -> None:
    """SIGKILL the shims containerd left (they outlive it by design), and remove their sockets."""
    marker = str(state.socket).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline.split(b"\0")[0] and marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), 9)
    tasks = state.path("containerd", "state", "io.containerd.runtime.v2.task")
    for address in tasks.glob("*/*/address"):
        socket = address.read_text().strip().removeprefix("unix://")
        if socket.startswith(str(SHIM_SOCKET_DIR)):
            Path(socket).unlink(missing_ok=True)


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.append(point.encode().decode("unicode_escape"))  # \040 for a space, ...
    return points


def _unmount_under(directory: Path) -> None:
    """Unmount whatever is mounted under ``directory``, deepest first (overlay root file systems,
    network namespaces, kubelet's volumes and its own rshared bind mount of its folder)."""
    prefix = str(directory.resolve())
    for _ in range(5):  # a bind mount can hide another mount at the same point
        points = sorted({p for p in _mount_points() if p == prefix or p.startswith(prefix + "/")},
                        key=len, reverse=True)
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _restore_host(state: RealNodeState) -> None:
    for name, value in state.sysctls.items():
        current = Path("/proc/sys", name)
        if current.exists() and current.read_text().strip() != value:
            current.write_text(value)
    if HOST_LOG_DIR.is_dir():
        for link in HOST_LOG_DIR.iterdir():  # kubelet's symlinks to our container logs
            if link.is_symlink() and os.readlink(link).startswith(state.directory):
                link.unlink()
    for path in state.created_paths:  # deepest first: the list names children before parents
        if path.startswith("/sys/fs/cgroup/"):  # containers' cgroups runc left: empty once they died
            for folder, _, _ in sorted(os.walk(path), key=lambda entry: len(entry[0]), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            continue
        if path == str(DEVICE_PLUGIN_DIR):  # the folder is ours: so are the device manager's files in it
            for name in DEVICE_PLUGIN_FILES:
                Path(path, name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty (someone else uses it now) or already gone
            Path(path).rmdir()


def state_dict(state: RealNodeState) -> dict[str, Any]:
    """What the run record keeps."""
    return asdict(state)
