"""``rljob operator``: one operator replica, all in one asyncio loop.

Every replica serves the status API (HTTPS) and ``/metrics``, ``/healthz``, ``/readyz``.
The replica holding the Lease also runs the watches (``streams``: jobs, worker pods, Nodes,
experiments, admission gates, runtimes, Namespaces), the work queue they feed and the periodic resync. Its
reconciler writes through a ``Kube`` guarded by the elector: once the Lease is not fresh no reconcile starts and no write is sent. Losing the
Lease stops the work queue first and ends the process with status 1, so its pod restarts
as a standby; SIGTERM/SIGINT stop it cleanly and release the Lease. A Lease
namespace that does not exist ends it at once with status 2 and a message saying what to pass.
Outside a cluster leader election is off by default (``settings``), so ``rljob operator
--kubeconfig K`` reconciles right away against any cluster that has the CRD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from aiohttp import web
from kubernetes import client as k8s

from rljob_operator import metrics
from rljob_operator.cluster.admission import PAUSED_REQUEUE_SECONDS, AdmissionPolicies
from rljob_operator.cluster.experiments import ExperimentReconciler
from rljob_operator.cluster.handlers import (
    EXPERIMENTS,
    JOBS,
    NODES,
    ExperimentEvents,
    GateEvents,
    GoneNodes,
    JobEvents,
    NodeEvents,
    PodEvents,
    gate_resource,
)
from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.kube import Kube, NotLeader, load_api_client
from rljob_operator.cluster.leader import LeaderElector, LeaseNamespaceMissing
from rljob_operator.cluster.namespaces import NAMESPACES, NamespaceEvents, NamespaceStore
from rljob_operator.cluster.podwatch import PODS, PodStore
from rljob_operator.cluster.reconciler import REQUEST_THREADS_PER_WORKER, Reconciler
from rljob_operator.cluster.runtimes import RUNTIME_RESOURCES, RuntimeEvents, RuntimeStore
from rljob_operator.cluster.streams import Watches
from rljob_operator.cluster.workqueue import ExperimentKey, Key, WorkQueue
from rljob_operator.decisions.children import JobNetwork
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.integrations import registry
from rljob_operator.integrations.client import GateClient, GateWatch
from rljob_operator.names import StatusEndpoint
from rljob_operator.server import tls
from rljob_operator.server.guard import StatusLimits
from rljob_operator.server.statusapi import StatusAPI
from rljob_operator.settings import OperatorSettings

log = logging.getLogger("rljob.operator")


def serving_cert(s: OperatorSettings, kube: Kube) -> tuple[tls.ServingCert, str]:
    """The status API's certificate and the CA PEM trainers should trust."""
    if s.tls_cert_file and s.tls_key_file:
        cert = tls.from_files(s.tls_cert_file, s.tls_key_file)
        if s.tls_ca_file:
            with open(s.tls_ca_file, encoding="utf-8") as f:
                return cert, f.read()
        return cert, cert.cert_pem
    svc, ns = s.service_name, s.operator_namespace
    hosts = [f"{svc}.{ns}.svc", svc, f"{svc}.{ns}", f"{svc}.{ns}.svc.cluster.local", "localhost", "127.0.0.1"]
    url_host = urlparse(s.effective_status_url).hostname
    if url_host and url_host not in hosts:
        hosts.insert(0, url_host)
    if s.tls_secret:
        secret_ns, _, secret_name = s.tls_secret.rpartition("/")
        cert = tls.shared_self_signed(kube, secret_ns or ns, secret_name, hosts)
    else:
        cert = tls.self_signed(hosts)
    return cert, cert.cert_pem


async def _serve(app: web.Application, host: str, port: int, ssl_context: object = None) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()  # type: ignore[arg-type]
    return runner


#: The operator process's exit status for a setting that cannot work (the Lease's namespace is missing,
#: the admission policies are not in force): no retry helps. (Not a trainer exit code: those live in
#: rljob_contract.pod.)
UNWORKABLE_SETTING_STATUS = 2


async def operate(s: OperatorSettings) -> int:
    """Run one replica until a signal (0), a lost Lease (1) or a setting that cannot work (2)."""
    # Every reconcile thread and its request threads may hold a connection, besides the Lease's
    # thread and the status API's reviews.
    api_client = load_api_client(s.kubeconfig, max(64, (1 + REQUEST_THREADS_PER_WORKER) * s.workers + 16))
    kube = Kube(api_client)
    policies = AdmissionPolicies(kube, s.admission_policies, s.without_admission_policies)
    if not await policies.at_start():
        return UNWORKABLE_SETTING_STATUS
    stopping = asyncio.Event()
    _install_signals(stopping)
    endpoint, runners = await _serve_endpoints(s, kube, policies)
    checking = asyncio.create_task(policies.keep_checking(s.admission_recheck_seconds))
    try:
        elector = None
        if s.leader_elect:
            elector = LeaderElector(kube, s.effective_lease_namespace, s.lease_name, s.identity,
                                    s.lease_seconds, s.renew_seconds, s.retry_seconds)
            if not await _acquire(elector, stopping):
                return 0
        else:
            log.info("leader election off: this replica reconciles alone (run one; --leader-elect for standbys)")
            metrics.LEADER.set(1)
        return await _lead(s, api_client, kube, endpoint, elector, stopping, policies)
    except LeaseNamespaceMissing as e:
        log.error("%s", e)
        return UNWORKABLE_SETTING_STATUS
    finally:
        checking.cancel()
        await _cleanup(runners)


def _install_signals(stopping: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)


async def _serve_endpoints(s: OperatorSettings, kube: Kube,
                          policies: AdmissionPolicies) -> tuple[StatusEndpoint, list[web.AppRunner]]:
    """Start the status API (HTTPS) and the metrics/health server; every replica serves both. Ready while
    the admission policies are in force."""
    cert, ca_pem = await asyncio.to_thread(serving_cert, s, kube)
    endpoint = StatusEndpoint(s.effective_status_url, ca_pem, s.token_audience)
    limits = StatusLimits(s.status_max_in_flight, s.status_rate_per_client, s.status_burst_per_client,
                          s.status_review_threads, s.status_negative_cache_seconds, s.status_rate_per_job,
                          s.status_burst_per_job)
    status_api = StatusAPI(kube, s.token_audience, s.heartbeat_flush_seconds, limits)
    runners = [
        await _serve(status_api.app(), s.status_host, s.status_port, cert.ssl_context()),
        await _serve(metrics.health_app(lambda: policies.in_force), s.metrics_host, s.metrics_port),
    ]
    log.info("status API on https://%s:%d (trainers use %s); metrics on :%d",
             s.status_host, s.status_port, endpoint.base_url, s.metrics_port)
    return endpoint, runners


async def _acquire(elector: LeaderElector, stopping: asyncio.Event) -> bool:
    """Wait for the Lease; False when a signal came first."""
    acquiring = asyncio.create_task(elector.acquire())
    stop_wait = asyncio.create_task(stopping.wait())
    await asyncio.wait([acquiring, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    if stopping.is_set():
        acquiring.cancel()
        return False
    stop_wait.cancel()
    acquiring.result()  # raises LeaseNamespaceMissing
    return True


def nodes_watchable(s: OperatorSettings, kube: Kube) -> bool:
    """Watch Nodes? Where the settings ask for it and this identity may list and watch them (a gang on
    a deleted Node is then restarted at once); asked once, at the start of leadership."""
    if not s.watch_nodes:
        return False
    if kube.may("list", "nodes") and kube.may("watch", "nodes"):
        log.info("Nodes watched: a gang with a worker on a deleted node is restarted at once")
        return True
    log.warning("cannot list and watch nodes: a gang on a deleted node is restarted only once the pod "
                "garbage collector removes its pods (about 40 s); grant both (the chart's "
                "rbac.capacityAutoscaling does) or set RLJOB_OPERATOR_WATCH_NODES=false")
    return False


def admission_gates(s: OperatorSettings, kube: Kube) -> tuple[list[GateClient], list[GateWatch]]:
    """The clients of the gates ``s`` enables (``integrations/registry.py``) and what to watch for them."""
    clients, watches = [], []
    for integration in registry.enabled(s):
        watch = integration.watch(kube)
        log.info("%s", integration.describe(watch is not None))
        clients.append(integration.client(kube, watch is not None, s))
        watches += [watch] if watch is not None else []
    return clients, watches


class Reconciling:
    """The work queue and what it runs for each key: a job's reconcile or an experiment's, in the
    operator's own threads, none started once the Lease is not fresh (with an elector) or while the
    admission policies are not in force (each key is looked at again later: ``cluster.admission``)."""

    def __init__(self, reconciler: Reconciler, experiments: ExperimentReconciler, jobs: JobCache,
                 threads: ThreadPoolExecutor, elector: LeaderElector | None, policies: AdmissionPolicies,
                 workers: int) -> None:
        self.reconciler = reconciler
        self.experiments = experiments
        self.jobs = jobs
        """The watch's jobs: a job's events wait while its reconcile runs (``JobCache.begin``)."""
        self.threads = threads
        self.elector = elector
        self.policies = policies
        self.queue = WorkQueue(self.reconcile, workers=workers)

    async def reconcile(self, key: Key) -> float | None:
        reason = self.elector.write_guard() if self.elector is not None else None
        if reason is not None:  # not even the reads: the process is about to stop
            raise NotLeader(f"reconcile of {key.namespace}/{key.name} not started: {reason}")
        if not self.policies.in_force:  # a job written meanwhile was not checked: build nothing for anyone
            return PAUSED_REQUEUE_SECONDS
        loop = asyncio.get_running_loop()
        if isinstance(key, ExperimentKey):
            return await loop.run_in_executor(self.threads, self.experiments.reconcile, key.namespace, key.name)
        self.jobs.begin(key)  # the job's watch events wait for this reconcile's end
        try:
            return await loop.run_in_executor(self.threads, self.reconciler.reconcile, key.namespace, key.name)
        finally:
            if self.jobs.end(key):  # one was not its own write: run again (the key is running)
                self.queue.add(key)


@dataclass
class Leading:
    """What the replica holding the Lease runs: the work queue (started), the watches that feed it (to
    start), the jobs' subscriber (its resync) and the threads reconciles run in."""

    work: Reconciling
    watches: Watches
    job_events: JobEvents
    threads: ThreadPoolExecutor


def _reconciling(s: OperatorSettings, api_client: Any, kube: Kube, endpoint: StatusEndpoint,
                 elector: LeaderElector | None, policies: AdmissionPolicies) -> Leading:
    """The work queue (started), the watches that feed it, and the threads reconciles run in (shut
    down after the queue stops); the reconciler reads the watches' jobs, pods and deleted Nodes.

    With an elector, every reconcile and every write of the reconciler first checks that the Lease
    is fresh (``LeaderElector.write_guard``). While the admission policies are not in force no
    reconcile runs: each job is looked at again later (``cluster.admission``).
    """
    network = JobNetwork(tuple(s.trainer_metrics_from), s.egress()) if s.network_policy else None
    if elector is not None:
        kube = kube.guarded(elector.write_guard)
    gate_clients, gate_watches = admission_gates(s, kube)
    watch_nodes = nodes_watchable(s, kube)
    # Threads of our own, s.workers of them: asyncio's default executor has min(32, CPUs + 4), so
    # 6 on a 2-core node, whatever s.workers says, and it is shared with everything else in the loop.
    threads = ThreadPoolExecutor(max_workers=s.workers, thread_name_prefix="rljob-reconcile")
    jobs = JobCache()  # filled by the watch, read by reconciles instead of a GET of their job
    pods = PodStore.watching(s.namespaces)
    runtimes = RuntimeStore(s.namespaces)  # filled by the runtimes' watches, read by reconciles
    namespaces = NamespaceStore()  # the Namespaces' labels: the runtimes' namespaceSelectors
    gone_nodes = GoneNodes()
    profile = PodProfile.from_settings(s)
    reconciler = Reconciler(kube, endpoint, instance=s.identity, force_delete_after=s.force_delete_after_seconds,
                            request_threads=REQUEST_THREADS_PER_WORKER * s.workers,
                            profile=profile, network=network, gates=gate_clients, job_cache=jobs,
                            capacity_max_age=s.capacity_refresh_seconds,
                            pod_cache=pods.pods, node_gone=gone_nodes.gone if watch_nodes else None,
                            runtimes=runtimes, namespaces=namespaces)
    experiments = ExperimentReconciler(kube, profile, instance=s.identity, runtimes=runtimes, namespaces=namespaces,
                                       network=network)
    work = Reconciling(reconciler, experiments, jobs, threads, elector, policies, s.workers)
    work.queue.start()

    # The watches' own connections (each holds one for minutes), with the operator's credentials.
    watches = Watches(Kube(k8s.ApiClient(api_client.configuration)), s.namespaces)
    job_events = JobEvents(jobs, work.queue)  # also wakes the experiment of a trial job
    watches.add(JOBS, job_events)
    watches.add(PODS, PodEvents(pods, work.queue))
    if watch_nodes:
        watches.add(NODES, NodeEvents(gone_nodes, pods, work.queue, reconciler))
    for gate in gate_watches:
        watches.add(gate_resource(gate), GateEvents(gate, work.queue))
    watches.add(EXPERIMENTS, ExperimentEvents(work.queue))
    for resource, kind in RUNTIME_RESOURCES:  # a runtime event wakes the jobs waiting for one
        watches.add(resource, RuntimeEvents(kind, runtimes, jobs, work.queue))
    watches.add(NAMESPACES, NamespaceEvents(namespaces, jobs, work.queue))  # relabelled: its jobs look again
    return Leading(work, watches, job_events, threads)


async def _lead(s: OperatorSettings, api_client: Any, kube: Kube, endpoint: StatusEndpoint,
                elector: LeaderElector | None, stopping: asyncio.Event, policies: AdmissionPolicies) -> int:
    """Watch and reconcile until a signal (0), the Lease is lost or a watch ends on its own (1)."""
    leading = _reconciling(s, api_client, kube, endpoint, elector, policies)
    leading.watches.start()
    holding = asyncio.create_task(elector.hold() if elector else asyncio.Event().wait())
    stop_wait = asyncio.create_task(stopping.wait())
    ended = asyncio.create_task(leading.watches.ended())  # a watch ended: the operator must not go on blind
    background = [asyncio.create_task(leading.job_events.resync(s.resync_seconds))]
    await asyncio.wait([holding, stop_wait, ended], return_when=asyncio.FIRST_COMPLETED)
    lost, blind = holding.done(), ended.done()
    if blind:
        stream = ended.result()
        log.error("stopping: the %s ended: %r", stream.what, stream.failure, exc_info=stream.failure)
    if lost:
        log.error("stopping: this replica no longer holds the lease")
    await leading.work.queue.stop()  # first: no reconcile may start while the rest winds down
    for task in [*background, holding, stop_wait, ended]:
        task.cancel()
    await leading.watches.stop()
    leading.threads.shutdown(wait=False)  # a reconcile still running finishes on its own
    if elector is not None and not lost:
        await asyncio.to_thread(elector.release)
    return 1 if lost or blind else 0


async def _cleanup(runners: list[web.AppRunner]) -> None:
    for runner in runners:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def run(s: OperatorSettings) -> int:
    logging.basicConfig(
        level=getattr(logging, s.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        profile = PodProfile.from_settings(s)
    except ValueError as e:  # a misspelt profile must not fall back to anything
        logging.getLogger("rljob.operator").error("%s", e)
        return UNWORKABLE_SETTING_STATUS
    logging.getLogger("rljob.operator").info(
        "pod profile %s; images %s; service accounts %s; Secret references %s; trust_remote_code %s",
        profile.level, ", ".join(profile.allowed_images), ", ".join(profile.allowed_service_accounts) or "default only",
        "allowed" if profile.allow_secret_references else "refused",
        "allowed" if profile.allow_trust_remote_code else "refused")
    return asyncio.run(operate(s))

