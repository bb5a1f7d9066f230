"""Fixtures of the delivery tests shared across their files (the images, built once per session)."""

from __future__ import annotations

import fcntl
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import containers

REPO = Path(__file__).resolve().parents[2]
IMAGES = containers.IMAGES


@pytest.fixture(scope="session")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both images built from this checkout (warm: only the code layers), by their local tags.

    Built under a lock shared by the test lanes: the first builds, the other then finds every layer cached.
    """
    containers.podman()  # a clear error when no engine is installed
    lock = tmp_path_factory.getbasetemp().parent / "rljob-images.lock"
    start = time.monotonic()
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        subprocess.run([str(REPO / "tools" / "images" / "build.sh"), *IMAGES], check=True, timeout=3600)
    print(f"images built in {time.monotonic() - start:.0f} s")
    return {image: f"localhost/rljob-{image}:dev" for image in IMAGES}
