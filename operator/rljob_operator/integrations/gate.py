"""An admission gate's decisions (pure): may a job's gang run, where, and what to write to the gate.

An admission gate is something outside the operator that decides when a job's gang may run:
Kueue (``integrations/kueue/``), a scheduler's PodGroup, MultiKueue. Each is one folder of
``integrations/`` and one entry of ``integrations/registry.py``; the core (``decisions/``,
``cluster/``) speaks to every gate through this module and ``client.py`` alone:

1. *observe* (cluster layer, ``client.GateClient.observe``): the gate reads its own objects for
   one job and hands the decisions a :class:`Gated`, the gate and its view; a job the gate does
   not govern gets none;
2. *decide* (pure, here): ``violations`` (what the gate cannot run: the job fails
   ``PolicyViolation``), ``verdict`` (hold the gang, with the job's reason and message; or admit
   it, with a placement for its pods and any reason that placement cannot be applied);
3. *write* (pure, here): ``writes`` turns the reconcile's outcome (the decided phase: running,
   held, stopped, finished, suspended) into the gate's own writes, carried by the Plan
   (``Plan.gate_writes``) and applied by the gate's client right after the job's status;
4. *watch* (``client.GateWatch``): the gate's resource whose events wake the job they name.

A job is held while any gate holds it (the first holding gate names the reason); admitted, its
pods take every gate's placement in the registry's order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from rljob_contract.job import RLTrainingJob, RLTrainingJobStatus

from rljob_operator.decisions.policy import PodProfile

View = TypeVar("View")
ViewIn = TypeVar("ViewIn", contravariant=True)


def unplaced(pod: dict[str, Any]) -> dict[str, Any]:
    """The placement of a gate that places nothing: the pod as built."""
    return pod


@dataclass(frozen=True)
class Hold:
    """Why a gate holds the gang: the job's phase is ``Queued`` with this reason and message."""

    reason: str
    message: str
    retry_after: float | None = None
    """When to look again if nothing else is pending (None: the gate's watch wakes the job)."""
    taken_back: str = "the admission was taken back"
    """How the ``Evicted`` Event begins when a running gang is stopped because of this hold."""


@dataclass(frozen=True)
class Verdict:
    """A gate's decision for one reconcile: hold the gang, or admit it and say where it runs."""

    hold: Hold | None = None
    """None: the gate admits the gang."""
    problems: list[str] = field(default_factory=list)
    """Admitted, but why its placement cannot be applied (the job fails ``PolicyViolation``)."""
    place: Callable[[dict[str, Any]], dict[str, Any]] = unplaced
    """A worker pod as built → the pod the gate's admission puts where it said (pure)."""


@dataclass(frozen=True)
class Outcome:
    """What a reconcile decided, for the gate's writes: the phase and message, whether any of the
    job's pods still holds resources, and the time.

    A gate gives back what it admitted only once the pods it admitted are gone (as batch Jobs finish
    only once their pods have terminated, since Kubernetes 1.31): a pod in a terminal phase holds
    nothing; one still running or Terminating does, however the job's phase reads.
    """

    phase: str
    message: str
    pods_left: bool
    """A pod of the job is not in a terminal phase (running, or Terminating)."""
    old_pods_left: bool
    """Such a pod outside the gang this reconcile keeps: of an older generation, or being deleted."""
    now: datetime


class AdmissionGate(Protocol[ViewIn]):
    """The pure side of an admission gate; ``ViewIn`` is what its client observed of one job."""

    name: str
    """The gate's name: its folder under ``integrations/`` and its key in ``Plan.gate_writes``."""

    def violations(self, job: RLTrainingJob, view: ViewIn) -> list[str]:
        """Fields of the job this gate cannot run, each named (empty: none)."""
        ...

    def verdict(self, job: RLTrainingJob, view: ViewIn, prev: RLTrainingJobStatus,
                profile: PodProfile | None) -> Verdict:
        """Hold the gang or admit it; ``prev`` is the status as last written, ``profile`` the platform's."""
        ...

    def writes(self, job: RLTrainingJob, view: ViewIn, outcome: Outcome) -> object:
        """The gate's own writes that go with ``outcome``, applied by its client (``GateClient.apply``)."""
        ...


@runtime_checkable
class Queueing(Protocol[ViewIn]):
    """What a gate with queues (Kueue) adds: the queue a job waits in, which the core writes to
    ``status.queue``. Its client then observes a job by that memory too, so a job once queued stays
    governed by the gate (and its quota) when the label that put it there is removed."""

    def queue(self, job: RLTrainingJob, view: ViewIn) -> str | None:
        """The queue ``job`` waits in (None: none)."""
        ...


@dataclass(frozen=True)
class Gated(Generic[View]):
    """A gate and what its client observed of one job: what the decisions are given."""

    gate: AdmissionGate[View]
    view: View
