#!/usr/bin/env python3
"""Write the README's table of operator settings from ``operator/rljob_operator/settings.py``.

    python operator/hack/gen_settings.py           # write it (make settings-table)
    python operator/hack/gen_settings.py --check   # exit 1 on drift

Each row is one :func:`rljob_operator.settings.setting`: its variable, ``rljob operator`` flag, chart
value, default and description (rendered by ``rljob_operator.settings_table``). The script replaces the
lines between the ``BEGIN generated`` and ``END generated`` comments of README.md and leaves the rest
as written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rljob_operator.settings_table import rendered

README = Path(__file__).resolve().parents[2] / "README.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the README differs from what would be written")
    parser.add_argument("--readme", type=Path, default=README, help="the README to write or check")
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    try:
        new = rendered(text, str(args.readme))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        print(f"{args.readme}: the settings table drifted from operator/rljob_operator/settings.py: "
              "run 'make generate'", file=sys.stderr)
        return 1
    args.readme.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
