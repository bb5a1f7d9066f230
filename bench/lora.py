"""LoRA adapters vs full fine-tuning in rljob's trainer: step time, peak memory, checkpoint bytes.

The quickstart-shaped job (``--small``, the default without a GPU: the 2-layer built-in model on
CPU, one process) or, on a GPU, the 0.5B-class shape of ``bench/gpu_grpo.py``; the two sides
alternate (full, LoRA, full, LoRA, ...) over ``--repeats`` rounds and the summary reports
medians. Peak memory is rank 0's (``summary.json``'s ``peak_memory_bytes``: torch's peak GPU
allocation on a GPU, the process's peak RSS on CPU, where the Python runtime dominates a tiny
model); checkpoint bytes are those of the final checkpoint folder.

    python -m bench.lora [--steps 20] [--repeats 3] [--small]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import median, rljob_train, write_result
from bench.gpu_grpo import bench_manifest

LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "targetModules": ["all-linear"]}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--small", action="store_true", help="quickstart-sized model on CPU")
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    small = a.small or not gpu
    full, _ = bench_manifest(a.steps, small, gpu)
    lora = copy.deepcopy(full)
    lora["spec"]["training"]["lora"] = LORA
    lora["spec"]["training"]["learningRate"] *= 10  # LoRA's usual learning rate
    runs: dict[str, list[dict[str, float]]] = {"full": [], "lora": []}
    with tempfile.TemporaryDirectory(prefix="rljob-lora-bench-") as tmp:
        for i in range(a.repeats):
            for side, doc in (("full", full), ("lora", lora)):
                out = Path(tmp) / f"{side}-{i}"
                s = rljob_train(copy.deepcopy(doc), out)
                ckpt = out / "run" / "checkpoints" / f"checkpoint-{s['steps']}"
                runs[side].append({"step_seconds": s["train_runtime"] / s["steps"],
                                   "peak_memory_bytes": s["peak_memory_bytes"], "checkpoint_bytes": folder_bytes(ckpt)})
            print(f"repeat {i}: " + ", ".join(f"{k} {v[-1]['step_seconds']:.3f} s/step" for k, v in runs.items()),
                  flush=True)
    med = {side: {k: median([r[k] for r in rs]) for k in rs[0]} for side, rs in runs.items()}
    rows: list[dict[str, Any]] = []
    for side in ("full", "lora"):
        rows += [
            {"metric": f"{side} step time (median)", "value": round(med[side]["step_seconds"], 4), "unit": "s"},
            {"metric": f"{side} peak memory (median)", "value": round(med[side]["peak_memory_bytes"] / 2**20, 1),
             "unit": "MiB"},
            {"metric": f"{side} checkpoint size", "value": round(med[side]["checkpoint_bytes"] / 2**20, 3), "unit": "MiB"},
        ]
    rows.append({"metric": "LoRA / full step time", "unit": "×",
                 "value": round(med["lora"]["step_seconds"] / med["full"]["step_seconds"], 3)})
    rows.append({"metric": "LoRA / full checkpoint bytes", "unit": "×",
                 "value": round(med["lora"]["checkpoint_bytes"] / med["full"]["checkpoint_bytes"], 3)})
    path = write_result("lora" if not small else "lora_cpu_small", {
        "config": {"steps": a.steps, "repeats": a.repeats, "small": small, "gpu": gpu, "lora": LORA},
        "runs": runs, "summary": rows,
    })
    print(json.dumps(rows, indent=1), f"\nwrote {path}")


if __name__ == "__main__":
    main()
