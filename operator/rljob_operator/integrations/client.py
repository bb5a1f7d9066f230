"""What an admission gate offers the cluster layer: a client, a watch, and how it is wired.

Each folder of ``integrations/`` makes one :class:`Integration` (registered in ``registry.py``).
The cluster layer uses a gate through its :class:`GateClient` (observe its objects for a job,
apply the writes the decisions chose) and its :class:`GateWatch` (the resource whose events wake
a job); the decisions use its pure side (``gate.AdmissionGate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rljob_contract.job import RLTrainingJob

from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.integrations.gate import Gated
from rljob_operator.names import LABEL_JOB

if TYPE_CHECKING:
    from rljob_operator.cluster.kube import Kube
    from rljob_operator.settings import OperatorSettings

#: The job's status merge-patched (the reconciler's writer: the job cache learns the version it made).
PatchStatus = Callable[[dict[str, Any], dict[str, Any]], None]


class GateClient(Protocol):
    """The cluster side of one gate in one reconciler: reads and writes the gate's objects."""

    name: str
    unwatched_requeue: float | None
    """How often a job the gate governs is looked at when no watch wakes it (None: watched)."""

    def observe(self, job: RLTrainingJob, uid: str) -> Gated[Any] | None:
        """The gate and its view of ``job`` (whose uid is ``uid``); None if the gate does not govern it."""
        ...

    def recheck(self, writes: Any) -> bool:
        """Do ``writes`` rely on no pod of the job being left? (The pods are then listed afresh first.)"""
        ...

    def apply(self, raw: dict[str, Any], writes: Any, status: dict[str, Any], patch_status: PatchStatus) -> None:
        """Apply ``writes`` for the job read as ``raw``, right after its ``status`` was written."""
        ...


@dataclass(frozen=True)
class GateWatch:
    """A resource whose events wake the job named by their label ``label`` (in the event's namespace)."""

    group: str
    version: str
    plural: str
    label: str = LABEL_JOB

    def key(self, labels: Mapping[str, str], namespace: str | None) -> JobKey:
        """The work queue key of the job an event of this resource is about."""
        return JobKey(namespace or "", labels[self.label])


@dataclass(frozen=True)
class Integration:
    """One admission gate as the operator wires it."""

    name: str
    enabled: Callable[[OperatorSettings], bool]
    """Does this operator run the gate (its setting)?"""
    client: Callable[[Kube, bool, OperatorSettings | None], GateClient]
    """The gate's client for one reconciler: ``client(kube, watched, settings)`` (settings None: the defaults)."""
    watch: Callable[[Kube], GateWatch | None]
    """What to watch, asked once at start (None: nothing, e.g. the gate's API is not served)."""
    describe: Callable[[bool], str]
    """The start-up log line, given whether the gate's resource is watched."""
    resources: tuple[str, ...] = ()
    """The resources the client requests, for the request metrics' ``resource`` label."""
