"""Heartbeats from a real training run: the logged metrics reach the heartbeat, and a NaN loss does not cost it
(the heartbeat's client without a run: ``tests/trainer/test_heartbeat.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from rljob_trainer.heartbeat import Heartbeat

from tests.support.trainer import wait_until


@pytest.mark.trainer  # imports transformers (the callback's base class): with the trainer tests, not test-fast
def test_logged_metrics_reach_the_heartbeat_and_a_nan_loss_does_not_cost_it(receiver: Any) -> None:
    """What TRL logs at a step (the trainer's TelemetryCallback) goes out as ``metrics``, finite numbers only."""
    import math
    from types import SimpleNamespace

    from rljob_trainer.telemetry import TelemetryCallback

    url, received = receiver
    hb = Heartbeat(url, None, None, "job-worker-0")
    callback = TelemetryCallback(None, hb)
    state = SimpleNamespace(is_world_process_zero=True, global_step=4)
    logs = {"loss": math.nan, "reward": 0.7, "kl": 0.02, "rewards/repeat_char/mean": 0.7, "epoch": 0.5,
            "grad_norm": math.inf, "completions/mean_length": 6.0}
    for _ in range(2):  # the receiver refuses the first POST: the second must arrive
        callback.on_log(None, state, None, logs=logs)
    wait_until(lambda: len(received) >= 2, timeout=10, what="two heartbeats")
    body = received[-1][0]
    assert body["step"] == 4 and body["reward"] == 0.7 and body["loss"] is None
    assert body["metrics"] == {"kl": 0.02, "rewards/repeat_char/mean": 0.7, "epoch": 0.5,
                               "completions/mean_length": 6.0}
