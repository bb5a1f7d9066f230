"""dashboard.png (``rljob/dashboard.py``): the shipped dashboard's key panels drawn from a run's metrics log.

Its panels are held to the dashboard (the title, the trainer series its queries read), and its log keys to
what the trainer exports: a record observed by the trainer's own ``TrainerMetrics`` and scraped shows, for
every panel series, the value the picture draws from the same record.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rljob.dashboard import KEY_PANELS, panels_from_log, read_metrics_log, write_dashboard
from tests.delivery.test_alerts import DASHBOARD

#: A run's logged steps with every key the key panels draw (two reward functions, a reference model): DAPO
#: with every completion truncated, so the masked-batch health signal trips after its window of 3 steps.
STEPS = [{"reward": 0.5 + step / 100, "reward_std": 0.25, "rewards/repeat_char/mean": 0.75,
          "rewards/length_penalty/mean": -0.125, "loss": 0.0625, "kl": 0.03125, "step_time": 0.375,
          "entropy": 3.5 - step / 10, "completions/clipped_ratio": 1.0, "frac_reward_zero_std": 0.25,
          "grad_norm": 0.5 + step / 10} for step in range(1, 8)]
RECORD = {"step": 7, **STEPS[-1]}
EVAL = {"step": 7, "eval/exact_match": 0.625}


def dashboard_panels() -> dict[str, list[str]]:
    """Each panel title of the shipped dashboard → its queries."""
    panels: dict[str, list[str]] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        panels.setdefault(panel.get("title", ""), []).extend(t["expr"] for t in panel.get("targets", []))
    return panels


def test_each_key_panel_is_a_dashboard_panel_reading_the_trainer_series_it_names() -> None:
    shipped = dashboard_panels()
    for panel in KEY_PANELS:
        assert panel.title in shipped, f"{panel.title!r} is not a panel of {DASHBOARD.name}"
        read = set(re.findall(r"\brljob_trainer_[a-z_]+", " ".join(shipped[panel.title])))
        assert read == {metric for metric, _ in panel.metrics}, (panel.title, read)


def trained(log: Path) -> dict[tuple[str, str], float]:
    """Feed ``STEPS`` and ``EVAL`` through the trainer's own callback (metrics log, gauges, health signals of a
    DAPO run with a reference model); (series, label value) → value, as its Prometheus endpoint shows them."""
    from types import SimpleNamespace

    from prometheus_client import generate_latest
    from rljob_contract.health import HealthSpec
    from rljob_trainer.telemetry import TelemetryCallback, TrainerMetrics, append_metrics

    metrics = TrainerMetrics()
    callback = TelemetryCallback(metrics, log_path=log, health=HealthSpec())
    callback.on_train_begin(SimpleNamespace(mask_truncated_completions=True, beta=0.04), None, None)
    for step, logs in enumerate(STEPS, start=1):
        callback.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=step), None, logs=dict(logs))
    metrics.observe_eval(EVAL["step"], {"eval/exact_match": EVAL["eval/exact_match"]})
    append_metrics(log, EVAL["step"], {"eval/exact_match": EVAL["eval/exact_match"]})
    samples = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        match = re.fullmatch(r'(rljob_trainer_[a-z_]+)(?:\{\w+="([^"]*)"\})? (\S+)', line)
        if match:
            samples[(match.group(1), match.group(2) or "")] = float(match.group(3))
    return samples


def test_the_picture_draws_each_series_from_the_log_key_the_trainer_exports_it_from(tmp_path: Path) -> None:
    exported = trained(tmp_path / "metrics.jsonl")
    drawn = dict(panels_from_log(read_metrics_log(tmp_path / "metrics.jsonl")))
    for panel in KEY_PANELS:
        for metric, pattern in panel.metrics:
            if pattern is None:  # not in the run's log: the dashboard alone draws it
                assert metric in {m for m, _ in exported}, metric
                continue
            legends = [legend for legend in drawn[panel.title] if "{" in pattern or legend == pattern]
            assert legends, (panel.title, metric)
            for legend in legends:
                label = legend if "{" in pattern else ""
                assert drawn[panel.title][legend][-1] == (7.0, exported[(metric, label)]), (panel.title, legend)
    assert set(drawn["Reward per function"]) == {"repeat_char", "length_penalty"}
    assert drawn["Held-out evaluation (latest)"] == {"exact_match": [(7.0, 0.625)]}
    # The DAPO run's whole batch was masked: the health panel draws the signal from when it tripped.
    assert drawn["Health signals tripped"] == {"maskedBatch": [(3.0, 1.0), (4.0, 1.0), (5.0, 1.0), (6.0, 1.0),
                                                              (7.0, 1.0)]}
    assert exported[("rljob_trainer_masked_ratio", "")] == 1.0


def test_rljob_train_writes_the_picture_from_its_metrics_log_and_none_without_series(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({**RECORD, "step": s, "reward": s / 10}) + "\n" for s in range(1, 6))
                   + '{"step": 6, "rew')  # a line cut short by a crash is skipped
    picture = write_dashboard(tmp_path, "metrics.jsonl")
    assert picture == tmp_path / "dashboard.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    log.write_text(json.dumps({"step": 1, "epoch": 0.1}) + "\n")
    (tmp_path / "dashboard.png").unlink()
    assert write_dashboard(tmp_path, "metrics.jsonl") is None and not (tmp_path / "dashboard.png").exists()
    assert write_dashboard(tmp_path / "missing", "metrics.jsonl") is None
