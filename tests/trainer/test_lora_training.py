"""LoRA adapters and the throughput knobs for real: torchrun runs of the quickstart on CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.trainer import (
    REPO,
    assert_same_curve,
    deep_update,
    logged_curve,
    quickstart_doc,
    run_rljob,
    write_manifest,
)
from tests.trainer.test_run_training import tensorboard_scalars

pytestmark = pytest.mark.trainer

#: The quickstart with LoRA, as users run it: why these settings, measured, is in the file's comment.
LORA_EXAMPLE = REPO / "examples" / "lora.yaml"


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.e2e  # minutes of training; make e2e (CI's budget: docs/development.md)
def test_lora_example_learns_resumes_exactly_from_its_adapter_and_exports_a_merged_model(tmp_path: Path) -> None:
    first, total = 60, 120
    example = yaml.safe_load(LORA_EXAMPLE.read_text())
    assert example["spec"]["training"]["maxSteps"] == total
    doc = deep_update(example, {"spec": {"training": {"maxSteps": first}}})
    out = tmp_path / "out"
    ran = run_rljob("train", str(write_manifest(tmp_path / "job.yaml", doc)), "--output", str(out), timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    ckpt = out / "checkpoints" / f"checkpoint-{first}"
    # The checkpoint holds the adapter, not the model, and is sealed like any other.
    assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / "rljob-manifest.json").is_file()
    assert not list(ckpt.glob("model*.safetensors"))
    base = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
    # The manifest records the base the trainer loaded, which export trusts over the adapter's file.
    assert json.loads((ckpt / "rljob-manifest.json").read_text())["base_model"]["name_or_path"] == base
    adapter_bytes = (ckpt / "adapter_model.safetensors").stat().st_size
    model_bytes = sum(f.stat().st_size for f in Path(base).glob("*.safetensors"))
    print(f"adapter {adapter_bytes} B = {adapter_bytes / model_bytes:.2f} of the model's {model_bytes} B")
    assert adapter_bytes < model_bytes

    # Resume: the same job with more steps continues from the adapter checkpoint.
    doc["spec"]["training"]["maxSteps"] = total
    logged_before = len((out / "metrics.jsonl").read_text().splitlines())
    again = run_rljob("train", str(write_manifest(tmp_path / "job.yaml", doc)), "--output", str(out), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    # Exactly where an uninterrupted run of `total` steps would be (issue #31): the adapter, the trained
    # head, the optimizer, the schedule and every RNG came back; each value of steps 61-120 is equal.
    reference = run_rljob("train", str(LORA_EXAMPLE), "--output", str(tmp_path / "reference"), timeout=900)
    assert reference.returncode == 0, reference.stderr[-3000:]
    resumed = logged_curve(out / "metrics.jsonl", from_line=logged_before)
    assert sorted(resumed) == list(range(first + 1, total + 1))
    assert_same_curve(resumed, logged_curve(tmp_path / "reference" / "metrics.jsonl"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == f"checkpoint-{first}" and summary["steps"] == total
    assert re.search(rf"resuming from \S*checkpoint-{first}\b", again.stderr + again.stdout)
    rewards = [r for _, r in tensorboard_scalars(out / "tensorboard", "train/reward")]
    assert len(rewards) == total
    # The example learns the task: from chance (about 0.03) to a last reward of at least 0.9, as the
    # uninterrupted run of it reports in its summary (the resumed run logged the same values).
    learned = json.loads((tmp_path / "reference" / "summary.json").read_text())
    assert mean(rewards[:10]) <= 0.2 and learned["reward_last"] >= 0.9, (learned["reward_last"], rewards)

    merged = tmp_path / "merged"
    exported = run_rljob("checkpoints", "export", str(out / "checkpoints"), str(merged), "--merged")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert f"checkpoint-{total}" in exported.stdout
    # The merged model, loaded with transformers alone, computes what base + adapter computes (the trained
    # head included: the export unties it from the embedding), not what the base computes, and generates.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    alone = AutoModelForCausalLM.from_pretrained(merged).eval()
    assert not hasattr(alone, "peft_config")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base),
                                        str(out / "checkpoints" / f"checkpoint-{total}")).eval()
    before = AutoModelForCausalLM.from_pretrained(base).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged)
    ids = tokenizer(["aaaaaa", "bbbbbb", "cccccc", "dddddd", "eeeeee", "ffffff"], return_tensors="pt").input_ids
    with torch.no_grad():
        got, want, was = alone(ids).logits, adapted(ids).logits, before(ids).logits
        generated = alone.generate(input_ids=ids, max_new_tokens=6, do_sample=False,
                                   pad_token_id=tokenizer.pad_token_id)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert (got - was).abs().max() > 1e-2
    assert generated.shape == (6, ids.shape[1] + 6)


def test_throughput_knobs_run_one_generation_per_two_steps_and_finish(tmp_path: Path) -> None:
    steps = 12
    doc = deep_update(quickstart_doc(), {"spec": {
        "workers": {"procsPerWorker": 1},
        "training": {"maxSteps": steps, "gradientCheckpointing": False, "stepsPerGeneration": 2},
        "checkpoint": {"everySteps": 1000},
    }})
    out = tmp_path / "out"
    ran = run_rljob("train", str(write_manifest(tmp_path / "job.yaml", doc)), "--output", str(out))
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps and len(summary["loss_history"]) == steps  # an optimizer step each
    # TRL generates (and logs rewards) once per stepsPerGeneration steps: at steps 1, 3, 5, ...
    assert [s for s, _ in summary["reward_history"]] == list(range(1, steps + 1, 2)), summary["reward_history"]
    assert summary["num_tokens"] > 0


def test_lora_with_beta_uses_the_base_model_as_reference(tmp_path: Path) -> None:
    """beta > 0 with LoRA: TRL's reference is the model with the adapter disabled (no second copy):
    the KL is 0 while the adapter is still a no-op and grows once it has trained."""
    steps = 12
    doc = deep_update(quickstart_doc(), {"spec": {
        "workers": {"procsPerWorker": 1},
        "training": {"maxSteps": steps, "learningRate": 0.03, "beta": 0.04,
                     "lora": yaml.safe_load(LORA_EXAMPLE.read_text())["spec"]["training"]["lora"]},
        "checkpoint": {"everySteps": 1000},
    }})
    out = tmp_path / "out"
    ran = run_rljob("train", str(write_manifest(tmp_path / "job.yaml", doc)), "--output", str(out))
    assert ran.returncode == 0, ran.stderr[-3000:]
    kl = [v for _, v in tensorboard_scalars(out / "tensorboard", "train/kl")]
    assert len(kl) == steps
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and max(kl[-4:]) > 1e-4, kl
