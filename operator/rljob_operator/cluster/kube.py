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
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from rljob_operator import metrics
from rljob_operator.api import GROUP, PLURAL, VERSION
from rljob_operator.decisions.refusals import namespace_terminating

log = logging.getLogger("rljob.kube")
FAULT_ENV = "RLJOB_FAULT_CRASH_AFTER_WRITES"
FIELD_MANAGER = "rljob-operator"


class ChildConflict(Exception):
    """An object with a child's name exists and belongs to something else."""


class NotLeader(Exception):
    """A write refused before it was sent: this replica may no longer act as the leader."""


def load_api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    """An ApiClient from ``kubeconfig``, else in-cluster credentials, else the default kubeconfig."""
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
    configuration.connection_pool_maxsize = 64
    return k8s.ApiClient(configuration)


_RESOURCES = ("pods", "configmaps", "services", "events", "leases", "secrets", PLURAL,
              "tokenreviews", "subjectaccessreviews")


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
    ) -> Any:
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
        metrics.API_REQUESTS.labels(verb=method, resource=_resource_of(path)).inc()
        try:
            response = self.api_client.call_api(*request, _request_timeout=self.timeout)
            response.read()
        except Exception:
            metrics.API_ERRORS.labels(verb=method, resource=_resource_of(path), code="connection").inc()
            raise
        if not 200 <= response.status <= 299:
            body = (response.data or b"").decode(errors="replace")
            if response.status not in (404, 409):  # normal answers to get and create-or-adopt
                # Creating in a namespace being deleted is refused with 403: not a permission problem.
                code = "NamespaceTerminating" if namespace_terminating(response.status, body) else str(response.status)
                metrics.API_ERRORS.labels(verb=method, resource=_resource_of(path), code=code).inc()
            raise ApiException.from_response(http_resp=response, body=body, data=None)
        if method != "GET" and count_write:
            self._after_write()
        return json.loads(response.data) if response.data else None

    def _after_write(self) -> None:
        if not self._crash_after:
            return
        with self._lock:
            self._writes[0] += 1
            if self._writes[0] >= self._crash_after:
                log.warning("fault injection: exiting after write %d", self._writes[0])
                os._exit(137)

    # ------------------------------------------------------------------- paths
    @staticmethod
    def core_path(namespace: str, plural: str, name: str | None = None) -> str:
        path = f"/api/v1/namespaces/{quote(namespace)}/{plural}"
        return f"{path}/{quote(name)}" if name else path

    @staticmethod
    def job_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}"
        if name:
            path += f"/{quote(name)}"
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

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.request(
            "PATCH", self.job_path(namespace, name, "status"), {"status": status},
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
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        out = self.request("GET", self.core_path(namespace, "pods"), query={"labelSelector": label_selector})
        return list(out.get("items") or [])

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/api/v1/nodes").get("items") or [])

    def list_bound_pods(self) -> list[dict[str, Any]]:
        """Every pod bound to a node and not finished, in all namespaces (what holds node capacity)."""
        selector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        return list(self.request("GET", "/api/v1/pods", query={"fieldSelector": selector}).get("items") or [])

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
            self.request("DELETE", self.core_path(namespace, "pods", name), body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # ------------------------------------------------------------- children
    def create_or_adopt(self, obj: dict[str, Any], owner_uid: str, compare_data: bool = False) -> dict[str, Any]:
        """Create ``obj``; if its name is taken, adopt or keep the existing one.

        Existing and controlled by ``owner_uid``: kept (ConfigMap data brought up to date when
        ``compare_data``). Existing without a controller but labelled for the same job: adopted
        (ownerReference added). Controlled by anything else: ``ChildConflict``.
        """
        meta = obj["metadata"]
        plural = obj["kind"].lower() + "s"
        namespace, name = meta["namespace"], meta["name"]
        try:
            return self.request(
                "POST", self.core_path(namespace, plural), obj, query={"fieldManager": FIELD_MANAGER}
            )
        except ApiException as e:
            if e.status != 409:
                raise
        existing = self.request("GET", self.core_path(namespace, plural, name))
        refs = existing["metadata"].get("ownerReferences") or []
        controller = next((r for r in refs if r.get("controller")), None)
        patch: dict[str, Any] = {}
        if controller is None:
            from rljob_operator.names import LABEL_JOB

            if (existing["metadata"].get("labels") or {}).get(LABEL_JOB) != meta["labels"].get(LABEL_JOB):
                raise ChildConflict(f"{obj['kind']} {namespace}/{name} exists and is not part of this job")
            patch["metadata"] = {"ownerReferences": refs + meta["ownerReferences"]}
            log.info("adopting %s %s/%s", obj["kind"], namespace, name)
        elif controller.get("uid") != owner_uid:
            raise ChildConflict(
                f"{obj['kind']} {namespace}/{name} exists and belongs to "
                f"{controller.get('kind')}/{controller.get('name')}"
            )
        if compare_data and existing.get("data") != obj.get("data"):
            patch["data"] = {k: obj.get("data", {}).get(k) for k in set(existing.get("data") or {}) | set(obj["data"])}
        if not patch:
            return existing
        return self.request(
            "PATCH", self.core_path(namespace, plural, name), patch, content_type="application/merge-patch+json"
        )

    def create_pod(self, pod: dict[str, Any]) -> bool:
        """Create a worker pod; False when its name is taken (the next reconcile looks at it)."""
        try:
            self.request("POST", self.core_path(pod["metadata"]["namespace"], "pods"), pod,
                         query={"fieldManager": FIELD_MANAGER})
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    # ------------------------------------------------------------------ events
    def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str, now: str,
                   component: str = "rljob-operator", instance: str = "") -> None:
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
            "count": 1,
        }
        self.request("POST", self.core_path(meta["namespace"], "events"), event)
