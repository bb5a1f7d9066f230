"""The RLExperiment API (``rljob.dev/v1alpha1``): pydantic models of an experiment's spec and status.

An experiment runs trials, each an RLTrainingJob built from ``spec.template``: either ``arms``
(named partial overrides of the template, each run with ``seeds`` seeds: an A/B/n test) or a
``search`` over ``spec.training`` fields (Optuna, random or TPE). Every trial's curve of
``objective.metric`` becomes one number (``objective.reduce``); ``earlyStopping`` stops trials
that fall below the median of the others. The models are CRD-friendly (camelCase aliases,
descriptions, closed objects) except ``arms[].overrides``, a free-form partial job spec that is
validated after it is merged into the template.
"""

from __future__ import annotations

import copy
import json
import os
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_snake
from pydantic_core import InitErrorDetails, PydanticCustomError

from rljob_contract.health import MAX_HEALTH_REPORTS, HealthSignal
from rljob_contract.job import (
    API_VERSION,
    Condition,
    ManifestError,
    ObjectMeta,
    RLTrainingJobSpec,
    StatusModel,
    read_documents,
    starts_with_a_letter,
)
from rljob_contract.pod import format_validation_error, validate_document
from rljob_contract.references import FIXED_FIELDS, references
from rljob_contract.rules import Rule, enforce
from rljob_contract.spec import EVAL_PREFIX, Model, TrainingSpec, check_eval_metric

KIND = "RLExperiment"
PLURAL = "rlexperiments"
SINGULAR = "rlexperiment"
SHORT_NAMES = ["rlexp"]
#: Longest arm name: it goes into trial names and label values.
MAX_ARM_NAME_LENGTH = 20
#: Most points of a trial's curve kept in the status (older points are thinned, see objective.thin).
MAX_CURVE_POINTS = 200
#: Most trials an experiment runs (search.maxTrials; arms × seeds): its status records each of them.
MAX_TRIALS = 500
#: Curve points all trials of an experiment's status keep together (each trial: at most MAX_CURVE_POINTS,
#: at least MIN_CURVE_POINTS): at MAX_TRIALS a trial keeps 10 points, so the status stays under the API
#: server's object size limit (1.5 MiB in etcd); experiments of up to 25 trials keep 200 each.
CURVE_POINT_BUDGET = 5_000
MIN_CURVE_POINTS = 10
#: Bytes of parameters (JSON, ``"name": value``) all trials of a search record together.
PARAMS_BUDGET = 150_000
#: Longest trial message and checkpoint location the experiment's status keeps (a longer message is cut,
#: a longer location dropped: the trial job's own status has it).
MAX_TRIAL_MESSAGE = 256
MAX_TRIAL_CHECKPOINT = 512
#: JSON bytes a number parameter's value may take (a float's repr, e.g. -1.2345678901234567e-300).
_NUMBER_BYTES = 24
#: Most conflicting jobs an experiment's status names (the condition TrialConflict counts them all).
MAX_CONFLICTS_LISTED = 20
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# ------------------------------------------------------------------------------- helpers


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` over ``base``: mappings merge key by key, anything else (lists too) replaces; null
    says nothing (it never removes a template's value)."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def template_document(template: RLTrainingJobSpec) -> dict[str, Any]:
    """The template as written (camelCase, only the fields set), the base arms and parameters merge into."""
    return template.model_dump(by_alias=True, mode="json", exclude_unset=True)


def set_path(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``document`` with the dotted camelCase ``path`` set to ``value`` (missing mappings made)."""
    parts = path.split(".")
    override: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        override = {part: override}
    return deep_merge(document, override)


def curve_points_per_trial(total_trials: int) -> int:
    """Curve points each trial keeps in the status of an experiment of ``total_trials`` trials."""
    return max(MIN_CURVE_POINTS, min(MAX_CURVE_POINTS, CURVE_POINT_BUDGET // max(total_trials, 1)))


def bounded_message(text: Any) -> str | None:
    """A trial's message as the status keeps it: at most MAX_TRIAL_MESSAGE characters (cut with an ellipsis)."""
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= MAX_TRIAL_MESSAGE else text[:MAX_TRIAL_MESSAGE - 1] + "…"


def bounded_checkpoint(location: Any) -> str | None:
    """A checkpoint location as the status keeps it: None when longer than MAX_TRIAL_CHECKPOINT (never cut)."""
    return location if isinstance(location, str) and len(location) <= MAX_TRIAL_CHECKPOINT else None


def _problem(message: str, value: Any, *loc: str | int) -> InitErrorDetails:
    error = PydanticCustomError("rljob_experiment", "{message}", {"message": message})
    return InitErrorDetails(type=error, loc=tuple(loc), input=value)


def spec_errors(document: dict[str, Any]) -> list[str]:
    """Problems of ``document`` as an RLTrainingJob spec, as ``field.path: message`` lines (none: valid)."""
    try:
        validate_document(RLTrainingJobSpec, document)
    except ValidationError as e:
        return format_validation_error(e)
    return []


def _spec_problems(document: dict[str, Any], *loc: str | int) -> list[InitErrorDetails]:
    """Validate ``document`` as an RLTrainingJob spec; each problem located under ``loc``."""
    problems = []
    for line in spec_errors(document):
        path, message = line.split(": ", 1)
        where = [p for p in path.split(".") if p != "(root)"]
        problems.append(_problem(message, document, *loc, *where))
    return problems


_ABSENT = object()


def reference_overrides(overrides: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, why) of each thing an arm's ``overrides`` may not set: the runtime (in either spelling), and any
    field that names a ConfigMap, Secret, … (``rljob_contract.references``).

    An experiment compares training settings on one pod shape, so the runtime is the template's; references are
    checked against the experiment's creator in ``spec.template`` (the admission policy), and trials are created by
    the operator.
    """
    found = [(key, "the runtime is the template's: an experiment compares training settings on one pod shape; "
                   "set spec.template.runtimeRef")
             for field in FIXED_FIELDS for key in dict.fromkeys((field, to_snake(field))) if key in overrides]
    found += [(ref.field, f"it names {ref.kind} {ref.name!r}, checked against the experiment's creator in "
                          "spec.template only: set it there")
              for ref in references(overrides, prefix="")]
    return found


def resolve_training_path(path: str) -> None:
    """Check that ``path`` (``training.learningRate``, ``training.trl.temperature``) names a field
    of ``spec.training``: raises ValueError saying why not. Keys under a free-form mapping
    (``trl``, ``modelOverrides``) are checked when the template is validated with the values."""
    parts = path.split(".")
    if parts[0] != "training" or len(parts) < 2:
        raise ValueError(f"{path!r} is not under spec.training (write training.<field>, e.g. training.learningRate)")
    model: Any = TrainingSpec
    for depth, part in enumerate(parts[1:], start=1):
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        if part not in fields:
            where = ".".join(parts[:depth])
            raise ValueError(f"{where} has no field {part!r} (fields: {', '.join(sorted(fields))})")
        annotation = fields[part].annotation
        if isinstance(annotation, type) and issubclass(annotation, Model):
            model = annotation
            continue
        if depth == len(parts) - 1 or str(annotation).startswith("dict"):
            return  # a scalar field, or a key of a free-form mapping such as trl
        raise ValueError(f"{'.'.join(parts[: depth + 1])} is not a section; {path!r} goes past it")
    raise ValueError(f"{path!r} names a section, not a field")


# ---------------------------------------------------------------------------------- spec


class Arm(Model):
    """One strategy of an A/B/n test: a partial job spec merged over the template."""

    name: str = Field(
        ..., min_length=1, max_length=MAX_ARM_NAME_LENGTH, pattern=DNS_LABEL,
        description="Arm name (lower-case letters, digits, '-'; it goes into trial names and labels).",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="A partial RLTrainingJob spec (camelCase, e.g. {training: {learningRate: 0.003}}) deep-merged "
        "into the template: mappings merge key by key, lists replace. The result is validated like a job.",
    )


class ParameterType(StrEnum):
    float = "float"
    int = "int"
    categorical = "categorical"


class SearchParameter(Model):
    """One searched field of ``spec.training``."""

    name: str = Field(
        ..., min_length=1, max_length=253,
        description="Dotted path of a spec.training field, e.g. training.learningRate, training.beta, "
        "training.trl.temperature.",
    )
    type: ParameterType = Field(..., description="float (min, max, log), int (min, max, step) or categorical (values).")
    min: float | None = Field(None, description="Lowest value (float, int).")
    max: float | None = Field(None, description="Highest value (float, int).")
    log: bool = Field(False, description="Sample on a log scale (float, int; min > 0).")
    step: int | None = Field(None, ge=1, description="Step between int values (default 1).")
    values: list[str | int | float | bool] | None = Field(
        None, min_length=1, max_length=256, description="The choices (categorical)."
    )

    @field_validator("name")
    @classmethod
    def _under_training(cls, v: str) -> str:
        resolve_training_path(v)
        return v

    @model_validator(mode="after")
    def _shape(self) -> SearchParameter:
        if self.type == ParameterType.categorical:
            if not self.values:
                raise ValueError("@values: a categorical parameter needs values")
            for key in ("min", "max", "step"):
                if getattr(self, key) is not None:
                    raise ValueError(f"@{key}: not used by a categorical parameter (give values)")
            return self
        if self.values is not None:
            raise ValueError(f"@values: not used by a {self.type} parameter (give min and max)")
        if self.min is None or self.max is None:
            raise ValueError(f"@{'min' if self.min is None else 'max'}: a {self.type} parameter needs min and max")
        if self.min >= self.max:
            raise ValueError(f"@max: must be greater than min ({self.max} ≤ {self.min})")
        if self.log and self.min <= 0:
            raise ValueError(f"@min: a log-scale range needs min > 0, got {self.min}")
        if self.type == ParameterType.int:
            for key in ("min", "max"):
                if not float(getattr(self, key)).is_integer():
                    raise ValueError(f"@{key}: an int parameter needs a whole number, got {getattr(self, key)}")
            if self.log and self.step not in (None, 1):
                raise ValueError("@step: Optuna cannot combine log with a step other than 1")
        elif self.step is not None:
            raise ValueError("@step: only int parameters take a step")
        return self

    def recorded_bytes(self) -> int:
        """Most JSON bytes this parameter takes in a trial's recorded ``params`` (``"name": value, ``)."""
        values = [len(json.dumps(v)) for v in self.values or []] or [_NUMBER_BYTES]
        return len(json.dumps(self.name)) + max(values) + 4

    def corner_values(self) -> list[Any]:
        """The values to check the template with: min and max, or every choice."""
        if self.type == ParameterType.categorical:
            return list(self.values or [])
        if self.type == ParameterType.int:
            return [int(self.min or 0), int(self.max or 0)]
        return [self.min, self.max]


_SHAPE = "SearchParameter._shape (in more words, with the values)"
#: CEL on each searched parameter; the model's _under_training and _shape say each in more words.
PARAMETER_RULES = [
    Rule("spec.search.parameters[].name: under training", "spec.search.parameters[]",
         "self.name.startsWith('training.')",
         "spec.search.parameters[].name must name a spec.training field, e.g. training.learningRate", ".name",
         holds=lambda p: p.name.startswith("training."), enforced_by="SearchParameter._under_training"),
    Rule("spec.search.parameters[]: a range needs min and max", "spec.search.parameters[]",
         "self.type == 'categorical' || (has(self.min) && has(self.max))",
         "spec.search.parameters[]: a float or int parameter needs min and max", ".min",
         holds=lambda p: p.type == ParameterType.categorical or (p.min is not None and p.max is not None),
         enforced_by=_SHAPE),
    # (values holds mixed scalars, untyped in a structural schema and so invisible to CEL: the models
    # check that a categorical parameter has them.)
    Rule("spec.search.parameters[]: categorical takes no range", "spec.search.parameters[]",
         "self.type != 'categorical' || (!has(self.min) && !has(self.max))",
         "spec.search.parameters[]: a categorical parameter takes values, not min and max", ".min",
         holds=lambda p: p.type != ParameterType.categorical or (p.min is None and p.max is None),
         enforced_by=_SHAPE),
    Rule("spec.search.parameters[].max: above min", "spec.search.parameters[]",
         "!has(self.min) || !has(self.max) || self.min < self.max",
         "spec.search.parameters[].max must be greater than min", ".max",
         holds=lambda p: p.min is None or p.max is None or p.min < p.max, enforced_by=_SHAPE),
    Rule("spec.search.parameters[].min: positive on a log scale", "spec.search.parameters[]",
         "!has(self.log) || !self.log || !has(self.min) || self.min > 0.0",
         "spec.search.parameters[].min must be > 0 for a log-scale range (log: true)", ".min",
         holds=lambda p: not p.log or p.min is None or p.min > 0, enforced_by=_SHAPE),
]


class SearchAlgorithm(StrEnum):
    random = "random"
    tpe = "tpe"


class SearchSpec(Model):
    """A hyperparameter search over spec.training fields (Optuna samplers, no database)."""

    parameters: list[SearchParameter] = Field(..., min_length=1, max_length=32, description="The searched fields.")
    algorithm: SearchAlgorithm = Field(
        SearchAlgorithm.tpe, description="random or tpe (Optuna's RandomSampler or TPESampler)."
    )
    max_trials: int = Field(..., ge=1, le=MAX_TRIALS,
                            description="Trials to run in all (pruned and failed ones count).")
    parallelism: int = Field(1, ge=1, le=1000, description="Most trials running at once.")
    max_failed_trials: int = Field(
        3, ge=0, le=1000, description="The experiment fails once more trials than this have failed."
    )
    seed: int = Field(0, ge=0, description="Seed of the sampler: the same seed and history ask the same values.")

    @model_validator(mode="after")
    def _params_fit_the_status(self) -> SearchSpec:
        each = sum(p.recorded_bytes() for p in self.parameters)
        if each * self.max_trials > PARAMS_BUDGET:
            raise ValueError(
                f"@maxTrials: the status records every trial's parameters ({each} bytes each with these names and "
                f"values), so at most {PARAMS_BUDGET // each} trials of this search fit (an object is at most 1.5 MiB)")
        return self

    @field_validator("parameters")
    @classmethod
    def _unique(cls, v: list[SearchParameter]) -> list[SearchParameter]:
        seen: set[str] = set()
        for i, p in enumerate(v):
            if p.name in seen:
                raise ValueError(f"@[{i}].name: {p.name!r} is searched twice")
            seen.add(p.name)
        return v


class Reduce(StrEnum):
    last_mean = "lastMean"
    at_step = "atStep"
    area = "area"


class Direction(StrEnum):
    maximize = "maximize"
    minimize = "minimize"


class ObjectiveSpec(Model):
    """How a trial's curve becomes the one number trials are ranked by."""

    metric: str = Field(
        "reward", min_length=1, max_length=253,
        description="A metric the trainer logs: reward (default), loss, or any key of TRL's logs "
        "(e.g. rewards/repeat_char/mean, completions/mean_length).",
    )
    reduce: Reduce = Field(
        Reduce.last_mean,
        description="lastMean: mean of the last k logged values; atStep: the value logged at step (or the last "
        "one before it); area: area under the curve divided by the steps it spans (a mean over steps).",
    )
    k: int = Field(5, ge=1, le=10000, description="lastMean: how many of the last logged values to average.")
    step: int | None = Field(None, ge=1, description="atStep: the step whose value counts.")
    direction: Direction = Field(Direction.maximize, description="maximize or minimize.")

    @model_validator(mode="after")
    def _step_given(self) -> ObjectiveSpec:
        enforce(self, OBJECTIVE_RULES)
        return self


OBJECTIVE_RULES = [
    Rule("spec.objective.step: atStep needs step", "spec.objective", "self.reduce != 'atStep' || has(self.step)",
         "spec.objective.step: reduce atStep needs step", ".step",
         holds=lambda o: o.reduce != Reduce.at_step or o.step is not None,
         refusal="@step: reduce atStep needs step"),
]


class StoppingRule(StrEnum):
    median = "median"


class EarlyStoppingSpec(Model):
    """Stop trials that fall behind: the median stopping rule at rungs."""

    rule: StoppingRule = Field(
        StoppingRule.median,
        description="median: at a rung, stop a trial whose objective so far is worse than the median of the "
        "other trials' objectives at that step.",
    )
    min_steps: int = Field(10, ge=1, description="No trial is stopped before this step.")
    rungs: list[int] | None = Field(
        None, min_length=1, max_length=1000,
        description="Steps at which trials are compared (each ≥ minSteps). Default: every interval steps.",
    )
    interval: int | None = Field(
        None, ge=1, description="Compare every interval steps from minSteps on (default: minSteps)."
    )
    min_trials: int = Field(
        2, ge=1, le=1000, description="Other trials that must have reached a rung before anyone is stopped there."
    )

    @model_validator(mode="after")
    def _rungs_or_interval(self) -> EarlyStoppingSpec:
        if self.rungs is not None and self.interval is not None:
            raise ValueError("@interval: give rungs or interval, not both")
        for i, rung in enumerate(self.rungs or []):
            if rung < self.min_steps:
                raise ValueError(f"@rungs[{i}]: rung {rung} is before minSteps ({self.min_steps})")
        return self

    def rung_steps(self, max_steps: int) -> list[int]:
        """The rungs up to ``max_steps``, ascending."""
        if self.rungs is not None:
            return sorted({r for r in self.rungs if r <= max_steps})
        every = self.interval or self.min_steps
        return list(range(self.min_steps, max_steps + 1, every))


def eval_rung_problem(metric: str, training: TrainingSpec, stopping: EarlyStoppingSpec | None) -> str | None:
    """Why trials could not be pruned on the evaluation metric ``metric`` at ``stopping``'s rungs
    (``field: message``), or None. An ``eval/`` metric is logged only where evaluation runs, so every rung
    must be a multiple of ``evaluation.everySteps``: at any other rung the trials would be judged by an
    older evaluation (the baseline before the first step, for a rung before the first evaluation)."""
    if stopping is None or not metric.startswith("eval/") or training.evaluation is None:
        return None
    every = training.evaluation.every_steps
    missed = [r for r in stopping.rung_steps(training.max_steps - 1) if not every or r % every]
    if not missed:
        return None
    field = "rungs" if stopping.rungs is not None else "interval" if stopping.interval is not None else "minSteps"
    schedule = (f"everySteps {every}: steps {every}, {2 * every}, …" if every
                else "no everySteps: only before the first step and at the end")
    return (f"{field}: rung {missed[0]} is not a step where {metric} is logged (spec.template.training.evaluation "
            f"runs at {schedule}); with an eval/ objective every rung must be a multiple of "
            "spec.template.training.evaluation.everySteps")


class RLExperimentSpec(Model):
    """Desired state of an experiment: a template job, arms or a search, an objective."""

    template: RLTrainingJobSpec = Field(
        ..., description="The RLTrainingJob spec every trial starts from (validated like a job's)."
    )
    arms: list[Arm] | None = Field(
        None, min_length=1, max_length=64, description="An A/B/n test: strategies to compare (give arms or search)."
    )
    seeds: int = Field(1, ge=1, le=100, description="arms: trials per arm, with seeds training.seed, +1, +2, …")
    parallelism: int | None = Field(
        None, ge=1, le=1000, description="arms: most trials running at once (default: all; search.parallelism "
        "bounds a search).",
    )
    search: SearchSpec | None = Field(None, description="A hyperparameter search (give arms or search).")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="What trials are ranked by.")
    early_stopping: EarlyStoppingSpec | None = Field(
        None, description="Stop trials that fall behind the median of the others (off when absent)."
    )
    prune_collapsed: bool = Field(
        False, description="Stop a running trial once its policy collapsed (the health signal entropyCollapse, "
        "spec.template.training.health): it is Pruned, not ranked. Off: it runs on and is marked collapsed.")

    @field_validator("arms")
    @classmethod
    def _arms_valid(cls, arms: list[Arm] | None, info: ValidationInfo) -> list[Arm] | None:
        template = info.data.get("template")
        if arms is None or template is None:
            return arms
        problems: list[InitErrorDetails] = []
        seen: set[str] = set()
        base = template_document(template)
        for i, arm in enumerate(arms):
            if arm.name in seen:
                problems.append(_problem(f"arm {arm.name!r} is given twice", arm.name, i, "name"))
            seen.add(arm.name)
            problems += [_problem(f"an arm may not set {path}: {why}", arm.overrides, i, "overrides", path)
                         for path, why in reference_overrides(arm.overrides)]
            problems += _spec_problems(deep_merge(base, arm.overrides), i, "overrides")
        if problems:
            raise ValidationError.from_exception_data("arms", problems)
        return arms

    @field_validator("search")
    @classmethod
    def _search_values_valid(cls, search: SearchSpec | None, info: ValidationInfo) -> SearchSpec | None:
        """Each end of each range (each choice) must give a valid job: learningRate max 2 is refused here."""
        template = info.data.get("template")
        if search is None or template is None:
            return search
        problems: list[InitErrorDetails] = []
        base = template_document(template)
        for i, parameter in enumerate(search.parameters):
            corners = parameter.corner_values()
            for j, value in enumerate(corners):
                key = "values" if parameter.type == ParameterType.categorical else ("min", "max")[j]
                problems += [_problem(f"{value!r} makes an invalid trial: {line}", value, "parameters", i, key)
                             for line in spec_errors(set_path(base, parameter.name, value))]
        if problems:
            raise ValidationError.from_exception_data("search", problems)
        return search

    @model_validator(mode="after")
    def _eval_objective_logged(self) -> RLExperimentSpec:
        try:
            check_eval_metric(self.objective.metric, self.template.training)
        except ValueError as e:
            raise ValueError(f"@objective.metric: {e} (in template)") from None
        return self

    @model_validator(mode="after")
    def _trials_fit_the_status(self) -> RLExperimentSpec:
        TRIALS_FIT.check(self)
        return self

    @model_validator(mode="after")
    def _eval_objective_at_rungs(self) -> RLExperimentSpec:
        base = template_document(self.template)
        trainings = [("template", self.template.training)] + [
            (f"arm {arm.name}", validate_document(RLTrainingJobSpec, deep_merge(base, arm.overrides)).training)
            for arm in self.arms or [] if arm.overrides]
        for where, training in trainings:
            problem = eval_rung_problem(self.objective.metric, training, self.early_stopping)
            if problem is not None:
                raise ValueError(f"@earlyStopping.{problem} (in {where})")
        return self

    @model_validator(mode="after")
    def _arms_or_search(self) -> RLExperimentSpec:
        ARMS_OR_SEARCH.check(self)
        return self

    @property
    def max_parallel(self) -> int:
        """Most trials running at once: search.parallelism, else parallelism, else every arm trial."""
        if self.search is not None:
            return self.search.parallelism
        return self.parallelism or len(self.arms or []) * self.seeds

    @property
    def total_trials(self) -> int:
        """Trials the experiment runs in all."""
        return self.search.max_trials if self.search is not None else len(self.arms or []) * self.seeds


ARMS_OR_SEARCH = Rule(
    "spec: arms or search", "spec", "has(self.arms) != has(self.search)",
    "spec: give exactly one of spec.arms (an A/B test) or spec.search (a hyperparameter search)", ".arms",
    holds=lambda s: (s.arms is None) != (s.search is None),
    refusal=lambda s: ("@arms: give exactly one of arms (an A/B test) or search (a hyperparameter search), "
                       f"got {'both' if s.arms is not None else 'neither'}"),
)
TRIALS_FIT = Rule(
    "spec.seeds: arms × seeds fit the status", "spec",
    f"!has(self.arms) || size(self.arms) * (has(self.seeds) ? self.seeds : 1) <= {MAX_TRIALS}",
    f"spec.seeds: arms × seeds must be at most {MAX_TRIALS} trials (the status records each)", ".seeds",
    holds=lambda s: s.arms is None or len(s.arms) * s.seeds <= MAX_TRIALS,
    refusal=lambda s: (f"@seeds: {len(s.arms)} arms × {s.seeds} seeds is {len(s.arms) * s.seeds} trials; an "
                       f"experiment runs at most {MAX_TRIALS} (its status records each)"),
)
# An eval/ objective (check_eval_metric, eval_rung_problem): the template must evaluate, and with early
# stopping every rung below maxSteps must be an evaluation step (the models also check the arms' overrides).
_EVAL_OBJECTIVE = "has(self.objective) && has(self.objective.metric) && self.objective.metric.startsWith('eval/')"
_EVALUATION = "self.template.training.evaluation"
_MAX_STEPS = "(has(self.template.training.maxSteps) ? self.template.training.maxSteps : 100)"
_MIN_STEPS = "(has(self.earlyStopping.minSteps) ? self.earlyStopping.minSteps : 10)"


def _on_schedule(step: str) -> str:
    """CEL: ``step`` is past the rungs that count, or a step where the template evaluates."""
    return f"({step} >= {_MAX_STEPS} || has({_EVALUATION}.everySteps) && {step} % {_EVALUATION}.everySteps == 0)"


#: On the resource (metadata is untyped in a CRD): trial jobs are named ``<experiment>-<arm or t<n>>...``, and a
#: job's name must start with a letter (``rljob_contract.job.ROOT_RULES``), so an experiment's must too.
EXPERIMENT_ROOT_RULES = [Rule(
    "metadata.name: starts with a letter", "", "self.metadata.name.matches('^[a-z]')",
    "metadata.name must start with a lower-case letter: it begins the names of the experiment's trial jobs, "
    "whose Services need one", None,
    holds=lambda experiment: starts_with_a_letter(experiment.metadata.name),
    enforced_by="ObjectMeta._starts_with_a_letter",
)]


#: RLExperimentSpec's rules across its sections, in the CRD's order.
EXPERIMENT_RULES = [
    ARMS_OR_SEARCH,
    TRIALS_FIT,
    Rule("spec.objective.metric: eval/ needs evaluation", "spec",
         f"!({_EVAL_OBJECTIVE}) || (has(self.template.training) && has({_EVALUATION}))",
         "spec.objective.metric: an evaluation metric (eval/...) needs spec.template.training.evaluation",
         ".objective.metric",
         holds=lambda s: not s.objective.metric.startswith(EVAL_PREFIX) or s.template.training.evaluation is not None,
         enforced_by="check_eval_metric (RLExperimentSpec._eval_objective_logged)"),
    Rule("spec.earlyStopping: rungs on the evaluation schedule", "spec",
         f"!({_EVAL_OBJECTIVE}) || !has(self.earlyStopping) || !has(self.template.training) || !has({_EVALUATION})"
         f" || (has(self.earlyStopping.rungs) ? self.earlyStopping.rungs.all(r, {_on_schedule('r')})"
         # minSteps, minSteps + interval, …: all on schedule when the first is and so is the interval (or one is due)
         f" : {_on_schedule(_MIN_STEPS)} && (!has(self.earlyStopping.interval)"
         f" || {_MIN_STEPS} + self.earlyStopping.interval >= {_MAX_STEPS}"
         f" || {_on_schedule('self.earlyStopping.interval')}))",
         "spec.earlyStopping: with an eval/ objective every rung (below maxSteps) must be a multiple of "
         "spec.template.training.evaluation.everySteps, the steps where evaluation metrics are logged",
         ".earlyStopping",
         holds=None, enforced_by="eval_rung_problem (RLExperimentSpec._eval_objective_at_rungs)"),
]


# -------------------------------------------------------------------------------- status


class ExperimentPhase(StrEnum):
    pending = "Pending"
    running = "Running"
    succeeded = "Succeeded"
    failed = "Failed"


class TrialPhase(StrEnum):
    pending = "Pending"
    running = "Running"
    succeeded = "Succeeded"
    failed = "Failed"
    pruned = "Pruned"


#: Trial phases that are final: the trial's objective no longer changes.
FINISHED_TRIAL_PHASES = frozenset({TrialPhase.succeeded.value, TrialPhase.failed.value, TrialPhase.pruned.value})


class CurvePoint(StatusModel):
    """One logged value of the objective's metric."""

    step: int = Field(..., description="Optimizer step.")
    value: float = Field(..., description="The metric's value logged at that step.")


class TrialStatus(StatusModel):
    """One trial (an RLTrainingJob owned by the experiment)."""

    name: str = Field(..., description="The trial's RLTrainingJob name.")
    uid: str | None = Field(
        None, max_length=64,
        description="UID of the trial's RLTrainingJob, recorded by the operator once it has created it: a job of "
        "that name with another UID (or none recorded) is a conflict, never this trial.")
    number: int = Field(..., description="The trial's number, 0-based, in creation order.")
    arm: str | None = Field(None, description="arms: the trial's arm.")
    params: dict[str, str | int | float | bool] | None = Field(
        None, description="search: the parameter values (by spec.search.parameters[].name)."
    )
    seed: int = Field(..., description="spec.training.seed of the trial.")
    phase: TrialPhase = Field(TrialPhase.pending, description="Pending, Running, Succeeded, Failed or Pruned.")
    objective: float | None = Field(None, description="The objective of the curve so far (final once finished).")
    steps: int | None = Field(None, description="Steps the trial ran (the last logged step).")
    checkpoint: str | None = Field(None, max_length=MAX_TRIAL_CHECKPOINT,
                                   description="The trial's best (else newest) complete checkpoint.")
    pruned: bool = Field(False, description="Stopped by early stopping.")
    pruned_at_step: int | None = Field(None, description="The rung at which it was stopped.")
    message: str | None = Field(None, max_length=MAX_TRIAL_MESSAGE, description="Why it failed or was pruned.")
    health: list[HealthSignal] = Field(
        default_factory=list, max_length=MAX_HEALTH_REPORTS,
        description="The health signals that tripped in the trial (docs/guides/health.md); entropyCollapse marks "
                    "it collapsed on the leaderboard.")
    curve: list[CurvePoint] = Field(
        default_factory=list, max_length=MAX_CURVE_POINTS,
        description=f"The objective's metric by step (at most {MAX_CURVE_POINTS} points, fewer in an experiment of "
        f"more than {CURVE_POINT_BUDGET // MAX_CURVE_POINTS} trials: {CURVE_POINT_BUDGET} in all, at least "
        f"{MIN_CURVE_POINTS} each; evenly thinned, the first and the last kept).",
    )


    @field_validator("message", mode="before")
    @classmethod
    def _message_bounded(cls, v: Any) -> str | None:
        return bounded_message(v)  # a status written before the bound is read, and written back within it

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _checkpoint_bounded(cls, v: Any) -> str | None:
        return bounded_checkpoint(v)


class ArmStatus(StatusModel):
    """One arm's objective over its seeds."""

    name: str = Field(..., description="The arm.")
    n: int = Field(0, description="Finished trials with an objective.")
    mean: float | None = Field(None, description="Mean objective over those trials.")
    ci95_low: float | None = Field(None, description="Lower end of the 95 % confidence interval of the mean.")
    ci95_high: float | None = Field(None, description="Upper end of that interval.")
    note: str | None = Field(None, description="Why there is no interval (e.g. not enough seeds).")
    trials: list[str] = Field(default_factory=list, description="The arm's trials.")
    collapsed: int = Field(0, description="Of those n trials, the ones whose policy collapsed (entropyCollapse).")


class LeaderboardEntry(StatusModel):
    """One row of the leaderboard (an arm, or a trial of a search)."""

    rank: int = Field(..., description="1 is the best.")
    name: str = Field(..., description="The arm or the trial.")
    objective: float | None = Field(None, description="Mean objective (arm) or objective (trial).")
    ci95_low: float | None = Field(None, description="arms: lower end of the 95 % interval.")
    ci95_high: float | None = Field(None, description="arms: upper end of the 95 % interval.")
    n: int = Field(1, description="Trials behind the number.")
    collapsed: int = Field(
        0, description="Of the trials behind the number, those whose policy collapsed (entropyCollapse): a rank "
                       "that rests on them says little about the strategy.")


class BestTrial(StatusModel):
    """The best finished trial."""

    trial: str = Field(..., description="The trial's name.")
    objective: float = Field(..., description="Its objective.")
    checkpoint: str | None = Field(None, description="Its best checkpoint's location.")
    params: dict[str, str | int | float | bool] | None = Field(None, description="search: its parameters.")
    arm: str | None = Field(None, description="arms: its arm.")


class Winner(StatusModel):
    """The best arm, and whether it is significantly better than the runner-up."""

    arm: str = Field(..., description="The arm with the best mean objective.")
    runner_up: str | None = Field(None, description="The second-best arm.")
    significant: bool = Field(False, description="p-value < 0.05 under the test below.")
    test: str = Field("", description="The test used (Welch's two-sample t-test), or why none could be run.")
    p_value: float | None = Field(None, description="Two-sided p-value of that test.")
    message: str = Field("", description="The verdict in words.")


class RLExperimentStatus(StatusModel):
    """Observed state of an experiment (written by the operator or by rljob experiment)."""

    phase: ExperimentPhase | None = Field(None, description="Pending, Running, Succeeded or Failed.")
    reason: str | None = Field(None, description="CamelCase reason of the current phase.")
    message: str | None = Field(None, description="Human-readable details.")
    observed_generation: int | None = Field(None, description="metadata.generation last acted on.")
    trials_total: int = Field(0, description="Trials the experiment runs in all.")
    trials_done: int = Field(0, description="Trials finished (succeeded, failed or pruned).")
    summary: str = Field("", description="done/total, for kubectl get.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="kstatus-compatible conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    trials: list[TrialStatus] = Field(default_factory=list, description="Every trial started, in creation order.")
    arms: list[ArmStatus] = Field(default_factory=list, description="arms: each arm's objective over seeds.")
    leaderboard: list[LeaderboardEntry] = Field(default_factory=list, description="Arms or trials, best first.")
    best: BestTrial | None = Field(None, description="The best finished trial and its checkpoint.")
    best_name: str | None = Field(None, description="Best arm (arms) or trial (search), for kubectl get.")
    best_objective: float | None = Field(None, description="Its objective, for kubectl get.")
    winner: Winner | None = Field(None, description="arms: the winning arm and its significance.")
    conflicts: list[str] = Field(
        default_factory=list, max_length=MAX_CONFLICTS_LISTED,
        description=f"RLTrainingJobs that carry the experiment's label but that it did not create (their UID is "
        f"not a trial's): never counted as trials (the first {MAX_CONFLICTS_LISTED} names).")


class RLExperiment(Model):
    """An experiment: one manifest for a laptop (``rljob experiment``) and a cluster."""

    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = Field(KIND)
    metadata: ObjectMeta
    spec: RLExperimentSpec
    status: RLExperimentStatus | None = None

    @model_validator(mode="after")
    def _kind_and_version(self) -> RLExperiment:
        if self.api_version != API_VERSION:
            raise ValueError(f"apiVersion must be {API_VERSION}, got {self.api_version!r}")
        if self.kind != KIND:
            raise ValueError(f"kind must be {KIND}, got {self.kind!r}")
        return self


def parse_experiment(document: Any, source: str = "<manifest>") -> RLExperiment:
    """A parsed YAML document → RLExperiment; ManifestError naming ``source`` and each field."""
    if not isinstance(document, dict):
        raise ManifestError(source, ["(root): expected a mapping with apiVersion, kind, metadata and spec"])
    try:
        return validate_document(RLExperiment, document)
    except ValidationError as e:
        raise ManifestError(source, format_validation_error(e)) from None


def load_experiment(path: str | os.PathLike[str]) -> RLExperiment:
    """The one RLExperiment in a YAML file (other kinds are skipped); ManifestError names file and field."""
    source = str(path)
    documents = read_documents(path)
    found = [d for d in documents if not (isinstance(d, dict) and d.get("kind") not in (None, KIND))]
    if len(found) != 1:
        raise ManifestError(source, [f"{len(found)} {KIND} documents; expected exactly one"])
    return parse_experiment(found[0], source)
