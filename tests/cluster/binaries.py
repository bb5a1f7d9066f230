"""Where the pinned etcd, Kubernetes, kwok, helm and promtool binaries live.

``tools/build-binaries.sh`` owns the versions (the go.mod files under tools/) and
the cache layout; this module only asks it for the directory, building what is
missing. ``RLJOB_BIN_DIR`` points at a ready directory instead (a CI cache, say).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-binaries.sh"

CONTROL_PLANE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)


class BinariesUnavailable(RuntimeError):
    """The pinned binaries are neither cached nor buildable here."""


def bin_dir(*, build: bool = True) -> Path:
    """Directory holding the pinned binaries; builds them first if ``build`` (slow when cold)."""
    override = os.environ.get("RLJOB_BIN_DIR")
    if override:
        directory = Path(override)
    else:
        command = [str(BUILD_SCRIPT)] + ([] if build else ["--check"])
        # stderr passes through: a cold build reports its progress there.
        result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise BinariesUnavailable(
                f"{BUILD_SCRIPT}{'' if build else ' --check'} failed (exit {result.returncode}); "
                "its output is above. `make binaries` builds them."
            )
        directory = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in CONTROL_PLANE_BINARIES if not (directory / name).exists()]
    if missing:
        raise BinariesUnavailable(f"{directory} lacks {', '.join(missing)}")
    return directory
