#!/usr/bin/env python3
"""The SBOM of an image's Python packages, CycloneDX 1.5 JSON, from its hash-pinned lock.

    /opt/rljob/venv/bin/python sbom.py --lock trainer.lock --image rljob-trainer --version 0.1.0 > sbom.cdx.json

Run by the Dockerfiles with the image's own venv, right after ``pip install --require-hashes -r <lock>``:
each component is a package of the lock (``tools/images/<image>.lock``, the image's part of requirements.lock)
with its version, purl and the SHA-256 hashes pip checked the download against. The packages the venv really
holds are compared with the lock first, and any difference fails the build: a package installed but not
locked (the venv's own pip is listed, marked as such) or locked but missing. Standard library only: it runs
in the image before anything else is there.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
import uuid
from pathlib import Path

#: Installed by ``python -m venv`` itself, not from the lock.
VENV_OWN = frozenset({"pip", "setuptools"})
REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:(?P<hex>[0-9a-f]{64})")


def normalized(name: str) -> str:
    """PEP 503: the name pip and PyPI compare."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hex digests) of a ``uv pip compile --generate-hashes`` lock."""
    packages: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        requirement = REQUIREMENT.match(line)
        if requirement:
            current = normalized(requirement["name"])
            packages[current] = (requirement["version"], [])
        elif current is not None:
            packages[current][1].extend(m["hex"] for m in HASH.finditer(line))
    return packages


def installed() -> dict[str, str]:
    """name -> version of the distributions this interpreter (the image's venv) sees."""
    return {normalized(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def differences(lock: dict[str, tuple[str, list[str]]], present: dict[str, str]) -> list[str]:
    """What the venv holds that the lock does not say, and the reverse."""
    problems = [f"{name} {version}: installed, not in the lock"
                for name, version in sorted(present.items()) if name not in lock and name not in VENV_OWN]
    for name, (version, _) in sorted(lock.items()):
        if name not in present:
            problems.append(f"{name} {version}: in the lock, not installed")
        elif present[name] != version:
            problems.append(f"{name}: installed {present[name]}, the lock says {version}")
    return problems


def component(name: str, version: str, hashes: list[str]) -> dict[str, object]:
    purl = f"pkg:pypi/{name}@{version}"
    entry: dict[str, object] = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
    if hashes:
        entry["hashes"] = [{"alg": "SHA-256", "content": digest} for digest in hashes]
    else:
        entry["properties"] = [{"name": "rljob:origin", "value": "the venv's own (python -m venv), not the lock"}]
    return entry


def sbom(image: str, version: str, lock_name: str, lock: dict[str, tuple[str, list[str]]],
         present: dict[str, str]) -> dict[str, object]:
    """The CycloneDX document. Its serial number is derived from its content: the same lock and image
    give the same file, so the image layer holding it is reused by a rebuild."""
    components = [component(name, version_, hashes) for name, (version_, hashes) in sorted(lock.items())]
    components += [component(name, present[name], []) for name in sorted(VENV_OWN & set(present) - set(lock))]
    body = {
        "metadata": {
            "component": {"type": "container", "bom-ref": f"{image}@{version}", "name": image, "version": version},
            "tools": {"components": [{"type": "application", "name": "rljob tools/images/sbom.py"}]},
            "properties": [{"name": "rljob:lock", "value": lock_name},
                           {"name": "rljob:hashes", "value": "the SHA-256 digests pip --require-hashes accepted"}],
        },
        "components": components,
    }
    serial = uuid.uuid5(uuid.NAMESPACE_URL, "rljob-sbom:" + json.dumps(body, sort_keys=True))
    return {"bomFormat": "CycloneDX", "specVersion": "1.5", "serialNumber": f"urn:uuid:{serial}", "version": 1,
            **body}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--image", required=True, help="the image's name, e.g. rljob-trainer")
    parser.add_argument("--version", required=True, help="rljob's version")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    lock = read_lock(args.lock.read_text())
    present = installed()
    problems = differences(lock, present)
    if problems:
        print(f"sbom.py: the venv differs from {args.lock}:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    text = json.dumps(sbom(args.image, args.version, args.lock.name, lock, present), indent=1) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
