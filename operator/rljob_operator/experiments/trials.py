"""An experiment → its trials: deterministic names, labels and full RLTrainingJob specs (pure).

Names are a function of the experiment and the trial (``<exp>-<arm>-s<seed>``, ``<exp>-t<number>``),
so a reconcile that runs twice, or after a restart, finds the trial it made instead of making a
second one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from rljob_contract.experiment import (
    Arm,
    RLExperiment,
    RLExperimentSpec,
    deep_merge,
    set_path,
    template_document,
)
from rljob_contract.job import API_VERSION, EXPERIMENT_LABEL, KIND, MAX_NAME_LENGTH, RLTrainingJobSpec
from rljob_contract.pod import validate_document

LABEL_EXPERIMENT = EXPERIMENT_LABEL
LABEL_ARM = "rljob.dev/arm"
LABEL_TRIAL = "rljob.dev/trial"
#: Trial names are job names, so they obey the job name bound.
MAX_TRIAL_NAME_LENGTH = MAX_NAME_LENGTH
_HASH_LENGTH = 6


def trial_name(experiment: str, suffix: str) -> str:
    """``<experiment>-<suffix>`` as a DNS label of at most MAX_TRIAL_NAME_LENGTH characters.

    Characters outside ``[a-z0-9-]`` become ``-``. A name that is too long keeps its suffix whole and
    is cut in the experiment part, which gets a short hash of the full name, so two long experiment
    names that share a prefix still give different trial names.
    """
    clean = re.sub(r"[^a-z0-9-]+", "-", f"{experiment}-{suffix}".lower()).strip("-")
    if len(clean) <= MAX_TRIAL_NAME_LENGTH:
        return clean
    digest = hashlib.sha256(clean.encode()).hexdigest()[:_HASH_LENGTH]
    tail = re.sub(r"[^a-z0-9-]+", "-", suffix.lower()).strip("-")[: MAX_TRIAL_NAME_LENGTH // 2]
    head = clean[: MAX_TRIAL_NAME_LENGTH - len(tail) - _HASH_LENGTH - 2].rstrip("-")
    return f"{head}-{digest}-{tail}"


@dataclass(frozen=True)
class Trial:
    """One trial to run: its job name, identity within the experiment and full job spec."""

    name: str
    number: int
    seed: int
    spec: RLTrainingJobSpec
    arm: str | None = None
    params: dict[str, Any] | None = field(default=None)


def arm_spec(spec: RLExperimentSpec, arm: Arm) -> RLTrainingJobSpec:
    """The template with ``arm.overrides`` deep-merged in (valid: the experiment's validation checked it)."""
    return validate_document(RLTrainingJobSpec, deep_merge(template_document(spec.template), arm.overrides))


def with_seed(spec: RLTrainingJobSpec, seed: int) -> RLTrainingJobSpec:
    """``spec`` with ``training.seed`` set."""
    return spec.model_copy(update={"training": spec.training.model_copy(update={"seed": seed})})


def arm_trials(experiment: RLExperiment) -> list[Trial]:
    """Every trial of an A/B/n test: for each arm (in order) ``seeds`` trials with seeds s, s+1, …,
    s being the arm's training.seed; numbered arm by arm."""
    spec = experiment.spec
    trials = []
    for a, arm in enumerate(spec.arms or []):
        base = arm_spec(spec, arm)
        for i in range(spec.seeds):
            seed = base.training.seed + i
            trials.append(Trial(
                name=trial_name(experiment.metadata.name, f"{arm.name}-s{seed}"),
                number=a * spec.seeds + i, seed=seed, spec=with_seed(base, seed), arm=arm.name,
            ))
    return trials


def trial_spec(template: RLTrainingJobSpec, params: dict[str, Any], seed: int) -> RLTrainingJobSpec:
    """The template with each ``params`` path (``training.learningRate``) set and the seed set."""
    document = template_document(template)
    for path, value in params.items():
        document = set_path(document, path, value)
    return with_seed(validate_document(RLTrainingJobSpec, document), seed)


def search_trial(experiment: RLExperiment, number: int, params: dict[str, Any]) -> Trial:
    """Search trial ``number`` with ``params``. Every search trial keeps the template's seed, so
    trials differ only in their parameters."""
    template = experiment.spec.template
    seed = template.training.seed
    return Trial(name=trial_name(experiment.metadata.name, f"t{number}"), number=number, seed=seed,
                 spec=trial_spec(template, params, seed), params=dict(params))


def trial_labels(experiment: str, trial: Trial) -> dict[str, str]:
    """Labels of a trial's RLTrainingJob: its experiment, trial number and (arms) arm."""
    labels = {LABEL_EXPERIMENT: experiment, LABEL_TRIAL: str(trial.number)}
    if trial.arm is not None:
        labels[LABEL_ARM] = trial.arm
    return labels


def trial_manifest(experiment: RLExperiment, trial: Trial) -> dict[str, Any]:
    """The trial's RLTrainingJob document (no ownerReferences: the operator adds those)."""
    metadata: dict[str, Any] = {"name": trial.name, "labels": trial_labels(experiment.metadata.name, trial)}
    if experiment.metadata.namespace:
        metadata["namespace"] = experiment.metadata.namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
            "spec": tracked_in_experiment(trial.spec, experiment.metadata.name).model_dump(
                by_alias=True, mode="json", exclude_none=True)}


def tracked_in_experiment(spec: RLTrainingJobSpec, experiment: str) -> RLTrainingJobSpec:
    """A trial's spec whose MLflow tracking names no MLflow experiment: the RLExperiment's name, so every trial
    lands beside the experiment's parent run (a job alone defaults to its own name)."""
    tracking = spec.training.tracking
    if tracking is None or tracking.mlflow is None or tracking.mlflow.experiment is not None:
        return spec
    mlflow = tracking.mlflow.model_copy(update={"experiment": experiment})
    training = spec.training.model_copy(update={"tracking": tracking.model_copy(update={"mlflow": mlflow})})
    return spec.model_copy(update={"training": training})
