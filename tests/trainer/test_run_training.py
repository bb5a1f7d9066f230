"""The trainer for real: torchrun with 2 CPU processes on the quickstart, crash and resume."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import requests
import yaml
from rljob_trainer.launch import free_port
from rljob_trainer.worker import NOT_PRELOADED

from tests.support.trainer import (
    QUICKSTART,
    REPO,
    assert_same_curve,
    deep_update,
    job_location,
    kill_group,
    logged_curve,
    quickstart_doc,
    run_rljob,
    scrape,
    start_rljob,
    wait_until,
    write_manifest,
    write_runtime,
)

pytestmark = pytest.mark.trainer

NAMED_SERIES = {
    "rljob_trainer_step",
    "rljob_trainer_reward",
    "rljob_trainer_reward_std",
    "rljob_trainer_reward_mean",
    "rljob_trainer_loss",
    "rljob_trainer_step_seconds",
    "rljob_trainer_tokens_per_second",
}


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below ``pid``: the ranks, and the fork server they were forked from."""
    return psutil.Process(pid).children(recursive=True)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    running = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                running.append(p)
        except psutil.NoSuchProcess:
            pass
    return running


def tensorboard_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            for e in acc.Scalars(tag):
                values[e.step] = e.value
    return sorted(values.items())


def test_quickstart_two_process_reward_rises_and_reports_agree(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "quickstart"
    proc = start_rljob("train", str(QUICKSTART), "--output", str(out), "--metrics-port", str(port),
                       log=tmp_path / "log.txt")
    samples = []
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            m = scrape(port)
            if m.get("rljob_trainer_step", {}).get((), 0) > 0:
                samples.append(m)
        except requests.RequestException:
            pass
        time.sleep(0.3)
    assert proc.wait(timeout=60) == 0, (tmp_path / "log.txt").read_text()[-3000:]
    # Known dependency noise is filtered (rljob_trainer.known_warnings): the output shows no deprecations.
    noisy = [line for line in (tmp_path / "log.txt").read_text().splitlines()
             if "FutureWarning" in line or "DeprecationWarning" in line]
    assert not noisy, "\n".join(noisy[:10])
    # The ranks were forked from a fork server that had preloaded the training stack (no GPU here).
    assert NOT_PRELOADED not in (tmp_path / "log.txt").read_text()

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 120
    assert summary["reward_first"] <= 0.3, summary["reward_first"]
    assert summary["reward_last"] >= 0.8, summary["reward_last"]
    assert summary["resumed_from"] is None
    assert summary["checkpoints"] == ["checkpoint-80", "checkpoint-120"]  # everySteps 40, keepLast 2
    assert (out / "reward_curve.png").stat().st_size > 1000
    # Beside it, the dashboard's key panels drawn from the run's own metrics (rljob/dashboard.py).
    assert (out / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No evaluation section, no evaluation (#33): nothing generated beyond training's own.
    assert "eval" not in summary and "eval/" not in (out / "metrics.jsonl").read_text()
    # A healthy run that solves its task trips no health signal (#47, docs/guides/health.md), though its entropy
    # falls near 0 and every group ends rewarded alike: not in summary.json, the output or the metrics log.
    assert summary["health"] == []
    assert "rljob: health" not in (tmp_path / "log.txt").read_text()
    assert "health/" not in (out / "metrics.jsonl").read_text()

    # The metrics endpoint served the named series while training ran...
    assert len(samples) >= 3, "too few scrapes during the run"
    assert set(samples[-1]) >= NAMED_SERIES, NAMED_SERIES - set(samples[-1])
    assert (("reward", "repeat_char"),) in samples[-1]["rljob_trainer_reward_mean"]
    # Each health signal's gauge is served, at 0, with the inputs it is judged on.
    assert samples[-1]["rljob_trainer_health_tripped"] == {
        (("signal", s),): 0.0 for s in ("entropyCollapse", "noLearningSignal", "maskedBatch", "klBlowUp",
                                       "gradNormSpike")}
    assert {"rljob_trainer_entropy", "rljob_trainer_entropy_start", "rljob_trainer_grad_norm",
            "rljob_trainer_reward_zero_std_ratio", "rljob_trainer_masked_ratio"} <= set(samples[-1])
    # The chart's PodMonitor drops a scrape over podMonitor.sampleLimit (a reward function registering
    # metrics without bound): a trainer's own series stay far below it.
    limit = yaml.safe_load((REPO / "charts" / "rljob" / "values.yaml").read_text())["podMonitor"]["sampleLimit"]
    served = max(sum(len(series) for series in scraped.values()) for scraped in samples)
    print(f"trainer metrics: {served} samples (PodMonitor sampleLimit {limit})")
    assert served * 4 <= limit
    # ...and what it served agrees with summary.json, step by step.
    history = dict((int(s), r) for s, r in summary["reward_history"])
    assert len(history) == 120
    matched = 0
    for m in samples:
        step = int(m["rljob_trainer_step"][()])
        reward = m["rljob_trainer_reward"][()]
        if step in history:
            assert reward == pytest.approx(history[step], abs=1e-6) or reward == pytest.approx(
                history.get(step + 1, -1), abs=1e-6
            )
            matched += 1
    assert matched >= 3
    # TensorBoard logged the same rewards.
    tb = tensorboard_scalars(out / "tensorboard", "train/reward")
    assert [s for s, _ in tb] == sorted(history)
    for step, value in tb:
        assert value == pytest.approx(history[step], abs=1e-5)


def test_sigkill_after_checkpoint_resumes_exactly_and_an_oom_restarts_batch_split_changes_only_rounding(
        tmp_path: Path) -> None:
    every = 10
    doc = deep_update(quickstart_doc(), {
        "spec": {"training": {"maxSteps": 60}, "checkpoint": {"everySteps": every, "keepLast": 2}},
    })
    manifest = write_manifest(tmp_path / "job.yaml", doc)
    out = tmp_path / "out"
    ckpts = out / "checkpoints"
    port = free_port()
    proc = start_rljob("train", str(manifest), "--output", str(out), "--metrics-port", str(port),
                       log=tmp_path / "first.txt")

    def progressed() -> int | None:
        latest = ckpts / "latest"
        if not latest.exists() or latest.read_text().strip() < "checkpoint-20":
            return None
        try:
            step = int(scrape(port)["rljob_trainer_step"][()])
        except (requests.RequestException, KeyError):
            return None
        return step if step >= 22 else None

    try:
        wait_until(progressed, timeout=400, interval=0.2, what="a checkpoint and progress past it")
        step_at_kill = int(scrape(port)["rljob_trainer_step"][()])
        gang = descendants(proc.pid)
        assert len(gang) >= 3, gang  # the ranks and the fork server they were forked from
        proc.kill()  # the launcher alone, as the OOM killer would
        assert proc.wait(timeout=60) == -signal.SIGKILL
        # No rank outlives its launcher (they would go on writing checkpoints).
        wait_until(lambda: not alive(gang),
                   timeout=30, what=f"ranks to exit after the launcher was killed: {gang}")
    finally:
        kill_group(proc, signal.SIGKILL)
    resumable = (ckpts / "latest").read_text().strip()
    resumable_step = int(resumable.split("-")[1])
    assert 0 <= step_at_kill - resumable_step <= every
    # A crash can leave a half-written checkpoint; one newer than `latest` must never be used.
    partial = ckpts / "checkpoint-55"
    shutil.copytree(ckpts / resumable, partial)
    (partial / "rljob-manifest.json").unlink()

    logged_before = len((out / "metrics.jsonl").read_text().splitlines())
    second = start_rljob("train", str(manifest), "--output", str(out), "--metrics-port", str(free_port()),
                         log=tmp_path / "second.txt")
    assert second.wait(timeout=600) == 0, (tmp_path / "second.txt").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == resumable
    assert summary["steps"] == 60
    steps_logged = [s for s, _ in summary["reward_history"]]
    # The resumed run re-did only the steps after the checkpoint.
    assert steps_logged[-1] == 60
    assert "resuming from" in (tmp_path / "second.txt").read_text()
    assert summary["checkpoints"] == ["checkpoint-50", "checkpoint-60"]

    # Exact resume (issue #31): the same manifest run without interruption logs the same values, to the
    # last bit, at every step the resumed run trained: rewards, loss, grad norm, entropy, lengths, tokens.
    reference = run_rljob("train", str(manifest), "--output", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    want = logged_curve(tmp_path / "reference" / "metrics.jsonl")
    resumed = logged_curve(out / "metrics.jsonl", from_line=logged_before)
    assert sorted(resumed) == list(range(resumable_step + 1, 61))
    print(f"resumed from step {resumable_step}: {assert_same_curve(resumed, want)} values equal")
    # And before the kill, the first run was that run too.
    assert_same_curve({k: v for k, v in logged_curve(out / "metrics.jsonl").items() if k <= resumable_step}, want)

    # After an out-of-memory restart the operator halves the per-device batch and doubles the accumulation
    # (status.oomRecovery): the same prompts and completions per optimizer step (TRL generates a step's
    # whole batch at once), so rewards, lengths and token counts stay equal; the loss is summed over
    # two micro-batches instead of one, which changes loss and gradients by float rounding, and the
    # logged entropy is then the mean of two micro-batches' means (0.1% off here, measured).
    split = tmp_path / "oom" / "checkpoints"
    shutil.copytree(tmp_path / "reference" / "checkpoints" / "checkpoint-50", split / "checkpoint-50")
    (split / "latest").write_text("checkpoint-50")
    halved = deep_update(doc, {"spec": {"training": {"batchSize": doc["spec"]["training"]["batchSize"] // 2,
                                                     "gradientAccumulationSteps": 2}}})
    oom = run_rljob("train", str(write_manifest(tmp_path / "oom.yaml", halved)), "--output", str(tmp_path / "oom"))
    assert oom.returncode == 0, oom.stderr[-3000:]
    after_oom = logged_curve(tmp_path / "oom" / "metrics.jsonl")
    assert sorted(after_oom) == list(range(51, 61))
    rounding = {"loss", "entropy", "grad_norm"}
    assert_same_curve({k: {m: v for m, v in vs.items() if m not in rounding} for k, vs in after_oom.items()},
                      {k: {m: v for m, v in vs.items() if m not in rounding} for k, vs in want.items()})
    for step, values in after_oom.items():
        assert values["loss"] == pytest.approx(want[step]["loss"], rel=1e-4, abs=1e-6), step
        assert values["grad_norm"] == pytest.approx(want[step]["grad_norm"], rel=1e-4), step
        assert values["entropy"] == pytest.approx(want[step]["entropy"], rel=5e-3), step


def test_checkpoints_in_a_folder_outside_the_output_outlive_it_and_resume(tmp_path: Path) -> None:
    """What a pvc:// job's gang restart looks like to the trainer (issue #31): the operator gives it the
    claim's mounted folder as spec.checkpoint.storage, the gang is killed, and the next gang starts with
    an empty /workspace/output (a new emptyDir) but the same folder. Manifests, retention and resume
    are the local-folder code the operator's rewrite leads to."""
    every = 10
    prefix = tmp_path / "claim" / "runs"  # stands for /var/lib/rljob/checkpoints/<claim>/<prefix>
    doc = deep_update(quickstart_doc(), {
        "spec": {"training": {"maxSteps": 40}, "checkpoint": {"everySteps": every, "keepLast": 2}},
    })
    claim = Path(job_location(str(prefix), doc))  # the job's own folder under the runtime's storage
    manifest = [str(write_manifest(tmp_path / "job.yaml", doc)), "--runtime",
                str(write_runtime(tmp_path / "runtime.yaml", {"storage": str(prefix)}))]
    first_out = tmp_path / "gang-0"
    proc = start_rljob("train", *manifest, "--output", str(first_out), "--metrics-port", str(free_port()),
                       log=tmp_path / "first.txt")
    try:
        wait_until(lambda: (claim / "latest").exists() and (claim / "latest").read_text().strip() >= "checkpoint-20",
                   timeout=400, interval=0.2, what="checkpoint-20 sealed in the claim folder")
    finally:
        kill_group(proc, signal.SIGKILL)  # the whole gang, as a node loss or a pod deletion does
    resumable = (claim / "latest").read_text().strip()
    assert (claim / resumable / "rljob-manifest.json").is_file()
    assert not (first_out / "checkpoints").exists()  # nothing went to the pod's own folder
    shutil.rmtree(first_out)  # the emptyDir goes with the pod

    second_out = tmp_path / "gang-1"
    second = start_rljob("train", *manifest, "--output", str(second_out), "--metrics-port", str(free_port()),
                         log=tmp_path / "second.txt")
    assert second.wait(timeout=600) == 0, (tmp_path / "second.txt").read_text()[-3000:]
    summary = json.loads((second_out / "summary.json").read_text())
    assert summary["resumed_from"] == resumable and summary["steps"] == 40
    assert f"resuming from {claim / resumable}" in (tmp_path / "second.txt").read_text()
    # Retention ran in the claim folder: the newest keepLast, each sealed, and `latest` on the newest.
    kept = sorted(p.name for p in claim.iterdir() if p.name.startswith("checkpoint-"))
    assert kept == ["checkpoint-30", "checkpoint-40"] == summary["checkpoints"]
    assert all((claim / name / "rljob-manifest.json").is_file() for name in kept)
    assert (claim / "latest").read_text().strip() == "checkpoint-40"


def test_rljob_train_refuses_a_pvc_location_naming_the_field(tmp_path: Path) -> None:
    """No claim outside a cluster: a permanent error naming the field, not a guessed local folder."""
    manifest = write_manifest(tmp_path / "job.yaml", quickstart_doc())
    runtime = write_runtime(tmp_path / "runtime.yaml", {"storage": "pvc://ckpt/run1"})
    result = run_rljob("train", str(manifest), "--runtime", str(runtime), "--output", str(tmp_path / "out"),
                       timeout=300)
    assert result.returncode == 78, result.stderr[-2000:]
    assert "spec.checkpoint.storage: pvc://ckpt/run1/default/quickstart names a PersistentVolumeClaim" in result.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_sigterm_saves_a_checkpoint_of_the_current_step_then_exits_143(tmp_path: Path) -> None:
    """What a resize, a suspend or a preempted node does to a worker: stop, but keep the progress."""
    doc = deep_update(quickstart_doc(), {
        "spec": {"training": {"maxSteps": 400}, "checkpoint": {"everySteps": 1000, "keepLast": 2}},
    })
    manifest = write_manifest(tmp_path / "job.yaml", doc)
    out = tmp_path / "out"
    port = free_port()
    proc = start_rljob("train", str(manifest), "--output", str(out), "--metrics-port", str(port),
                       log=tmp_path / "log.txt")

    def stepping() -> int | None:
        try:
            step = int(scrape(port)["rljob_trainer_step"][()])
        except (requests.RequestException, KeyError):
            return None
        return step if step >= 5 else None

    try:
        signalled_at = wait_until(stepping, timeout=400, interval=0.2, what="training under way")
        gang = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)  # the launcher only, as the kubelet signals a container's PID 1
        code = proc.wait(timeout=120)
    finally:
        kill_group(proc, signal.SIGKILL)
    log = (tmp_path / "log.txt").read_text(errors="replace")
    assert code == 143, log[-3000:]
    assert "stopped by SIGTERM" in log
    latest = (out / "checkpoints" / "latest").read_text().strip()
    saved = int(latest.split("-")[1])
    assert signalled_at <= saved < 400  # everySteps is 1000: this checkpoint exists because of the signal
    assert (out / "checkpoints" / latest / "rljob-manifest.json").exists()  # sealed: complete
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == saved and summary["latest_checkpoint"]["name"] == latest
    wait_until(lambda: not alive(gang),
               timeout=30, what=f"ranks to exit: {gang}")
