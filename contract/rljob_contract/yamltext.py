"""YAML that every Kubernetes client reads the way we meant it, and YAML from users read safely.

PyYAML writes YAML 1.1, but leaves ``y``, ``Y``, ``n`` and ``N`` unquoted: its resolver does not take
them for booleans. go-yaml v2 does, and sigs.k8s.io/yaml is built on it: so kubectl, Helm and
kustomize's ``kubectl apply`` read ``n:`` as the key ``"false"``. A CRD schema property ``n`` written
by PyYAML becomes a property ``false``, and the API server then prunes every ``n`` the objects carry
(it did: ``status.arms[].n`` of an RLExperiment installed with Helm or ``kubectl apply -f crds/``).

:func:`dump` is ``yaml.safe_dump`` with those four quoted too. Everything else either reader could
take for other than a string (``yes``, ``off``, ``null``, ``1e3``, ``12:30``, ...) PyYAML quotes already.

:func:`load` and :func:`load_all` are how everything rljob reads from users is read (a manifest for
``rljob validate``, ``train`` or ``experiment``, a trainer config): ``yaml.safe_load`` without aliases.
An alias (``*name``, also ``<<: *name``) repeats a node without copying it, so ten aliases of ten
aliases ... expand a file under 1 KB into millions of values, which validation, merging and dumping
then walk one by one (an RLExperiment of 600 bytes took 1.8 s and 190 MB in ``rljob validate``).
Refusing aliases costs nothing a manifest needs (Helm and kustomize write none, and the API server
stores none); bounding their expansion instead would leave a limit to tune. Nesting is bounded too
(``MAX_DEPTH``): PyYAML's composer recurses per level, and a few thousand ``[`` are a RecursionError.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

#: Plain scalars go-yaml v2 resolves as booleans and PyYAML (YAML 1.1 less these) as strings.
GO_ONLY_BOOLEANS = ("y", "Y", "n", "N")


#: How deeply a document read from a user may nest (a job's deepest field, an affinity term in
#: ``podTemplate``, is about 15 levels down).
MAX_DEPTH = 100


class UnsafeYAML(yaml.YAMLError):
    """YAML that is refused whatever it says: an alias, or nesting deeper than ``MAX_DEPTH``."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        super().__init__(f"{problem}{where}")


class ManifestLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases and nesting deeper than ``MAX_DEPTH`` while it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise UnsafeYAML(f"the alias *{event.anchor} is not accepted: write the value out (aliases let a "
                             "file of a few hundred bytes expand to millions of values)", event.start_mark)
        if self.depth >= MAX_DEPTH:
            raise UnsafeYAML(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self.depth -= 1


#: Numbers with an exponent but no dot, or no sign in the exponent (``1e-3``, ``1.5e3``, ``.5e3``): YAML 1.1,
#: so PyYAML, reads them as strings; go-yaml v2 (kubectl, Helm, the API server) as floats. Read as Go does:
#: ``learningRate: 1e-3`` is a number, as ``kubectl apply`` sends it.
GO_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
ManifestLoader.add_implicit_resolver("tag:yaml.org,2002:float", GO_FLOAT, list("-+.0123456789"))


def load(text: str) -> Any:
    """The one YAML document of ``text``, as ``yaml.safe_load`` reads it; ``UnsafeYAML`` (a ``YAMLError``) for
    an alias or too deep a nesting."""
    return yaml.load(text, Loader=ManifestLoader)  # noqa: S506 - a SafeLoader


def load_all(text: str) -> list[Any]:
    """Every YAML document of ``text`` (``yaml.safe_load_all``), refused as :func:`load` refuses."""
    return list(yaml.load_all(text, Loader=ManifestLoader))  # noqa: S506 - a SafeLoader


class ManifestDumper(yaml.SafeDumper):
    """``SafeDumper`` that quotes :data:`GO_ONLY_BOOLEANS`."""


ManifestDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(f"^(?:{'|'.join(GO_ONLY_BOOLEANS)})$"),
                                      list(GO_ONLY_BOOLEANS))


def dump(data: Any, **options: Any) -> str:
    """``yaml.safe_dump(data, **options)`` that kubectl, Helm and the API server read back unchanged."""
    return yaml.dump(data, Dumper=ManifestDumper, **options)  # type: ignore[no-any-return]

