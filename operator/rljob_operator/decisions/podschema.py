"""Unknown fields of a runtime's ``podTemplate``: a free-form object checked against Kubernetes' own schema.

The runtime CRDs keep ``podTemplate`` as written (``x-kubernetes-preserve-unknown-fields``), so nothing but
this check stands between a key the API does not know (a typo, or the Python spelling
``service_account_name`` of ``serviceAccountName``) and the operator's merge and checks. The schema
is the Kubernetes client's models (``V1Pod`` and what it refers to: each field's JSON name, Python name and
type), the client the operator talks to the API server with, as ``podschema_fields`` has them: generated
from the client at build time (``operator/hack/gen_pod_schema.py``), so the operator imports none of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from rljob_operator.decisions.podschema_fields import MODELS

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
    model = MODELS.get(type_name)
    if model is None or not isinstance(value, dict):
        return  # a scalar, a free-form object, or a wrong type the API server refuses itself
    by_python_name = {python_name: json_name for json_name, (python_name, _) in model.items()}
    for key, item in value.items():
        if key in model:
            yield from _walk(item, model[key][1], f"{path}.{key}")
        elif key in by_python_name:
            yield f"{path}.{key}: unknown field (field names are camelCase: write {by_python_name[key]!r})"
        else:
            yield f"{path}.{key}: unknown field (a {type_name.removeprefix('V1')} has no such field)"

