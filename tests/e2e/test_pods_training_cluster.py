"""Contract: the pods the operator builds really train, their heartbeats reach the job's status, and
so do their evaluations on held-out data (#33), read back from the API server while they train.

The operator builds a 2-worker gang on fake nodes; this test takes each pod's command and
environment exactly as built and runs them here as two processes (two torchrun nodes on
CPU, the built-in tiny model), changing only what a pod gets from its node: files (the
ConfigMap, the projected token) become local files, the rendezvous endpoint maps to
loopback, ports become free ones (tests/support/pod_harness.py, which also checks that every RLJOB_*
variable of the pods is one it knows how to map). Both nodes must train to completion and rank
0's heartbeats must show up in the job's ``status.progress``.

The job is the template of examples/experiments/ab-held-out.yaml on two nodes of 16 completions a
step each: builtin:first-char, evaluated every 20 of 80 steps on 64 held-out prompts. Training on
CPU is deterministic for a seed; `rljob train` of the same setup (2 processes) logs a greedy held-out
accuracy of 0.23 (chance: the untrained model repeats the last character), 0.20, 0.36, 0.47, 0.61.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import fake_pods
from tests.cluster.waiting import wait_for
from tests.support.operator_process import (
    annotate_pod,
    create_job,
    get_job,
    job_manifest,
    job_pods,
    wait_phase,
)
from tests.support.pod_harness import logs, start_gang, stop
from tests.support.trainer import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.e2e]

METRIC = "eval/exact_match"


def held_out_spec() -> dict[str, Any]:
    """examples/experiments/ab-held-out.yaml's template on 2 workers of one process (the same 32 a step)."""
    template = yaml.safe_load((REPO / "examples" / "experiments" / "ab-held-out.yaml").read_text())["spec"]["template"]
    assert template["training"]["batchSize"] == 32
    template["workers"] = {"replicas": 2, "procsPerWorker": 1}
    template["training"]["batchSize"] = 16
    return template  # type: ignore[no-any-return]


def test_pods_as_built_train_report_progress_and_a_rising_held_out_accuracy(
        kube: Any, namespace: str, operator: Any, tmp_path: Path) -> None:
    op = operator()
    spec = held_out_spec()
    steps, every = spec["training"]["maxSteps"], spec["training"]["evaluation"]["everySteps"]
    create_job(kube, namespace, job_manifest("contract", replicas=2, spec=spec))
    wait_phase(kube, namespace, "contract", "Running")
    pods = job_pods(kube, namespace, "contract")
    for pod in pods:
        url = next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "RLJOB_STATUS_URL")
        assert url.startswith(op.status_url)
    procs = start_gang(kube, namespace, "contract", 0, tmp_path)
    seen: dict[int, dict[str, Any]] = {}  # status.progress.evaluation as read back, by its step
    try:
        def finished() -> bool:
            evaluation = (get_job(kube, namespace, "contract")["status"].get("progress") or {}).get("evaluation")
            if evaluation:
                seen.setdefault(evaluation["step"], evaluation)
            return all(p.poll() is not None for p, _, _ in procs) and steps in seen

        wait_for(finished, 900, interval=0.2, message="the run's end and its last evaluation in the status")
        codes = [p.wait() for p, _, _ in procs]
    finally:
        stop(procs)
    assert codes == [0, 0], logs(procs)

    def final_progress() -> dict[str, Any] | None:
        progress = get_job(kube, namespace, "contract")["status"].get("progress") or {}
        return progress if progress.get("step") == steps else None

    progress = wait_for(final_progress, 30, message="final heartbeat in status.progress")
    assert isinstance(progress["reward"], float) and progress["lastHeartbeat"]

    # Each evaluation stayed in the status until the next: read back at several points of the run, with the
    # values rank 0 logged, and the best so far with its step.
    records = [json.loads(line) for line in (procs[0][2] / "output" / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r[METRIC] for r in records if METRIC in r}
    print(f"held-out accuracy logged {logged}; read from the status at steps {sorted(seen)}")
    assert sorted(logged) == list(range(0, steps + 1, every))
    assert {0, steps} <= set(seen) <= set(logged) and len(seen) >= 3, sorted(seen)
    for step, evaluation in seen.items():
        assert evaluation["metric"] == METRIC and evaluation["value"] == pytest.approx(logged[step])
        assert evaluation["values"] == {METRIC: pytest.approx(logged[step])}
        best = max((s for s in logged if s <= step), key=lambda s: (logged[s], s))  # the newer of equals
        assert (evaluation["bestStep"], evaluation["bestValue"]) == (best, pytest.approx(logged[best])), step
    # From chance to well above it: the first evaluation in the status is the untrained model's.
    assert seen[0]["value"] <= 0.35 and seen[steps]["value"] >= 0.5, seen
    assert seen[steps]["bestStep"] == steps and seen[steps]["bestValue"] >= seen[0]["value"] + 0.25

    # The fake pods finish as the real processes did: the job succeeds and keeps its progress.
    for pod in pods:
        annotate_pod(kube, namespace, pod["metadata"]["name"], fake_pods.exit_annotations(0))
    job = wait_phase(kube, namespace, "contract", "Succeeded")
    assert job["status"]["progress"]["step"] == steps and job["status"]["progress"]["evaluation"] == seen[steps]
