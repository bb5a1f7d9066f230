"""Fixtures the real-node test files share: the control plane with its real node, and an S3 bucket its pods reach."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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
