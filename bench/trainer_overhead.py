"""rljob's trainer vs a plain TRL GRPOTrainer script: same quickstart config, same seed, one run.

Both train the quickstart (builtin:tiny, builtin:repeat-char, 2 processes over gloo) with
one checkpoint after the last step on both sides (rljob always saves one; the plain script is
told to); runs alternate (plain, rljob, plain, rljob, ...) so machine
noise hits both alike. Steps/s comes from the Trainer's own ``train_runtime`` (the training
loop, not process start-up); tokens are counted as in ``bench/gpu_grpo.py``
(``rljob_trainer.telemetry.tokens_seen``). Target: rljob's overhead ≤ 3 %. Background checkpoint upload
on vs off is measured by ``bench/checkpoint_upload.py``.

    python -m bench.trainer_overhead [--repeats 3] [--steps 120]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import yaml

from bench.common import REPO, median, plain_trl, rljob_train, write_result

TARGET_OVERHEAD_PCT = 3.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=120)
    a = p.parse_args()
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["training"]["maxSteps"] = a.steps
    doc["spec"]["checkpoint"] = {"everySteps": 10 * a.steps, "keepLast": 1}
    nproc = doc["spec"]["workers"]["replicas"] * doc["spec"]["workers"]["procsPerWorker"]
    runs: dict[str, list[float]] = {"plain_trl": [], "rljob": []}
    tokens: dict[str, list[float]] = {"plain_trl": [], "rljob": []}
    with tempfile.TemporaryDirectory(prefix="rljob-bench-") as tmp:
        for i in range(a.repeats):
            plain = plain_trl(Path(tmp) / f"plain-{i}", a.steps, nproc, "--save-at-end")
            ours = rljob_train(copy.deepcopy(doc), Path(tmp) / f"rljob-{i}")
            for side, r in (("plain_trl", plain), ("rljob", ours)):
                runs[side].append(r["steps"] / r["train_runtime"])
                tokens[side].append(r["num_tokens"] / r["train_runtime"])
            print(f"repeat {i}: plain {runs['plain_trl'][-1]:.2f} steps/s, rljob {runs['rljob'][-1]:.2f} steps/s")
    plain_sps, ours_sps = median(runs["plain_trl"]), median(runs["rljob"])
    ratio = ours_sps / plain_sps
    overhead = (1 - ratio) * 100
    path = write_result("trainer_overhead", {
        "config": {"steps": a.steps, "processes": nproc, "repeats": a.repeats},
        "steps_per_second": runs,
        "tokens_per_second": tokens,
        "summary": [
            {"metric": "plain TRL steps/s (median)", "value": round(plain_sps, 3), "unit": "steps/s"},
            {"metric": "rljob steps/s (median)", "value": round(ours_sps, 3), "unit": "steps/s"},
            {"metric": "rljob / plain TRL", "value": round(ratio, 3), "unit": "×"},
            {"metric": "rljob / plain TRL tokens/s", "unit": "×",
             "value": round(median(tokens["rljob"]) / median(tokens["plain_trl"]), 3)},
            {"metric": "rljob overhead", "value": round(overhead, 2), "unit": "%",
             "target": f"≤ {TARGET_OVERHEAD_PCT}", "met": overhead <= TARGET_OVERHEAD_PCT},
        ],
    })
    print(f"rljob/plain = {ratio:.3f} (overhead {overhead:.1f} %); wrote {path}")


if __name__ == "__main__":
    main()
