"""YAML read as kubectl, Helm and the API server read it (go-yaml v2, under sigs.k8s.io/yaml).

go-yaml v2 resolves the plain scalars ``y``, ``Y``, ``n`` and ``N`` as booleans, and sigs.k8s.io/yaml turns
a boolean key into the string ``"true"``/``"false"``; PyYAML reads all four as strings. go-yaml v2 also reads
as a float any plain scalar that starts like a number and Go's ``strconv.ParseFloat`` takes (``1e-3``,
``1.5e3``), where YAML 1.1, so PyYAML, wants a dot and a signed exponent. Everything else the two read alike
(both are YAML 1.1: ``yes``/``no``/``on``/``off`` are booleans to both). :class:`GoLoader` is ``SafeLoader``
with go-yaml's extra booleans and floats; :func:`go_differences` names where a text reads otherwise to Go than
to rljob's own reader (``rljob_contract.yamltext``, which reads floats as Go does and refuses aliases; a text
with an alias is read by PyYAML alone).
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from rljob_contract import yamltext


class GoLoader(yaml.SafeLoader):
    """``SafeLoader`` that also takes ``y``, ``Y``, ``n`` and ``N`` for booleans, as go-yaml v2 does."""


GoLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
GoLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d[\d_]*\.?[\d_]*|\.[\d_]+)[eE][-+]?\d+$"),
                               list("-+.0123456789"))
GoLoader.add_constructor("tag:yaml.org,2002:bool",
                         lambda loader, node: loader.construct_scalar(node) in {"y", "Y", "yes", "Yes", "YES", "true",
                                                                                "True", "TRUE", "on", "On", "ON"})


def _as_json_keys(value: Any) -> Any:
    """sigs.k8s.io/yaml's conversion: a boolean key becomes "true" or "false"."""
    if isinstance(value, dict):
        return {(str(k).lower() if isinstance(k, bool) else k): _as_json_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json_keys(v) for v in value]
    return value


def _diff(ours: Any, go: Any, path: str) -> list[str]:
    if isinstance(ours, dict) and isinstance(go, dict):
        out = [f"{path}.{k}: the key reads as {_key_in(go, ours)}" for k in ours if k not in go]
        for k in ours:
            if k in go:
                out += _diff(ours[k], go[k], f"{path}.{k}")
        return out
    if isinstance(ours, list) and isinstance(go, list) and len(ours) == len(go):
        return [d for i, (a, b) in enumerate(zip(ours, go, strict=True)) for d in _diff(a, b, f"{path}[{i}]")]
    return [] if ours == go and type(ours) is type(go) else [f"{path}: {ours!r} reads as {go!r}"]


def _key_in(go: dict[Any, Any], ours: dict[Any, Any]) -> str:
    extra = [k for k in go if k not in ours]
    return repr(extra[0]) if len(extra) == 1 else "something else"


def go_differences(text: str) -> list[str]:
    """Where ``text`` (one or more documents) reads otherwise in Go than in rljob: "doc N path: what"."""
    try:
        ours = yamltext.load_all(text)
    except yamltext.UnsafeYAML:
        ours = list(yaml.safe_load_all(text))
    go = [_as_json_keys(d) for d in yaml.load_all(text, Loader=GoLoader)]
    return [f"document {i}{d}" for i, (a, b) in enumerate(zip(ours, go, strict=True)) for d in _diff(a, b, "")]
