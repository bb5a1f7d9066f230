"""Build the prompt dataset from ``spec.training.dataset``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rljob_contract.plugins.storage import backend_for
from rljob_contract.spec import DatasetSpec, TrainingSpec

from rljob_trainer.builtin.tasks import BUILTIN_TASKS, builtin_rows
from rljob_trainer.errors import PermanentError

WHERE = "spec.training.dataset"
EVAL_WHERE = "spec.training.evaluation"
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def local_format(name: str) -> str | None:
    return FILE_FORMATS.get(Path(name).suffix.lower())


def check_dataset_source(spec: DatasetSpec, where: str = WHERE) -> None:
    """Cheap checks before any process starts: a local file must exist."""
    if spec.name in BUILTIN_TASKS or backend_for(spec.name).remote:
        return
    looks_local = local_format(spec.name) is not None or spec.name.startswith(("/", "./", "../"))
    if looks_local and not os.path.exists(spec.name):
        raise PermanentError(f"{where}.name", f"dataset file {spec.name!r} does not exist")
    if looks_local and local_format(spec.name) is None:
        raise PermanentError(f"{where}.name", f"{spec.name!r}: use a .jsonl, .parquet or .csv file")


def load_prompts(spec: DatasetSpec, seed: int, cache_dir: str, where: str = WHERE) -> Any:
    """A ``datasets.Dataset`` whose ``prompt`` column holds the prompts (errors name ``where``)."""
    import datasets

    check_dataset_source(spec, where)
    name = spec.name
    if name in BUILTIN_TASKS:
        ds = datasets.Dataset.from_list(builtin_rows(name, spec.size, seed))
    else:
        if backend_for(name).remote:  # object storage (s3://): downloaded through its backend's location
            from rljob_trainer.checkpoints.backends import download_file

            local = "dataset" if where == WHERE else "eval-dataset"
            name = download_file(name, os.path.join(cache_dir, local + Path(name).suffix))
        fmt = local_format(name)
        try:
            if fmt is not None:
                ds = datasets.load_dataset(fmt, data_files=name, split="train")
            else:
                ds = datasets.load_dataset(name, split=spec.split)
        except Exception as e:
            raise PermanentError(f"{where}.name", f"cannot load dataset {spec.name!r}: {e}") from e
    if spec.prompt_field not in ds.column_names:
        raise PermanentError(
            f"{where}.promptField",
            f"column {spec.prompt_field!r} not in dataset {spec.name!r} (columns: {', '.join(ds.column_names)})",
        )
    if spec.prompt_field != "prompt":
        if "prompt" in ds.column_names:
            ds = ds.remove_columns("prompt")
        ds = ds.rename_column(spec.prompt_field, "prompt")
    if len(ds) == 0:
        raise PermanentError(f"{where}.name", f"dataset {spec.name!r} has no rows")
    return ds


def prompt_key(prompt: Any) -> str:
    """A prompt as a string that is equal for equal prompts (text, or a conversation's messages)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def split_held_out(ds: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """(training rows, held-out rows): ``fraction`` of the distinct prompts, chosen with ``seed``, are held
    out with every row that has them, so no held-out prompt is ever trained on. Deterministic: the same
    prompts for the same data, fraction and seed (whatever the row order). At least one prompt each side."""
    import random

    where = f"{EVAL_WHERE}.heldOutFraction"
    distinct = sorted({prompt_key(p) for p in ds["prompt"]})
    if len(distinct) < 2:
        raise PermanentError(where, f"the training data has {len(distinct)} distinct prompt(s); a held-out "
                                    "split needs at least 2 (or give evaluation.dataset)")
    random.Random(seed).shuffle(distinct)
    count = min(len(distinct) - 1, max(1, round(fraction * len(distinct))))
    held = set(distinct[:count])
    is_held = [prompt_key(p) in held for p in ds["prompt"]]
    train = ds.select([i for i, h in enumerate(is_held) if not h])
    return train, ds.select([i for i, h in enumerate(is_held) if h])


def training_and_eval_prompts(training: TrainingSpec, cache_dir: str) -> tuple[Any, Any]:
    """The prompts to train on and, when ``spec.training.evaluation`` is set, those to evaluate on
    (the held-out part of the training data, or its own dataset), else None."""
    ds = load_prompts(training.dataset, training.seed, cache_dir)
    evaluation = training.evaluation
    if evaluation is None:
        return ds, None
    if evaluation.held_out_fraction is not None:
        ds, held = split_held_out(ds, evaluation.held_out_fraction, evaluation.held_out_seed)
    else:
        assert evaluation.dataset is not None  # the model's rule: one of the two
        held = load_prompts(evaluation.dataset, training.seed, cache_dir, where=f"{EVAL_WHERE}.dataset")
    return ds, held.select(range(min(len(held), evaluation.max_prompts)))
