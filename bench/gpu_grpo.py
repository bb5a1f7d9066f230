"""GRPO on a 0.5B-class model built from a config: rljob vs plain TRL, tokens/s and step time.

For a machine with a GPU (bf16). With ``--small`` (the default when no GPU is present) it
runs end to end on CPU with the quickstart-sized model, so the script itself stays tested.

    python -m bench.gpu_grpo [--steps 20] [--small]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import yaml

from bench.common import REPO, plain_trl, rljob_train, write_result

# Qwen2.5-0.5B-like shape on the character vocabulary (~360M parameters without its large embedding).
HALF_B = {"hiddenSize": 896, "intermediateSize": 4864, "numHiddenLayers": 24, "numAttentionHeads": 14,
          "numKeyValueHeads": 2, "maxPositionEmbeddings": 512}


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--small", action="store_true", help="quickstart-sized model (CPU smoke run)")
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    small = a.small or not gpu
    overrides = {} if small else HALF_B
    batch, completion = (16, 6) if small else (32, 128)
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    t = doc["spec"]["training"]
    t.update({"maxSteps": a.steps, "modelOverrides": overrides, "batchSize": batch,
              "maxCompletionLength": completion, "precision": "bf16" if gpu else "fp32",
              "learningRate": 1e-5 if not small else 0.003})
    doc["spec"]["workers"] = {"replicas": 1, "procsPerWorker": 1}
    doc["spec"]["checkpoint"] = {"everySteps": 10 * a.steps, "keepLast": 1}
    with tempfile.TemporaryDirectory(prefix="rljob-gpu-bench-") as tmp:
        ours = rljob_train(copy.deepcopy(doc), Path(tmp) / "rljob")
        snake = {"".join("_" + c.lower() if c.isupper() else c for c in k): v for k, v in overrides.items()}
        extra = ["--model-overrides", json.dumps(snake), "--batch", str(batch),
                 "--max-completion-length", str(completion)] + (["--bf16"] if gpu else [])
        plain = plain_trl(Path(tmp) / "plain", a.steps, 1, *extra)
        tb_dir = Path(tmp) / "rljob" / "run"
        ours_tokens = _rljob_tokens(tb_dir)
    rows = []
    for name, runtime, steps, tokens in [
        ("rljob", ours["train_runtime"], ours["steps"], ours_tokens),
        ("plain TRL", plain["train_runtime"], plain["steps"], plain["num_tokens"]),
    ]:
        rows.append({"metric": f"{name} step time", "value": round(runtime / steps, 4), "unit": "s"})
        rows.append({"metric": f"{name} tokens/s", "value": round(tokens / runtime, 1), "unit": "tokens/s"})
    ratio = (plain["train_runtime"] / plain["steps"]) / (ours["train_runtime"] / ours["steps"])
    rows.append({"metric": "rljob / plain TRL speed", "value": round(ratio, 3), "unit": "×",
                 "target": "≥ 0.97", "met": ratio >= 0.97})
    path = write_result("gpu_grpo" if not small else "gpu_grpo_cpu_small", {
        "config": {"steps": a.steps, "small": small, "model_overrides": overrides, "batch": batch,
                   "max_completion_length": completion, "gpu": gpu},
        "summary": rows,
    })
    print(json.dumps(rows, indent=1), f"\nwrote {path}")


def _rljob_tokens(run_dir: Path) -> float:
    # The Trainer logs cumulative num_tokens; the newest TensorBoard value is the total.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    best = 0.0
    for events in run_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        if "train/num_tokens" in acc.Tags().get("scalars", []):
            best = max(best, max(e.value for e in acc.Scalars("train/num_tokens")))
    return best


if __name__ == "__main__":
    main()
