"""Build the prompt dataset from ``spec.training.dataset``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rljob_trainer.builtin.tasks import BUILTIN_TASKS, builtin_rows
from rljob_trainer.config import DatasetSpec
from rljob_trainer.errors import PermanentError

WHERE = "spec.training.dataset"
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def local_format(name: str) -> str | None:
    return FILE_FORMATS.get(Path(name).suffix.lower())


def check_dataset_source(spec: DatasetSpec) -> None:
    """Cheap checks before any process starts: a local file must exist."""
    if spec.name in BUILTIN_TASKS or spec.name.startswith("s3://"):
        return
    looks_local = local_format(spec.name) is not None or spec.name.startswith(("/", "./", "../"))
    if looks_local and not os.path.exists(spec.name):
        raise PermanentError(f"{WHERE}.name", f"dataset file {spec.name!r} does not exist")
    if looks_local and local_format(spec.name) is None:
        raise PermanentError(f"{WHERE}.name", f"{spec.name!r}: use a .jsonl, .parquet or .csv file")


def load_prompts(spec: DatasetSpec, seed: int, cache_dir: str) -> Any:
    """A ``datasets.Dataset`` whose ``prompt`` column holds the prompts."""
    import datasets

    check_dataset_source(spec)
    name = spec.name
    if name in BUILTIN_TASKS:
        ds = datasets.Dataset.from_list(builtin_rows(name, spec.size, seed))
    else:
        if name.startswith("s3://"):
            from rljob_trainer.storage import download_object

            name = download_object(name, os.path.join(cache_dir, "dataset" + Path(name).suffix))
        fmt = local_format(name)
        try:
            if fmt is not None:
                ds = datasets.load_dataset(fmt, data_files=name, split="train")
            else:
                ds = datasets.load_dataset(name, split=spec.split)
        except Exception as e:
            raise PermanentError(f"{WHERE}.name", f"cannot load dataset {spec.name!r}: {e}") from e
    if spec.prompt_field not in ds.column_names:
        raise PermanentError(
            f"{WHERE}.promptField",
            f"column {spec.prompt_field!r} not in dataset {spec.name!r} (columns: {', '.join(ds.column_names)})",
        )
    if spec.prompt_field != "prompt":
        if "prompt" in ds.column_names:
            ds = ds.remove_columns("prompt")
        ds = ds.rename_column(spec.prompt_field, "prompt")
    if len(ds) == 0:
        raise PermanentError(f"{WHERE}.name", f"dataset {spec.name!r} has no rows")
    return ds
