"""dashboard.png: the key panels of the shipped Grafana dashboard, drawn from a run's own series.

On a cluster the dashboard (``charts/rljob/files/dashboards/rljob.json``) draws these panels from
Prometheus; ``rljob train`` has no Prometheus, so the same panels are drawn beside ``reward_curve.png``
from the run's metrics log (``metrics.jsonl``, what the trainer exports as ``rljob_trainer_*``), so a
researcher sees at a glance what a dashboard would show: the reward and its spread, each reward function,
the loss, the KL, the held-out evaluation, the RL health signals and their inputs (entropy, truncated
completions, groups without learning signal, gradient norm) and the step time. ``make e2e`` draws the same panels from a
real Prometheus's range queries (``tests/e2e``). ``KEY_PANELS`` names each panel as the dashboard titles it
and the trainer series its queries read; ``tests/delivery/test_dashboard_picture.py`` holds them to the
dashboard, so a renamed panel or metric fails there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: One panel's series: a legend name → its points (x, y), x a step (a run's log) or a time (Prometheus).
Series = dict[str, list[tuple[float, float]]]


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: its ``title`` in the dashboard and the trainer series (``metrics``) its queries read,
    each with the key of the run's metrics log it is exported from (``{label}`` for a labelled series), or
    None for a series the log does not hold (it is drawn from Prometheus only)."""

    title: str
    metrics: tuple[tuple[str, str | None], ...]


#: The dashboard's key panels, in its order: the trainer series each draws and the log key behind it.
KEY_PANELS = (
    Panel("Reward", (("rljob_trainer_reward", "reward"), ("rljob_trainer_reward_std", "reward_std"))),
    Panel("Reward per function", (("rljob_trainer_reward_mean", "rewards/{reward}/mean"),)),
    Panel("Loss", (("rljob_trainer_loss", "loss"),)),
    Panel("KL to the reference model", (("rljob_trainer_kl", "kl"),)),
    Panel("Held-out evaluation (latest)", (("rljob_trainer_eval", "eval/{metric}"),)),
    Panel("Health signals tripped", (("rljob_trainer_health_tripped", "health/{signal}"),)),
    Panel("Entropy", (("rljob_trainer_entropy", "entropy"), ("rljob_trainer_entropy_start", None))),
    Panel("Masked and truncated completions", (("rljob_trainer_masked_ratio", None),
                                               ("rljob_trainer_completions_clipped_ratio",
                                                "completions/clipped_ratio"))),
    Panel("Groups without learning signal", (("rljob_trainer_reward_zero_std_ratio", "frac_reward_zero_std"),)),
    Panel("Gradient norm", (("rljob_trainer_grad_norm", "grad_norm"),)),
    Panel("Step time", (("rljob_trainer_step_seconds", "step_time"),)),
)


def _matches(pattern: str, key: str) -> str | None:
    """The legend of log key ``key`` when it fits ``pattern`` (``rewards/{reward}/mean``), else None."""
    if "{" not in pattern:
        return pattern if key == pattern else None
    head, _, rest = pattern.partition("{")
    tail = rest.partition("}")[2]
    inner = key[len(head):len(key) - len(tail)] if len(key) > len(head) + len(tail) else ""
    return inner if inner and key.startswith(head) and key.endswith(tail) and "/" not in inner else None


def panels_from_log(records: list[dict[str, Any]]) -> list[tuple[str, Series]]:
    """Each key panel's series from a metrics log's records (``{"step": N, key: value, …}``), empty where the
    run logged none (no KL without a reference model, no evaluation without spec.training.evaluation)."""
    panels = []
    for panel in KEY_PANELS:
        series: Series = {}
        for _, pattern in panel.metrics:
            if pattern is None:
                continue
            for record in records:
                for key, value in record.items():
                    legend = _matches(pattern, key)
                    if legend is not None and isinstance(value, int | float) and math.isfinite(value):
                        series.setdefault(legend, []).append((float(record["step"]), float(value)))
        panels.append((panel.title, series))
    return panels


def read_metrics_log(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics log; a line cut short by a crash is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int | float):
            records.append(record)
    return records


def plot_dashboard(panels: list[tuple[str, Series]], path: Path, xlabel: str = "step") -> Path | None:
    """Draw the panels that have series in a grid of two columns into ``path``; None (no file) when none has."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [(title, series) for title, series in panels if series]
    if not drawn:
        return None
    rows = (len(drawn) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3 * rows), dpi=100, squeeze=False)
    for ax, (title, series) in zip(axes.flat, drawn, strict=False):
        for legend, points in sorted(series.items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, linewidth=1, label=legend)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_dashboard(output: Path, log_name: str) -> Path | None:
    """``output/dashboard.png`` from ``output/<log_name>`` (the run's metrics log); None when it has no series."""
    log = output / log_name
    if not log.exists():
        return None
    return plot_dashboard(panels_from_log(read_metrics_log(log)), output / "dashboard.png")
