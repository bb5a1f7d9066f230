"""The largest RLExperiment status the operator can write (``tests/operator/test_experiments_cluster.py`` writes it to the
real API server; ``tests/operator/test_experiments_decisions.py`` checks its bounds): a search at MAX_TRIALS trials, each
recording parameters of the whole per-trial share of PARAMS_BUDGET, every trial job hostile (the longest values
its status can hold), and conflicts with the longest names."""

from __future__ import annotations

import copy
from typing import Any

from rljob_contract.experiment import (
    MAX_CONFLICTS_LISTED,
    MAX_TRIAL_CHECKPOINT,
    MAX_TRIALS,
    PARAMS_BUDGET,
    parse_experiment,
)
from rljob_contract.health import HealthSignal
from rljob_operator.decisions.curve import MAX_CURVE_POINTS as JOB_CURVE_POINTS
from rljob_operator.decisions.experiments import plan_experiment
from rljob_operator.experiments.trials import MAX_TRIAL_NAME_LENGTH

#: The longest-printing float JSON has (and the API server keeps as written).
LONG_FLOAT = -1.2345678901234567e-300


def largest_experiment(template: dict[str, Any]) -> dict[str, Any]:
    """A search of MAX_TRIALS trials (its recorded parameters are made larger below)."""
    return {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLExperiment",
            "metadata": {"name": "huge", "namespace": "ns", "uid": "u" * 36, "generation": 1},
            "spec": {"template": copy.deepcopy(template), "search": {"maxTrials": MAX_TRIALS, "parameters": [
                {"name": "training.learningRate", "type": "float", "min": 1e-6, "max": 1e-2}]}}}


def _params() -> dict[str, str]:
    """Parameters whose JSON is the per-trial share of PARAMS_BUDGET."""
    share = PARAMS_BUDGET // MAX_TRIALS
    return {"training.trl.p": "v" * (share - len('{"training.trl.p": ""}'))}


def _trial(number: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(recorded status entry, its hostile job) of trial ``number``."""
    name = f"t{number}-".ljust(MAX_TRIAL_NAME_LENGTH, "x")
    uid = f"{number:08d}-0000-0000-0000-000000000000"
    entry = {"name": name, "uid": uid, "number": number, "params": _params(), "seed": 2**62, "phase": "Running"}
    curve = [{"step": 10**12 + k, "reward": LONG_FLOAT, "loss": LONG_FLOAT,
              "metrics": {f"m{i:02d}".ljust(64, "x"): LONG_FLOAT for i in range(32)}}
             for k in range(JOB_CURVE_POINTS)]
    job = {"metadata": {"name": name, "uid": uid},
           "status": {"phase": "Failed" if number % 2 else "Succeeded", "message": "e" * 100_000,
                      "progress": {"curve": curve, "checkpoint": "s3://" + "c" * (MAX_TRIAL_CHECKPOINT - 5),
                                   "health": _every_health_signal()}}}
    return entry, job


def _every_health_signal() -> list[dict[str, Any]]:
    """Every health signal tripped, and what a hostile writer of the job's status adds (kept out of the trial)."""
    tripped = [{"signal": s.value, "step": 1, "lastStep": 2, "active": True, "value": LONG_FLOAT,
                "threshold": LONG_FLOAT} for s in HealthSignal]
    return tripped + [{"signal": "x" * 10_000}] * 1000


def largest_status(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the experiment, the status the operator writes for it at the maxima)."""
    doc = largest_experiment(template)
    pairs = [_trial(n) for n in range(MAX_TRIALS)]
    doc["status"] = {"trials": [entry for entry, _ in pairs]}
    conflicts = [{"metadata": {"name": f"c{i}-".ljust(253, "z"), "uid": f"forged-{i}"}}
                 for i in range(MAX_CONFLICTS_LISTED + 5)]
    plan = plan_experiment(doc, parse_experiment(doc), [job for _, job in pairs] + conflicts, "2026-01-01T00:00:00Z")
    return doc, plan.status
