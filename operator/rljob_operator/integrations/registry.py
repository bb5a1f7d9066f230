"""The admission gates the operator knows, in the order they are consulted; settings choose which run.

A new gate is one folder of ``integrations/`` whose ``__init__.py`` defines ``INTEGRATION``
(``client.Integration``), and one line here (docs/architecture.md, "How to add an integration").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rljob_operator.cluster import kube as kube_module
from rljob_operator.integrations import kueue
from rljob_operator.integrations.client import GateClient, Integration

if TYPE_CHECKING:
    from rljob_operator.cluster.kube import Kube
    from rljob_operator.settings import OperatorSettings

INTEGRATIONS: dict[str, Integration] = {i.name: i for i in (kueue.INTEGRATION,)}
"""Every gate the operator knows, by name, in the order they are consulted."""

for _integration in INTEGRATIONS.values():
    kube_module.count_resources(*_integration.resources)


def enabled(settings: OperatorSettings) -> list[Integration]:
    """The gates these settings run, in registry order."""
    return [i for i in INTEGRATIONS.values() if i.enabled(settings)]


def default_clients(kube: Kube) -> list[GateClient]:
    """Every known gate's client, none watched (a reconciler built without settings: tests, tools)."""
    return [i.client(kube, False, None) for i in INTEGRATIONS.values()]
