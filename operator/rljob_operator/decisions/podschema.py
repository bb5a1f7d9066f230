"""Unknown fields of a runtime's ``podTemplate``: a free-form object checked against Kubernetes' own schema.

The runtime CRDs keep ``podTemplate`` as written (``x-kubernetes-preserve-unknown-fields``), so nothing but
this check stands between a key the API does not know (a typo, or the Python spelling
``service_account_name`` of ``serviceAccountName``) and the operator's merge and checks. The schema
is the Kubernetes client's models (``V1Pod`` and what it refers to: ``openapi_types`` gives each
field's type, ``attribute_map`` its JSON name), the client the operator talks to the API server with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from kubernetes import client

_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


#: A runtime's free-form pod fields: (field of its spec, the client's type of its value).
RUNTIME_FIELDS = (("podTemplate", "V1Pod"),)


def unknown_fields(spec: dict[str, Any], path: str = "spec") -> list[str]:
    """``<path>.<field>: unknown field ...`` for every key of the free-form pod fields of ``spec`` (a runtime's
    spec as the API spells it) that Kubernetes lacks."""
    return [problem for field, type_name in RUNTIME_FIELDS
            for problem in _walk(spec.get(field), type_name, f"{path}.{field}")]


def _walk(value: Any, type_name: str, path: str) -> Iterator[str]:
    if (inner := _LIST.match(type_name)) and isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, inner.group(1), f"{path}[{i}]")
        return
    if (inner := _DICT.match(type_name)) and isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, inner.group(1), f"{path}[{key}]")
        return
    model = getattr(client, type_name, None) if type_name.startswith("V1") else None
    if model is None or not isinstance(value, dict):
        return  # a scalar, a free-form object, or a wrong type the API server refuses itself
    fields = {json_name: model.openapi_types[name] for name, json_name in model.attribute_map.items()}
    by_python_name = {name: json_name for name, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key in fields:
            yield from _walk(item, fields[key], f"{path}.{key}")
        elif key in by_python_name:
            yield f"{path}.{key}: unknown field (field names are camelCase: write {by_python_name[key]!r})"
        else:
            yield f"{path}.{key}: unknown field (a {type_name.removeprefix('V1')} has no such field)"


def load_models(type_name: str = "V1Pod", seen: set[str] | None = None) -> set[str]:
    """Import the client's model ``type_name`` and every model it refers to; their names.

    The client imports each model on first use, and V1Pod's take the interpreter about a quarter of a
    second: the operator loads them at start-up, so that its first reconcile (in a burst, every job's
    first reconcile behind it) does not pay that.
    """
    seen = set() if seen is None else seen
    while (inner := _LIST.match(type_name) or _DICT.match(type_name)) is not None:
        type_name = inner.group(1)
    model = getattr(client, type_name, None) if type_name.startswith("V1") and type_name not in seen else None
    if model is not None:
        seen.add(type_name)
        for field_type in model.openapi_types.values():
            load_models(field_type, seen)
    return seen
