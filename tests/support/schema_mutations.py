"""Mutations of ``examples/quickstart.yaml``: an unknown key in every mapping, a wrong type in every leaf.

``rljob validate`` (unit test) and the API server with the generated CRD (cluster test) must refuse
every one, naming the field path: whatever fails when the trainer starts should fail at
``kubectl apply`` instead.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from tests.support.trainer import quickstart_doc

UNKNOWN_KEY = "zzUnknown"


def _wrong_type(value: Any) -> Any:
    """A value of another JSON type than ``value``'s (bool before int: bool is an int in Python)."""
    if isinstance(value, bool):
        return "not-a-bool"
    if isinstance(value, int | float):
        return "not-a-number"
    if isinstance(value, str):
        return 12345
    raise TypeError(f"no wrong type for {value!r}")


def _nodes(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _nodes(child, f"{path}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _nodes(child, f"{path}[{i}]")


def _parent_and_key(doc: dict[str, Any], path: str) -> tuple[Any, str | int]:
    """The container holding ``path`` in ``doc`` and the key (or index) of ``path`` in it."""
    parts: list[str | int] = []
    for part in path.split("."):
        name, *indexes = part.split("[")
        parts.append(name)
        parts += [int(i.rstrip("]")) for i in indexes]
    node: Any = doc
    for part in parts[:-1]:
        node = node[part]
    return node, parts[-1]


def quickstart_mutations() -> list[tuple[str, dict[str, Any], str]]:
    """(case, mutated manifest, the field path an error must name), for everything under ``spec``."""
    base = quickstart_doc()
    out = []
    for path, node in _nodes(base["spec"], "spec"):
        doc = copy.deepcopy(base)
        if isinstance(node, dict):
            target, key = _parent_and_key(doc, path) if path != "spec" else (doc, "spec")
            target[key][UNKNOWN_KEY] = 1
            out.append((f"unknown-key-in-{path}", doc, f"{path}.{UNKNOWN_KEY}"))
        elif not isinstance(node, list):
            target, key = _parent_and_key(doc, path)
            target[key] = _wrong_type(node)
            out.append((f"wrong-type-of-{path}", doc, path))
    return out
