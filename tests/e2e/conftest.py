"""Fixtures the real-node tests share: the control plane with its real node, an S3 bucket its pods reach, and
the images of ``make images`` pushed to the session's registry, which the real node's containerd pulls by
digest (nothing is side-loaded)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import registry
from tests.support.s3_server import MotoServer


@pytest.fixture
def real_node(control_plane: Any) -> Any:
    """The session's control plane, which ``-m realnode`` starts with the real node (tests/cluster/fixtures.py)."""
    assert control_plane.real_node is not None, "run with -m realnode (make e2e): the control plane has no real node"
    return control_plane


@pytest.fixture
def bucket(real_node: Any, tmp_path: Any) -> Iterator[tuple[MotoServer, str]]:
    """The S3 test server on the pods' gateway address, and a fresh bucket on it."""
    server = MotoServer(host=real_node.real_node.gateway, log=tmp_path / "s3.log").start()
    try:
        yield server, server.create_bucket()
    finally:
        server.stop()


#: The images ``make images`` built, which ``dev_images`` pushes.
DEV_IMAGES = {"trainer": "localhost/rljob-trainer:dev", "operator": "localhost/rljob-operator:dev"}


def push(local: str, remote: str) -> str:
    """``podman push`` over plain HTTP (the session's registry); the pushed manifest's digest."""
    with tempfile.TemporaryDirectory() as folder:
        digest_file = Path(folder) / "digest"
        subprocess.run(["podman", "push", "--quiet", "--tls-verify=false", "--compression-format", "zstd",
                        "--digestfile", str(digest_file), local, remote], check=True, capture_output=True, timeout=1200)
        return digest_file.read_text().strip()


@pytest.fixture(scope="session")
def dev_images(control_plane: Any) -> dict[str, str]:
    """Both images of ``make images`` in the session's registry: image -> ``<registry>/rljob/<image>@<digest>``.
    An unchanged layer is never pushed twice (the registry's storage is the machine's)."""
    assert control_plane.registry_address, "run with -m realnode (make e2e): the control plane has no registry"
    pushed = {}
    for image, local in DEV_IMAGES.items():
        repository = f"{control_plane.registry_address}/{registry.NAMESPACE}/{image}"
        pushed[image] = f"{repository}@{push(local, f'{repository}:dev')}"
    return pushed


def image_values(trainer: str, operator: str | None = None) -> list[str]:
    """The chart's values naming pushed images by digest (``<repository>@<digest>``): the runtimes' trainer, which
    the pod profile then allows, and the operator's when given."""
    repository, digest = trainer.split("@")
    values = ["--set", f"runtimes.image.repository={repository}", "--set", f"runtimes.image.digest={digest}",
              "--set", f"podProfile.allowedImages={{{repository}@*}}"]
    if operator:
        repository, digest = operator.split("@")
        values += ["--set", f"image.repository={repository}", "--set", f"image.digest={digest}"]
    return values


@pytest.fixture
def trainer_image(dev_images: dict[str, str]) -> str:
    """The trainer of ``make images`` in the session's registry, by digest."""
    return dev_images["trainer"]
