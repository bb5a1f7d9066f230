"""The watches of the RLTrainingJobs and their worker pods (kopf's streams, ``streams``/``podwatch``)
and of what else the operator follows (kopf handlers), each event queueing a job for a reconcile.

Handlers stay short: every event (a job created, edited, its status written; a worker pod
scheduled, ready, exited) only adds the job's key to the work queue, and the queue runs
:class:`~rljob_operator.cluster.reconciler.Reconciler` serially per job. Two kinds of event wait:
a pod's that only changes what the status reports is queued a moment later, with the others of
its gang (``STATUS_NEWS_SECONDS``); the job's own status write, which the watch shows back, is
not queued at all (``JobCache``, which keeps the jobs the watch shows for the reconciler). The jobs
and the pods are not kopf handlers: kopf's per-object machinery did nothing for them but cost CPU,
so ``JobStream`` and ``PodWatch`` read kopf's own watch streams, started and stopped by the
``watch_streams`` startup and cleanup activities. kopf keeps its login, the Nodes, the gates' objects
and the RLExperiments (``experiments``). No handler
needs a finalizer (kopf timers and daemons would add one and block ``kubectl delete`` while
the operator is down); deadlines and TTLs are delayed re-queues, and a periodic resync
catches anything a watch missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import kopf

from rljob_operator.cluster.jobcache import JobCache
from rljob_operator.cluster.podwatch import PODS, PodWatch
from rljob_operator.cluster.runtimes import RuntimeStore, runtime_streams
from rljob_operator.cluster.streams import JobStream, ResourceStream
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.plan import RUNTIME_NOT_FOUND
from rljob_operator.integrations.client import GateWatch
from rljob_operator.names import LABEL_JOB


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf builds one on every watch event (a deep copy of the whole object) for its
    on.create/update/resume/delete handlers. rljob registers none of those (only on.event, on.login,
    on.startup/cleanup and indexes; ``check_handlers`` refuses to start otherwise), so nothing would ever read it."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def check_handlers(registry: kopf.OperatorRegistry) -> None:
    """Raise if a handler needs the diff base that ``NoDiffBase`` does not keep (kopf's change and
    daemon/timer handlers: the latter would also add finalizers, see the module's docstring)."""
    needing = [h.id for h in [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]]
    if needing:
        raise RuntimeError(f"kopf handlers {', '.join(needing)} need a diff base; only on.event, on.login, "
                           "on.startup/cleanup and indexes are supported (see NoDiffBase)")


def kopf_settings(gate_watches: Sequence[GateWatch] = ()) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.scanning.disabled = True  # no cluster-wide CRD/namespace listing needed
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.posting.level = 40  # kopf's own events: errors only (ours are the phase transitions)
    # The API server filters the pods and the gates' objects by label, not kopf: a handler's ``labels=``
    # only filters what the watch already sent, and every other pod of the cluster (or namespace) would
    # be decoded and run through kopf's machinery (or the pod watch), each of its events.
    settings.watching.label_selectors[PODS.group, PODS.version, PODS.plural] = LABEL_JOB
    for gate in gate_watches:
        settings.watching.label_selectors[gate.group, gate.version, gate.plural] = gate.label
    return settings


def connection_info(configuration: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from the kubernetes client configuration the reconciler uses."""
    if configuration.refresh_api_key_hook is not None:  # in-cluster: re-read the rotating token
        configuration.refresh_api_key_hook(configuration)
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    scheme, token = None, None
    if header:
        parts = header.split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def urgent_pod_event(type: str | None, pod: dict[str, Any], others: Sequence[dict[str, Any]]) -> bool:
    """Does this watch event of a worker pod call for a gang decision ahead of routine ones?

    Yes when the worker ended (its trainer exited, the pod Failed or Succeeded, or the cluster marked
    it for disruption); when a deleted pod was the last of its job's pods still terminating
    (``others``: the job's pods after the event), so the replacements can be created; and when a
    ready pod makes every pod of its job ready (the gang is Running: again, after a restart). A
    pod created, scheduled, marked for deletion or ready before its gang only changes what the
    status reports.
    """
    if type == "DELETED":
        return not any((other.get("metadata") or {}).get("deletionTimestamp") for other in others)
    seen = ObservedPod.from_pod(pod, "")  # the pod watch's slim copy (a full pod reads the same)
    if seen.finished or seen.exit_code is not None or seen.disrupted:
        return True
    return seen.ready and all(o.ready and not o.deleting for o in (ObservedPod.from_pod(p, "") for p in others))


#: How long a pod's watch event that only changes what the status reports (a pod created, scheduled,
#: running, ready before its gang, marked for deletion) waits for the other such events of its job.
STATUS_NEWS_SECONDS = 1.0
#: How long a deleted Node is remembered (its pods are force-deleted long before: the next reconcile).
GONE_NODE_MEMORY_SECONDS = 3600.0


class JobWatch:
    """The registry of handlers, feeding ``enqueue`` and remembering which jobs exist."""

    def __init__(self, configuration: Any, enqueue: Callable[..., None], forget: Callable[[JobKey], None],
                 gate_watches: Sequence[GateWatch] = (), watch_nodes: bool = False,
                 nodes_changed: Callable[[], None] | None = None, jobs: JobCache | None = None,
                 namespaces: list[str] | None = None, runtimes: RuntimeStore | None = None) -> None:
        """``namespaces``: those watched (none: the whole cluster). ``nodes_changed``: called (with
        ``watch_nodes``) when a Node is added or deleted; ``jobs``: the cache the watch keeps the jobs
        in (the reconciler's; a new one if None)."""
        self.jobs = jobs if jobs is not None else JobCache()
        self.gate_watches = tuple(gate_watches)
        self.enqueue = enqueue
        self.forget = forget
        self.known: set[JobKey] = set()
        self.registry = kopf.OperatorRegistry()
        self.pods = PodWatch(namespaces or [], self.pod_event)
        """The worker pods by job (``PodWatch``: kopf's stream without kopf's per-object machinery)."""
        self.job_stream = JobStream(namespaces or [], self.job_event)
        """The RLTrainingJobs, read the same way."""
        self.runtimes = runtimes if runtimes is not None else RuntimeStore(namespaces or [])
        """The runtimes (both kinds), from their own streams; reconciles look a job's runtime up here."""
        self.streams: tuple[ResourceStream, ...] = (
            self.job_stream, self.pods, *runtime_streams(namespaces or [], self.runtimes, self.runtimes_changed))
        self.gone_nodes: dict[str, float] = {}
        """Nodes the watch saw deleted (and not created again since): name → when (monotonic)."""
        registry = self.registry

        @kopf.on.startup(registry=registry, id="watch_streams")
        async def watch_streams(settings: kopf.OperatorSettings, **_: Any) -> None:
            for stream in self.streams:
                stream.start(settings)  # a task of kopf's: it holds kopf's credentials

        @kopf.on.cleanup(registry=registry, id="watch_streams_stop")
        async def watch_streams_stop(**_: Any) -> None:
            await asyncio.gather(*(stream.stop() for stream in self.streams))

        @kopf.on.login(registry=registry, id="rljob_login")
        def rljob_login(**_: Any) -> kopf.ConnectionInfo:
            return connection_info(configuration)

        if watch_nodes:  # a Node deleted: the gangs with a worker there are lost now, not after pod GC
            @kopf.on.event("", "v1", "nodes", registry=registry, id="node_event")
            async def node_event(type: str | None, name: str, **_: Any) -> None:
                if type in ("ADDED", "DELETED") and nodes_changed is not None:
                    nodes_changed()  # before the jobs below are queued: they size their gangs afresh
                if type == "DELETED":
                    self.node_deleted(name)
                else:  # listed, added or modified: a Node of that name exists (again)
                    self.gone_nodes.pop(name, None)

        for gate_watch in gate_watches:  # an admission gate admitting, preempting or evicting a job's gang
            self._watch_gate(gate_watch)

    def _watch_gate(self, gate: GateWatch) -> None:
        """Queue the job named by each event of the gate's resource (``integrations/client.py``)."""
        @kopf.on.event(gate.group, gate.version, gate.plural, labels={gate.label: kopf.PRESENT},
                       registry=self.registry, id=f"{gate.plural}_event")
        async def gate_event(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
            self.enqueue(gate.key(labels, namespace))

    def cached_pods(self, namespace: str, name: str) -> list[dict[str, Any]] | None:
        """The job's worker pods as the watch last saw them; None before the watch has started.

        Called from reconcile threads: ``list()`` of a dict's values is one step for the GIL.
        """
        return self.pods.store.pods(namespace, name)

    async def stream_failed(self) -> ResourceStream:
        """Wait until a stream ends on its own; that stream (its ``failure`` says why)."""
        waits = {asyncio.ensure_future(stream.failed.wait()): stream for stream in self.streams}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return waits[done.pop()]

    def runtimes_changed(self) -> None:
        """A runtime came, changed or went: the jobs waiting for one look again."""
        for key in self.jobs.with_reason(RUNTIME_NOT_FOUND):
            self.enqueue(key)

    def job_event(self, type: str | None, key: JobKey, job: Mapping[str, Any]) -> None:
        """An RLTrainingJob's event (type None: listed, not deleted): the cache first, then the queue."""
        deleted = type == "DELETED"
        quiet = self.jobs.seen(key, None if deleted else dict(job))
        self.job_changed(key, deleted=deleted, quiet=quiet, new=not deleted and not job.get("status"))

    def pod_event(self, type: str | None, key: JobKey, pod: dict[str, Any], others: list[dict[str, Any]]) -> None:
        """A worker pod's event (``others``: its job's pods after it): a gang decision is queued now,
        news for the status only a moment later, with the others of the gang as they come up."""
        if urgent_pod_event(type, pod, others):
            self.enqueue(key, urgent=True)
        else:
            self.enqueue(key, delay=STATUS_NEWS_SECONDS)

    def node_gone(self, name: str | None) -> bool:
        """Was Node ``name`` deleted (seen by the watch, and not created again since)?"""
        return name is not None and name in self.gone_nodes

    def node_deleted(self, name: str) -> None:
        """Remember the Node as gone and queue every job with a worker pod bound to it."""
        now = time.monotonic()
        for node, when in list(self.gone_nodes.items()):
            if now - when > GONE_NODE_MEMORY_SECONDS:
                del self.gone_nodes[node]
        self.gone_nodes[name] = now
        for key in self.pods.store.jobs():
            if any((pod.get("spec") or {}).get("nodeName") == name for pod in self.pods.store.job_pods(key)):
                self.enqueue(key, urgent=True)

    def job_changed(self, key: JobKey, deleted: bool, quiet: bool = False, new: bool = False) -> None:
        """``quiet``: the event queues nothing now (``JobCache.seen``: this operator's own status write, or
        held for the end of the job's running reconcile). ``new``: a job no reconcile has written a
        status for yet: creating its gang is a gang decision, queued as urgent, so that in a burst new
        jobs are not served after the Running writes of the gangs created before them."""
        if deleted:
            self.known.discard(key)
            self.forget(key)
        else:
            self.known.add(key)
        if not quiet:
            self.enqueue(key, urgent=new)  # a deleted job is reconciled once more: it clears its metrics

    async def resync(self, every: float) -> None:
        """Queue every known job every ``every`` seconds, behind the jobs that events brought."""
        while True:
            await asyncio.sleep(every)
            for key in list(self.known):
                self.enqueue(key, low=True)
