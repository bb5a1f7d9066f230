"""A tiny causal LM and a character tokenizer, both built locally: nothing is downloaded.

``materialize_builtin_model`` saves them to a folder, because TRL reloads the reference
model from the policy's path when ``beta > 0`` and every rank must load identical weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +-=:.,!?'"
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]

#: Defaults of builtin:tiny — a 2-layer Llama with a 50-token vocabulary (~70k parameters).
TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def build_tokenizer() -> Any:
    """A character-level fast tokenizer: one token per character in ``CHARS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def _snake(key: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in key)


def tiny_config_kwargs(overrides: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(TINY_DEFAULTS)
    kwargs.update({_snake(k): v for k, v in overrides.items()})
    return kwargs


def materialize_builtin_model(cache_dir: str | os.PathLike[str], overrides: dict[str, Any], seed: int) -> Path:
    """Build builtin:tiny with ``overrides`` and ``seed``, save model + tokenizer, return the folder.

    The folder name is a hash of the architecture and seed, so repeated runs reuse it, and a
    half-written folder is never used (it is written under a temporary name, then renamed).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = tiny_config_kwargs(overrides)
    key = hashlib.sha256(json.dumps([kwargs, seed, CHARS], sort_keys=True).encode()).hexdigest()[:12]
    target = Path(cache_dir) / f"builtin-tiny-{key}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, target)
    except OSError:
        # Another process won the race; its folder is complete.
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
