"""Kueue as an admission gate: ``decide.py`` (pure: the Workload, admission → flavors, eviction →
Queued, the Workload's writes), ``client.py`` (its requests, a job's Workloads observed, the writes
applied, the Workload watch). Enabled by the operator setting ``kueue``."""

from __future__ import annotations

from rljob_operator.integrations.client import Integration
from rljob_operator.integrations.kueue.client import RESOURCES, KueueClient, describe, watch
from rljob_operator.integrations.kueue.decide import KUEUE

INTEGRATION = Integration(
    name=KUEUE.name,
    enabled=lambda settings: settings.kueue,
    client=KueueClient,
    watch=watch,
    describe=describe,
    resources=RESOURCES,
)
