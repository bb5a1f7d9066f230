"""Checkpoints in a folder, without a training run: sealed and verified, resumed from the newest complete
one, retention (``rljob checkpoints prune`` and its dry run), and the publisher a folder and its mirror share.
On object storage: ``test_checkpoints_s3.py``; read back as untrusted input: ``test_checkpoints_untrusted.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rljob_trainer import checkpoints as ck


def make_checkpoint(root: Path, step: int, reward: float | None = None, seal: bool = True) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(bytes([step % 256]) * 1000)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if seal:
        ck.seal_checkpoint(d, step, {"reward": reward} if reward is not None else {})
    return d


def test_sealed_checkpoint_verifies_and_moves_latest(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    assert (tmp_path / ck.LATEST).read_text().strip() == "checkpoint-20"
    assert ck.verify_checkpoint(tmp_path / "checkpoint-20") == []
    manifest = json.loads((tmp_path / "checkpoint-20" / ck.MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "trainer_state.json"}


def test_unsealed_checkpoint_is_ignored_by_resume(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20, seal=False)
    assert [c.name for c in ck.complete_checkpoints(tmp_path)] == ["checkpoint-10"]
    assert ck.find_resume_checkpoint(tmp_path) == tmp_path / "checkpoint-10"


def test_corrupt_checkpoint_falls_back_to_previous_complete_one(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    newest = make_checkpoint(tmp_path, 20)
    (newest / "model.safetensors").write_bytes(b"\x00" * 1000)  # same size, other bytes
    assert "md5 mismatch" in ck.verify_checkpoint(newest)[0]
    assert ck.find_resume_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
    (tmp_path / "checkpoint-10" / "trainer_state.json").unlink()
    assert ck.find_resume_checkpoint(tmp_path) is None


def test_retention_keeps_last_best_newest_and_protected(tmp_path: Path) -> None:
    for step, reward in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3), (50, 0.4)]:
        make_checkpoint(tmp_path, step, reward)
    make_checkpoint(tmp_path, 5, seal=False)   # crash debris older than the newest: removed
    make_checkpoint(tmp_path, 60, seal=False)  # may still be being written: kept
    deleted, after = ck.LocalLocation(tmp_path).apply_retention(ck.RetentionPolicy(keep_last=2, keep_best=1),
                                                                protect={"checkpoint-20"})
    assert sorted(deleted) == ["checkpoint-30", "checkpoint-5"]
    remaining = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert remaining == ["checkpoint-10", "checkpoint-20", "checkpoint-40", "checkpoint-50", "checkpoint-60"]
    assert [c.name for c in after.complete] == ["checkpoint-10", "checkpoint-20", "checkpoint-40", "checkpoint-50"]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (manifests and ``latest`` included)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_prune_dry_run_deletes_nothing_and_names_what_prune_then_deletes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rljob import cli

    for step, reward in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3)]:
        make_checkpoint(tmp_path, step, reward)
    make_checkpoint(tmp_path, 5, seal=False)  # crash debris: pruned too
    before = tree(tmp_path)
    args = ["checkpoints", "prune", str(tmp_path), "--keep-last", "1", "--keep-best", "1"]
    assert cli.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    would = [line.split()[-1] for line in out.splitlines() if line.startswith("would delete")]
    assert would == [str(tmp_path / n) for n in ("checkpoint-5", "checkpoint-20", "checkpoint-30")]
    assert f"kept 2 complete checkpoint(s) at {tmp_path}" in out
    assert tree(tmp_path) == before  # not one file deleted or rewritten
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("deleting")] == would
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-40"]


def test_local_primary_and_a_mirror_folder_share_the_publisher_and_its_retention(tmp_path: Path) -> None:
    from rljob_trainer.checkpoints.publisher import CheckpointPublisher

    primary, mirror = ck.LocalLocation(tmp_path / "pvc"), ck.LocalLocation(tmp_path / "mirror")
    heartbeat = SimpleNamespace(checkpoint=None, best_checkpoint=None, best_metric=None)
    pub = CheckpointPublisher(primary, [mirror], ck.RetentionPolicy(keep_last=2, keep_best=1),
                              transfer=ck.TransferSettings(), folder_is_primary=True, retries=0, heartbeat=heartbeat)
    for step, reward in [(10, 0.9), (20, 0.1), (30, 0.2), (40, 0.3), (50, 0.4)]:
        d = make_checkpoint(primary.root, step, seal=False)
        pub.save(d, step, {"reward": reward})
        # Sealed in place before save returns: a complete checkpoint the moment training goes on.
        assert (primary.root / ck.LATEST).read_text() == f"checkpoint-{step}\n" and ck.verify_checkpoint(d) == []
        assert heartbeat.checkpoint == f"checkpoint-{step}" and heartbeat.best_checkpoint == "checkpoint-10"
    assert pub.close(timeout=60) and pub.failures == 0
    # Retention at the primary keeps what was still being copied, so finish with one more prune pass.
    primary.apply_retention(pub.policy)
    expected = ["checkpoint-10", "checkpoint-40", "checkpoint-50"]
    assert [c.name for c in primary.listing().complete] == expected
    assert [c.name for c in mirror.listing().complete] == expected and mirror.listing().latest == "checkpoint-50"
    fields = pub.summary_fields()
    assert fields["checkpoints"] == expected and fields["checkpoint_upload_failures"] == 0
    assert fields["best_checkpoint"]["location"] == str(primary.root / "checkpoint-10")


def test_retention_never_deletes_the_newest_complete_checkpoint() -> None:
    infos = [ck.CheckpointInfo(f"checkpoint-{s}", s, {"reward": 1.0 - s / 100}) for s in (1, 2, 3)]
    keep = ck.retention_keep(infos, keep_last=0, keep_best=1)
    assert "checkpoint-3" in keep and "checkpoint-1" in keep
