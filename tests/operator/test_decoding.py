"""The operator's JSON decoding (``kube.loads``): orjson where it decodes as the standard library does,
the standard library where orjson refuses; and the watch streams decoded the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rljob_operator.cluster.kube import loads
from rljob_operator.decisions.children import desired_worker_pod

from tests.support.jobs import ENDPOINT, make_job


def test_loads_decodes_what_the_standard_library_decodes_to_the_same_objects() -> None:
    pod = desired_worker_pod(make_job(), 0, 0, ENDPOINT)
    pod["metadata"]["managedFields"] = [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}]
    text = json.dumps(pod)
    assert loads(text) == json.loads(text) == loads(text.encode())
    huge = '{"spec": {"podTemplate": {"x": 123456789012345678901234567890, "y": -1e400}}}'
    assert loads(huge) == json.loads(huge)  # beyond 64 bits: orjson refuses, the standard library decodes
    for number in ("18446744073709551616", "-9223372036854775809", "123456789012345678901234567890"):
        text = f'{{"spec": {{"training": {{"trl": {{"seed": {number}}}}}}}}}'
        assert loads(text)["spec"]["training"]["trl"]["seed"] == int(number)  # orjson alone: a float, digits lost
    assert loads('"\\u00e9t\\u00e9"') == "été"
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"truncated": ')


def test_the_streams_read_the_clients_watch_decoded_by_loads_into_dicts_and_its_errors_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``streams._JsonWatch`` is the kubernetes client's public ``watch.Watch`` with each line decoded by
    ``loads`` into a plain dict (no client model): this fails the day the locked client stops decoding
    through ``unmarshal_event`` or raising an ERROR event (410 Gone: the stream lists again)."""
    import io

    import urllib3
    from kubernetes.client.exceptions import ApiException
    from rljob_operator.cluster import streams

    pod = desired_worker_pod(make_job(), 0, 0, ENDPOINT)
    pod["metadata"]["resourceVersion"] = "6"
    lines = [{"type": "ADDED", "object": pod},
             {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "7"}}},
             {"type": "MODIFIED", "object": {"metadata": {"name": "x", "resourceVersion": "8"},
                                             "spec": {"n": 1}}},
             {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                          "message": "too old resource version: 1 (9)"}}]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    asked: list[dict[str, Any]] = []

    def request(**kwargs: Any) -> urllib3.HTTPResponse:
        asked.append(kwargs)
        return urllib3.HTTPResponse(body=io.BytesIO(body), preload_content=False, status=200)

    decoded: list[Any] = []
    monkeypatch.setattr(streams, "loads", lambda data: decoded.append(data) or loads(data))
    seen: list[dict[str, Any]] = []
    with pytest.raises(ApiException) as error:
        for event in streams._JsonWatch(return_type="object").stream(
                request, resource_version="5", timeout_seconds=300, allow_watch_bookmarks=True):
            seen.append(event)
    assert error.value.status == 410 and len(decoded) == 4
    assert asked == [{"watch": True, "_preload_content": False, "resource_version": "5", "timeout_seconds": 300,
                      "allow_watch_bookmarks": True}]  # one request: the stream resumes or relists itself
    assert [e["type"] for e in seen] == ["ADDED", "BOOKMARK", "MODIFIED"]
    assert seen[0]["object"] == pod and type(seen[0]["object"]) is dict
