"""The children of an RLTrainingJob, as plain dicts built from its spec (pure).

A job owns a ConfigMap and a headless Service, both named after the job, the Service's EndpointSlice
``<job>-rendezvous`` (worker 0's address), a NetworkPolicy ``<job>-workers`` (when the platform has them on:
ingress, and egress as ``decisions.egress`` says), and one pod per worker, ``<job>-worker-<i>``. Names are deterministic, so a reconcile that runs twice or
after a crash finds what it made and never makes a second copy; ownerReferences let the
garbage collector delete everything with the job.

Every pod is built from the job on its runtime (``rljob_contract.runtime.resolve``: the image, GPU
resource, sizes, checkpoint storage and the runtime's ``podTemplate``, merged over what the operator
builds); each builder takes the :class:`~rljob_contract.runtime.Resolved` runtime (None: the job on no
runtime, as ``rljob train`` runs it: for tests of other decisions).

The pods follow the trainer's in-pod contract (``rljob_contract.pod``): the command
``python -m rljob_trainer.launch --config /etc/rljob/trainer.yaml``, the ``RLJOB_*``
rendezvous environment (c10d hosted by worker 0, reached through the headless Service),
``restartPolicy: Never`` (the operator restarts whole gangs), GPU requests equal to limits,
the GPU taint tolerated, and a projected, audience-bound service-account token for the
status API's heartbeats.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from rljob_contract import pod as contract
from rljob_contract.job import RestartPolicy, RLTrainingJob
from rljob_contract.runtime import Resolved, resolve
from rljob_contract.spec import reward_module_file

from rljob_operator.decisions.checkpoints import claim_volumes, credential_volumes, mounted_checkpoint
from rljob_operator.decisions.egress import Egress, egress_rules
from rljob_operator.decisions.observed import ObservedPod
from rljob_operator.decisions.runtimes import snapshot_data
from rljob_operator.names import (
    ANNOTATION_CREATED_FOR,
    ANNOTATION_IN_PLACE_RESTARTS,
    ANNOTATION_JOB_GENERATION,
    ANNOTATION_REDIALS,
    ANNOTATION_SPEC_HASH,
    CONFIG_DIR,
    CONFIG_KEY,
    CONTAINER,
    LABEL_GANG_GENERATION,
    LABEL_JOB,
    LABEL_SERVICE_NAME,
    LABEL_SLICE_MANAGED_BY,
    LABEL_WORKER_INDEX,
    MANAGED_BY,
    METRICS_PORT,
    OUTPUT_DIR,
    RDZV_PORT,
    STATUS_CA_KEY,
    TOKEN_DIR,
    TOKEN_EXPIRATION_SECONDS,
    TOKEN_FILE,
    TRAINER_COMMAND,
    StatusEndpoint,
    configmap_name,
    job_labels,
    job_namespace,
    job_uid,
    networkpolicy_name,
    owner_reference,
    rendezvous_endpoint,
    rendezvous_name,
    run_id,
    service_name,
    worker_name,
)


def _metadata(job: RLTrainingJob, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job_namespace(job),
        "labels": {**job_labels(job), "app.kubernetes.io/component": component},
        # The adoption marker (``Kube.create_or_adopt``): only an object made for this job's uid is adopted.
        "annotations": {ANNOTATION_CREATED_FOR: job_uid(job)},
        "ownerReferences": [owner_reference(job)],
    }


def resolved(job: RLTrainingJob, runtime: Resolved | None) -> Resolved:
    """``runtime``, else the job on no runtime (``resolve(job, None)``)."""
    return runtime if runtime is not None else resolve(job, None)


def spec_hash(job: RLTrainingJob) -> str:
    """Fingerprint of everything a running gang was built from (all of spec but runPolicy and sizing).

    The worker count is not in it: a resize is decided by the operator (``status.scaling``) and
    starts a new gang itself, whether ``kubectl scale`` or the Capacity policy asked for it.

    A gang whose pods carry another hash *and* another ``metadata.generation`` was built
    from a spec the user has since edited, and is restarted. (The generation guard keeps an
    operator upgrade that adds defaulted fields from restarting every running gang.)
    """
    spec = job.spec.model_dump(
        by_alias=True, mode="json",
        exclude={"run_policy": True, "autoscaling": True,
                 "workers": {"replicas", "min_replicas", "max_replicas", "termination_grace_period_seconds"}},
    )
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- children


def desired_configmap(job: RLTrainingJob, endpoint: StatusEndpoint | None = None,
                      runtime: Resolved | None = None) -> dict[str, Any]:
    """The trainer config (and the status API's CA) that every worker mounts at /etc/rljob, and the runtime the
    pods are built from (``runtime.json``: the snapshot a gang keeps when its runtime changes, ``decisions.runtimes``).

    After an out-of-memory failure the batch shape OOM recovery chose (``status.oomRecovery``)
    replaces the spec's per-device batch and accumulation. A ``pvc://claim/prefix`` checkpoint
    location becomes the folder the claim is mounted at (``checkpoints.mounted_checkpoint``).
    """
    r = resolved(job, runtime)
    config = job.trainer_config(OUTPUT_DIR, r.checkpoint, list(r.sources) if r.sources is not None else None)
    config = config.model_copy(update={"checkpoint": mounted_checkpoint(config.checkpoint)})
    data = {CONFIG_KEY: contract.dump_config(config), **snapshot_data(r.runtime)}
    if endpoint is not None and endpoint.ca_pem:
        data[STATUS_CA_KEY] = endpoint.ca_pem
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, configmap_name(job.metadata.name), "config"),
        "data": data,
    }


#: The ports of the rendezvous Service and its EndpointSlice.
_PORTS = (("rendezvous", RDZV_PORT), ("metrics", METRICS_PORT))


def desired_service(job: RLTrainingJob) -> dict[str, Any]:
    """Headless Service giving worker 0, which hosts the rendezvous, its DNS name.

    Only worker 0 needs one: the other workers reach worker 0 by that name and are reached by
    the addresses they announce in the rendezvous (their own names resolve from the pod's
    /etc/hosts). No selector: a selector chooses pods by labels, which anyone who may create a
    pod in the namespace can copy (with ``spec.hostname`` set to worker 0's, such a pod would answer
    for worker 0's name beside it). The operator writes the Service's one EndpointSlice itself,
    with the address of the worker 0 it created (``desired_rendezvous``); EndpointSlices are not
    the namespace's users' to write (Kubernetes' aggregated roles have never granted it).
    """
    name = job.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, service_name(name), "rendezvous"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}
                      for port_name, port in _PORTS],
        },
    }


def desired_rendezvous(job: RLTrainingJob, worker0: ObservedPod | None) -> dict[str, Any]:
    """The EndpointSlice of the job's headless Service: ``worker0`` (the operator's own, of the current gang)
    under its hostname, once it has an address; no endpoint otherwise.

    Ready, whatever the pod's readiness: the workers rendezvous long before they are Ready (CoreDNS
    answers only for ready endpoints). Owned by the job, as its other children are.
    """
    name = job.metadata.name
    metadata = _metadata(job, rendezvous_name(name), "rendezvous")
    metadata["labels"].update({LABEL_SERVICE_NAME: service_name(name), LABEL_SLICE_MANAGED_BY: MANAGED_BY})
    endpoints = []
    if worker0 is not None and worker0.pod_ip:
        endpoint: dict[str, Any] = {
            "addresses": [worker0.pod_ip],
            "hostname": worker_name(name, 0),
            "conditions": {"ready": True},
            "targetRef": {"kind": "Pod", "namespace": job_namespace(job), "name": worker0.name, "uid": worker0.uid},
        }
        if worker0.node:
            endpoint["nodeName"] = worker0.node
        endpoints.append(endpoint)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": "IPv6" if worker0 is not None and ":" in (worker0.pod_ip or "") else "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"} for port_name, port in _PORTS],
        "endpoints": endpoints,
    }


@dataclass(frozen=True)
class JobNetwork:
    """The platform's settings for the NetworkPolicy the operator gives every job."""

    metrics_from: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """NetworkPolicyPeers (Prometheus) that may reach the trainers' metrics port; empty: none."""
    egress: Egress | None = None
    """Where the job's pods may connect to (``decisions.egress``); None: anywhere (ingress only)."""


def desired_network_policy(job: RLTrainingJob, network: JobNetwork, runtime: Resolved | None = None) -> dict[str, Any]:
    """Ingress to the job's worker pods: everything from the job's own pods, metrics from ``metrics_from``;
    with ``network.egress``, egress only to DNS, the job's own pods, the status API and object storage.

    Rendezvous (c10d on 29500) and NCCL/Gloo (ephemeral ports) need every port between the
    workers, so the job's pods (same namespace: a peer without namespaceSelector) may use all.
    The spec is written as the API server stores it (policyTypes and protocols explicit), so
    comparing it with the stored one is exact.
    """
    own = {"matchLabels": {LABEL_JOB: job.metadata.name}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": own}]}]
    if network.metrics_from:
        ingress.append({"from": [copy.deepcopy(p) for p in network.metrics_from],
                        "ports": [{"protocol": "TCP", "port": METRICS_PORT}]})
    spec: dict[str, Any] = {"podSelector": copy.deepcopy(own), "policyTypes": ["Ingress"], "ingress": ingress}
    if network.egress is not None:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = egress_rules(own, network.egress) + runtime_egress(resolved(job, runtime))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, networkpolicy_name(job.metadata.name), "network"),
        "spec": spec,
    }


def runtime_egress(runtime: Resolved) -> list[dict[str, Any]]:
    """The runtime's extra egress (``spec.egress.to``), as the API server stores NetworkPolicy rules."""
    return [{"to": [{"ipBlock": {"cidr": rule.cidr}}],
             **({"ports": [{"protocol": "TCP", "port": p} for p in rule.ports]} if rule.ports else {})}
            for rule in runtime.egress]


def in_place_restarts(job: RLTrainingJob) -> int:
    """How often a worker of this job may restart its ranks to meet a replaced peer (0: never).

    Every job, fixed-size or elastic, replaces a failed worker other than worker 0 in place when its
    checkpoints outlive a pod (``failure.respond.replaceable``), and the survivors' agents re-rendezvous
    with it; each replacement counts against ``backoffLimit``, which therefore also bounds the agents'
    restarts. It lives beside the environment that tells the pods (``RLJOB_IN_PLACE_RESTARTS``); the
    failure's decision reads it too. Given whatever the checkpoints' storage: an agent restarts its
    ranks only after a peer was lost, and a gang restart deletes it before it could.
    """
    policy = job.spec.run_policy
    if policy.restart_policy == RestartPolicy.never:
        return 0
    return policy.backoff_limit


def worker_env(
    job: RLTrainingJob, index: int, generation: int, endpoint: StatusEndpoint | None = None,
    runtime: Resolved | None = None,
) -> list[dict[str, Any]]:
    """The ``RLJOB_*`` environment of worker ``index`` (the trainer's in-pod contract)."""
    name, namespace, workers = job.metadata.name, job_namespace(job), job.spec.workers
    grace = resolved(job, runtime).termination_grace_period_seconds
    env: list[dict[str, Any]] = [
        {"name": contract.NNODES_ENV, "value": str(job.replicas)},
        # The launcher's wait for ranks saving their checkpoint on SIGTERM, inside the pod's grace period.
        {"name": contract.SHUTDOWN_TIMEOUT_ENV,
         "value": str(max(5, grace - 10))},
        {"name": contract.NODE_RANK_ENV, "value": str(index)},
        {"name": contract.NPROC_PER_NODE_ENV, "value": str(workers.procs_per_worker)},
        {"name": contract.RDZV_ENDPOINT_ENV, "value": rendezvous_endpoint(name, namespace)},
        {"name": contract.RUN_ID_ENV, "value": run_id(job, generation)},
        {"name": contract.OUTPUT_DIR_ENV, "value": OUTPUT_DIR},
        {"name": contract.METRICS_PORT_ENV, "value": str(METRICS_PORT)},
        {"name": contract.POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},  # the root filesystem is read-only
        {"name": contract.CREDENTIALS_DIR_ENV, "value": contract.CREDENTIALS_DIR},
    ]
    if job.spec.training.tracking is not None:  # the image the tracked run names (only then: no other pod changes)
        env.append({"name": contract.IMAGE_ENV, "value": resolved(job, runtime).image})
    restarts = in_place_restarts(job)
    if restarts:
        env.append({"name": contract.IN_PLACE_RESTARTS_ENV, "value": str(restarts)})
    if endpoint is not None:
        env.append({"name": contract.STATUS_URL_ENV, "value": endpoint.heartbeat_url(namespace, name)})
        env.append({"name": contract.TOKEN_FILE_ENV, "value": f"{TOKEN_DIR}/{TOKEN_FILE}"})
        if endpoint.ca_pem:
            env.append({"name": contract.STATUS_CA_FILE_ENV, "value": f"{CONFIG_DIR}/{STATUS_CA_KEY}"})
    return env


def _resources(runtime: Resolved) -> dict[str, Any]:
    requests: dict[str, Any] = dict(runtime.resources.get("requests") or {})
    limits: dict[str, Any] = dict(runtime.resources.get("limits") or {})
    if runtime.gpus_per_worker:  # extended resources: requests must equal limits
        requests[runtime.gpu_resource] = limits[runtime.gpu_resource] = str(runtime.gpus_per_worker)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _probes(index: int) -> dict[str, Any]:
    """Health probes for worker 0 only.

    The trainer serves ``/healthz`` and ``/readyz`` from global rank 0, which torchrun places
    on worker 0 (ranks follow the sorted host names, and ``<job>-worker-0`` sorts first).
    Other workers have no probe: they count as ready while their container runs.
    """
    if index != 0:
        return {}

    def get(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": METRICS_PORT},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }

    return {
        # Model download and load happen before the server starts: allow up to an hour.
        "startupProbe": get("/healthz", 10, 360),
        "livenessProbe": get("/healthz", 20, 3),
        "readinessProbe": get("/readyz", 10, 3),
    }


#: The trainer image's non-root user (Dockerfile.trainer).
TRAINER_UID = 1000


def _worker_metadata(job: RLTrainingJob, index: int, generation: int) -> dict[str, Any]:
    """Name, labels (index, gang generation) and the annotations a spec change is detected by."""
    metadata = _metadata(job, worker_name(job.metadata.name, index), "worker")
    metadata["labels"].update({LABEL_WORKER_INDEX: str(index), LABEL_GANG_GENERATION: str(generation)})
    metadata["annotations"] = {
        ANNOTATION_SPEC_HASH: spec_hash(job),
        ANNOTATION_JOB_GENERATION: str((job.metadata.model_extra or {}).get("generation") or ""),
    }
    if in_place_restarts(job):  # what the pod's environment tells its agent, where the decisions can see it
        metadata["annotations"][ANNOTATION_IN_PLACE_RESTARTS] = str(in_place_restarts(job))
        metadata["annotations"][ANNOTATION_REDIALS] = "true"
    return metadata


def _trainer_container(job: RLTrainingJob, index: int, env: list[dict[str, Any]], runtime: Resolved) -> dict[str, Any]:
    """The trainer container: our environment over the job's, the operator's mounts, probes on worker 0."""
    ours = {e["name"] for e in env}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": runtime.image,
        "command": list(TRAINER_COMMAND),
        "env": [dict(e) for e in runtime.env if e["name"] not in ours] + env,
        "ports": [
            {"name": "rendezvous", "containerPort": RDZV_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(runtime),
        "volumeMounts": [
            {"name": "rljob-config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "rljob-workspace", "mountPath": "/workspace"},
            {"name": "rljob-shm", "mountPath": "/dev/shm"},
            {"name": "rljob-tmp", "mountPath": "/tmp"},
            *claim_volumes(runtime.checkpoint)[1],
            *credential_volumes(runtime.checkpoint)[1],
            *reward_volumes(job)[1],
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Pod Security "restricted": the root filesystem is read-only, so HF, matplotlib,
        # triton and inductor caches go under HOME=/tmp (an emptyDir).
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        **_probes(index),
    }
    if runtime.image_pull_policy:
        container["imagePullPolicy"] = runtime.image_pull_policy
    return container


def reward_volumes(job: RLTrainingJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, trainer volumeMounts) of the reward modules from ConfigMaps (``rewards[].source.configMap``):
    one projected volume, read-only at ``REWARDS_DIR``, each module at its ``package/module.py`` path."""
    sources: list[dict[str, Any]] = []
    for reward in job.spec.training.rewards:
        source = reward.source.config_map if reward.source is not None else None
        if source is not None:
            item = {"configMap": {"name": source.name, "items": [{"key": source.key,
                                                                   "path": reward_module_file(reward.name)}]}}
            if item not in sources:
                sources.append(item)
    if not sources:
        return [], []
    return ([{"name": "rljob-rewards", "projected": {"sources": sources, "defaultMode": 0o444}}],
            [{"name": "rljob-rewards", "mountPath": contract.REWARDS_DIR, "readOnly": True}])


def _volumes(job: RLTrainingJob, runtime: Resolved) -> list[dict[str, Any]]:
    """The operator's volumes: the ConfigMap, scratch space, shared memory, /tmp, the checkpoint claims and
    the storage credentials' Secrets."""
    return [
        {"name": "rljob-config", "configMap": {"name": configmap_name(job.metadata.name)}},
        {"name": "rljob-workspace", "emptyDir": {}},
        # NCCL and DataLoader workers need more shared memory than a container's 64 MiB.
        {"name": "rljob-shm", "emptyDir": {"medium": "Memory"}},
        {"name": "rljob-tmp", "emptyDir": {}},
        *claim_volumes(runtime.checkpoint)[0],
        *credential_volumes(runtime.checkpoint)[0],
        *reward_volumes(job)[0],
    ]


def _status_token(endpoint: StatusEndpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the projected, audience-bound token the trainer's heartbeats carry."""
    volume = {
        "name": "rljob-status-token",
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": endpoint.audience,
                        "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
                        "path": TOKEN_FILE,
                    }
                }
            ]
        },
    }
    return volume, {"name": "rljob-status-token", "mountPath": TOKEN_DIR, "readOnly": True}


def pod_security_context() -> dict[str, Any]:
    """Pod Security "restricted": the trainer image's non-root user, the runtime's seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "runAsGroup": TRAINER_UID,
        "fsGroup": TRAINER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def desired_worker_pod(
    job: RLTrainingJob, index: int, generation: int, endpoint: StatusEndpoint | None = None,
    runtime: Resolved | None = None,
) -> dict[str, Any]:
    """Worker ``index`` of gang ``generation``: one torchrun node (then the runtime's ``podTemplate`` merged)."""
    name, r = job.metadata.name, resolved(job, runtime)
    metadata = _worker_metadata(job, index, generation)
    env = worker_env(job, index, generation, endpoint, r)
    container = _trainer_container(job, index, env, r)
    volumes = _volumes(job, r)
    if endpoint is not None:
        token_volume, token_mount = _status_token(endpoint)
        container["volumeMounts"].append(token_mount)
        volumes.append(token_volume)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": metadata["name"],
        "subdomain": service_name(name),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": r.termination_grace_period_seconds,
        # Trainers need no Kubernetes API access: the heartbeat token is a separate projected volume.
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        "tolerations": [{"key": r.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}],
    }
    if r.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in r.image_pull_secrets]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if r.pod_template:
        pod = _apply_pod_template(pod, r.pod_template, metadata, env)
    return pod


def desired_worker_pods(
    job: RLTrainingJob, generation: int, endpoint: StatusEndpoint | None = None, runtime: Resolved | None = None,
) -> list[dict[str, Any]]:
    """Every worker pod of gang ``generation``, in index order."""
    return [desired_worker_pod(job, i, generation, endpoint, runtime) for i in range(job.replicas)]


# ------------------------------------------------------------------- pod template merge

#: Lists merged item by item on this key (None: items appended, never removed); every other list is replaced.
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
               "volumeMounts": "mountPath", "ports": "containerPort", "tolerations": None, "drop": None}


def _empty(value: Any) -> bool:
    """null, {}, [] or "": a value that says nothing, so it never removes one the operator set."""
    return value is None or (isinstance(value, dict | list | str) and not value)


def merge_pod_template(base: Any, override: Any, key: str | None = None) -> Any:
    """``override`` over ``base``: maps merge, named lists merge by name, other lists replace.

    What the operator sets can be changed, never removed: an empty value (null, {}, [], "") keeps the
    operator's, tolerations and dropped capabilities are appended (the GPU toleration and ``drop: [ALL]``
    stay). Whether a changed value is allowed is the pod profile's question, asked of the merged pod
    (``decisions.policy``).
    """
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            if k in base and _empty(v):
                continue
            out[k] = merge_pod_template(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(override, list) and key in _MERGE_KEYS:
        merge_key = _MERGE_KEYS[key]
        if merge_key is None:
            return base + [copy.deepcopy(v) for v in override if v not in base]
        out_list = list(base)
        index = {item.get(merge_key): i for i, item in enumerate(out_list) if isinstance(item, dict)}
        for item in override:
            k = item.get(merge_key) if isinstance(item, dict) else None
            if k is not None and k in index:
                out_list[index[k]] = merge_pod_template(out_list[index[k]], item, None)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(override)


def _apply_pod_template(
    pod: dict[str, Any], template: dict[str, Any], metadata: dict[str, Any], env: list[dict[str, Any]]
) -> dict[str, Any]:
    """The runtime's ``podTemplate`` merged over ``pod``; the names, labels, command, environment and grace period
    we rely on win."""
    override = {k: v for k, v in template.items() if k in ("metadata", "spec")}
    merged: dict[str, Any] = merge_pod_template(pod, override)
    # What the operator relies on always wins.
    merged["metadata"]["name"] = metadata["name"]
    merged["metadata"]["namespace"] = metadata["namespace"]
    merged["metadata"]["ownerReferences"] = metadata["ownerReferences"]
    merged["metadata"]["labels"] = {**merged["metadata"].get("labels", {}), **metadata["labels"]}
    merged["metadata"]["annotations"] = {**merged["metadata"].get("annotations", {}), **metadata["annotations"]}
    spec = merged["spec"]
    spec["restartPolicy"] = "Never"
    # The job's grace period within the runtime's bound (the template's is a default: ``resolve``).
    spec["terminationGracePeriodSeconds"] = pod["spec"]["terminationGracePeriodSeconds"]
    spec["hostname"] = pod["spec"]["hostname"]
    spec["subdomain"] = pod["spec"]["subdomain"]
    for container in spec["containers"]:
        if container.get("name") == CONTAINER:
            container["command"] = list(TRAINER_COMMAND)
            ours = {e["name"] for e in env}
            container["env"] = [e for e in container.get("env", []) if e.get("name") not in ours] + env
    return merged
