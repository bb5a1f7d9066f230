#!/usr/bin/env python3
"""Write the reference checks of the admission policy into the chart and the kustomize base.

    python charts/rljob/hack/gen_admission.py           # write both
    python charts/rljob/hack/gen_admission.py --check   # exit 1 on drift

The checks come from the one table of reference fields (``contract/rljob_contract/references.py``,
rendered as CEL by ``rljob_operator.admission``); this script replaces the lines between the
``BEGIN generated`` and ``END generated`` comments of ``charts/rljob/templates/admission-policies.yaml``
and ``manifests/base/admission-policies.yaml`` (the job policy's, then the RLTrainingRuntime policy's,
whose markers end in ``(RUNTIME_REFERENCES)``) and leaves the rest of each file as written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rljob_operator.admission import (
    BEGIN,
    END,
    RUNTIME_BEGIN,
    RUNTIME_END,
    runtime_validations_yaml,
    validations_yaml,
)

REPO = Path(__file__).resolve().parents[3]
FILES = (REPO / "charts/rljob/templates/admission-policies.yaml", REPO / "manifests/base/admission-policies.yaml")


#: Each generated region: its first and last lines, and what goes between (those lines included).
REGIONS = ((BEGIN, END, validations_yaml), (RUNTIME_BEGIN, RUNTIME_END, runtime_validations_yaml))


def rendered(text: str, path: Path) -> str:
    """``text`` with each generated region replaced by the table's checks."""
    for begin, end, generate in REGIONS:
        lines = text.splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == begin]
        ends = [i for i, line in enumerate(lines) if line.rstrip("\n") == end]
        if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
            raise SystemExit(f"{path}: expected one {begin.strip()!r} line before one {end.strip()!r} line")
        text = "".join(lines[: starts[0]]) + generate() + "".join(lines[ends[0] + 1:])
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from what would be written")
    args = parser.parse_args(argv)
    drifted = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        new = rendered(text, path)
        if new != text:
            drifted.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and drifted:
        names = ", ".join(str(p.relative_to(REPO)) for p in drifted)
        print(f"{names}: drifted from contract/rljob_contract/references.py: run 'make generate'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
