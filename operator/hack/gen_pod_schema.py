#!/usr/bin/env python3
"""Write ``operator/rljob_operator/decisions/podschema_fields.py``: the pod's schema from the Kubernetes client.

    python operator/hack/gen_pod_schema.py            # write it (make pod-schema)
    python operator/hack/gen_pod_schema.py --check    # exit 1 when it differs from the installed client

The operator checks a runtime's free-form ``podTemplate`` against Kubernetes' own schema
(``rljob_operator.decisions.podschema``): the client's model ``V1Pod`` and every ``V1`` model it refers to,
each field's JSON name, Python name and type (``attribute_map``, ``openapi_types``). Read from the models
at run time, those 134 classes (pydantic models) held about 8 MiB of every replica's memory for three
strings per field; so the table is generated here, from the installed client (the version the operator
image pins), and committed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "operator/rljob_operator/decisions/podschema_fields.py"
ROOT = "V1Pod"
_INNER = re.compile(r"^(?:List\[(.+)\]|Dict\[str, (.+)\])$")


def models(root: str = ROOT) -> dict[str, dict[str, tuple[str, str]]]:
    """``{model: {json name: (python name, type)}}`` for ``root`` and every ``V1`` model it refers to."""
    from kubernetes import client

    out: dict[str, dict[str, tuple[str, str]]] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        while (inner := _INNER.match(name)) is not None:
            name = inner.group(1) or inner.group(2)
        if not name.startswith("V1") or name in out or (model := getattr(client, name, None)) is None:
            continue
        out[name] = {json_name: (python_name, model.openapi_types[python_name])
                     for python_name, json_name in model.attribute_map.items()}
        todo.extend(t for _, t in out[name].values())
    return dict(sorted(out.items()))


def render() -> str:
    from kubernetes.client import __version__ as version

    table = models()
    lines = [
        f'"""The pod\'s schema in the Kubernetes client {version}: ``{ROOT}`` and the {len(table)} ``V1`` models it refers',
        "to. Generated, do not edit.",
        "",
        "Written by ``operator/hack/gen_pod_schema.py`` (``make pod-schema``) from the installed client; a test fails",
        "when it drifts. Each model: ``{JSON name: (Python name, type)}``, the type as the client spells it",
        "(``List[V1Container]``, ``Dict[str, str]``, ``str``).",
        '"""',
        "",
        f"CLIENT_VERSION = {version!r}",
        "",
        "# fmt: off",
        "MODELS: dict[str, dict[str, tuple[str, str]]] = {",
    ]
    for name, fields in table.items():
        lines.append(f"    {name!r}: {{")
        lines += [f"        {json_name!r}: {value!r}," for json_name, value in fields.items()]
        lines.append("    },")
    lines += ["}", "# fmt: on", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT.relative_to(REPO)} differs from the installed Kubernetes client: run make pod-schema",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
