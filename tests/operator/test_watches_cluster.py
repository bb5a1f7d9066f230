"""The operator's streams (``cluster/streams.py``) against the real API server: listed, then watched; a
stream away for a while resumes where it was; one away so long that the API server no longer holds its
resourceVersion (410 Gone) lists afresh and hands on as DELETED what vanished meanwhile; a stream that
cannot go on ends, and stops the operator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rljob_contract.job import GROUP, VERSION
from rljob_operator.cluster import runner
from rljob_operator.cluster.streams import Resource, Stream
from rljob_operator.names import StatusEndpoint
from rljob_operator.settings import OperatorSettings

from tests.cluster.components import UNCACHED_RESOURCE

pytestmark = pytest.mark.cluster

LABEL = "rljob.dev/stream-test"
#: Followed by the test streams: kube-apiserver keeps no watch cache of them (``UNCACHED_RESOURCE``), so a
#: compaction of etcd's history expires a stream's resourceVersion at once, as a long absence would.
TEMPLATES = Resource("", "v1", UNCACHED_RESOURCE, label_selector=LABEL)


class Recorder:
    """A subscriber writing down what it is handed: (type or LISTED, name, uid)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str, str | None]] = []

    def event(self, scope: str | None, type: str | None, body: Any) -> None:
        self.seen.append((type, body["metadata"]["name"], body["metadata"].get("uid")))

    def listed(self, scope: str | None) -> None:
        self.seen.append(("LISTED", scope or "", None))

    def listings(self) -> int:
        return sum(1 for type, _, _ in self.seen if type == "LISTED")


async def until(predicate: Callable[[], Any], what: Any, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        await asyncio.sleep(0.05)


def test_a_stream_resumes_and_after_410_lists_afresh_handing_on_as_deleted_what_vanished(
        kube: Any, namespace: str, control_plane: Any) -> None:
    path = kube.core_path(namespace, UNCACHED_RESOURCE)

    def create(name: str, labelled: bool = True) -> str:
        template = {"metadata": {"name": name, "labels": {LABEL: "yes"} if labelled else {}},
                    "template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/x"}]}}}
        return str(kube.request("POST", path, template)["metadata"]["uid"])

    def delete(name: str) -> None:
        kube.request("DELETE", kube.core_path(namespace, UNCACHED_RESOURCE, name))

    async def scenario() -> Recorder:
        uids = {name: await asyncio.to_thread(create, name) for name in ("a", "b")}
        await asyncio.to_thread(create, "unlabelled", False)  # the API server never sends it
        recorder = Recorder()
        stream = Stream(kube, TEMPLATES, recorder, [namespace])
        follower = stream.followers[0]

        async def away() -> None:
            await stream.stop()
            await asyncio.to_thread(follower.thread.join, 20)  # type: ignore[union-attr]
            assert not follower.thread.is_alive()  # type: ignore[union-attr]

        stream.start()
        try:
            await until(lambda: recorder.listings() == 1, "the first listing")
            assert recorder.seen == [(None, "a", uids["a"]), (None, "b", uids["b"]), ("LISTED", namespace, None)]
            uids["d"] = await asyncio.to_thread(create, "d")
            await until(lambda: ("ADDED", "d", uids["d"]) in recorder.seen, "d added")

            # Away for a moment: the watch resumes at its resourceVersion and the API server replays.
            await away()
            await asyncio.to_thread(delete, "b")
            stream.start()
            await until(lambda: ("DELETED", "b", uids["b"]) in recorder.seen, "b's deletion replayed")
            assert recorder.listings() == 1

            # Away so long that the history it would resume from is compacted: 410 Gone, a listing afresh.
            # Meanwhile d was deleted and "a" replaced by a namesake; e is new.
            await away()
            resumes_from = follower.resource_version
            await asyncio.to_thread(delete, "a")
            uids["a2"] = await asyncio.to_thread(create, "a")
            await asyncio.to_thread(delete, "d")
            uids["e"] = await asyncio.to_thread(create, "e")
            await asyncio.to_thread(control_plane.compact_etcd)
            mark = len(recorder.seen)
            stream.start()
            await until(lambda: recorder.listings() == 2, lambda: f"the listing after 410 Gone: {recorder.seen}")
            assert recorder.seen[mark:] == [("DELETED", "a", uids["a"]), (None, "a", uids["a2"]), (None, "e", uids["e"]),
                                            ("DELETED", "d", uids["d"]), ("LISTED", namespace, None)]
            assert not stream.failed.is_set() and follower.resource_version != resumes_from
            return recorder
        finally:
            await stream.stop()

    recorder = asyncio.run(scenario())
    assert "unlabelled" not in {name for _, name, _ in recorder.seen}


def test_a_stream_of_a_resource_not_served_ends_unless_optional(kube: Any, namespace: str) -> None:
    async def scenario() -> tuple[Stream, Stream]:
        required = Stream(kube, Resource("rljob.invalid", "v1", "things"), Recorder(), [namespace])
        optional = Stream(kube, Resource("rljob.invalid", "v1", "things", optional=True), Recorder(), [namespace])
        for stream in (required, optional):
            stream.start()
        try:
            await asyncio.wait_for(required.failed.wait(), 20)
            await asyncio.sleep(1)
            return required, optional
        finally:
            for stream in (required, optional):
                await stream.stop()

    required, optional = asyncio.run(scenario())
    assert isinstance(required.failure, ApiException) and required.failure.status == 404
    assert not optional.failed.is_set() and optional.followers[0].not_served  # looks again later


def test_a_stream_that_ends_stops_the_operator_with_status_1(
        kube: Any, api_client: Any, namespace: str, crd_installed: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The leader's loop, in this process against the real API server, with the experiments' stream made
    one that cannot go on (a resource not served, not optional): the operator stops (status 1), saying why."""
    monkeypatch.setattr(runner, "EXPERIMENTS", Resource(GROUP, VERSION, "rlexperimentsnotserved"))
    settings = OperatorSettings(namespaces=[namespace], workers=2, kueue=False, watch_nodes=False,
                                leader_elect=False, network_policy=False)
    endpoint = StatusEndpoint("https://127.0.0.1:1", "")

    async def lead() -> int:
        policies = SimpleNamespace(in_force=True)  # the admission policies: not this test's concern
        return await asyncio.wait_for(runner._lead(settings, api_client, kube, endpoint, None, asyncio.Event(),
                                                   policies), 30)  # type: ignore[arg-type]

    assert asyncio.run(lead()) == 1
    assert "stopping: the watch of rlexperimentsnotserved ended" in caplog.text
