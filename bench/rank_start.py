"""How ranks start: forked from a preloaded fork server vs spawned; trials sharing the cores vs not.

Two side-by-side comparisons, each alternating its sides over the repeats (medians reported):

* ``node``: ``rljob train`` of the quickstart for 2 steps with 2 processes, end to end (the
  process's wall time), with ``RLJOB_RANK_START=forkserver`` (the default on a machine without a
  GPU: a fork server imports TRL, transformers and torch once while the pre-flight runs, and each
  rank is a fork of it) and ``RLJOB_RANK_START=spawn`` (each rank a fresh interpreter importing
  them itself, as on GPU nodes). Both sides must log the same rewards.
* ``trials``: ``rljob experiment`` with 2 one-process trials of 20 steps at once, with the cores
  shared (the default: ``OMP_NUM_THREADS`` = cores ÷ processes at once) and with each trial's
  process using every core (``OMP_NUM_THREADS`` = cores, which the runner keeps when set: how the
  runner behaved before). Both sides must reach the same objectives.

    python -m bench.rank_start [--repeats 5] [--trial-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, median, run, write_result

STEPS = 2
TRIAL_STEPS = 20


def node_manifest() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["training"]["maxSteps"] = STEPS
    doc["spec"]["checkpoint"]["everySteps"] = 1000
    return doc


def experiment_manifest() -> dict[str, Any]:
    """Two seeds of one arm: one-process trials of the quickstart task (as tests/contract/test_cli_experiment_training.py)."""
    template = {
        "workers": {"replicas": 1, "procsPerWorker": 1},
        "training": {
            "model": "builtin:tiny", "dataset": {"name": "builtin:repeat-char", "size": 256},
            "rewards": [{"name": "repeat_char", "kwargs": {"length": 6}}],
            "batchSize": 16, "numGenerations": 8, "maxCompletionLength": 6, "learningRate": 0.01,
            "maxSteps": TRIAL_STEPS, "seed": 0, "trl": {"lr_scheduler_type": "constant", "temperature": 1.0},
        },
        "checkpoint": {"everySteps": 1000, "keepLast": 1},
    }
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment", "metadata": {"name": "bench-cores"},
            "spec": {"template": template, "seeds": 2, "objective": {"k": 5},
                     "arms": [{"name": "only", "overrides": {}}]}}


def node_run(folder: Path, side: str) -> tuple[float, list[Any]]:
    folder.mkdir(parents=True)
    manifest = folder / "job.yaml"
    manifest.write_text(yaml.safe_dump(node_manifest()))
    wall = run([sys.executable, "-m", "rljob", "train", str(manifest), "--output", str(folder / "out")],
               RLJOB_RANK_START=side)
    return wall, json.loads((folder / "out" / "summary.json").read_text())["reward_history"]


def trials_run(folder: Path, side: str) -> tuple[float, list[float]]:
    folder.mkdir(parents=True)
    manifest = folder / "exp.yaml"
    manifest.write_text(yaml.safe_dump(experiment_manifest()))
    extra = {"OMP_NUM_THREADS": str(os.cpu_count() or 1)} if side == "all-cores" else {}
    wall = run([sys.executable, "-m", "rljob", "experiment", str(manifest), "--output", str(folder / "out"),
                "--parallel", "2"], **extra)
    trials = json.loads((folder / "out" / "summary.json").read_text())["status"]["trials"]
    return wall, sorted(t["objective"] for t in trials)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs per side, node start")
    parser.add_argument("--trial-repeats", type=int, default=3, help="alternating runs per side, trials")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.trial_repeats < 1:
        parser.error("repeats must be at least 1")

    os.environ.pop("OMP_NUM_THREADS", None)  # the shared side is the runner's own choice
    node: dict[str, list[float]] = {"forkserver": [], "spawn": []}
    trials: dict[str, list[float]] = {"shared": [], "all-cores": []}
    with tempfile.TemporaryDirectory(prefix="rljob-bench-rank-start-") as tmp:
        rewards: dict[str, Any] = {}
        for repeat in range(args.repeats):
            for side in (("forkserver", "spawn") if repeat % 2 == 0 else ("spawn", "forkserver")):
                wall, history = node_run(Path(tmp) / f"node-{side}-{repeat}", side)
                node[side].append(wall)
                if rewards.setdefault(side, history) != history:
                    raise SystemExit(f"bench.rank_start: {side} logged different rewards across repeats")
            print(f"node {repeat + 1}/{args.repeats}: forkserver {node['forkserver'][-1]:.1f} s, "
                  f"spawn {node['spawn'][-1]:.1f} s", flush=True)
        if rewards["forkserver"] != rewards["spawn"]:
            raise SystemExit(f"bench.rank_start: the sides logged different rewards: {rewards}")
        objectives: dict[str, list[float]] = {}
        for repeat in range(args.trial_repeats):
            for side in (("shared", "all-cores") if repeat % 2 == 0 else ("all-cores", "shared")):
                wall, found = trials_run(Path(tmp) / f"trials-{side}-{repeat}", side)
                trials[side].append(wall)
                objectives.setdefault(side, found)
            print(f"trials {repeat + 1}/{args.trial_repeats}: shared {trials['shared'][-1]:.1f} s, "
                  f"all cores {trials['all-cores'][-1]:.1f} s", flush=True)
        if objectives["shared"] != objectives["all-cores"]:
            raise SystemExit(f"bench.rank_start: the sides reached different objectives: {objectives}")

    fork, spawn = median(node["forkserver"]), median(node["spawn"])
    shared, every = median(trials["shared"]), median(trials["all-cores"])
    summary = [
        {"metric": f"2-rank {STEPS}-step run end to end, ranks forked from the fork server vs spawned (median)",
         "value": f"{fork:.1f} vs {spawn:.1f} s ({spawn / fork:.2f}x)", "unit": ""},
        {"metric": f"2 one-process trials of {TRIAL_STEPS} steps at once, cores shared vs each using all (median)",
         "value": f"{shared:.1f} vs {every:.1f} s ({every / shared:.2f}x)", "unit": ""},
    ]
    path = write_result("rank_start", {
        "repeats": args.repeats, "trial_repeats": args.trial_repeats,
        "node": {"forkserver_s": node["forkserver"], "spawn_s": node["spawn"], "forkserver_median_s": round(fork, 2),
                 "spawn_median_s": round(spawn, 2), "ratio_spawn_over_forkserver": round(spawn / fork, 2),
                 "rewards": rewards["forkserver"]},
        "trials": {"shared_s": trials["shared"], "all_cores_s": trials["all-cores"],
                   "shared_median_s": round(shared, 2), "all_cores_median_s": round(every, 2),
                   "ratio_all_cores_over_shared": round(every / shared, 2), "objectives": objectives["shared"]},
        "summary": summary,
    })
    for row in summary:
        print(f"{row['metric']}: {row['value']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
