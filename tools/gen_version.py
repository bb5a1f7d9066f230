#!/usr/bin/env python3
"""Carry pyproject.toml's ``version`` to every file that states rljob's version.

    python tools/gen_version.py           # write them (part of make generate)
    python tools/gen_version.py --check   # exit 1 when one differs, naming the file and the line

One number, bumped in one place (``[project] version``), names the Python package, the chart (its
``version`` and ``appVersion``, so the images' default tags), the images ``make release`` pushes, the CRDs'
``app.kubernetes.io/version`` label (``rljob_contract.version``, which ``rljob crd`` reads) and the kustomize
manifests. Each entry below is a file and a pattern whose one group is the version: a pattern that matches
nowhere is an error too, so moving a line cannot silently take it out of the sweep.
``tests/delivery/test_version.py`` runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (file, pattern): the pattern's group 1 is the version. Every match in the file is rewritten.
PLACES: tuple[tuple[str, str], ...] = (
    ("contract/rljob_contract/version.py", r'^VERSION = "([^"]+)"$'),
    ("charts/rljob/Chart.yaml", r"^version: (\S+)$"),
    ("charts/rljob/Chart.yaml", r'^appVersion: "([^"]+)"$'),
    ("manifests/base/kustomization.yaml", r'app\.kubernetes\.io/version: "([^"]+)"'),
    ("manifests/overlays/cluster-wide/kustomization.yaml", r'app\.kubernetes\.io/version: "([^"]+)"'),
    ("manifests/overlays/single-namespace/kustomization.yaml", r'app\.kubernetes\.io/version: "([^"]+)"'),
    ("manifests/trainer/kustomization.yaml", r'app\.kubernetes\.io/version: "([^"]+)"'),
    ("manifests/base/deployment.yaml", r"image: ghcr\.io/rljob/operator:(\S+)$"),
    ("manifests/base/runtimes.yaml", r"image: ghcr\.io/rljob/trainer:(\S+)$"),
)


def project_version(pyproject: Path | None = None) -> str:
    """``[project] version`` of pyproject.toml: the one place the version is bumped."""
    pyproject = pyproject or REPO / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text())["project"]["version"]
    if not re.fullmatch(r"\d+\.\d+\.\d+(?:[-+.][0-9A-Za-z.+-]+)?", version):
        raise ValueError(f"{pyproject}: [project] version {version!r} is not a version like 1.2.3")
    return str(version)


def rewritten(text: str, pattern: str, version: str) -> tuple[str, int]:
    """``text`` with every match's group 1 replaced by ``version``; and how many matched."""
    def put(match: re.Match[str]) -> str:
        start, end = match.span(1)
        whole = match.group(0)
        offset = match.start(0)
        return whole[: start - offset] + version + whole[end - offset:]

    return re.subn(pattern, put, text, flags=re.MULTILINE)


def drift(version: str, write: bool) -> list[str]:
    """The places that do not state ``version`` (written first when ``write``), as messages."""
    problems = []
    for relative, pattern in PLACES:
        path = REPO / relative
        text = path.read_text()
        new, count = rewritten(text, pattern, version)
        if count == 0:
            problems.append(f"{relative}: no line matches {pattern!r} (update tools/gen_version.py)")
        elif new != text:
            if write:
                path.write_text(new)
            else:
                old = sorted({m.group(1) for m in re.finditer(pattern, text, flags=re.MULTILINE)} - {version})
                problems.append(f"{relative}: states version {', '.join(old)}, pyproject.toml says {version}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on drift instead of writing")
    args = parser.parse_args(argv)
    problems = drift(project_version(), write=not args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems and args.check:
        print("run `make generate` (tools/gen_version.py) after bumping pyproject.toml's version", file=sys.stderr)
    return 1 if problems and (args.check or any("no line matches" in p for p in problems)) else 0


if __name__ == "__main__":
    sys.exit(main())
