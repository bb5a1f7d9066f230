"""Resolve the manifest's rewards into TRL reward functions that fail loudly and by name."""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any

from rljob_contract.spec import EvalMetricSpec, RewardSpec

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
