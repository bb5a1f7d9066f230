"""GRPO on a 0.5B-class model built from a config: rljob vs plain TRL, tokens/s and step time.

For a machine with a GPU (bf16). With ``--small`` (the default when no GPU is present) it
runs end to end on CPU with the quickstart-sized model, so the script itself stays tested.
The two sides alternate (plain, rljob, plain, rljob, ...) over ``--repeats`` rounds and the
summary reports medians, so machine noise hits both alike. Both sides do the same work: one
process, the same seed (so the same completions and the same tokens), and a checkpoint after
the last step (rljob always saves one; the plain script is told to). Tokens are counted the
same way on both sides (``rljob_trainer.telemetry.tokens_seen``: TRL's prompt + completion
tokens over the run), so the tokens/s ratio equals the step-time ratio whenever both sides
generated the same tokens; the summary shows both token counts so a difference is visible.

    python -m bench.gpu_grpo [--steps 20] [--repeats 3] [--small]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, median, plain_trl, rljob_train, write_result

# Qwen2.5-0.5B-like shape on the character vocabulary (~360M parameters without its large embedding).
HALF_B = {"hiddenSize": 896, "intermediateSize": 4864, "numHiddenLayers": 24, "numAttentionHeads": 14,
          "numKeyValueHeads": 2, "maxPositionEmbeddings": 512}
TARGET_RATIO = 0.97


def bench_manifest(steps: int, small: bool, gpu: bool) -> tuple[dict[str, Any], list[str]]:
    """The rljob manifest and the plain script's extra arguments for the same run."""
    overrides = {} if small else HALF_B
    batch, completion = (16, 6) if small else (32, 128)
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["training"].update({
        "maxSteps": steps, "modelOverrides": overrides, "batchSize": batch, "maxCompletionLength": completion,
        "precision": "bf16" if gpu else "fp32", "learningRate": 1e-5 if not small else 0.003})
    doc["spec"]["workers"] = {"replicas": 1, "procsPerWorker": 1}
    doc["spec"]["checkpoint"] = {"everySteps": 10 * steps, "keepLast": 1}  # only the final one
    snake = {"".join("_" + c.lower() if c.isupper() else c for c in k): v for k, v in overrides.items()}
    extra = ["--model-overrides", json.dumps(snake), "--batch", str(batch), "--max-completion-length",
             str(completion), "--save-at-end"] + (["--bf16"] if gpu else [])
    if not small:
        extra += ["--learning-rate", "1e-5"]
    return doc, extra


def alternate(doc: dict[str, Any], extra: list[str], steps: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Run plain TRL and rljob alternately; per side, each run's step time, tokens and tokens/s."""
    runs: dict[str, list[dict[str, float]]] = {"plain_trl": [], "rljob": []}
    with tempfile.TemporaryDirectory(prefix="rljob-gpu-bench-") as tmp:
        for i in range(repeats):
            plain = plain_trl(Path(tmp) / f"plain-{i}", steps, 1, *extra)
            ours = rljob_train(copy.deepcopy(doc), Path(tmp) / f"rljob-{i}")
            for side, r in (("plain_trl", plain), ("rljob", ours)):
                runs[side].append({"step_seconds": r["train_runtime"] / r["steps"], "tokens": r["num_tokens"],
                                   "tokens_per_second": r["num_tokens"] / r["train_runtime"]})
            print(f"repeat {i}: " + ", ".join(
                f"{side} {runs[side][-1]['step_seconds']:.3f} s/step {runs[side][-1]['tokens_per_second']:.1f} tok/s"
                for side in runs), flush=True)
    return runs


def summarize(runs: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Median rows per side, then the two ratios (step time and tokens/s), which agree when the tokens do."""
    rows: list[dict[str, Any]] = []
    med = {side: {k: median([r[k] for r in rs]) for k in rs[0]} for side, rs in runs.items()}
    for side, name in (("rljob", "rljob"), ("plain_trl", "plain TRL")):
        rows.append({"metric": f"{name} step time (median)", "value": round(med[side]["step_seconds"], 4),
                     "unit": "s"})
        rows.append({"metric": f"{name} tokens/s (median)", "value": round(med[side]["tokens_per_second"], 1),
                     "unit": "tokens/s"})
        rows.append({"metric": f"{name} tokens per run", "value": med[side]["tokens"], "unit": "tokens"})
    ratio = med["plain_trl"]["step_seconds"] / med["rljob"]["step_seconds"]
    rows.append({"metric": "rljob / plain TRL speed (step time)", "value": round(ratio, 3), "unit": "×",
                 "target": f"≥ {TARGET_RATIO}", "met": ratio >= TARGET_RATIO})
    token_ratio = med["rljob"]["tokens_per_second"] / med["plain_trl"]["tokens_per_second"]
    rows.append({"metric": "rljob / plain TRL tokens/s", "value": round(token_ratio, 3), "unit": "×"})
    return rows


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--small", action="store_true", help="quickstart-sized model (CPU smoke run)")
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    small = a.small or not gpu
    doc, extra = bench_manifest(a.steps, small, gpu)
    runs = alternate(doc, extra, a.steps, a.repeats)
    rows = summarize(runs)
    t = doc["spec"]["training"]
    path = write_result("gpu_grpo" if not small else "gpu_grpo_cpu_small", {
        "config": {"steps": a.steps, "repeats": a.repeats, "small": small, "model_overrides": t["modelOverrides"],
                   "batch": t["batchSize"], "max_completion_length": t["maxCompletionLength"], "gpu": gpu},
        "runs": runs,
        "summary": rows,
    })
    print(json.dumps(rows, indent=1), f"\nwrote {path}")


if __name__ == "__main__":
    main()
