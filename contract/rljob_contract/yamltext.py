"""YAML that every Kubernetes client reads the way we meant it.

PyYAML writes YAML 1.1, but leaves ``y``, ``Y``, ``n`` and ``N`` unquoted: its resolver does not take
them for booleans. go-yaml v2 does, and sigs.k8s.io/yaml is built on it: so kubectl, Helm and
kustomize's ``kubectl apply`` read ``n:`` as the key ``"false"``. A CRD schema property ``n`` written
by PyYAML becomes a property ``false``, and the API server then prunes every ``n`` the objects carry
(it did: ``status.arms[].n`` of an RLExperiment installed with Helm or ``kubectl apply -f crds/``).

:func:`dump` is ``yaml.safe_dump`` with those four quoted too. Everything else either reader could
take for other than a string (``yes``, ``off``, ``null``, ``1e3``, ``12:30``, ...) PyYAML quotes already.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

#: Plain scalars go-yaml v2 resolves as booleans and PyYAML (YAML 1.1 less these) as strings.
GO_ONLY_BOOLEANS = ("y", "Y", "n", "N")


class ManifestDumper(yaml.SafeDumper):
    """``SafeDumper`` that quotes :data:`GO_ONLY_BOOLEANS`."""


ManifestDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(f"^(?:{'|'.join(GO_ONLY_BOOLEANS)})$"),
                                      list(GO_ONLY_BOOLEANS))


def dump(data: Any, **options: Any) -> str:
    """``yaml.safe_dump(data, **options)`` that kubectl, Helm and the API server read back unchanged."""
    return yaml.dump(data, Dumper=ManifestDumper, **options)  # type: ignore[no-any-return]

