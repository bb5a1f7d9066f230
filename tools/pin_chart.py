#!/usr/bin/env python3
"""Pin a copy of the chart's values.yaml to released images, by digest (``make release``, tools/release.sh).

    python tools/pin_chart.py VALUES --registry REG --version V --operator-digest D1 --trainer-digest D2

Rewrites, in place, the values of a copy of ``charts/rljob`` so ``helm install`` of the pushed chart runs
exactly the images that were pushed with it: ``image`` (the operator) and ``runtimes.image`` (the trainer)
name ``REG/operator`` and ``REG/trainer`` with their digests (a digest wins over the tag: a tag moved later
changes nothing), and ``podProfile.allowedImages`` allows that trainer repository. The file's comments
(the chart's documentation of every value) are kept: only the values' lines change, and the result is
checked by parsing it, so an edit that missed its line fails here rather than ship a chart pinned to nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w]*):(?P<value> .*)?$")


def wanted(registry: str, version: str, operator_digest: str, trainer_digest: str) -> dict[tuple[str, ...], Any]:
    """Each value to set, by its path in values.yaml."""
    for name, digest in (("operator", operator_digest), ("trainer", trainer_digest)):
        if not DIGEST.fullmatch(digest):
            raise ValueError(f"--{name}-digest {digest!r} is not sha256:<64 hex digits>")
    trainer = f"{registry}/trainer"
    return {
        ("image", "repository"): f"{registry}/operator",
        ("image", "tag"): version,
        ("image", "digest"): operator_digest,
        ("runtimes", "image", "repository"): trainer,
        ("runtimes", "image", "tag"): version,
        ("runtimes", "image", "digest"): trainer_digest,
        ("podProfile", "allowedImages"): [f"{trainer}:*", f"{trainer}@*"],
    }


def pinned_text(text: str, values: dict[tuple[str, ...], Any]) -> str:
    """``text`` (values.yaml) with each path's value replaced; a list replaces the ``- item`` lines under it."""
    lines, out, path, skip_items_deeper_than = text.splitlines(), [], [], -1
    for line in lines:
        if skip_items_deeper_than >= 0:
            stripped = line.lstrip(" ")
            if stripped.startswith("- ") and len(line) - len(stripped) >= skip_items_deeper_than:
                continue
            skip_items_deeper_than = -1
        match = KEY_LINE.match(line)
        if not match or line.lstrip().startswith("#"):
            out.append(line)
            continue
        depth = len(match["indent"]) // 2
        path = [*path[:depth], match["key"]]
        value = values.get(tuple(path))
        if value is None:
            out.append(line)
        elif isinstance(value, list):
            out.append(f"{match['indent']}{match['key']}:")
            out.extend(f"{match['indent']}  - {json.dumps(item)}" for item in value)
            skip_items_deeper_than = len(match["indent"])
        else:
            out.append(f"{match['indent']}{match['key']}: {json.dumps(value)}")
    return "\n".join(out) + "\n"


def set_path(document: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def pin(values_file: Path, values: dict[tuple[str, ...], Any]) -> None:
    """Rewrite ``values_file``; fails, writing nothing, unless the result parses to the old values with
    exactly ``values`` changed."""
    text = values_file.read_text()
    expected = copy.deepcopy(yaml.safe_load(text))
    for path, value in values.items():
        set_path(expected, path, value)
    new = pinned_text(text, values)
    if yaml.safe_load(new) != expected:
        raise ValueError(f"{values_file}: pinning did not give the expected values (a value's line moved?)")
    values_file.write_text(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("values", type=Path)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--operator-digest", required=True)
    parser.add_argument("--trainer-digest", required=True)
    args = parser.parse_args(argv)
    try:
        pin(args.values, wanted(args.registry, args.version, args.operator_digest, args.trainer_digest))
    except ValueError as error:
        print(f"pin_chart: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
