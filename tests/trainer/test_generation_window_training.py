"""Exact resume with more than one optimizer step per generation (issue #48, point 2).

TRL generates a batch of completions every ``stepsPerGeneration`` steps and trains on slices of it in
between. A run resumed inside such a window generates afresh, so every later step differs from the
uninterrupted run. SIGTERM (a resize, a suspend, a preempted node) therefore waits for the window's last
step before it saves; the periodic checkpoints are held to whole windows by the spec's rules.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import requests
from rljob_trainer.launch import free_port

from tests.support.trainer import (
    assert_same_curve,
    deep_update,
    kill_group,
    logged_curve,
    quickstart_doc,
    run_rljob,
    scrape,
    start_rljob,
    wait_until,
    write_manifest,
)

pytestmark = pytest.mark.trainer

WINDOW = 4
MAX_STEPS = 24


def trained_step(port: int) -> int | None:
    try:
        return int(scrape(port)["rljob_trainer_step"][()])
    except (requests.RequestException, KeyError):
        return None


def test_sigterm_inside_a_generation_window_saves_at_its_end_and_the_resume_replays_the_run_exactly(
        tmp_path: Path) -> None:
    doc = deep_update(quickstart_doc(), {"spec": {
        "training": {"maxSteps": MAX_STEPS, "stepsPerGeneration": WINDOW},
        "checkpoint": {"everySteps": 1000, "keepLast": 2},  # any checkpoint is the one SIGTERM made
    }})
    manifest = write_manifest(tmp_path / "job.yaml", doc)
    out = tmp_path / "out"
    port = free_port()
    proc = start_rljob("train", str(manifest), "--output", str(out), "--metrics-port", str(port),
                       log=tmp_path / "first.txt")
    try:
        # A window's first step generates (the slow one): signal while it runs, so the stop lands mid-window.
        signalled_at = wait_until(lambda: (s := trained_step(port)) is not None and s >= WINDOW
                                  and s % WINDOW == 0 and s < MAX_STEPS - WINDOW and s,
                                  timeout=400, interval=0.05, what="a window's end, with windows still to come")
        proc.send_signal(signal.SIGTERM)  # the launcher only, as the kubelet signals a container's PID 1
        code = proc.wait(timeout=120)
    finally:
        kill_group(proc, signal.SIGKILL)
    log = (tmp_path / "first.txt").read_text(errors="replace")
    assert code == 143, log[-3000:]
    latest = (out / "checkpoints" / "latest").read_text().strip()
    saved = int(latest.split("-")[1])
    assert saved % WINDOW == 0 and signalled_at <= saved < MAX_STEPS, (signalled_at, saved, log[-3000:])
    waited = "finishing the generation window" in log
    print(f"signalled after step {signalled_at}, saved {latest}, waited for the window's end: {waited}")

    logged_before = len((out / "metrics.jsonl").read_text().splitlines())
    second = run_rljob("train", str(manifest), "--output", str(out))
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == latest

    reference = run_rljob("train", str(manifest), "--output", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    want = logged_curve(tmp_path / "reference" / "metrics.jsonl")
    resumed = logged_curve(out / "metrics.jsonl", from_line=logged_before)
    assert sorted(resumed) == list(range(saved + 1, MAX_STEPS + 1))
    print(f"resumed from step {saved}: {assert_same_curve(resumed, want)} values equal")
