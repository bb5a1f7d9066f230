"""Trials' health (pure): which signals tripped in a trial, whether its policy collapsed, whether to prune it.

A ranking must not rest silently on a collapsed arm (issue #47): a trial whose policy collapsed
(``rljob_contract.health.COLLAPSE_SIGNALS``) is marked on the leaderboard (``collapsed``), the winner's
message says so, and with ``spec.pruneCollapsed`` it is stopped as soon as it collapses. The signals come
from the trial job's ``status.progress.health`` on a cluster, from its metrics log's ``health/<signal>``
values on this machine (``rljob experiment``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rljob_contract.health import COLLAPSE_SIGNALS, HEALTH_LOG_PREFIX, HealthSignal

_KNOWN = {s.value for s in HealthSignal}


def ordered(signals: Iterable[str]) -> list[HealthSignal]:
    """Known signal names, once each, in HealthSignal's order (anything else is dropped)."""
    seen = {s for s in signals if s in _KNOWN}
    return [s for s in HealthSignal if s.value in seen]


def signals_from_progress(progress: Mapping[str, Any]) -> list[HealthSignal]:
    """The signals a job's ``status.progress.health`` lists (written by the status API; read defensively)."""
    warnings = progress.get("health")
    if not isinstance(warnings, list):
        return []
    return ordered(str(w.get("signal")) for w in warnings if isinstance(w, Mapping))


def signals_from_logs(records: Iterable[Mapping[str, Any]]) -> list[HealthSignal]:
    """The signals a metrics log's records show as tripped at any step."""
    return ordered(key.removeprefix(HEALTH_LOG_PREFIX) for record in records for key in record
                   if key.startswith(HEALTH_LOG_PREFIX))


def collapsed(signals: Iterable[str]) -> bool:
    """Its policy collapsed: a collapse signal tripped."""
    return any(s in COLLAPSE_SIGNALS for s in signals)


def count_collapsed(trials: Sequence[Any]) -> int:
    """How many of ``trials`` (TrialStatus) collapsed."""
    return sum(collapsed(t.health) for t in trials)


def collapse_prune_message(signals: Sequence[str]) -> str | None:
    """Why a running trial is stopped under ``pruneCollapsed`` (None: it did not collapse)."""
    if not collapsed(signals):
        return None
    names = ", ".join(signals)
    return f"its policy collapsed ({names}; docs/guides/health.md): pruned by spec.pruneCollapsed"


def collapse_note(winner: str, winner_collapsed: int, winner_n: int, runner_up: str | None,
                  runner_up_collapsed: int, runner_up_n: int) -> str:
    """What the winner's message adds when the comparison rests on collapsed trials ("" when it does not)."""
    notes = []
    if winner_collapsed:
        notes.append(f"{winner_collapsed} of {winner_n} trial(s) of the winner {winner} collapsed")
    if runner_up is not None and runner_up_collapsed:
        notes.append(f"{runner_up_collapsed} of {runner_up_n} trial(s) of the runner-up {runner_up} collapsed")
    if not notes:
        return ""
    return ("; but " + " and ".join(notes) + " (entropyCollapse): the ranking says how those runs went, not how "
            "the strategy does when it trains (docs/guides/health.md)")
