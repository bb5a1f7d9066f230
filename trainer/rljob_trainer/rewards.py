"""Resolve the manifest's rewards into TRL reward functions that fail loudly and by name.

A custom reward's module comes from the trainer image, or from its ``source``: a ConfigMap the operator
mounts at ``REWARDS_DIR`` (``rljob_contract.pod``), or an ``s3://…/module.py`` object the launcher fetches
(:func:`prepare_reward_sources`, size-bounded, under the runtime's ``sources.allowed``). The launcher
hands the folders to its ranks (``REWARD_PATH_ENV``); each puts them first on ``sys.path`` before it imports.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rljob_contract import pod as contract
from rljob_contract.runtime import source_allowed
from rljob_contract.spec import (
    MAX_REWARD_MODULE_BYTES,
    EvalMetricSpec,
    RewardSpec,
    TrainerConfig,
    reward_module_file,
)

from rljob_trainer.builtin.rewards import BUILTIN_REWARDS
from rljob_trainer.errors import PermanentError, is_cuda_oom


class RewardFunctionError(PermanentError):
    """A reward function raised, or returned something other than one number per completion."""


def import_reward(spec: RewardSpec | EvalMetricSpec, index: int, where: str | None = None) -> Callable[..., Any]:
    """The callable behind ``spec.name``; a PermanentError naming the field (``where``, by default the
    training reward's) when it cannot be had."""
    where = where or f"spec.training.rewards[{index}].name"
    if ":" not in spec.name:
        return BUILTIN_REWARDS[spec.name]
    use_reward_path()
    module_name, func_name = spec.name.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or anything the module raises while importing
        raise PermanentError(where, f"cannot import module {module_name!r} for reward {spec.name}: {e}") from e
    fn = getattr(module, func_name, None)
    if fn is None:
        raise PermanentError(where, f"module {module_name!r} has no function {func_name!r}")
    if not callable(fn):
        raise PermanentError(where, f"{spec.name} is not callable")
    try:
        inspect.signature(fn).bind(prompts=[], completions=[], **spec.kwargs)
    except TypeError as e:
        raise PermanentError(
            where, f"{spec.name} must accept (prompts, completions, **kwargs) and the given kwargs: {e}"
        ) from e
    return fn


def checked_reward(fn: Callable[..., Any], label: str, kwargs: dict[str, Any]) -> Callable[..., list[float | None]]:
    """Wrap ``fn`` so a bad result stops the run with a message naming ``label``."""
    bound = functools.partial(fn, **kwargs) if kwargs else fn

    def reward(prompts: Any = None, completions: Any = None, **columns: Any) -> list[float | None]:
        try:
            values = bound(prompts=prompts, completions=completions, **columns)
        except Exception as e:
            if is_cuda_oom(e):  # not the function's fault: the node exits EXIT_CUDA_OOM, retried with half the batch
                raise
            raise RewardFunctionError(f"reward function {label}", f"raised {type(e).__name__}: {e}") from e
        n = len(completions or [])
        try:
            values = list(values)
        except TypeError:
            raise RewardFunctionError(
                f"reward function {label}", f"returned {type(values).__name__}, expected a list of {n} numbers"
            ) from None
        if len(values) != n:
            raise RewardFunctionError(
                f"reward function {label}", f"returned {len(values)} values for {n} completions"
            )
        out: list[float | None] = []
        for v in values:
            if v is None:  # TRL allows None: "this reward does not apply to this sample"
                out.append(None)
                continue
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise RewardFunctionError(
                    f"reward function {label}", f"returned a non-number value {v!r}"
                ) from None
            if math.isnan(f):
                raise RewardFunctionError(f"reward function {label}", "returned NaN")
            out.append(f)
        return out

    reward.__name__ = label
    reward.__qualname__ = label
    return reward


def reward_label(spec: RewardSpec) -> str:
    return spec.name.split(":", 1)[1] if ":" in spec.name else spec.name


def resolve_rewards(specs: list[RewardSpec]) -> tuple[list[Callable[..., Any]], list[float]]:
    """Reward callables for TRL and their weights, in manifest order."""
    funcs, weights, seen = [], [], set()
    for i, spec in enumerate(specs):
        label = reward_label(spec)
        if label in seen:  # TRL logs per __name__; keep the series distinct
            label = f"{label}_{i}"
        seen.add(label)
        funcs.append(checked_reward(import_reward(spec, i), label, spec.kwargs))
        weights.append(spec.weight)
    return funcs, weights


# ------------------------------------------------------------------------ reward sources


def prepare_reward_sources(cfg: TrainerConfig, environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """Make every sourced reward module importable: check the mounted ones, fetch the ``uri`` ones into the output
    folder's cache. Returns the environment for the ranks (``REWARD_PATH_ENV``), also set in ``environ``; a
    PermanentError names the field of a module that cannot be had."""
    folders: list[str] = []
    fetched = Path(cfg.output_dir) / ".cache" / "rewards"
    for i, reward in enumerate(cfg.training.rewards):
        source, where = reward.source, f"spec.training.rewards[{i}].source"
        if source is None:
            continue
        if source.config_map is not None:
            path = Path(contract.REWARDS_DIR) / reward_module_file(reward.name)
            if not path.is_file():
                raise PermanentError(f"{where}.configMap", (
                    f"{path} is not there: the operator mounts ConfigMap {source.config_map.name} (key "
                    f"{source.config_map.key}) in the worker pods; outside a cluster give the module a uri, or "
                    "install it"))
            folders.append(contract.REWARDS_DIR)
        elif source.uri is not None:
            fetch_reward_module(source.uri, fetched / reward_module_file(reward.name), cfg, f"{where}.uri")
            folders.append(str(fetched))
    if not folders:
        return {}
    env = {contract.REWARD_PATH_ENV: os.pathsep.join(dict.fromkeys(folders))}
    environ.update(env)
    return env


def fetch_reward_module(uri: str, dest: Path, cfg: TrainerConfig, where: str) -> Path:
    """Download the module at ``uri`` (s3://) to ``dest`` with the runtime's storage endpoint and credentials, at
    most ``MAX_REWARD_MODULE_BYTES``; PermanentError naming ``where`` when it is not allowed, too large or absent."""
    from botocore.exceptions import BotoCoreError, ClientError
    from rljob_contract.plugins.storage.s3 import split_s3

    from rljob_trainer.storage import error_code, s3_client

    if cfg.sources is not None and not source_allowed(uri, cfg.sources):
        allowed = ", ".join(cfg.sources) or "built-ins only"
        raise PermanentError(where, f"{uri} is not under the runtime's sources ({allowed}; its spec.sources.allowed)")
    bucket, key = split_s3(uri)
    client = s3_client(cfg.checkpoint.endpoint_url, cfg.checkpoint.region)
    try:
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > MAX_REWARD_MODULE_BYTES:
            raise PermanentError(where, f"{uri} is {size} bytes; a reward module may have at most "
                                        f"{MAX_REWARD_MODULE_BYTES}")
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_REWARD_MODULE_BYTES + 1)
    except (ClientError, BotoCoreError) as e:
        raise PermanentError(where, f"{error_code(e)} on {uri}") from e
    if len(body) > MAX_REWARD_MODULE_BYTES:  # it grew between the two requests
        raise PermanentError(where, f"{uri} is larger than {MAX_REWARD_MODULE_BYTES} bytes")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    tmp.write_bytes(body)
    os.replace(tmp, dest)
    return dest


def use_reward_path(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Put the folders of ``REWARD_PATH_ENV`` first on ``sys.path`` (once each): a sourced module wins over one of
    the same name elsewhere."""
    folders = [f for f in (environ.get(contract.REWARD_PATH_ENV) or "").split(os.pathsep) if f]
    for folder in reversed(folders):
        if sys.path[:1] != [folder]:
            if folder in sys.path:
                sys.path.remove(folder)
            sys.path.insert(0, folder)
