"""Run history that outlives the custom resources: one small JSON record per finished run.

Rank 0 writes a :class:`RunRecord` beside the run's checkpoints (``<location>/runs/<started>-<hash>.json``,
every location of the run: the primary and each mirror) when the run ends; ``rljob history <location>``
lists the records under a location long after the RLTrainingJob or RLExperiment was deleted.

A record read back from storage is hostile: whoever can write the bucket can write anything there. So
:func:`parse_record` reads it strictly (unknown fields, wrong types, control characters and oversized
files are refused, naming the file), and a caller skips and names a bad one rather than stop.
Torch-free: the CLI reads records without the trainer's stack.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rljob_contract.pod import format_validation_error

#: The folder, under a checkpoint location, that holds the run records.
RECORD_FOLDER = "runs"
#: The largest record read back (a record is about 2 KB; anything larger is not one of ours).
MAX_RECORD_BYTES = 64 << 10
#: Most records ``rljob history`` reads under one location (the newest by name are kept).
MAX_RECORDS = 10_000
RECORD_KIND = "rljob.dev/RunRecord"
#: A record's file name: ``<started as 20261205T061500Z>-<first 12 hex digits of the spec hash>.json``.
RECORD_NAME_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{12}\.json$")

#: Text with no control characters (a record's strings are printed in a terminal).
Text = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*$")]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
MetricName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class CheckpointPointer(_Strict):
    """Where a checkpoint of the run lies (never the weights themselves)."""

    name: Name
    step: int = Field(..., ge=0)
    location: Text | None = None
    metric: MetricName | None = None
    value: float | None = None


class RunRecord(_Strict):
    """One finished run: what ran (spec hash), how it ended, its final and best metrics, where its checkpoints are."""

    kind: Literal["rljob.dev/RunRecord"] = "rljob.dev/RunRecord"
    version: Literal[1] = 1
    job: Name
    namespace: Name | None = None
    spec_hash: str = Field(..., pattern=r"^[0-9a-f]{64}$", description="sha256 of spec.training (canonical JSON).")
    phase: Literal["Succeeded", "Stopped"]
    started: datetime
    finished: datetime
    wall_seconds: float = Field(..., ge=0)
    steps: int = Field(..., ge=0)
    algorithm: Name
    model: Text
    final: dict[MetricName, float] = Field(default_factory=dict, max_length=256,
                                           description="The last logged reward and the final evaluation's values.")
    best: dict[MetricName, float] = Field(default_factory=dict, max_length=256,
                                          description="The best reward and evaluation values over the run.")
    latest_checkpoint: CheckpointPointer | None = None
    best_checkpoint: CheckpointPointer | None = None
    checkpoints: list[Name] = Field(default_factory=list, max_length=1000)
    tracking: dict[Name, Text] = Field(default_factory=dict, max_length=16,
                                       description="Where the run is tracked: mlflow_run_id, wandb_run_id, ...")


def spec_hash(training: Any) -> str:
    """sha256 of a ``TrainingSpec`` as canonical JSON (camelCase, sorted keys): equal specs, equal hashes."""
    body = training.model_dump(mode="json", by_alias=True)
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def record_name(record: RunRecord) -> str:
    """The record's path under its location: ``runs/<started>-<hash>.json`` (names sort by start time)."""
    return f"{RECORD_FOLDER}/{record.started.strftime('%Y%m%dT%H%M%SZ')}-{record.spec_hash[:12]}.json"


def is_record_key(rel: str) -> bool:
    """Whether a path relative to a listed location is a record (``.../runs/<name>.json``)."""
    folder, _, name = rel.rpartition("/")
    return (folder == RECORD_FOLDER or folder.endswith("/" + RECORD_FOLDER)) and bool(RECORD_NAME_RE.match(name))


def dump_record(record: RunRecord) -> bytes:
    return (json.dumps(record.model_dump(mode="json", exclude_none=True), indent=2) + "\n").encode()


class BadRecord(ValueError):
    """A file where a record should be that is not one: ``where`` names it, ``problems`` say why."""

    def __init__(self, where: str, problems: list[str]) -> None:
        super().__init__(f"{where}: " + "; ".join(problems))
        self.where = where
        self.problems = problems


def parse_record(body: bytes, where: str) -> RunRecord:
    """A record read back from storage, strictly (BadRecord naming ``where`` and every problem)."""
    if len(body) > MAX_RECORD_BYTES:
        raise BadRecord(where, [f"{len(body)} bytes, more than a record's {MAX_RECORD_BYTES}"])
    try:
        return RunRecord.model_validate_json(body, strict=True)
    except ValidationError as e:
        raise BadRecord(where, format_validation_error(e)) from None
