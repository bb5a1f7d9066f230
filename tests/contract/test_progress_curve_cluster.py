"""The progress curve at its maxima on a real API server: the status the operator writes is accepted
(the models' side: ``tests/contract/test_progress_curve.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract.test_progress_curve import _hostile_run


@pytest.mark.cluster
def test_the_api_server_accepts_the_curve_at_its_maxima(kube: Any, crd_installed: Any, namespace: str) -> None:
    """No 422: the largest curve a hostile trainer can cause (above) is written to the real API server's
    status subresource as the status API writes it, and read back whole."""
    from tests.support.operator_process import get_job, job_manifest

    kube.request("POST", kube.job_path(namespace), job_manifest("curve", replicas=1))
    curve = _hostile_run()
    kube.request("PATCH", kube.job_path(namespace, "curve", "status"), {"status": {"progress": {"curve": curve}}},
                 content_type="application/merge-patch+json")
    stored = get_job(kube, namespace, "curve")
    assert stored["status"]["progress"]["curve"] == curve
    assert len(json.dumps(stored)) < 1024 * 1024  # and far from the object size limit (1.5 MiB)
