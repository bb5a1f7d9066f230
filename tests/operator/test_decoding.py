"""The operator's JSON decoding (``kube.loads``): orjson where it decodes as the standard library does,
the standard library where orjson refuses; and kopf's watch streams decoded the same way."""

from __future__ import annotations

import inspect
import json

import pytest
from rljob_operator.cluster.kube import loads
from rljob_operator.decisions.children import desired_worker_pod

from tests.operator.test_operator_unit import ENDPOINT, make_job


def test_loads_decodes_what_the_standard_library_decodes_to_the_same_objects() -> None:
    pod = desired_worker_pod(make_job(), 0, 0, ENDPOINT)
    pod["metadata"]["managedFields"] = [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}]
    text = json.dumps(pod)
    assert loads(text) == json.loads(text) == loads(text.encode())
    huge = '{"spec": {"podTemplate": {"x": 123456789012345678901234567890, "y": -1e400}}}'
    assert loads(huge) == json.loads(huge)  # beyond 64 bits: orjson refuses, the standard library decodes
    assert loads('"\\u00e9t\\u00e9"') == "été"
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"truncated": ')


def test_kopf_decodes_its_watch_streams_with_loads_once_the_pod_watch_starts() -> None:
    """``streams.decode_watches_fast`` swaps the ``json`` that kopf's ``api.stream`` decodes lines with:
    this fails the day the locked kopf decodes them otherwise (the swap would then do nothing)."""
    from kopf._cogs.clients import api as kopf_api
    from rljob_operator.cluster.streams import decode_watches_fast

    assert "json.loads(line" in inspect.getsource(kopf_api.stream)
    original = kopf_api.json
    try:
        decode_watches_fast()
        decode_watches_fast()  # idempotent
        assert kopf_api.json.loads is loads
        assert kopf_api.json.dumps is json.dumps  # the rest of the module is the standard library's
    finally:
        kopf_api.json = original
