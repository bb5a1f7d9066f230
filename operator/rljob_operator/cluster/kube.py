"""A thin, synchronous Kubernetes REST layer speaking plain JSON dicts.

The typed client deserialises every object into generated classes (slow, and lossy for
custom resources); the operator's builders and observers work on the JSON the API server
speaks, so this module sends and returns exactly that. Every call counts its failures in
the operator's metrics. ``create_or_adopt`` is the one idempotent create the reconciler uses.

``RLJOB_FAULT_CRASH_AFTER_WRITES=N`` makes the process exit abruptly right after its N-th
successful write (tests use it to interrupt a reconcile at every possible point).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from rljob_contract.job import GROUP, PLURAL, VERSION

from rljob_operator import metrics
from rljob_operator.decisions.refusals import namespace_terminating
from rljob_operator.names import ANNOTATION_CREATED_FOR, LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("rljob.kube")
FAULT_ENV = "RLJOB_FAULT_CRASH_AFTER_WRITES"
FIELD_MANAGER = "rljob-operator"
#: Objects per page of a list across the cluster (client-go's reflector asks for 500; a pod decodes to ~39 KiB,
#: so a page of 100 is a few MiB).
LIST_PAGE = 100


#: 19 digits in a row: perhaps an integer beyond 64 bits, which orjson decodes as a float, losing digits.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def loads(data: bytes | str) -> Any:
    """JSON decoded as the standard library decodes it, by orjson where it can (two to three times faster).

    The operator decodes every watch event (a pod's JSON is kilobytes) and every answer; orjson gives the
    same objects, but not for an integer beyond 64 bits: it refuses some and decodes others as a float,
    silently losing digits (orjson 3.13: 18446744073709551616 → 1.8446744073709552e19). A document with 19
    digits in a row (such an integer, or only a long digit string: then the slow way costs a little time,
    nothing else) and one orjson refuses are decoded by the standard library.
    """
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_DIGITS.search(raw):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


class ChildConflict(Exception):
    """An object with a child's name exists and belongs to something else."""


#: Collection names of the children ``create_or_adopt`` makes.
_CHILD_PLURALS = {"ConfigMap": "configmaps", "Service": "services", "NetworkPolicy": "networkpolicies",
                  "EndpointSlice": "endpointslices"}


def adoptable(existing: dict[str, Any], owner_uid: str) -> str:
    """Why an uncontrolled ``existing`` object may not be adopted by job ``owner_uid`` ("" when it may).

    Only what the operator created for this job carries both its managed-by label and the
    annotation with this job's uid. The job's labels alone prove nothing: anyone who may create a
    ConfigMap can copy them, even before the job exists, and have the operator mount their config;
    the uid exists only once the job does, and a leftover of an earlier job of the same name has
    another one.
    """
    meta = existing.get("metadata") or {}
    if (meta.get("labels") or {}).get(LABEL_MANAGED_BY) != MANAGED_BY:
        return f"lacks the label {LABEL_MANAGED_BY}={MANAGED_BY}"
    marker = (meta.get("annotations") or {}).get(ANNOTATION_CREATED_FOR)
    if marker != owner_uid:
        return (f"was not created by the operator for this job (annotation {ANNOTATION_CREATED_FOR} is "
                f"{marker!r}, the job's uid is {owner_uid!r})")
    return ""


def _replacing(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns object ``current`` into exactly ``desired``."""
    out: dict[str, Any] = {k: None for k in current if k not in desired}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if old != value:
                out[key] = _replacing(old, value)
        elif old != value:
            out[key] = value
    return out


class NotLeader(Exception):
    """A write refused before it was sent: this replica may no longer act as the leader."""


def load_api_client(kubeconfig: str | None = None, connections: int = 64) -> k8s.ApiClient:
    """An ApiClient from ``kubeconfig``, else in-cluster credentials, else the default kubeconfig,
    keeping up to ``connections`` connections open."""
    configuration = k8s.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    # Reconcile workers, their concurrent pod creations and the status API share the client: a pool
    # smaller than that discards connections and pays a TLS handshake per request under load.
    configuration.connection_pool_maxsize = connections
    return k8s.ApiClient(configuration)


_RESOURCES = ["pods", "configmaps", "services", "networkpolicies", "endpointslices", "events", "leases", "secrets",
              PLURAL, "rlexperiments", "tokenreviews", "subjectaccessreviews", "selfsubjectaccessreviews"]


def count_resources(*plurals: str) -> None:
    """Label requests to these resources by name in the request metrics (an admission gate's own,
    ``integrations/registry.py``); any other resource counts as ``other``."""
    _RESOURCES.extend(p for p in plurals if p not in _RESOURCES)


def _resource_of(path: str) -> str:
    parts = path.split("/")
    return next((r for r in _RESOURCES if r in parts), "other")


class Kube:
    """JSON-in, JSON-out access to the API server through one ``ApiClient``."""

    def __init__(self, api_client: k8s.ApiClient, timeout: float = 30.0) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self.write_guard: Callable[[], str | None] | None = None
        """Asked right before every write is sent; a reason string refuses it (``NotLeader``)."""
        self._writes = [0]  # a list: copies (``guarded``, the elector's) count into the same total
        self._crash_after = int(os.environ.get(FAULT_ENV, "0") or 0)
        self._lock = threading.Lock()

    def guarded(self, write_guard: Callable[[], str | None]) -> Kube:
        """This client (same connection pool) refusing every write while ``write_guard`` gives a reason.

        The reconciler's writes go through one: a replica whose Lease is not fresh sends none, even
        from a reconcile thread that was already past its checks when the process froze.
        """
        guarded = copy.copy(self)
        guarded.write_guard = write_guard
        return guarded

    # ---------------------------------------------------------------- transport
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        count_write: bool = True,
        metered: bool = True,
        answer: bool = True,
    ) -> Any:
        """Send one request; the answer's JSON (None when empty), or ``ApiException``.

        ``metered``: counted in the request metrics (the reconciler's and the status API's requests;
        the watches' listings are not). ``answer=False``: the answer is not decoded (None), for writes whose
        answer nobody reads (a pod's JSON is kilobytes).
        """
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        if method != "GET" and self.write_guard is not None:
            # Checked last, after serialising: the narrowest gap before the request leaves.
            reason = self.write_guard()
            if reason is not None:
                raise NotLeader(f"{method} {path} not sent: {reason}")
        if metered:
            metrics.API_REQUESTS.labels(verb=method, resource=_resource_of(path)).inc()
        try:
            response = self.api_client.call_api(*request, _request_timeout=self.timeout)
            response.read()
        except Exception:
            if metered:
                metrics.API_ERRORS.labels(verb=method, resource=_resource_of(path), code="connection").inc()
            raise
        if not 200 <= response.status <= 299:
            body = (response.data or b"").decode(errors="replace")
            if metered and response.status not in (404, 409):  # normal answers to get and create-or-adopt
                # Creating in a namespace being deleted is refused with 403: not a permission problem.
                code = "NamespaceTerminating" if namespace_terminating(response.status, body) else str(response.status)
                metrics.API_ERRORS.labels(verb=method, resource=_resource_of(path), code=code).inc()
            raise ApiException.from_response(http_resp=response, body=body, data=None)
        if method != "GET" and count_write:
            self._after_write()
        return loads(response.data) if response.data and answer else None

    def open(self, path: str, query: dict[str, Any], timeout: tuple[float, float]) -> Any:
        """GET ``path`` and return the response unread, for a watch to stream (urllib3's response);
        ``ApiException`` for an answer that is not a success. ``timeout``: (connect, between two reads).
        Not counted in the request metrics, as the watches' listings are not."""
        request = self.api_client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=[(k, v) for k, v in query.items() if v is not None],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=(response.data or b"").decode(errors="replace"),
                                              data=None)
        return response.response

    def _after_write(self) -> None:
        if not self._crash_after:
            return
        with self._lock:
            self._writes[0] += 1
            if self._writes[0] >= self._crash_after:
                log.warning("fault injection: exiting after write %d", self._writes[0])
                os._exit(137)

    # ------------------------------------------------------------------- paths
    # Names are escaped whole (safe=""): a "/" in one is never a path separator, so a name cannot
    # climb to another object (quote's default keeps "/", which let "../" through).
    @staticmethod
    def core_path(namespace: str, plural: str, name: str | None = None) -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/{plural}"
        return f"{path}/{quote(name, safe='')}" if name else path

    @staticmethod
    def job_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}"
        if name:
            path += f"/{quote(name, safe='')}"
        if subresource:
            path += f"/{subresource}"
        return path

    # ------------------------------------------------------------------- jobs
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.job_path(namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any],
                         resource_version: str | None = None) -> dict[str, Any]:
        """Merge-patch the job's status; with ``resource_version``, only if the job is still at it (else 409)."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.request(
            "PATCH", self.job_path(namespace, name, "status"), body,
            content_type="application/merge-patch+json",
        )

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
        try:
            self.request("DELETE", self.job_path(namespace, name), body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # ------------------------------------------------------------------- pods
    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.core_path(namespace, "pods", name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        out = self.request("GET", self.core_path(namespace, "pods"), query={"labelSelector": label_selector})
        return list(out.get("items") or [])

    def may(self, verb: str, resource: str, group: str = "") -> bool:
        """May this client's identity ``verb`` ``resource`` cluster-wide? (a SelfSubjectAccessReview)"""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group}}}
        answer = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review,
                              count_write=False)
        return bool((answer.get("status") or {}).get("allowed"))

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/api/v1/nodes").get("items") or [])

    def list_bound_pods(self, page: int = LIST_PAGE) -> Iterator[dict[str, Any]]:
        """Every pod bound to a node and not finished, in all namespaces (what holds node capacity), read ``page``
        pods at a time (``limit`` and ``continue``, as client-go's reflector reads).

        A generator: the caller keeps what it needs of each pod (``scaling.PodUsage``, a few hundred bytes) before
        the next page is read, so what this costs in memory is one page, not the cluster's pods (about 39 KiB
        each decoded: a whole listing of a large cluster once a second took hundreds of MiB, issue #43 point 4).
        """
        query: dict[str, Any] = {"fieldSelector": "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
                                 "limit": page}
        while True:
            answer = self.request("GET", "/api/v1/pods", query=query)
            items, token = answer.get("items") or [], (answer.get("metadata") or {}).get("continue")
            del answer
            items.reverse()
            while items:  # each pod dropped here once the caller took what it needs of it
                yield items.pop()
            if not token:
                return
            query["continue"] = token

    def delete_pod(self, namespace: str, name: str, uid: str | None = None, force: bool = False) -> None:
        """Delete a pod (by uid when given, so a newer pod with the same name survives).

        ``force``: grace period 0, for a pod whose kubelet will never confirm its end.
        """
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if force:
            body["gracePeriodSeconds"] = 0
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", self.core_path(namespace, "pods", name), body, answer=False)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # ------------------------------------------------------------- children
    @classmethod
    def child_path(cls, obj: dict[str, Any], name: str | None = None) -> str:
        """The collection (or, with ``name``, the object) path of a child: a core or a grouped API."""
        namespace, plural = obj["metadata"]["namespace"], _CHILD_PLURALS[obj["kind"]]
        if obj["apiVersion"] == "v1":
            return cls.core_path(namespace, plural, name)
        path = f"/apis/{obj['apiVersion']}/namespaces/{quote(namespace)}/{plural}"
        return f"{path}/{quote(name)}" if name else path

    def create_or_adopt(self, obj: dict[str, Any], owner_uid: str, compare_data: bool = False,
                        compare_spec: bool = False, look_first: bool = False,
                        compare_fields: tuple[str, ...] = ()) -> dict[str, Any]:
        """Create ``obj``; if its name is taken, keep or adopt the existing one, or raise ``ChildConflict``.

        Kept: controlled by ``owner_uid``. Adopted (ownerReference added): no controller, and the
        operator's marker for this very job (``adoptable``). Anything else: ``ChildConflict``.
        A kept or adopted object is brought up to date: its ``data`` with ``compare_data``, its
        ``spec`` (replaced exactly) with ``compare_spec``, the top-level ``compare_fields`` (replaced whole).
        ``look_first``: GET before the POST (one request instead of a refused POST and a GET, where
        the object most likely exists already: a gang restarted).
        """
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        existing = self.get_child(obj) if look_first else None
        if existing is None:
            try:
                return self.request("POST", self.child_path(obj), obj, query={"fieldManager": FIELD_MANAGER})
            except ApiException as e:
                if e.status != 409:
                    raise
            existing = self.request("GET", self.child_path(obj, name))
        refs = existing["metadata"].get("ownerReferences") or []
        controller = next((r for r in refs if r.get("controller")), None)
        patch: dict[str, Any] = {}
        if controller is None:
            problem = adoptable(existing, owner_uid)
            if problem:
                raise ChildConflict(f"{obj['kind']} {namespace}/{name} exists and {problem}: the operator adopts "
                                    f"only what it created for this job; delete or rename that {obj['kind']}")
            patch["metadata"] = {"ownerReferences": refs + meta["ownerReferences"]}
            log.info("adopting %s %s/%s", obj["kind"], namespace, name)
        elif controller.get("uid") != owner_uid:  # (controlled by this job: kept, marker or not; an
            # ownerReference to the uid is as impossible before the job exists as the marker is,
            # and children made before the marker existed have only the reference)
            raise ChildConflict(
                f"{obj['kind']} {namespace}/{name} exists and belongs to "
                f"{controller.get('kind')}/{controller.get('name')}"
            )
        if compare_data and existing.get("data") != obj.get("data"):
            patch["data"] = {k: obj.get("data", {}).get(k) for k in set(existing.get("data") or {}) | set(obj["data"])}
        if compare_spec and existing.get("spec") != obj["spec"]:
            patch["spec"] = _replacing(existing.get("spec") or {}, obj["spec"])
        patch.update({k: obj.get(k) for k in compare_fields if existing.get(k) != obj.get(k)})
        if not patch:
            return existing
        return self.request(
            "PATCH", self.child_path(obj, name), patch, content_type="application/merge-patch+json"
        )

    def recreate_child(self, obj: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any]:
        """Delete ``existing`` (by uid: only that object) and create ``obj`` in its place; what the API server
        created. For a field that cannot be taken back by a patch without leaving something behind."""
        meta = existing["metadata"]
        body = {"propagationPolicy": "Background", "preconditions": {"uid": meta["uid"]}}
        try:
            self.request("DELETE", self.child_path(obj, meta["name"]), body)
        except ApiException as e:
            if e.status not in (404, 409):  # gone already, or replaced by someone else: the create says which
                raise
        return self.request("POST", self.child_path(obj), obj, query={"fieldManager": FIELD_MANAGER})  # type: ignore[no-any-return]

    def get_child(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The object named as ``obj`` (same kind, namespace and name); None if there is none."""
        try:
            return self.request("GET", self.child_path(obj, obj["metadata"]["name"]))  # type: ignore[no-any-return]
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_pod(self, pod: dict[str, Any]) -> bool:
        """Create a worker pod; False when its name is taken (the next reconcile looks at it). The pod the API
        server answers with is not decoded: its watch event brings it."""
        try:
            self.request("POST", self.core_path(pod["metadata"]["namespace"], "pods"), pod,
                         query={"fieldManager": FIELD_MANAGER}, answer=False)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    # ------------------------------------------------------------------ events
    def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now: str,
                   component: str = "rljob-operator", instance: str = "", count: int = 1) -> Any:
        """Create an Event on ``job``; the Event the API server created (its name generated)."""
        meta = job["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": job.get("apiVersion"),
                "kind": job.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": f"rljob.dev/{component}",
            "reportingInstance": instance or component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": count,
        }
        return self.request("POST", self.core_path(meta["namespace"], "events"), event)

    def patch_event(self, namespace: str, name: str, count: int, message: str, now: str) -> Any:
        """A repeat of Event ``namespace/name``: its count, message and lastTimestamp (what a kubelet patches)."""
        return self.request("PATCH", self.core_path(namespace, "events", name),
                            {"count": count, "message": message[:1024], "lastTimestamp": now},
                            content_type="application/merge-patch+json")
