"""Old-vs-new comparison of ``plan_reconcile`` over thousands of random scenarios.

    python -m tests.support.plan_scenarios --against main              # 20,000 scenarios, seed 0
    python -m tests.support.plan_scenarios --against main --scenarios 20000 --seed 7

A structural change of the decisions (modules moved, functions split) must not change one Plan. This
draws random reconciles a failure can meet — a job (restart policy, backoff, OOM recovery, elastic
bounds, durable or ephemeral checkpoints, deadlines, TTL), its stored status (phase, restarts,
disruptions, gang generation, the last failure and the pods it replaced, heartbeats, backoff and gang
start times), its pods (generations, phases, exit codes, container and pod reasons, disruption
conditions, deletions, nodes, deleted nodes, owners), the cluster's nodes and the time — then decides
each with this checkout's ``rljob_operator`` and with commit REV's (``git archive`` into a temporary
folder), each in its own interpreter, and compares the serialised Plans. It prints how many scenarios
ended in each phase and reason (so a reader sees the failure paths were reached) and every difference.
Exit status 1 when a Plan differs, 2 when the scenarios no longer reach the outcomes a failure can have
(``MUST_REACH``: the comparison would prove nothing about them).

The scenarios are drawn here, from plain dicts, and only then handed to either side's models, so both
sides decide exactly the same inputs. Not a pytest test: it takes a minute of CPU per side.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("contract", "operator", "trainer")
NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
JOB_UID = "job-uid"
NODES = ("gpu-node-0", "gpu-node-1", "gpu-node-2")


def _time(offset_seconds: float | None) -> str | None:
    if offset_seconds is None:
        return None
    return (NOW + timedelta(seconds=offset_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------ scenarios


def _runtime(r: random.Random) -> dict[str, Any]:
    """The job's ClusterRLTrainingRuntime, with a random checkpoint location (none: a folder of the pod's)."""
    spec: dict[str, Any] = {"image": "registry.invalid/rljob-trainer:test"}
    storage = r.choice((None, None, "s3://bucket/runs", "pvc://claim/runs", "/workspace/output/ckpt"))
    if storage is not None:
        spec["checkpoint"] = {"storage": storage}
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "ClusterRLTrainingRuntime", "metadata": {"name": "default"},
            "spec": spec}


def _job(r: random.Random) -> dict[str, Any]:
    """A valid job with a random run policy, size and batch (its checkpoint location: ``_runtime``)."""
    replicas = r.choice((1, 2, 2, 3, 4))
    workers: dict[str, Any] = {"replicas": replicas, "procsPerWorker": 1}
    autoscaling: dict[str, Any] = {}
    if r.random() < 0.35:  # elastic
        workers["minReplicas"] = r.randint(1, replicas)
        workers["maxReplicas"] = r.randint(replicas, 5)
        if r.random() < 0.3:
            autoscaling = {"policy": "Capacity", "cooldownSeconds": r.choice((0, 300))}
    run_policy: dict[str, Any] = {
        "restartPolicy": r.choice(("OnFailure", "OnFailure", "ExitCode", "Never")),
        "backoffLimit": r.choice((0, 1, 2, 3, 3)),
        "backoffBaseSeconds": r.choice((0, 2.5, 10)),
        "backoffMaxSeconds": r.choice((5, 600)),
        "oomRecovery": r.random() < 0.7,
        "oomMinBatchSize": r.choice((1, 2, 4)),
        "stallTimeoutSeconds": r.choice((30, 600)),
        "startupTimeoutSeconds": r.choice((60, 1800)),
        "suspend": r.random() < 0.04,
    }
    if r.random() < 0.15:
        run_policy["activeDeadlineSeconds"] = r.choice((60, 3600, 86400))
    if r.random() < 0.2:
        run_policy["ttlSecondsAfterFinished"] = r.choice((0, 60, 3600))
    checkpoint: dict[str, Any] = {"everySteps": 100, "keepLast": 1}
    doc: dict[str, Any] = {
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob",
        "metadata": {"name": "train", "namespace": "team-a", "uid": JOB_UID, "generation": r.randint(1, 3)},
        "spec": {
            "workers": workers,
            "training": {
                "model": "builtin:tiny", "dataset": {"name": "builtin:repeat-char", "size": 64},
                "rewards": [{"name": "repeat_char", "kwargs": {"length": 4}}],
                "batchSize": r.choice((4, 8, 12)), "gradientAccumulationSteps": r.choice((1, 2)),
                "numGenerations": 4, "maxCompletionLength": 4, "maxSteps": 3, "learningRate": 0.003,
            },
            "checkpoint": checkpoint,
            "runPolicy": run_policy,
        },
    }
    if autoscaling:
        doc["spec"]["autoscaling"] = autoscaling
    return doc


PHASES = ("Running",) * 6 + ("Starting",) * 2 + ("Restarting",) * 3 + ("Pending", "Queued", "Succeeded",
                                                                        "Failed", "Suspended", None)
REASONS = ("Running", "WorkerFailed", "OOMKilled", "HeartbeatTimeout", "StartupTimeout", "WorkerLost",
           "Resizing", "Completed", "BackoffLimitExceeded", "InvalidSpec", "PolicyViolation", "Evicted")


def _status(r: random.Random, job: dict[str, Any], uids: list[str]) -> dict[str, Any]:
    """A stored status: any phase, restart bookkeeping, heartbeats, a last failure naming replaced pods."""
    if r.random() < 0.05:
        return {}
    status: dict[str, Any] = {
        "phase": r.choice(PHASES), "reason": r.choice(REASONS), "message": r.choice(("", "earlier")),
        "observedGeneration": r.choice((None, job["metadata"]["generation"], 1)),
        "gangGeneration": r.choice((0, 1, 1, 2)),
        "restarts": r.choice((0, 0, 1, 2, 3, 4)), "disruptions": r.choice((0, 0, 1, 3)),
        "startTime": _time(r.choice((None, -7200, -600, -30))),
        "gangStartTime": _time(r.choice((None, -7200, -1900, -700, -100, -10))),
        "nextRestartTime": _time(r.choice((None, None, -5, 0, 3, 300))),
    }
    if status["phase"] in ("Succeeded", "Failed"):
        status["completionTime"] = _time(r.choice((None, -4000, -90, -1)))
    if r.random() < 0.6:
        progress = {"step": r.randint(0, 50), "lastHeartbeat": _time(r.choice((None, -7200, -900, -45, -5)))}
        if r.random() < 0.2:
            progress["lastThrottled"] = _time(r.choice((-900, -20)))
        status["progress"] = progress
    if r.random() < 0.4:
        replaced = r.sample(uids, k=min(len(uids), r.randint(0, 2))) + (["gone-uid"] if r.random() < 0.3 else [])
        status["lastFailure"] = {"worker": "train-worker-1", "reason": r.choice(("WorkerFailed", "WorkerLost")),
                                 "exitCode": r.choice((None, 1)), "message": r.choice(("", "train-worker-1 died")),
                                 "time": _time(-60), "disruption": r.random() < 0.3, "replacedPods": replaced}
    if r.random() < 0.15:
        status["oomRecovery"] = {"batchSize": 2, "gradientAccumulationSteps": 2}
    if r.random() < 0.4:
        status["conditions"] = [{"type": "CheckpointsDurable", "status": r.choice(("True", "False")),
                                 "reason": r.choice(("Durable", "Ephemeral")), "lastTransitionTime": _time(-3600)}]
    return status


EXIT_CODES = (1, 1, 2, 78, 200, 75, 137, 143, None)
POD_REASONS = (None, None, None, "Evicted", "NodeLost", "Preempting", "DeletionByTaintManager")


def _terminated(r: random.Random, phase: str) -> dict[str, Any] | None:
    if phase == "Succeeded":
        return {"exitCode": 0, "reason": "Completed", "finishedAt": _time(r.choice((-50, -5)))}
    code = r.choice(EXIT_CODES)
    if phase != "Failed" or code is None:
        return None
    terminated = {"exitCode": code, "reason": "OOMKilled" if code == 137 and r.random() < 0.6 else "Error",
                  "finishedAt": _time(r.choice((-50, -20, -5)))}
    if r.random() < 0.5:
        terminated["message"] = r.choice(("CUDA error\nline two", "  Traceback  ", "permanent: bad config"))
    return terminated


def _pod(r: random.Random, index: int, generation: int, spec_hash: str, job_generation: int) -> dict[str, Any]:
    """One worker pod of the job as the watch would show it (only what ``ObservedPod`` reads)."""
    phase = r.choice(("Running",) * 5 + ("Pending", "Failed", "Failed", "Succeeded"))
    owner = r.choice((JOB_UID,) * 12 + ("other-uid", None))
    name = f"train-worker-{index}"
    meta: dict[str, Any] = {
        "name": name, "namespace": "team-a", "uid": f"pod-{index}-{generation}-{r.randint(0, 9)}",
        "labels": {"rljob.dev/job": "train", "rljob.dev/worker-index": str(index),
                   "rljob.dev/gang-generation": str(generation)},
        "annotations": {"rljob.dev/spec-hash": spec_hash if r.random() < 0.9 else "stale",
                        "rljob.dev/job-generation": str(job_generation if r.random() < 0.8 else 0)},
    }
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "name": "train",
                                    "uid": owner, "controller": True}]
    if r.random() < 0.12:
        meta["deletionTimestamp"] = _time(r.choice((-120, -30, 10)))
    conditions = [{"type": "Ready", "status": str(phase == "Running" and r.random() < 0.85)}]
    if r.random() < 0.08:
        conditions.append({"type": "DisruptionTarget", "status": "True"})
    if phase == "Pending" and r.random() < 0.4:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": "0/3 nodes are available"})
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    reason = r.choice(POD_REASONS)
    if reason is not None:
        status["reason"] = reason
    terminated = _terminated(r, phase)
    if terminated is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    elif phase == "Pending" and r.random() < 0.3:
        status["containerStatuses"] = [{"name": "trainer", "state": {"waiting": {"reason": "ErrImagePull",
                                                                                  "message": "not found"}}}]
    node = r.choice(NODES + (None,)) if phase != "Pending" or r.random() < 0.5 else None
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


def _nodes(r: random.Random) -> list[dict[str, Any]] | None:
    """The cluster's nodes (None: capacity not looked at), some not Ready."""
    if r.random() < 0.6:
        return None
    return [{"metadata": {"name": n}, "spec": {},
             "status": {"conditions": [{"type": "Ready", "status": "True" if r.random() < 0.85 else "False"}],
                        "allocatable": {"nvidia.com/gpu": str(r.choice((0, 1, 2, 4))), "pods": "110"}}}
            for n in NODES if r.random() < 0.9]


def scenario(r: random.Random) -> dict[str, Any]:
    """One reconcile's inputs as plain data; the spec hash of current pods is filled in by the side."""
    job = _job(r)
    runtime = _runtime(r)
    replicas = job["spec"]["workers"]["replicas"]
    pods_by_gen: list[tuple[int, int]] = []
    gen = r.choice((0, 1, 1, 2))
    for index in range(replicas + (1 if r.random() < 0.1 else 0)):
        if r.random() < 0.12:
            continue  # a worker that is gone
        pods_by_gen.append((index, gen if r.random() < 0.85 else max(gen - 1, 0)))
    pods = [_pod(r, i, g, "", job["metadata"]["generation"]) for i, g in pods_by_gen]
    status = _status(r, job, [p["metadata"]["uid"] for p in pods])
    if status and r.random() < 0.8:
        status["gangGeneration"] = gen
    if status:
        job["status"] = status
    return {
        "job": job, "runtime": runtime, "pods": pods, "now_offset": r.choice((0, 0, 0, 5, 40, 700, 2000)),
        "nodes": _nodes(r), "gone": [n for n in NODES if r.random() < 0.07],
        "force_delete_after": r.choice((60.0, 60.0, 0.0)),
    }


# ---------------------------------------------------------------------------------------- one side


def decide(s: dict[str, Any]) -> dict[str, Any]:
    """The serialised Plan this side's ``plan_reconcile`` decides for scenario ``s`` (or the error it raises)."""
    from rljob_contract.job import parse_job
    from rljob_operator.decisions.children import spec_hash
    from rljob_operator.decisions.lifecycle import plan_reconcile
    from rljob_operator.decisions.observed import ObservedPod
    from rljob_operator.decisions.scaling import Capacity

    def created(pods: list[dict[str, Any]]) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}

    try:
        job = parse_job(s["job"])
        on: dict[str, Any] = {}
        with contextlib.suppress(ImportError):  # a side from before runtimes (issue #42) builds on none
            from rljob_contract.runtime import parse_runtime, resolve

            on["runtime"] = resolve(job, parse_runtime(s["runtime"]))
        want = spec_hash(job)
        for pod in s["pods"]:
            annotations = pod["metadata"]["annotations"]
            if annotations["rljob.dev/spec-hash"] == "":
                annotations["rljob.dev/spec-hash"] = want
        gone = set(s["gone"])
        # Every pod drawn is one the operator created: on a side that kept a record of its pods' UIDs
        # (``created``), recorded under its name; on one that reads the pod's controller reference
        # (``job_name``), controlled by the job. Strangers are not drawn: no older side knows them.
        params = inspect.signature(ObservedPod.from_pod).parameters
        mark: list[Any] = ([created([p]) for p in s["pods"]] if "created" in params
                           else [job.metadata.name] * len(s["pods"]) if "job_name" in params else [None] * len(s["pods"]))
        pods = [ObservedPod.from_pod(p, JOB_UID, *([m] if m is not None else []), node_gone=lambda n: n in gone)
                for p, m in zip(s["pods"], mark, strict=True)]
        capacity = Capacity.from_objects(s["nodes"], s["pods"]) if s["nodes"] is not None else None
        plan = plan_reconcile(job, pods, NOW + timedelta(seconds=s["now_offset"]),
                              force_delete_after=s["force_delete_after"], capacity=capacity, **on)
    except Exception as e:  # an error is a decision too: both sides must raise the same
        return {"error": f"{type(e).__name__}: {e}"}
    children = None if plan.children is None else {
        "configmap": plan.configmap, "service": plan.service, "networkpolicy": plan.networkpolicy}
    return {
        "status": plan.status, "delete_pods": plan.delete_pods, "force_delete_pods": plan.force_delete_pods,
        "children": children, "create_pods": plan.create_pods, "delete_job": plan.delete_job,
        "events": [asdict(e) for e in plan.events], "requeue_after": plan.requeue_after,
        "gang_restart": plan.gang_restart, "replaced_workers": getattr(plan, "replaced_workers", None),
        "gate_writes": plan.gate_writes,
    }


@contextlib.contextmanager
def steps_recorded() -> Iterator[list[str]]:
    """While open, each of ``lifecycle.STEPS`` appends its name to the list yielded when it decides (read
    by the summary only: which step decides is not compared)."""
    from rljob_operator.decisions import lifecycle

    decided: list[str] = []

    def recorded(step: Any) -> Any:
        def run(ctx: Any) -> Any:
            plan = step(ctx)
            if plan is not None:
                decided.append(step.__name__)
            return plan
        return run

    steps = lifecycle.STEPS
    lifecycle.STEPS = tuple(recorded(s) for s in steps)
    try:
        yield decided
    finally:
        lifecycle.STEPS = steps


def decided(seed: int, count: int) -> Iterator[str]:
    """``count`` scenarios drawn from ``seed``, decided: one JSON line each, the serialised Plan and,
    beside it, the step that decided it."""
    r = random.Random(seed)
    with steps_recorded() as steps:
        for _ in range(count):
            steps.clear()
            plan = json.dumps(decide(scenario(r)), sort_keys=True, default=str)
            yield json.dumps({"step": steps[0] if steps else None, "plan": plan})


# -------------------------------------------------------------------------------------- comparison


def _side(root: Path, seed: int, count: int, out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(root / s) for s in SOURCES))
    # -P: this folder holds operator.py, which must not shadow the standard library's operator.
    subprocess.run([sys.executable, "-P", str(Path(__file__).resolve()), "--emit", str(out), "--seed", str(seed),
                    "--scenarios", str(count)], env=env, check=True, cwd=root)


def _checkout(rev: str, into: Path) -> None:
    archive = into / "rev.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, *SOURCES], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")


def kind(line: str) -> str:
    """The step that decided a Plan, its phase and reason, and whether it replaces workers or the gang."""
    decided = json.loads(line)
    plan = json.loads(decided["plan"])
    if "error" in plan:
        return f"error {plan['error'].split(':')[0]}"
    status = plan["status"]
    what = "replace in place" if plan.get("replaced_workers") else f"new gang ({plan['gang_restart']})" \
        if plan["gang_restart"] else ""
    return f"{decided['step']}: {status.get('phase')} {status.get('reason')} {what}".strip()


#: Outcomes the scenarios must reach for a comparison to say something about a failure's decision.
MUST_REACH = {
    "a job failed by a failure": ("plan_failure: Failed",),
    "a gang restart": ("plan_failure: Restarting", "new gang"),
    "a replacement in place": ("plan_failure: Restarting", "replace in place"),
    "a stall": ("plan_failure: Restarting HeartbeatTimeout",),
    "out of memory": ("plan_failure: Restarting CudaOutOfMemory",),
    "a disruption": ("plan_failure: Restarting Evicted",),
}


def unreached_outcomes(kinds: Counter[str]) -> list[str]:
    """The outcomes of ``MUST_REACH`` no scenario reached, and errors if more than 1 % raised (a
    generator the models now refuse compares nothing but two identical errors)."""
    missing = [what for what, parts in MUST_REACH.items() if not any(all(p in k for p in parts) for k in kinds)]
    errors = sum(n for k, n in kinds.items() if k.startswith("error"))
    return missing + ([f"fewer errors ({errors} scenarios raised)"] if errors * 100 > sum(kinds.values()) else [])


def compare(old: list[str], new: list[str]) -> list[str]:
    """A line per scenario whose Plans differ: its number and the Plan fields that differ."""
    differences = []
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        a, b = json.loads(a)["plan"], json.loads(b)["plan"]
        if a != b:
            pa, pb = json.loads(a), json.loads(b)
            fields = sorted(k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k))
            differences.append(f"scenario {i}: {', '.join(fields)}\n  old: "
                               + ", ".join(f"{k}={pa.get(k)!r:.300}" for k in fields) + "\n  new: "
                               + ", ".join(f"{k}={pb.get(k)!r:.300}" for k in fields))
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", help="the git revision to compare this checkout with (e.g. main)")
    parser.add_argument("--scenarios", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--emit", type=Path, help=argparse.SUPPRESS)  # one side, in its own interpreter
    args = parser.parse_args(argv)
    if args.emit is not None:
        args.emit.write_text("".join(line + "\n" for line in decided(args.seed, args.scenarios)), encoding="utf-8")
        return 0
    if not args.against:
        parser.error("--against REV is required")
    with tempfile.TemporaryDirectory() as tmp:
        old_root = Path(tmp) / "old"
        old_root.mkdir()
        _checkout(args.against, old_root)
        _side(old_root, args.seed, args.scenarios, Path(tmp) / "old.jsonl")
        _side(REPO, args.seed, args.scenarios, Path(tmp) / "new.jsonl")
        old = (Path(tmp) / "old.jsonl").read_text(encoding="utf-8").splitlines()
        new = (Path(tmp) / "new.jsonl").read_text(encoding="utf-8").splitlines()
    kinds = Counter(kind(line) for line in new)
    print(f"{len(new)} scenarios (seed {args.seed}), this checkout vs {args.against}; outcomes:")
    for outcome, n in sorted(kinds.items(), key=lambda kv: (kv[0].split(":")[0], -kv[1])):
        print(f"  {n:6d}  {outcome}")
    differences = compare(old, new)
    print(f"{len(differences)} Plan(s) differ")
    for d in differences:
        print(d)
    unreached = unreached_outcomes(kinds)
    if unreached:  # identical Plans would prove nothing about these
        print(f"the scenarios no longer reach: {', '.join(unreached)}")
    return 1 if differences else 2 if unreached else 0


if __name__ == "__main__":
    sys.exit(main())
