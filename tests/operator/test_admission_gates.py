"""The admission-gate seam (integrations/gate.py, integrations/registry.py): a second gate, defined
only here, is registered like Kueue and holds, places and releases a gang with no change to the core."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from rljob_contract.job import RLTrainingJob, RLTrainingJobStatus, parse_job
from rljob_operator.cluster import runner
from rljob_operator.cluster.handlers import GateEvents
from rljob_operator.cluster.kube import Kube
from rljob_operator.cluster.reconciler import Reconciler
from rljob_operator.cluster.workqueue import JobKey
from rljob_operator.decisions.lifecycle import plan_reconcile
from rljob_operator.decisions.policy import PodProfile
from rljob_operator.integrations import registry
from rljob_operator.integrations.client import GateWatch, Integration, PatchStatus
from rljob_operator.integrations.gate import Gated, Hold, Outcome, Verdict
from rljob_operator.settings import OperatorSettings

from tests.operator.test_plans import RecordingKube
from tests.support.jobs import NOW, UID, observe, pod_json
from tests.support.operator_process import job_manifest

APPROVAL = "example.com/approved"


def approved_placement(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"].setdefault("nodeSelector", {})["example.com/pool"] = "approved"
    return pod


class ApprovalGate:
    """Holds a gang until the job carries the annotation ``example.com/approved: "yes"``; places its
    pods in the approved pool; writes the decided phase back (to prove writes reach its client)."""

    name = "approval"

    def violations(self, job: RLTrainingJob, view: str | None) -> list[str]:
        return ["metadata.annotations[example.com/approved]: must be yes or absent"] if view == "maybe" else []

    def verdict(self, job: RLTrainingJob, view: str | None, prev: RLTrainingJobStatus,
                profile: PodProfile | None) -> Verdict:
        if view != "yes":
            return Verdict(hold=Hold("AwaitingApproval", f"annotate the job {APPROVAL}=yes", 5.0,
                                     "the approval was withdrawn"))
        return Verdict(place=approved_placement)

    def writes(self, job: RLTrainingJob, view: str | None, outcome: Outcome) -> tuple[str, bool]:
        return outcome.phase, outcome.pods_left


APPROVAL_GATE = ApprovalGate()


class ApprovalClient:
    """Observes the annotation (a real gate reads its own objects); records what it is asked to apply."""

    name = APPROVAL_GATE.name
    applied: list[tuple[str, Any, str]] = []

    def __init__(self, kube: Kube, watched: bool, settings: OperatorSettings | None) -> None:
        self.unwatched_requeue = None if watched else 7.0

    def observe(self, job: RLTrainingJob, uid: str, worker: Any = None,
                runtime: Any = None) -> Gated[str | None] | None:
        return Gated(APPROVAL_GATE, job.metadata.annotations.get(APPROVAL))

    def recheck(self, writes: Any) -> bool:
        return False

    def apply(self, raw: dict[str, Any], writes: Any, status: dict[str, Any], patch_status: PatchStatus) -> None:
        self.applied.append((raw["metadata"]["name"], writes, status.get("phase") or ""))


APPROVAL_INTEGRATION = Integration(
    name=APPROVAL_GATE.name, enabled=lambda settings: True, client=ApprovalClient,
    watch=lambda kube: GateWatch("example.com", "v1", "approvals"),
    describe=lambda watched: "approval: jobs wait for example.com/approved=yes",
)


@pytest.fixture
def approval_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(registry.INTEGRATIONS, APPROVAL_GATE.name, APPROVAL_INTEGRATION)
    ApprovalClient.applied = []
    yield


def make(annotation: str | None = None, status: dict[str, Any] | None = None) -> RLTrainingJob:
    doc = job_manifest("train", 2, namespace="team-a")
    doc["metadata"].update({"uid": UID, "generation": 1,
                            "annotations": {APPROVAL: annotation} if annotation is not None else {}})
    if status is not None:
        doc["status"] = status
    return parse_job(doc)


def gates_for(job: RLTrainingJob) -> tuple[Gated[Any], ...]:
    """What the operator does: the settings' gates from the registry, each client observing the job."""
    clients = [i.client(None, False, None) for i in registry.enabled(OperatorSettings(kueue=False))]  # type: ignore[arg-type]
    return tuple(g for g in (c.observe(job, UID) for c in clients) if g is not None)


def test_a_gate_registered_in_the_registry_holds_then_releases_and_places_the_gang(
        approval_registered: None) -> None:
    assert [i.name for i in registry.enabled(OperatorSettings(kueue=False))] == ["approval"]
    job = make()
    held = plan_reconcile(job, [], NOW, gates=gates_for(job))
    assert (held.status["phase"], held.status["reason"]) == ("Queued", "AwaitingApproval")
    assert held.create_pods == [] and held.requeue_after == 5.0
    assert held.gate_writes == {"approval": ("Queued", False)}

    job = make("yes", status=held.status)
    released = plan_reconcile(job, [], NOW, gates=gates_for(job))
    assert (released.status["phase"], released.status["reason"]) == ("Pending", "CreatingWorkers")
    assert [p["spec"]["nodeSelector"]["example.com/pool"] for p in released.create_pods] == ["approved"] * 2
    assert released.gate_writes == {"approval": ("Pending", False)}


def test_a_gate_taking_its_admission_back_stops_the_running_gang_as_a_new_generation(
        approval_registered: None) -> None:
    running = {"phase": "Running", "reason": "Running", "gangGeneration": 0, "startTime": "2030-01-01T11:00:00Z",
               "gangStartTime": "2030-01-01T11:00:00Z"}
    job = make("no", status=running)
    pods = [pod_json(job, 0), pod_json(job, 1)]
    plan = plan_reconcile(job, observe(job, *pods), NOW, gates=gates_for(job))
    assert plan.status["phase"] == "Queued" and plan.status["gangGeneration"] == 1
    assert sorted(plan.delete_pods) == ["train-worker-0", "train-worker-1"] and plan.gang_restart == "Evicted"
    assert [e.message.split(":")[0] for e in plan.events if e.reason == "Evicted"] == ["the approval was withdrawn"]
    assert plan.gate_writes == {"approval": ("Queued", True)}


def test_a_gates_violation_fails_the_job_naming_the_field(approval_registered: None) -> None:
    job = make("maybe")
    plan = plan_reconcile(job, [], NOW, gates=gates_for(job))
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "PolicyViolation")
    assert "metadata.annotations[example.com/approved]" in plan.status["message"]


def test_the_reconciler_observes_and_applies_a_registered_gate_with_no_change_to_the_core(
        approval_registered: None) -> None:
    raw = job_manifest("train", 2, namespace="team-a")
    raw["metadata"].update({"uid": UID, "generation": 1, "resourceVersion": "7"})
    kube = RecordingKube(raw)
    reconciler = Reconciler(kube, clock=lambda: NOW, profile=PodProfile(allowed_images=("*",)))  # type: ignore[arg-type]
    try:
        assert list(reconciler.gates) == ["kueue", "approval"]  # every registered gate, by default
        assert reconciler.reconcile("team-a", "train") == 5.0  # the hold's retry, before the unwatched 7 s
    finally:
        reconciler.close()
    writes = [c for c in kube.calls if c[0] != "event"]
    assert writes == [("status", "Queued", "AwaitingApproval")]  # no ConfigMap, no pod
    assert ("event", "AwaitingApproval") in kube.calls
    assert ApprovalClient.applied == [("train", ("Queued", False), "Queued")]

    raw["metadata"]["annotations"] = {APPROVAL: "yes"}
    kube = RecordingKube(raw)
    reconciler = Reconciler(kube, clock=lambda: NOW, profile=PodProfile(allowed_images=("*",)),  # type: ignore[arg-type]
                            gates=[APPROVAL_INTEGRATION.client(kube, True, None)])  # type: ignore[arg-type]
    try:
        reconciler.reconcile("team-a", "train")
    finally:
        reconciler.close()
    assert kube.calls[0] == ("status", "Pending", "CreatingWorkers")
    assert kube.calls.count(("create", "Pod")) == 2


def test_the_runner_starts_the_enabled_gates_and_the_watch_registers_their_resource(
        approval_registered: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="rljob")
    clients, watches = runner.admission_gates(OperatorSettings(kueue=False), SimpleNamespace())  # type: ignore[arg-type]
    assert [c.name for c in clients] == ["approval"] and clients[0].unwatched_requeue is None  # watched
    assert watches == [GateWatch("example.com", "v1", "approvals")]
    assert "approval: jobs wait for example.com/approved=yes" in caplog.text

    async def wired() -> runner.Leading:
        leading = runner._reconciling(OperatorSettings(kueue=False, watch_nodes=False, workers=1),
                                      SimpleNamespace(configuration=None), SimpleNamespace(),  # type: ignore[arg-type]
                                      None, None, SimpleNamespace(in_force=True))
        await leading.work.queue.stop()
        leading.threads.shutdown(wait=False)
        return leading

    stream = next(s for s in asyncio.run(wired()).watches.streams if s.resource.plural == "approvals")
    assert (stream.resource.group, stream.resource.version, stream.resource.label_selector) == (
        "example.com", "v1", "rljob.dev/job")  # the API server filters them by the job label
    assert isinstance(stream.subscriber, GateEvents)
    enqueued: list[Any] = []
    stream.subscriber.queue = SimpleNamespace(add=lambda key, **kw: enqueued.append(key))
    stream.subscriber.event("team-a", "MODIFIED", {"metadata": {"namespace": "team-a",
                                                               "labels": {"rljob.dev/job": "train"}}})
    assert enqueued == [JobKey("team-a", "train")]  # an event of the gate's resource wakes the job it names
