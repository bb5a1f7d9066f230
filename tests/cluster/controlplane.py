"""A real Kubernetes control plane on 127.0.0.1, with kwok faking GPU nodes.

etcd, kube-apiserver (TLS, RBAC, service-account tokens), kube-controller-manager
(garbage collector, node lifecycle, pod GC, taint eviction, ...), kube-scheduler
and kwok, each a process of the pinned binaries (see ``binaries.py``), on free
loopback ports; with ``ClusterConfig.real_node``, one real node too (``realnode.py``:
containerd, kubelet, kube-proxy and CoreDNS running real containers). Used by the pytest
fixtures (a temp dir, removed on stop) and by ``python -m tests.cluster up`` (``.dev-cluster/``,
detached).

    with ControlPlane() as cp:
        client = cp.api_client()
        ...
"""

from __future__ import annotations

import atexit
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import components, kueue, nodes, pki, realnode, registry
from tests.cluster.binaries import bin_dir
from tests.cluster.components import Layout
from tests.cluster.processes import (
    ProcessRecord,
    RunRecord,
    free_port,
    is_running,
    reap_stale,
    start_process,
    stop_component,
)
from tests.cluster.waiting import wait_for

STATE_FILE = "state.json"
#: Components whose state is all in the API server, stopped with SIGKILL after 0.5 s instead of 10 s:
#: Kueue's manager takes the full 10 s to wind down on SIGTERM (at every session's end).
STATELESS_AT_STOP = frozenset({"kueue"})


@dataclass
class ClusterConfig:
    """Knobs of a test control plane; defaults favour fast, realistic fault tests."""

    gpu_nodes: int = 4
    """Fake GPU nodes created at start, named ``<node_prefix><i>``."""
    node_prefix: str = "gpu-node-"
    node_shape: nodes.GpuNodeShape = field(default_factory=nodes.GpuNodeShape)
    """Capacity, labels and GPU model of the default nodes."""
    node_monitor_grace_s: int = 15
    """kube-controller-manager --node-monitor-grace-period: silence before NotReady."""
    eviction_toleration_s: int = 10
    """Default not-ready/unreachable NoExecute toleration the apiserver adds to pods
    (300 s on a real cluster): how long pods stay on a dead node before eviction."""
    start_timeout_s: float = 180.0
    """Bound on each start-up wait (etcd, apiserver, controllers, nodes)."""
    log_verbosity: int = 1
    kwok_pod_parallelism: int = 4
    """How many pod stages kwok plays at once (its ``podPlayStageParallelism``; 4, kwok's default).
    kwok plays the kubelet of every fake node: a real cluster of 100 nodes has 100 kubelets."""
    kueue: bool = False
    """Start Kueue too (``ControlPlane.start_kueue``); the test fixture ``kueue`` starts it on demand."""
    audit_groups: tuple[str, ...] = ("rljob:audited",)
    """Users in these groups have every request written to ``ControlPlane.audit_log`` (JSON,
    Metadata level); nobody else's is, so the log costs nothing to other tests. Issue such a
    user with ``ControlPlane.client_kubeconfig(name, groups=(...,))``."""
    real_node: bool = False
    """Add one real node (``realnode.NODE_NAME``, labelled ``rljob.dev/real-node=true``, untainted):
    containerd, kubelet, kube-proxy and CoreDNS on this host. Needs root, the Debian packages of
    ``tools/real-node-deps.sh`` and ``tools/build-binaries.sh --real-node``; one per machine."""
    real_node_images: tuple[str, ...] = ()
    """Images loaded from the local podman storage into the real node's containerd, besides the
    base image of ``tools/images/base.sh``. Images pushed to the registry need none of this: the node
    pulls them."""
    registry: bool = False
    """Start an OCI registry too (``registry.py``: plain HTTP on 127.0.0.1, storage in the machine's cache),
    which the real node's containerd pulls from: ``ControlPlane.registry_address``."""


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become healthy."""


class ControlPlane:
    """Processes, credentials and helpers of one local control plane.

    ``workdir=None`` uses a fresh temp dir that :meth:`stop` removes. With
    ``detached=True`` the processes outlive this Python process (dev cluster)
    and only :meth:`down` stops them; otherwise they are stopped at exit and,
    should this process be killed, by the kernel (PDEATHSIG) and by the next
    start's stale-run reaper.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        config: ClusterConfig | None = None,
        *,
        detached: bool = False,
    ) -> None:
        self.config = config or ClusterConfig()
        self.detached = detached
        self._requested_workdir = Path(workdir).resolve() if workdir else None
        self._layout: Layout | None = None
        self._record: RunRecord | None = None
        self._argv: dict[str, list[str]] = {}
        # Kept so that Python does not warn about, or reap, children still running.
        self._popen: dict[str, subprocess.Popen] = {}
        self._admin_client = None
        self.kueue_start_seconds: float | None = None
        """How long ``start_kueue`` took, CRDs to webhooks answering (None: not started)."""
        self.real_node: realnode.RealNodeState | None = None
        """The real node's network and folder (None: none started)."""
        self.real_node_start_seconds: dict[str, float] = {}
        """How long each step of the real node's start took (containerd, images, node Ready, ...)."""
        self.registry_address: str | None = None
        """``127.0.0.1:<port>`` of the registry (``ClusterConfig.registry``; None: none started)."""
        self.real_node_images: dict[str, list[str]] = {"imported": [], "kept": []}
        """The images ``load_images`` imported into the real node's containerd, and those it kept (the
        same image ID was there from an earlier node: ``nodeimages``)."""

    # ----------------------------------------------------------------- paths
    @property
    def layout(self) -> Layout:
        """Files and ports of the running control plane."""
        if self._layout is None:
            raise ControlPlaneError("control plane not started")
        return self._layout

    @property
    def workdir(self) -> Path:
        """Folder of this control plane's data, credentials and logs."""
        return self.layout.workdir

    @property
    def bin(self) -> Path:
        """Folder of the pinned binaries in use (kubectl, helm, ... are there too)."""
        return self.layout.bin

    @property
    def server(self) -> str:
        """kube-apiserver URL."""
        return self.layout.server

    @property
    def admin_kubeconfig(self) -> Path:
        """Kubeconfig with a system:masters client certificate."""
        return self.layout.kubeconfig("admin")

    @property
    def ca_cert(self) -> Path:
        """CA that signed the apiserver's serving certificate."""
        return self.layout.cert("ca")

    @property
    def logs_dir(self) -> Path:
        """Folder of per-component logs (``<component>.log``)."""
        return self.layout.path("logs")

    @property
    def audit_log(self) -> Path:
        """The API server's JSON audit log of the users in ``ClusterConfig.audit_groups``."""
        return self.layout.path(components.AUDIT_LOG)

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log's events so far (a line the writer has not finished is skipped)."""
        events = []
        for line in self.audit_log.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events
    @property
    def processes(self) -> list[ProcessRecord]:
        """The component processes currently recorded."""
        return list(self._record.processes) if self._record else []

    # ------------------------------------------------------------- lifecycle
    def start(self, *, build_binaries: bool = True) -> ControlPlane:
        """Start every component, create the default GPU nodes, wait until Ready.

        ``build_binaries=False`` fails fast (``BinariesUnavailable``) instead of
        building missing binaries, which takes many minutes when cold.
        """
        binaries = bin_dir(build=build_binaries)
        node_binaries = realnode.real_node_bin_dir(build=build_binaries) if self.config.real_node else None
        # Ports are picked free, then bound by the components a moment later; on
        # the rare collision with another process, start again on new ports.
        for attempt in range(3):
            try:
                return self._start_once(binaries, node_binaries)
            except ControlPlaneError as error:
                if "address already in use" not in str(error) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, binaries: Path, node_binaries: realnode.NodeBinaries | None) -> ControlPlane:
        reap_stale(workdir=self._requested_workdir)
        if self._requested_workdir:
            workdir = self._requested_workdir
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(tempfile.mkdtemp(prefix="rljob-cluster-"))
        ports = {
            name: free_port()
            for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        }
        self._layout = layout = Layout(binaries, workdir, ports)
        self._record = RunRecord.create(workdir, remove_workdir=True, detached=self.detached)
        if not self.detached:
            atexit.register(self.stop)
        try:
            components.write_credentials(layout)
            if node_binaries is not None:
                realnode.issue_apiserver_kubelet_client(layout.path("pki"))
            self._launch("etcd", components.etcd_argv(layout))
            self._wait_healthy("etcd", lambda: _http_ok(f"{layout.etcd_url}/health"), "etcd /health")
            if self.config.audit_groups:
                layout.path(components.AUDIT_POLICY).write_text(components.audit_policy(self.config))
            self._launch("kube-apiserver", components.apiserver_argv(layout, self.config))
            self._wait_apiserver_ready()
            self._start_controllers()
            if self.config.gpu_nodes:
                self.add_gpu_nodes(self.config.gpu_nodes)
            self._wait_default_service_account()
            if self.config.registry:
                self._start_registry()
            if node_binaries is not None:
                self._start_real_node(node_binaries)
            if self.config.kueue:
                self.start_kueue()
        except BaseException:
            self.stop()
            raise
        (workdir / STATE_FILE).write_text(json.dumps(
            {"record": self._record.path, "ports": ports, "server": self.server, "registry": self.registry_address}
        ))
        return self

    def stop(self) -> None:
        """Stop every component and remove the work directory. Idempotent."""
        if self._admin_client is not None:
            self._admin_client.close()
            self._admin_client = None
        if self._record is not None:
            self._record.stop_all()
            self._record = None
        if not self.detached:
            atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @classmethod
    def down(cls, workdir: Path) -> bool:
        """Stop a (detached) control plane started in ``workdir``; False if none ran."""
        workdir = Path(workdir).resolve()
        stopped = bool(reap_stale(workdir=workdir))
        if workdir.exists():
            shutil.rmtree(workdir, ignore_errors=True)
        return stopped

    @classmethod
    def describe(cls, workdir: Path) -> dict | None:
        """Ports, server and process liveness of the control plane in ``workdir``."""
        state_path = Path(workdir).resolve() / STATE_FILE
        if not state_path.exists():
            return None
        state = json.loads(state_path.read_text())
        try:
            record = RunRecord.load(Path(state["record"]))
        except OSError:
            return None
        state["processes"] = {p.name: is_running(p.pid, p.exe) for p in record.processes}
        return state

    # ------------------------------------------------------------ components
    def _launch(self, name: str, argv: list[str]) -> None:
        assert self._record is not None
        self._argv[name] = argv
        process, record = start_process(
            name, argv, self.logs_dir / f"{name}.log", die_with_parent=not self.detached
        )
        self._popen[name] = process
        if name in STATELESS_AT_STOP:
            record.stop_timeout = 0.5
        self._record.processes = [p for p in self._record.processes if p.name != name] + [record]
        self._record.save()

    def _exited(self, name: str) -> bool:
        records = [p for p in self.processes if p.name == name]
        return not records or not is_running(records[0].pid, records[0].exe)

    def _log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.logs_dir / f"{name}.log").read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _wait_healthy(self, name: str, check, what: str) -> None:
        def healthy() -> bool:
            if self._exited(name):
                raise ControlPlaneError(f"{name} exited during start-up:\n{self._log_tail(name)}")
            return check()

        try:
            wait_for(healthy, self.config.start_timeout_s, interval=0.1, message=what)
        except TimeoutError as error:
            raise ControlPlaneError(f"{error}\n{name} log tail:\n{self._log_tail(name)}") from None

    def _wait_apiserver_ready(self) -> None:
        layout = self.layout
        context = ssl.create_default_context(cafile=str(layout.cert("ca")))
        context.load_cert_chain(str(layout.cert("admin")), str(layout.key("admin")))
        self._wait_healthy(
            "kube-apiserver",
            lambda: _http_ok(f"{layout.server}/readyz", context),
            "kube-apiserver /readyz",
        )

    def _start_controllers(self) -> None:
        layout = self.layout
        stages = layout.path("kwok-stages.yaml")
        stages.write_text(yaml.safe_dump_all(components.kwok_stages(self.config), sort_keys=False))
        self._launch("kube-controller-manager", components.controller_manager_argv(layout, self.config))
        self._launch("kube-scheduler", components.scheduler_argv(layout, self.config))
        self._launch("kwok", components.kwok_argv(layout, stages))
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs, loopback only
        for name, port_name in (
            ("kube-controller-manager", "controller-manager"),
            ("kube-scheduler", "scheduler"),
        ):
            url = f"https://127.0.0.1:{layout.ports[port_name]}/healthz"
            self._wait_healthy(name, lambda url=url: _http_ok(url, insecure), f"{name} /healthz")

    def _wait_default_service_account(self) -> None:
        core = self._core()
        wait_for(
            lambda: core.list_namespaced_service_account("default").items,
            self.config.start_timeout_s,
            message="the default service account (kube-controller-manager running)",
        )

    # -------------------------------------------------------------- registry
    def _start_registry(self) -> None:
        """distribution on a free loopback port, its storage in the machine's cache; returns once ``/v2/``
        answers."""
        layout = self.layout
        layout.ports["registry"] = free_port()
        address = f"127.0.0.1:{layout.ports['registry']}"
        config_file = layout.path("registry.yml")
        config_file.write_text(registry.config(address, registry.storage_root()))
        self._launch("registry", registry.argv(layout.bin / "registry", config_file))
        self._wait_healthy("registry", lambda: registry.answers(address), "the registry's /v2/")
        self.registry_address = address

    # ------------------------------------------------------------- real node
    def _start_real_node(self, binaries: realnode.NodeBinaries) -> None:
        """containerd, CoreDNS, kubelet and kube-proxy on this host; returns once the node is Ready,
        DNS answers and Services route. See ``realnode.py``."""
        assert self._record is not None
        layout, steps = self.layout, self.real_node_start_seconds
        clock = time.monotonic()
        realnode.refuse_second_node(self._record.path)
        state = realnode.claim_network(layout.path("node"))
        self.real_node = state
        realnode.save_host_settings(state)
        state.kube_proxy = binaries["kube-proxy"]
        state.api_port = layout.ports["apiserver"]  # recorded first: teardown removes the rule
        realnode.claim_image_root(state)  # the images earlier nodes imported, when they left it clean
        # From here on a stop, or the next start's reaper after a crash, tears the node down.
        self._record.real_node = realnode.state_dict(state)
        self._record.save()
        realnode.forward_api(state, layout.ports["apiserver"])
        for name in ("kubelet", "kubelet-healthz", "coredns-ready", "kube-proxy-healthz", "kube-proxy-metrics"):
            layout.ports[name] = free_port()
        state.registry = self.registry_address or ""
        realnode.write_node_files(state, binaries, layout.path("pki"), self.server, layout.ports)
        self._launch("containerd", [binaries["containerd"], f"--config={state.path('containerd.toml')}"])
        self._wait_healthy("containerd", lambda: realnode.containerd_ready(binaries, state), "containerd's API")
        steps["containerd"] = time.monotonic() - clock
        realnode.import_pause_image(binaries, state)
        self.load_images((realnode.base_image(), *self.config.real_node_images), binaries)
        steps["images"] = time.monotonic() - clock - steps["containerd"]
        self._launch("coredns", [binaries["coredns"], "-conf", str(state.path("Corefile"))])
        ready = f"http://127.0.0.1:{layout.ports['coredns-ready']}/ready"
        self._launch("kubelet", realnode.kubelet_argv(binaries, state, self.config.log_verbosity))
        self._wait_healthy("kubelet", lambda: self._node_schedulable(realnode.NODE_NAME),
                           "the real node Ready, its not-ready taint removed")
        steps["node ready"] = time.monotonic() - clock
        self._launch("kube-proxy", [binaries["kube-proxy"], f"--config={state.path('kube-proxy.yaml')}"])
        self._wait_healthy("coredns", lambda: _http_ok(ready), "CoreDNS /ready (its first sync)")
        healthz = f"http://127.0.0.1:{layout.ports['kube-proxy-healthz']}/healthz"
        self._wait_healthy("kube-proxy", lambda: _http_ok(healthz), "kube-proxy /healthz (its first sync)")
        steps["total"] = time.monotonic() - clock

    def load_images(self, images: tuple[str, ...] | list[str], binaries: realnode.NodeBinaries | None = None) -> None:
        """Copy images from the local podman storage into the real node's containerd (no registry), those
        it lacks by image ID."""
        if self.real_node is None:
            raise ControlPlaneError("no real node: start with ClusterConfig(real_node=True)")
        binaries = binaries or realnode.real_node_bin_dir(build=False)
        imported, kept = realnode.load_images(binaries, self.real_node, images)
        self.real_node_images["imported"] += imported
        self.real_node_images["kept"] += kept

    def _node_schedulable(self, name: str) -> bool:
        """Ready, and the node lifecycle controller has removed the taints it had while not Ready."""
        from kubernetes.client.exceptions import ApiException

        try:
            node = self._core().read_node(name)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return nodes.node_is_ready(node) and not node.spec.taints

    # ----------------------------------------------------------------- Kueue
    @property
    def kueue_running(self) -> bool:
        """Kueue's manager was started and has not exited."""
        return "kueue" in self._argv and not self._exited("kueue")

    def start_kueue(self) -> float:
        """Install Kueue's CRDs and webhooks, start its manager; returns seconds until it admits.

        Ready means its webhooks answer through kube-apiserver (a server-side dry run of a
        ResourceFlavor passes them) and its readiness probe says so. See ``tests/cluster/kueue.py``.
        """
        import time

        from kubernetes import client

        started = time.monotonic()
        layout = self.layout
        self._core()
        api = self._admin_client
        binary = layout.binary("kueue")
        for name in kueue.PORTS:
            layout.ports[name] = free_port()
        files = kueue.certificates()
        cert_dir = layout.path("kueue-certs")
        cert_dir.mkdir(exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (cert_dir / name).write_bytes(files[name])
        folder, port = kueue.config_dir(Path(binary)), layout.ports["kueue-webhook"]
        objects = [*kueue.crds(folder / "crd", port, files["ca.crt"]),
                   {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": kueue.NAMESPACE}},
                   kueue.secret(files),
                   *kueue.webhook_configurations((folder / "webhook" / "manifests.yaml").read_text(), port,
                                                 files["ca.crt"])]
        manifest = layout.path("kueue-install.yaml")
        manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        # Server-side: the CRDs are too large for client-side apply's last-applied annotation.
        subprocess.run([layout.binary("kubectl"), f"--kubeconfig={self.admin_kubeconfig}", "apply", "--server-side",
                        "--force-conflicts", "--field-manager=rljob-tests", "-f", str(manifest)],
                       check=True, capture_output=True, timeout=120)
        config_file = layout.path("kueue-config.yaml")
        config_file.write_text(yaml.safe_dump(kueue.configuration(layout.ports, cert_dir), sort_keys=False))
        self._launch("kueue", kueue.argv(binary, config_file, self.admin_kubeconfig))
        health = f"http://127.0.0.1:{layout.ports['kueue-health']}/readyz"
        self._wait_healthy("kueue", lambda: _http_ok(health), "kueue /readyz")
        custom = client.CustomObjectsApi(api)
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "rljob-readiness-probe"}}
        self._wait_healthy("kueue", lambda: _dry_run_ok(custom, probe), "Kueue's webhooks (a dry-run ResourceFlavor)")
        self.kueue_start_seconds = time.monotonic() - started
        return self.kueue_start_seconds

    # ------------------------------------------------------------ fault tests
    def revive_crashed(self) -> list[str]:
        """Start kube-scheduler or kube-controller-manager again if it exited, as a kubelet restarts
        a crashed static pod; returns the names started again.

        kube-scheduler exits by design when its cache turns out inconsistent ("Pod updated on a
        different node than previously added to"), which a kube-apiserver restart in the middle of
        bindings can cause. Without this, one such exit would leave every later test without a
        scheduler.
        """
        revived = []
        for name in ("kube-scheduler", "kube-controller-manager"):
            if name in self._argv and self._exited(name):
                popen = self._popen.get(name)
                if popen is not None:
                    popen.poll()  # reap it
                self._launch(name, self._argv[name])
                revived.append(name)
        return revived

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now (as kube-apiserver does every few minutes); its revision.

        A watch etcd serves (``components.UNCACHED_RESOURCE``'s: no watch cache in front) resumed from
        an older resourceVersion is then answered 410 Gone, as a client away for long would be."""
        def etcd(path: str, body: dict) -> dict:
            request = urllib.request.Request(f"{self.layout.etcd_url}{path}", json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=10) as answer:
                return dict(json.load(answer))

        revision = int(etcd("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port; etcd keeps the data.

        Namespace deletions under way (earlier tests' teardowns) are waited out first. Cut short by
        the restart, the namespace controller can find the custom resources missing from discovery
        while the new server registers them, finalize the namespace anyway, and leave its custom
        resources in etcd with no namespace (seen once: a later operator watching every namespace
        reconciled another test's jobs there).
        """
        core = self._core()
        wait_for(lambda: not [n for n in core.list_namespace().items if n.status.phase == "Terminating"], 120,
                 interval=0.5, message="namespace deletions under way finished before the restart")
        record = next(p for p in self.processes if p.name == "kube-apiserver")
        stop_component(record, timeout=10.0)
        self._launch("kube-apiserver", self._argv["kube-apiserver"])
        self._wait_apiserver_ready()

    # ----------------------------------------------------------------- nodes
    def add_gpu_nodes(
        self,
        count: int = 1,
        *,
        shape: nodes.GpuNodeShape | None = None,
        prefix: str | None = None,
        wait: bool = True,
    ) -> list[str]:
        """Create ``count`` fake GPU nodes (next free names) and wait until Ready."""
        core = self._core()
        prefix = prefix if prefix is not None else self.config.node_prefix
        existing = {n.metadata.name for n in core.list_node().items}
        names: list[str] = []
        index = 0
        while len(names) < count:
            if f"{prefix}{index}" not in existing:
                names.append(f"{prefix}{index}")
            index += 1
        version = self.server_version()
        for name in names:
            manifest = nodes.gpu_node_manifest(name, shape or self.config.node_shape, kubelet_version=version)
            core.create_node(manifest)
        if wait:
            for name in names:
                self.wait_node_ready(name, True)
        return names

    def wait_node_ready(self, name: str, ready: bool, timeout: float | None = None) -> None:
        """Wait until node ``name`` reports Ready (``ready``) or not."""
        core = self._core()
        wait_for(
            lambda: nodes.node_is_ready(core.read_node(name)) == ready,
            timeout or self.config.start_timeout_s,
            message=f"node {name} Ready={ready}",
        )

    def set_node_ready(self, name: str, ready: bool, *, wait: bool = True) -> None:
        """Make a node unreachable (no heartbeats: NotReady/Unknown after the grace
        period, then its pods are evicted) or bring it back."""
        value = None if ready else "true"
        self._core().patch_node(name, {"metadata": {"annotations": {nodes.UNREACHABLE_ANNOTATION: value}}})
        if wait:
            self.wait_node_ready(name, ready, timeout=self.config.node_monitor_grace_s * 4 + 30)

    def remove_node(self, name: str, *, wait: bool = True) -> None:
        """Delete a node, as when a cloud instance disappears."""
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        core.delete_node(name)
        if wait:

            def gone() -> bool:
                try:
                    core.read_node(name)
                except ApiException as error:
                    return error.status == 404
                return False

            wait_for(gone, 60, message=f"node {name} deleted")

    # --------------------------------------------------------------- clients
    def api_client(self, kubeconfig: Path | None = None):
        """A new ``kubernetes.client.ApiClient`` (admin unless ``kubeconfig``); close it."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(kubeconfig or self.admin_kubeconfig),
            client_configuration=configuration,
            persist_config=False,
            # The client writes the embedded certificates to files; keep them in
            # the work directory, so they go with it even if this process is killed.
            temp_file_path=str(self.layout.path("client-files")),
        )
        return client.ApiClient(configuration)

    def server_version(self) -> str:
        """kube-apiserver's gitVersion, e.g. ``v1.37.2``."""
        from kubernetes import client

        self._core()
        return client.VersionApi(self._admin_client).get_code().git_version

    def _core(self):
        from kubernetes import client

        if self._admin_client is None:
            self._admin_client = self.api_client()
        return client.CoreV1Api(self._admin_client)

    def client_kubeconfig(self, name: str, groups: tuple[str, ...] = ("system:masters",)) -> Path:
        """Kubeconfig of user ``name`` in ``groups`` (a client certificate signed by the cluster's CA).

        ``groups=("system:masters", "rljob:audited")``: an admin whose requests the audit log records.
        """
        path = self.layout.path("kubeconfigs", f"user-{name}.kubeconfig")
        path.parent.mkdir(exist_ok=True)
        authority = pki.ClusterPKI(self.layout.path("pki"), existing=True)
        client = authority.issue(f"user-{name}", name, groups)
        return pki.write_kubeconfig(path, self.server, self.ca_cert, user=name, client=client)

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        create: bool = True,
        expiration_s: int = 3600,
    ) -> Path:
        """Kubeconfig acting as service account ``namespace/name`` (TokenRequest token).

        Creates the service account when ``create`` and it does not exist.
        """
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        if create:
            try:
                core.create_namespaced_service_account(
                    namespace, {"metadata": {"name": name, "namespace": namespace}}
                )
            except ApiException as error:
                if error.status != 409:
                    raise
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_s)
        )
        token = core.create_namespaced_service_account_token(name, namespace, request).status.token
        path = self.layout.path("kubeconfigs", f"sa-{namespace}-{name}.kubeconfig")
        path.parent.mkdir(exist_ok=True)
        return pki.write_kubeconfig(
            path,
            self.server,
            self.ca_cert,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=token,
            namespace=namespace,
        )


def _dry_run_ok(custom, body: dict) -> bool:
    """A server-side dry-run create of cluster-scoped Kueue ``body`` passes Kueue's webhooks."""
    from kubernetes.client.exceptions import ApiException

    try:
        custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "resourceflavors", body, dry_run="All")
        return True
    except ApiException as error:
        return error.status == 409  # it exists: the create went through the webhooks first


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
