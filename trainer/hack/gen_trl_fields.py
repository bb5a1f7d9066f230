#!/usr/bin/env python3
"""Write ``contract/rljob_contract/trl_fields.py``: the fields of TRL's GRPOConfig and RLOOConfig.

    python trainer/hack/gen_trl_fields.py            # write it (make trl-fields)
    python trainer/hack/gen_trl_fields.py --check    # exit 1 when it differs from the installed TRL

``rljob validate`` and the operator check ``spec.training.trl`` against these fields without
importing torch or TRL, so the table is generated here, at build time, from the installed TRL
(the version the trainer image pins), and committed. Each field's type becomes a small JSON
schema (the vocabulary ``rljob_contract.spec.python_type`` and ``rljob_operator.crd`` read):
``type`` boolean/integer/number/string/array/object, ``enum``, ``items``, ``minItems``/``maxItems``,
``additionalProperties``, ``anyOf`` (unions), ``nullable``. A type that cannot be written in a
manifest (a Python object) is recorded as ``{"unsupported": "<type>"}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "contract/rljob_contract/trl_fields.py"
sys.path.insert(0, str(REPO / "contract"))
from rljob_contract.plugins.algorithms import CONFIG_CLASSES  # noqa: E402 - the algorithms' TRL config classes

SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}
#: Longest description kept (the CRD carries one per field; `kubectl explain` shows it).
MAX_DESCRIPTION = 200


def _enum_values(tp: type[enum.Enum]) -> list[Any]:
    return [m.value for m in tp]


def value_schema(tp: Any) -> dict[str, Any]:
    """A Python type annotation of a TRL config field → the JSON-schema vocabulary above."""
    if tp is Any:
        return {}
    if tp in SCALARS:
        return {"type": SCALARS[tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": _enum_values(tp)}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if kinds == {bool}:
            return {"type": "boolean"}
        if kinds == {str}:
            return {"type": "string", "enum": list(args)}
        return {"unsupported": repr(tp)}
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        options = [a for a in args if a is not type(None)]
        # transformers converts "enum-or-str" fields with Enum(value): only the enum's values work.
        enums = [a for a in options if isinstance(a, type) and issubclass(a, enum.Enum)]
        if enums and all(a in enums or a is str for a in options):
            out = {"type": "string", "enum": [v for e in enums for v in _enum_values(e)]}
        else:
            schemas = []
            for a in options:
                s = value_schema(a)
                if s not in schemas:
                    schemas.append(s)
            if any("unsupported" in s for s in schemas):
                return {"unsupported": repr(tp)}
            out = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        return {**out, "nullable": True} if nullable else out
    if origin in (list, typing.List):  # noqa: UP006 - matching old-style annotations too
        return {"type": "array", "items": value_schema(args[0]) if args else {}}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": value_schema(args[0])}
        items = [value_schema(a) for a in args]
        if all(i == items[0] for i in items):
            return {"type": "array", "items": items[0], "minItems": len(items), "maxItems": len(items)}
        return {"unsupported": repr(tp)}
    if tp is dict or origin is dict:
        if not args or args[1] is Any:
            return {"type": "object"}
        return {"type": "object", "additionalProperties": value_schema(args[1])}
    return {"unsupported": getattr(tp, "__qualname__", repr(tp))}


def describe(field: dataclasses.Field[Any]) -> str:
    """The first sentence of the field's help text, at most MAX_DESCRIPTION characters."""
    text = " ".join(str(field.metadata.get("help", "")).split())
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    if len(first) > MAX_DESCRIPTION:
        first = first[: MAX_DESCRIPTION - 1].rsplit(" ", 1)[0] + "…"
    return first or f"TRL config field {field.name}."


def collect() -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """(versions, fields): every init field of GRPOConfig and RLOOConfig with its schema."""
    import transformers
    import trl

    fields: dict[str, dict[str, Any]] = {}
    for algorithm, class_name in CONFIG_CLASSES.items():
        cls = getattr(trl, class_name)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            schema = value_schema(hints.get(f.name, f.type))
            choices = f.metadata.get("choices")
            if choices and schema.get("type") == "string":
                schema["enum"] = list(choices)
            entry = fields.setdefault(f.name, {"schema": schema, "algorithms": [], "description": describe(f)})
            if entry["schema"] != schema:
                # rljob_contract.spec and rljob_operator.crd would need a per-algorithm type.
                raise SystemExit(f"gen_trl_fields: {f.name} has different types in GRPOConfig and RLOOConfig: "
                                 f"{entry['schema']} vs {schema}; teach contract/rljob_contract/spec.py and crd.py about it")
            entry["algorithms"].append(algorithm)
    versions = {"trl": trl.__version__, "transformers": transformers.__version__}
    return versions, dict(sorted(fields.items()))


def render(versions: dict[str, str], fields: dict[str, dict[str, Any]]) -> str:
    """The module's text: one line per field, so a TRL upgrade shows as a readable diff."""
    lines = [
        f'"""GRPOConfig and RLOOConfig fields of trl {versions["trl"]} '
        f'(transformers {versions["transformers"]}): generated, do not edit.',
        "",
        "Written by ``trainer/hack/gen_trl_fields.py`` (``make trl-fields``) from the installed TRL; a test",
        "fails when it drifts. Pure data: ``rljob validate`` and the operator read it without torch.",
        "Each field: ``schema`` (JSON-schema subset), ``algorithms`` (grpo, rloo), ``description``.",
        '"""',
        "",
        "from typing import Any",
        "",
        f"TRL_VERSION = {json.dumps(versions['trl'])}",
        f"TRANSFORMERS_VERSION = {json.dumps(versions['transformers'])}",
        f"CONFIG_CLASSES = {json.dumps(CONFIG_CLASSES)}",
        "",
        "# fmt: off",
        "TRL_FIELDS: dict[str, dict[str, Any]] = {",
    ]
    for name, entry in fields.items():
        lines.append(f"    {name!r}: {entry!r},")
    lines += ["}", "# fmt: on", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on drift")
    args = parser.parse_args(argv)
    text = render(*collect())
    current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else None
    if args.check:
        if current != text:
            print(f"{OUTPUT.relative_to(REPO)} drifted from the installed TRL; run `make trl-fields`",
                  file=sys.stderr)
            return 1
        return 0
    if current != text:
        OUTPUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUTPUT.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
