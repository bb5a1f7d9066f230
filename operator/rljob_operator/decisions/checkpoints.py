"""Where a job's checkpoints live in its pods, and whether they outlive the gang (pure).

The checkpoint storage a job resolved from its runtime (``rljob_contract.runtime.resolve``: the runtime's
``spec.checkpoint``, each location under the job's own path) may name something the pods must mount,
as its storage backend's descriptor says (``rljob_contract.plugins.storage``; today a PersistentVolumeClaim of the
job's namespace, ``pvc://claim/prefix``). The operator mounts each such volume once, read-write, at
``CLAIMS_DIR/<claim>`` in every worker (:func:`claim_volumes`), and the trainer config in the
ConfigMap names the mounted folder instead (:func:`mounted_checkpoint`): the trainer treats it as any
local folder — the same manifest, retention, mirror and resume code as for S3 — and never needs to
know about claims.

A job whose checkpoints land only on a volume that dies with its pod (the default,
``/workspace/output/checkpoints``, is on an emptyDir) silently starts again from step 0 after every
gang restart, the very event checkpoints exist for. :func:`durability` says whether that is so, for
the condition ``CheckpointsDurable`` and a one-time Warning Event (``plan.checkpoint_event``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rljob_contract import pod as contract
from rljob_contract.plugins.storage import PodVolume, backend_for
from rljob_contract.spec import CheckpointSpec

from rljob_operator.names import CLAIMS_DIR, CONTAINER, OUTPUT_DIR

#: The condition that says whether checkpoints survive a gang restart, and its two reasons.
CONDITION = "CheckpointsDurable"
DURABLE = "Durable"
EPHEMERAL = "Ephemeral"
#: The Warning Event posted when a job's checkpoints become ephemeral (once per transition).
EVENT_REASON = "EphemeralCheckpoints"
#: Volume types whose contents go with the pod, or stay on one node the next gang may not get
#: (inline ``csi`` volumes are CSI ephemeral volumes; ``ephemeral`` claims are deleted with the pod).
POD_BOUND_VOLUMES = frozenset({
    "emptyDir", "ephemeral", "csi", "hostPath", "gitRepo", "image", "configMap", "secret", "downwardAPI",
    "projected",
})
#: What to set, said in every Ephemeral message.
ADVICE = (
    "run the job on a runtime (spec.runtimeRef) whose spec.checkpoint.storage is pvc://<claim>/<prefix> (a "
    "PersistentVolumeClaim of this namespace) or s3://<bucket>/<prefix>, or has such a location in its "
    "spec.checkpoint.mirrors"
)


# ------------------------------------------------------------------------------ claims


def pod_volumes(checkpoint: CheckpointSpec) -> list[PodVolume]:
    """The volumes the checkpoint locations need in the pods, each once (by key), in order (storage first,
    then mirrors)."""
    needed: dict[str, PodVolume] = {}
    for uri in _locations(checkpoint):
        volume = backend_for(uri).pod_volume(uri)
        if volume is not None:
            needed.setdefault(volume.key, volume)
    return list(needed.values())


def _locations(checkpoint: CheckpointSpec) -> list[str]:
    return [*([checkpoint.storage] if checkpoint.storage else []), *(m.location for m in checkpoint.mirrors)]


def claim_volume_name(index: int) -> str:
    """The pod volume of the ``index``-th claim (claim names may be longer than a volume name may be)."""
    return f"rljob-checkpoints-{index}"


def claim_volumes(checkpoint: CheckpointSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, trainer volumeMounts) of every volume the locations need (:func:`pod_volumes`: a
    claim), each mounted read-write at ``CLAIMS_DIR/<key>``."""
    volumes, mounts = [], []
    for i, volume in enumerate(pod_volumes(checkpoint)):
        name = claim_volume_name(i)
        volumes.append({"name": name, **volume.source})
        mounts.append({"name": name, "mountPath": posixpath.join(CLAIMS_DIR, volume.key), "readOnly": False})
    return volumes, mounts


def credential_volumes(checkpoint: CheckpointSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, trainer volumeMounts) of the Secrets ``credentialsSecret`` fields name, each mounted
    read-only at ``CREDENTIALS_DIR/<checkpoint|mirror-i>`` (readable by the pod's group, fsGroup)."""
    named = [(contract.credentials_folder(), checkpoint.credentials_secret)]
    named += [(contract.credentials_folder(i), m.credentials_secret) for i, m in enumerate(checkpoint.mirrors)]
    volumes, mounts = [], []
    for folder, secret in named:
        if secret:
            name = f"rljob-credentials-{folder}"
            volumes.append({"name": name, "secret": {"secretName": secret, "defaultMode": 0o440}})
            mounts.append({"name": name, "mountPath": posixpath.join(contract.CREDENTIALS_DIR, folder),
                           "readOnly": True})
    return volumes, mounts


def mounted_location(uri: str) -> str:
    """The folder a worker sees for ``uri``: ``pvc://claim/prefix`` → ``CLAIMS_DIR/claim/prefix``; a
    location that needs no volume is unchanged."""
    volume = backend_for(uri).pod_volume(uri)
    if volume is None:
        return uri
    root = posixpath.join(CLAIMS_DIR, volume.key)
    return posixpath.join(root, volume.subpath) if volume.subpath else root


def mounted_checkpoint(checkpoint: CheckpointSpec) -> CheckpointSpec:
    """``checkpoint`` as the trainer in a worker pod gets it: every location that needs a volume (pvc://)
    replaced by its mounted folder."""
    if not pod_volumes(checkpoint):
        return checkpoint
    mirrors = [m.model_copy(update={"location": mounted_location(m.location)}) for m in checkpoint.mirrors]
    storage = mounted_location(checkpoint.storage) if checkpoint.storage else None
    return checkpoint.model_copy(update={"storage": storage, "mirrors": mirrors})


# -------------------------------------------------------------------------- durability


@dataclass(frozen=True)
class Durability:
    """Whether a job's checkpoints outlive its gang, and what the condition says about it."""

    durable: bool
    message: str

    @property
    def status(self) -> str:
        return "True" if self.durable else "False"

    @property
    def reason(self) -> str:
        return DURABLE if self.durable else EPHEMERAL


def durability(checkpoint: CheckpointSpec, worker_pod: Callable[[], dict[str, Any]]) -> Durability:
    """Do the checkpoints survive a gang restart? Yes when any location (storage or a mirror) does:
    resume takes the newest complete checkpoint any location holds.

    ``worker_pod`` builds a worker pod as created (the user's volumes and ``podTemplate`` merged);
    it is called only for local paths, to find the volume each one is on.
    """
    primary = checkpoint.storage or posixpath.join(OUTPUT_DIR, "checkpoints")
    locations = [primary, *(m.location for m in checkpoint.mirrors)]
    remote = next((uri for uri in locations if backend_for(uri).durable), None)
    if remote is not None:
        return Durability(True, f"checkpoints go to {remote}, which outlives the worker pods")
    pod = worker_pod()
    where = {uri: _volume_of(uri, pod) for uri in locations}
    lasting = next(((uri, v) for uri, v in where.items() if v[0] and v[1] not in POD_BOUND_VOLUMES), None)
    if lasting is not None:
        uri, (volume, kind) = lasting
        return Durability(True, f"checkpoints go to {uri} on volume {volume} ({kind}), which outlives the worker pods")
    volume, kind = where[primary]
    on = f"the pod's {kind} volume {volume}" if volume else "the container's own filesystem"
    default = "" if checkpoint.storage else " (the runtime's spec.checkpoint.storage is not set)"
    return Durability(False, f"checkpoints go to {primary}{default} on {on}: every gang restart deletes them and "
                             f"the job starts again from step 0; {ADVICE}")


def _volume_of(path: str, pod: dict[str, Any]) -> tuple[str, str]:
    """(volume name, volume type) of the trainer's mount that holds ``path``; ("", "") when none does."""
    spec = pod.get("spec") or {}
    container: dict[str, Any] = next((c for c in spec.get("containers") or [] if c.get("name") == CONTAINER), {})
    target = posixpath.normpath(path) if path.startswith("/") else ""
    best: dict[str, Any] | None = None
    for mount in container.get("volumeMounts") or []:
        root = posixpath.normpath(str(mount.get("mountPath") or "/"))
        inside = target == root or target.startswith(root.rstrip("/") + "/")
        if target and inside and (best is None or len(root) > len(posixpath.normpath(best["mountPath"]))):
            best = mount
    if best is None:
        return "", ""
    volume: dict[str, Any] = next((v for v in spec.get("volumes") or [] if v.get("name") == best.get("name")), {})
    kind = next((k for k in volume if k != "name"), "emptyDir")  # a mount without its volume: the pod fails
    return str(best.get("name")), kind
