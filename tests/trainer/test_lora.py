"""Throughput knobs and LoRA without a training run: what reaches TRL, validation, and merged export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rljob_contract.job import ManifestError, parse_job
from rljob_contract.spec import TrainerConfig
from rljob_trainer.algorithms import BUILDERS
from rljob_trainer.checkpoints.export import base_identity
from rljob_trainer.checkpoints.manifest import MANIFEST, build_manifest
from rljob_trainer.worker import build_trl_config, peft_config, run_alone_when_alone

from tests.support.operator_process import job_manifest


def trainer_config(**training: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"jobName": "j", "worldSize": 2, "training": training})


def test_throughput_knobs_reach_trls_config() -> None:
    config_cls, _ = BUILDERS["grpo"].trl_classes()
    args = build_trl_config(trainer_config(batchSize=4, numGenerations=4, gradientCheckpointing=False,
                                           stepsPerGeneration=3), config_cls, "/tmp/ckpt", use_cpu=True)
    assert args.gradient_checkpointing is False and args.activation_checkpointing is False
    assert args.steps_per_generation == 3
    assert args.generation_batch_size == 4 * 3  # TRL's rule, at the world size of this process (1)
    default = build_trl_config(trainer_config(), config_cls, "/tmp/ckpt", use_cpu=True)
    assert default.gradient_checkpointing is True  # TRL's default, kept: memory before speed
    assert default.steps_per_generation == default.gradient_accumulation_steps


def test_generation_batch_size_reaches_trl_and_sets_steps_per_generation() -> None:
    config_cls, _ = BUILDERS["rloo"].trl_classes()
    args = build_trl_config(trainer_config(algorithm="rloo", batchSize=4, numGenerations=4, generationBatchSize=16),
                            config_cls, "/tmp/ckpt", use_cpu=True)
    assert (args.generation_batch_size, args.steps_per_generation) == (16, 4)


@pytest.mark.parametrize(("training", "field", "words"), [
    ({"generationBatchSize": 12}, "spec.training.generationBatchSize", "multiple of batchSize × workers = 4 × 2 = 8"),
    ({"generationBatchSize": 16, "stepsPerGeneration": 2}, "spec.training.generationBatchSize", "not both"),
    ({"batchSize": 3, "numGenerations": 8, "stepsPerGeneration": 2}, "spec.training.stepsPerGeneration",
     "batchSize × workers × stepsPerGeneration = 3 × 2 × 2 = 12"),
    ({"generationBatchSize": 24, "numGenerations": 16}, "spec.training.generationBatchSize",
     "numGenerations (16) must divide the generation batch generationBatchSize = 24"),
])
def test_generation_batch_errors_name_the_field_to_change(training: dict[str, object], field: str,
                                                          words: str) -> None:
    doc = job_manifest("gen")
    doc["spec"]["training"].update(training)
    with pytest.raises(ManifestError) as error:
        parse_job(doc)
    assert any(p.startswith(field) and words in p for p in error.value.problems), error.value.problems


def test_steps_per_generation_makes_an_otherwise_split_group_whole() -> None:
    doc = job_manifest("gen")
    doc["spec"]["training"].update({"batchSize": 3, "numGenerations": 4, "stepsPerGeneration": 2})  # 3 × 2 × 2 = 12
    assert parse_job(doc).spec.training.steps_per_generation == 2


def test_lora_spec_becomes_peft_lora_config() -> None:
    from peft import LoraConfig

    cfg = trainer_config(lora={"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"],
                               "modulesToSave": ["lm_head"]})
    lora = peft_config(cfg)
    assert isinstance(lora, LoraConfig)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (4, 8, 0.0)
    assert set(lora.target_modules) == {"q_proj", "v_proj"} and lora.modules_to_save == ["lm_head"]
    assert peft_config(trainer_config(lora={})).target_modules == "all-linear"
    assert peft_config(trainer_config()) is None


def test_a_gang_of_one_trains_without_a_process_group() -> None:
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert run_alone_when_alone(env) is True
    assert "LOCAL_RANK" not in env and "LOCAL_WORLD_SIZE" not in env and env["RANK"] == "0"
    two = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    assert run_alone_when_alone(two) is False and two["LOCAL_RANK"] == "1"


def _adapter_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """(base model folder, checkpoint folder holding a LoRA adapter with non-zero weights)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from rljob_trainer.builtin.tiny_model import materialize_builtin_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = Path(materialize_builtin_model(str(tmp_path / "cache"), {}, seed=0))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA's B starts at zero (a no-op adapter); give it weights that change outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ckpt = tmp_path / "checkpoint-10"
    model.save_pretrained(ckpt)
    AutoTokenizer.from_pretrained(base).save_pretrained(ckpt)
    _seal(ckpt, base_identity(str(base)))
    return base, ckpt


def _seal(ckpt: Path, base_model: dict[str, str] | None) -> None:
    """The manifest the trainer's publisher writes, with the base model it trained on."""
    (ckpt / MANIFEST).write_text(json.dumps(build_manifest(ckpt, 10, {}, base_model=base_model)))


def test_export_merged_matches_the_adapter_model_and_loads_without_peft(tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from rljob_trainer.checkpoints.export import export_merged
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, ckpt = _adapter_checkpoint(tmp_path)
    out = export_merged(ckpt, tmp_path / "merged")
    assert not (out / "adapter_config.json").exists() and (out / "config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(ckpt)).eval()
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    ids = AutoTokenizer.from_pretrained(out)("cccccc", return_tensors="pt").input_ids
    with torch.no_grad():
        want, got, before = adapted(ids).logits, merged(ids).logits, plain(ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert (got - before).abs().max() > 1e-2  # the adapter changed the model, so agreement means something
    assert merged.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4


def test_export_refuses_bad_input_and_leaves_nothing_behind(tmp_path: Path) -> None:
    from rljob_trainer.checkpoints.export import ExportError, export_merged

    base, ckpt = _adapter_checkpoint(tmp_path)
    dest = tmp_path / "exports"
    dest.mkdir()
    with pytest.raises(ExportError, match="no adapter_config.json, so not a LoRA adapter checkpoint"):
        export_merged(base, dest / "a")  # a full model folder
    with pytest.raises(ExportError, match="cannot load the base model"):
        export_merged(ckpt, dest / "b", base=str(tmp_path / "missing-base"))
    (dest / "taken").mkdir()
    with pytest.raises(ExportError, match="already exists"):
        export_merged(ckpt, dest / "taken")
    config = json.loads((ckpt / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None
    (ckpt / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="names no base model; give one with --base"):
        export_merged(ckpt, dest / "c")
    assert sorted(p.name for p in dest.iterdir()) == ["taken"]  # no partial exports
    assert export_merged(ckpt, dest / "d", base=str(base)).is_dir()  # --base fills the gap


def test_export_merges_only_into_the_base_the_trainer_recorded_unless_told(tmp_path: Path) -> None:
    """The adapter's files come from the job's own code: the base they name is trusted only when it is
    the one the manifest recorded at seal time (name and config.json digest); ``--base`` overrides."""
    import shutil

    from rljob_trainer.checkpoints.export import ExportError, export_merged

    base, ckpt = _adapter_checkpoint(tmp_path)
    recorded = json.loads((ckpt / MANIFEST).read_text())["base_model"]
    assert recorded["name_or_path"] == str(base) and len(recorded["config_sha256"]) == 64
    dest = tmp_path / "exports"
    # The adapter repointed at another model (here a copy that differs only in its config).
    other = tmp_path / "other-base"
    shutil.copytree(base, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rljob_note": "not the trained base"}))
    adapter = json.loads((ckpt / "adapter_config.json").read_text())
    (ckpt / "adapter_config.json").write_text(json.dumps({**adapter, "base_model_name_or_path": str(other)}))
    with pytest.raises(ExportError, match=r"names the base model .*other-base.* but the checkpoint was trained on"):
        export_merged(ckpt, dest / "a")
    (ckpt / "adapter_config.json").write_text(json.dumps(adapter))
    # The base model swapped at the recorded path.
    original = (base / "config.json").read_bytes()
    (base / "config.json").write_text(json.dumps({**config, "rljob_note": "swapped"}))
    with pytest.raises(ExportError, match="config.json differs"):
        export_merged(ckpt, dest / "b")
    (base / "config.json").write_bytes(original)
    # A manifest that records no base (or a malformed one) leaves the choice to the user.
    _seal(ckpt, None)
    with pytest.raises(ExportError, match="records no base model.*--base"):
        export_merged(ckpt, dest / "c")
    manifest = json.loads((ckpt / MANIFEST).read_text())
    (ckpt / MANIFEST).write_text(json.dumps({**manifest, "base_model": {"name_or_path": 7}}))
    with pytest.raises(ExportError, match="no readable base_model"):
        export_merged(ckpt, dest / "d")
    assert not dest.exists() or not list(dest.iterdir())  # nothing written by a refusal
    assert export_merged(ckpt, dest / "e", base=str(base)).is_dir()  # the user's own choice
    _seal(ckpt, recorded)
    assert export_merged(ckpt, dest / "f").is_dir()  # the recorded base, unchanged: no --base needed
