"""Evaluation on held-out prompts (``spec.training.evaluation``, issue #33).

Every rank generates completions for its share of the evaluation prompts (``prompts[rank::world]``),
rank 0 gathers them and computes the metrics: reward functions resolved as the training rewards are
(``exact_match`` gives accuracy), BLEU (sacrebleu) and ROUGE (rouge-score) against a reference column,
and pass@k when sampling. Every rank takes part in the same collective at the same steps (the steps
are the only condition), so evaluating never leaves a rank waiting alone. Sampling runs under a
forked RNG with a fixed seed: evaluation never changes the training's random stream, and the same
model gives the same numbers in training and in ``rljob evaluate``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rljob_contract.spec import (
    EVAL_PREFIX,
    TEXT_METRICS,
    Decoding,
    EvalMetricSpec,
    EvaluationSpec,
    RewardSpec,
)

from rljob_trainer.errors import PermanentError

WHERE = "spec.training.evaluation"
#: Prefix of every evaluation metric's name in logs, heartbeats and summary.json.
PREFIX = EVAL_PREFIX
#: Prompts generated in one batch.
GENERATION_CHUNK = 32


@dataclass
class EvalSet:
    """The evaluation prompts with every column of their rows (reward functions and references read them)."""

    prompts: list[Any]
    columns: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def from_dataset(cls, ds: Any) -> EvalSet:
        columns = {name: list(ds[name]) for name in ds.column_names}
        return cls(prompts=columns.pop("prompt"), columns=columns)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate (Chen et al. 2021) that at least one of k of n samples, c of them correct, passes."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacrebleu's corpus BLEU (0-100), one reference per hypothesis."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


def rouge(kind: str, hypotheses: list[str], references: list[str]) -> float:
    """rouge-score's mean F-measure (0-1) of ``kind`` (rouge1, rouge2, rougeL), with Porter stemming."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer([kind], use_stemmer=True)
    scores = [scorer.score(ref, hyp)[kind].fmeasure for hyp, ref in zip(hypotheses, references, strict=True)]
    return sum(scores) / len(scores) if scores else 0.0


def text_metric(name: str, hypotheses: list[str], references: list[str]) -> float:
    return bleu(hypotheses, references) if name == "bleu" else rouge(name, hypotheses, references)


class Scorer:
    """The configured metrics, resolved once (a reward that cannot be imported is a permanent error)."""

    def __init__(self, spec: EvaluationSpec, rewards: list[RewardSpec]) -> None:
        from rljob_trainer.rewards import checked_reward, import_reward

        self.spec = spec
        self.metrics = spec.metric_specs(rewards)
        self.rewards: dict[str, Callable[..., list[float | None]]] = {}
        for i, metric in enumerate(self.metrics):
            if metric.name not in TEXT_METRICS:
                where = f"{WHERE}.metrics[{i}].name" if spec.metrics else f"spec.training.rewards[{i}].name"
                fn = import_reward(metric, i, where=where)
                self.rewards[metric.label()] = checked_reward(fn, f"eval/{metric.label()}", metric.kwargs)

    @property
    def headline(self) -> str:
        return PREFIX + self.metrics[0].label()

    def score(self, data: EvalSet, completions: list[list[str]]) -> dict[str, float]:
        """``eval/<metric>`` (and ``eval/<metric>/pass_at_<k>``) over ``completions[i]``, prompt i's samples."""
        out: dict[str, float] = {}
        for metric in self.metrics:
            if metric.name in TEXT_METRICS:
                out[PREFIX + metric.label()] = self._text(metric, data, completions)
            else:
                out.update(self._reward(metric, data, completions))
        return out

    def _text(self, metric: EvalMetricSpec, data: EvalSet, completions: list[list[str]]) -> float:
        refs = data.columns.get(self.spec.reference_field)
        if refs is None:
            raise PermanentError(f"{WHERE}.referenceField", (
                f"column {self.spec.reference_field!r} (the reference of {metric.name}) is not in the evaluation "
                f"data (columns: {', '.join(['prompt', *data.columns])})"))
        hyps = [c for group in completions for c in group]
        return text_metric(metric.name, hyps, [str(r) for r, group in zip(refs, completions, strict=True)
                                               for _ in group])

    def _reward(self, metric: EvalMetricSpec, data: EvalSet, completions: list[list[str]]) -> dict[str, float]:
        n = [len(group) for group in completions]

        def repeat(values: list[Any]) -> list[Any]:  # one per completion
            return [v for v, k in zip(values, n, strict=True) for _ in range(k)]

        conversational = bool(data.prompts) and not isinstance(data.prompts[0], str)
        flat: list[Any] = [({"role": "assistant", "content": c} if conversational else c)
                           for group in completions for c in group]
        if conversational:
            flat = [[message] for message in flat]
        columns = {k: repeat(v) for k, v in data.columns.items()}
        values = self.rewards[metric.label()](prompts=repeat(data.prompts), completions=flat, **columns)
        valid = [v for v in values if v is not None]
        name = PREFIX + metric.label()
        out = {name: sum(valid) / len(valid) if valid else math.nan}
        for k in self.spec.pass_at_k:
            out[f"{name}/pass_at_{k}"] = mean_pass_at_k(values, n, k, self.spec.pass_threshold)
        return out


def mean_pass_at_k(values: list[float | None], group_sizes: list[int], k: int, threshold: float) -> float:
    """pass@k averaged over prompts; ``values`` holds each prompt's ``group_sizes[i]`` values in turn, and a
    value passes when it reaches ``threshold`` (None never does)."""
    per_prompt, start = [], 0
    for count in group_sizes:
        group = values[start:start + count]
        start += count
        per_prompt.append(pass_at_k(count, sum(1 for v in group if v is not None and v >= threshold), k))
    return sum(per_prompt) / len(per_prompt) if per_prompt else math.nan


def prompt_ids(tokenizer: Any, prompts: Sequence[Any]) -> list[list[int]]:
    """Token ids of each prompt, as TRL's trainers tokenize them (a chat template for conversations)."""
    if prompts and not isinstance(prompts[0], str):
        return [list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]) for p in prompts]
    return [list(ids) for ids in tokenizer(text=list(prompts))["input_ids"]]


def generate(model: Any, tokenizer: Any, prompts: Sequence[Any], spec: EvaluationSpec, max_new_tokens: int,
             tick: Callable[[], None] = lambda: None) -> list[list[str]]:
    """Completions (``numGenerations`` each when sampled, else one greedy) of ``prompts``, in batches of
    prompts of one length: no padding, so a prompt's greedy completion does not depend on its neighbours
    (the same model gives the same text in training, on any number of ranks, and in ``rljob evaluate``)."""
    import torch

    ids = prompt_ids(tokenizer, prompts)
    out: list[list[str]] = [[] for _ in prompts]
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(ids):
        by_length.setdefault(len(row), []).append(i)
    sampled = spec.decoding == Decoding.sampled
    device = next(model.parameters()).device
    for indices in by_length.values():
        for start in range(0, len(indices), GENERATION_CHUNK):
            chunk = indices[start:start + GENERATION_CHUNK]
            batch = torch.tensor([ids[i] for i in chunk], dtype=torch.long, device=device)
            generated = model.generate(
                input_ids=batch, attention_mask=torch.ones_like(batch), max_new_tokens=max_new_tokens,
                do_sample=sampled, temperature=spec.temperature if sampled else None, top_p=None, top_k=None,
                num_return_sequences=spec.num_generations, pad_token_id=tokenizer.pad_token_id, use_cache=True,
            )
            texts = tokenizer.batch_decode(generated[:, batch.shape[1]:], skip_special_tokens=True)
            for j, i in enumerate(chunk):
                out[i] = texts[j * spec.num_generations:(j + 1) * spec.num_generations]
            tick()
    return out


def _rank_and_world() -> tuple[int, int, Any]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size(), dist
    return 0, 1, None


def evaluate_model(model: Any, tokenizer: Any, data: EvalSet, scorer: Scorer, max_new_tokens: int,
                   seed: int, tick: Callable[[], None] = lambda: None) -> dict[str, float] | None:
    """Every rank generates for its share of the prompts; rank 0 gathers the completions and returns the
    metrics (the other ranks None). A collective: every rank must call it at the same point."""
    import torch

    rank, world, dist = _rank_and_world()
    mine = list(range(rank, len(data.prompts), world))
    was_training = model.training
    model.eval()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []  # manual_seed seeds all
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed + rank)
            texts = generate(model, tokenizer, [data.prompts[i] for i in mine], scorer.spec, max_new_tokens, tick)
    finally:
        model.train(was_training)
    shares: list[Any] = [list(zip(mine, texts, strict=True))]
    if dist is not None:
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(shares[0], gathered if rank == 0 else None, dst=0)
        shares = gathered
    if rank != 0:
        return None
    completions: list[list[str]] = [[] for _ in data.prompts]
    for share in shares:
        for i, group in share:
            completions[i] = group
    return scorer.score(data, completions)


class HeartbeatTicker:
    """Heartbeats while rank 0 evaluates (at most every ``interval`` s), so a long evaluation counts as
    progress for the operator's stall detector."""

    def __init__(self, heartbeat: Any, step: int, interval: float = 10.0) -> None:
        self.heartbeat, self.step, self.interval = heartbeat, step, interval
        self.last = time.monotonic()

    def __call__(self) -> None:
        if self.heartbeat is not None and time.monotonic() - self.last >= self.interval:
            self.heartbeat.send(step=self.step, reward=None, loss=None)
            self.last = time.monotonic()


def eval_history(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evaluation records of a Trainer's log history: ``{"step": N, "eval/<metric>": value, …}``."""
    return [h for h in log_history if "step" in h and any(str(k).startswith(PREFIX) for k in h)]


def eval_summary(log_history: list[dict[str, Any]], headline: str | None) -> dict[str, Any] | None:
    """summary.json's ``eval``: the headline metric, the latest and the best record by it (with its step,
    the newer of equals, as keepBest picks), and every record. None when nothing was evaluated."""
    history = eval_history(log_history)
    if not history:
        return None
    headline = headline or next(k for k in history[-1] if k.startswith(PREFIX))
    scored = [h for h in history if isinstance(h.get(headline), int | float) and math.isfinite(h[headline])]
    best = max(scored, key=lambda h: (h[headline], h["step"])) if scored else None  # as keepBest's best_of
    return {"metric": headline, "latest": history[-1], "best": best, "history": history}


def eval_report(log_history: list[dict[str, Any]], headline: str) -> dict[str, Any] | None:
    """The heartbeat's ``evaluation`` (contract.EvalReport): the latest values and the best by ``headline``."""
    summary = eval_summary(log_history, headline)
    if summary is None:
        return None
    latest, best = summary["latest"], summary["best"]
    return {"metric": headline, "step": latest["step"],
            "values": {k: v for k, v in latest.items() if k.startswith(PREFIX)},
            "best_step": best["step"] if best else None, "best_value": best[headline] if best else None}


class EvalReporter:
    """Rank 0's reports of one evaluation: metrics.jsonl, TensorBoard, Prometheus, a heartbeat, and the
    Trainer's log history (which checkpoints keep, so a resumed run's summary has the earlier ones)."""

    def __init__(self, metrics: Any, heartbeat: Any, log_path: Any, tensorboard_dir: str | None,
                 headline: str, tracked: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.metrics, self.heartbeat, self.log_path = metrics, heartbeat, log_path
        self.headline = headline
        self.tracked = tracked  # spec.training.tracking's runs (RunTracking.log_eval)
        self.tensorboard_dir = tensorboard_dir
        self._writer: Any = None

    def report(self, step: int, values: dict[str, float], log_history: list[dict[str, Any]] | None) -> None:
        from rljob_contract.pod import finite_metrics

        from rljob_trainer.telemetry import append_metrics

        if log_history is not None:
            log_history.append({"step": step, **values})
        if self.log_path is not None:
            append_metrics(self.log_path, step, values)
        if self.metrics is not None:
            self.metrics.observe_eval(step, values)
        if self.heartbeat is not None:
            self.heartbeat.evaluation = eval_report(log_history or [{"step": step, **values}], self.headline)
            self.heartbeat.send(step=step, reward=None, loss=None, metrics=finite_metrics(values))
        self._tensorboard(step, values)
        if self.tracked is not None:
            self.tracked(step, values)

    def _tensorboard(self, step: int, values: dict[str, float]) -> None:
        if self.tensorboard_dir is None:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.tensorboard_dir)
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()


def evaluation_callback(evaluation: EvaluationSpec, data: EvalSet, scorer: Scorer, tokenizer: Any,
                        max_new_tokens: int, seed: int, reporter: EvalReporter | None) -> Any:
    """A TrainerCallback evaluating before the first step (``atStart``), every ``everySteps`` and at the last
    step, before that step's checkpoint is saved (so keepBest and the checkpoint's state see the values).
    The condition is the step alone, the same on every rank: all ranks join the same collectives."""
    from transformers import TrainerCallback

    def run(state: Any, model: Any) -> None:
        tick = HeartbeatTicker(reporter.heartbeat if reporter else None, state.global_step)
        values = evaluate_model(model, tokenizer, data, scorer, max_new_tokens, seed, tick)
        if values is not None and reporter is not None:
            reporter.report(state.global_step, values, state.log_history)

    class Evaluate(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            if reporter is not None and reporter.heartbeat is not None:  # resumed: the evaluations so far
                reporter.heartbeat.evaluation = eval_report(state.log_history, reporter.headline)
            if evaluation.at_start and state.global_step == 0:
                run(state, model)

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            every = evaluation.every_steps
            if state.global_step >= state.max_steps or (every and state.global_step % every == 0):
                run(state, model)

    return Evaluate()
