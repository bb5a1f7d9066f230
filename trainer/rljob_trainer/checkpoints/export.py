"""``rljob checkpoints export --merged``: a LoRA checkpoint → one Hugging Face model for serving.

A checkpoint of a run with ``spec.training.lora`` holds the adapter only (``adapter_config.json``,
``adapter_model.safetensors``). Export loads the base model the checkpoint was trained on (or ``--base``),
applies the adapter, merges it into the weights (PEFT's ``merge_and_unload``) and writes the result
with ``save_pretrained``, so ``AutoModelForCausalLM.from_pretrained(OUT)`` loads it without PEFT.
The model is written to a temporary folder next to ``OUT`` and renamed into place: an export that
fails leaves nothing behind, and an existing ``OUT`` is never overwritten.

The adapter's files are untrusted (a job's own code wrote them): the base model they name is used
only when it is the one the trainer recorded in the checkpoint's manifest when it sealed it (its
name or path, and the SHA-256 of its ``config.json`` when it is a folder). Otherwise export refuses,
unless the user names the base with ``--base``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from rljob_trainer.checkpoints.manifest import MANIFEST, BaseModelIdentity, load_manifest

ADAPTER_CONFIG = "adapter_config.json"


class ExportError(Exception):
    """Bad input to an export (not an adapter checkpoint, base model missing, output exists)."""


def adapter_base(checkpoint: Path) -> str:
    """The base model an adapter checkpoint was trained on (``base_model_name_or_path``)."""
    config_path = checkpoint / ADAPTER_CONFIG
    if not config_path.is_file():
        raise ExportError(
            f"{checkpoint}: no {ADAPTER_CONFIG}, so not a LoRA adapter checkpoint (a run without "
            "spec.training.lora saves the full model, which loads as it is)"
        )
    try:
        base = json.loads(config_path.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except ValueError as e:
        raise ExportError(f"{config_path}: not JSON: {e}") from e
    if not base:
        raise ExportError(f"{config_path}: names no base model; give one with --base")
    return str(base)


def _config_sha256(name_or_path: str) -> str | None:
    config = Path(name_or_path) / "config.json"
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None


def base_identity(name_or_path: str) -> dict[str, str]:
    """What a manifest records of the base model an adapter is trained on (the trainer calls it)."""
    identity = {"name_or_path": name_or_path}
    digest = _config_sha256(name_or_path)
    if digest is not None:
        identity["config_sha256"] = digest
    return identity


def trusted_base(checkpoint: Path) -> str:
    """The base model to merge ``checkpoint``'s adapter into, when no ``--base`` is given: the one the
    adapter names, if it is the one the manifest recorded, and (for a folder) has the recorded config."""
    named = adapter_base(checkpoint)
    try:  # bounded, no links, validated (base_model included) as every manifest read back from storage
        recorded = load_manifest(checkpoint)[0].get("base_model")
    except (OSError, ValueError) as e:
        raise ExportError(f"{checkpoint / MANIFEST}: no readable base_model: {e}; give the base with --base") from e
    identity = BaseModelIdentity.model_validate(recorded) if recorded is not None else None
    if identity is None:
        raise ExportError(f"{checkpoint / MANIFEST}: records no base model (a checkpoint written before "
                          f"rljob recorded it); the adapter names {named!r}: give the base with --base")
    if named != identity.name_or_path:
        raise ExportError(f"{checkpoint / ADAPTER_CONFIG}: names the base model {named!r}, but the checkpoint was "
                          f"trained on {identity.name_or_path!r} (its manifest); give the base with --base")
    if identity.config_sha256 is not None and _config_sha256(named) != identity.config_sha256:
        raise ExportError(f"{named}: not the base model the checkpoint was trained on (its config.json differs "
                          "from the one recorded in the manifest, or is missing); give the base with --base")
    return named


def export_merged(checkpoint: Path, out: Path, base: str | None = None) -> Path:
    """Merge the adapter in ``checkpoint`` into its base model and write the result to ``out``.

    ``base``: the base model (a folder or hub id) when the one recorded in the adapter is not
    reachable here (a pod's path, for example), or the user's own choice over what the checkpoint
    records. Raises ExportError on bad input.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = base or trusted_base(checkpoint)
    if out.exists():
        raise ExportError(f"{out}: already exists; choose a new folder (export never overwrites)")
    try:
        model = AutoModelForCausalLM.from_pretrained(base)
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot load the base model {base!r} (give the base model's folder with --base): {e}") from e
    try:
        merged = PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload()
    except (OSError, ValueError, RuntimeError) as e:
        raise ExportError(f"{checkpoint}: the adapter does not fit the base model {base!r}: {e}") from e
    # The trainer saves the tokenizer with every checkpoint; an adapter saved elsewhere may lack it.
    tokenizer_from = str(checkpoint) if (checkpoint / "tokenizer_config.json").is_file() else base
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, out)  # same folder, so atomic; fails if out appeared meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
