"""The one table of references: which fields name a Secret, ConfigMap, ServiceAccount, claim, ….

Nothing a job or a namespaced runtime names may grant more than its writer's rights, so every field
through which one names another object of the namespace is listed here, once: a job's (the reward
modules' ConfigMaps, :data:`JOB_REFERENCES`) and a runtime's (its pod template, pull Secrets and
checkpoint storage, :data:`RUNTIME_REFERENCES`: a namespace's admins write RLTrainingRuntimes). From it come:

* the admission policies' CEL (``charts/rljob/hack/gen_admission.py`` writes the reference
  variables of ``charts/rljob/templates/admission-policies.yaml`` and of
  ``manifests/base/admission-policies.yaml``; a test fails on drift);
* the operator's own checks of the runtime it builds pods from (``decisions.policy``: Secrets under
  ``allowSecretReferences``, ServiceAccounts under ``allowedServiceAccounts``) and what an experiment's
  arm may not override (``rljob_contract.experiment``: no reference, and not the runtime);
* ``tests/contract/test_references.py`` walks the PodSpec of the API server's OpenAPI document and fails when
  Kubernetes has a reference field this table lacks.

Paths are camelCase, as the API (and :func:`rljob_contract.pod.validate_document`) spells them, relative
to the object's ``spec``; ``[]`` marks a list, whose items are labelled by their ``name`` (``location`` for
mirrors).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rljob_contract.plugins.storage import backends

SECRET = "Secret"
CONFIG_MAP = "ConfigMap"
SERVICE_ACCOUNT = "ServiceAccount"
CLAIM = "PersistentVolumeClaim"
RESOURCE_CLAIM = "ResourceClaim"
RESOURCE_CLAIM_TEMPLATE = "ResourceClaimTemplate"
POD_GROUP = "PodGroup"
#: A TypedLocalObjectReference (a claim's dataSource): the kind and apiGroup are the object's own.
TYPED = "Typed"

#: kind → (API group, resource, verbs any one of which allows using it). A ServiceAccount is used by
#: acting as it: a token for it, or impersonating it.
RIGHTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    SECRET: (("", "secrets", "get"),),
    CONFIG_MAP: (("", "configmaps", "get"),),
    SERVICE_ACCOUNT: (("", "serviceaccounts/token", "create"), ("", "serviceaccounts", "impersonate")),
    CLAIM: (("", "persistentvolumeclaims", "get"),),
    RESOURCE_CLAIM: (("resource.k8s.io", "resourceclaims", "get"),),
    RESOURCE_CLAIM_TEMPLATE: (("resource.k8s.io", "resourceclaimtemplates", "get"),),
    POD_GROUP: (("scheduling.k8s.io", "podgroups", "get"),),
}

#: Volume sources whose ``secretRef`` names a Secret (the in-tree drivers that take one).
_SECRET_REF_VOLUMES = ("cephfs", "cinder", "flexVolume", "iscsi", "rbd", "scaleIO", "storageos")
_CONTAINERS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True)
class Reference:
    """A field naming an object of the job's namespace: ``path`` (camelCase, ``[]`` for lists) and ``kind``.

    ``scheme``: the value names the object only when it starts with it (``pvc://claim/prefix``).
    """

    path: str
    kind: str
    scheme: str = ""


def _pod_references() -> tuple[Reference, ...]:
    """Every reference field of a PodSpec."""
    refs = [Reference("serviceAccountName", SERVICE_ACCOUNT), Reference("serviceAccount", SERVICE_ACCOUNT),
            Reference("imagePullSecrets[].name", SECRET),
            Reference("resourceClaims[].resourceClaimName", RESOURCE_CLAIM),
            Reference("resourceClaims[].resourceClaimTemplateName", RESOURCE_CLAIM_TEMPLATE),
            Reference("schedulingGroup.podGroupName", POD_GROUP)]
    for containers in _CONTAINERS:
        refs += [Reference(f"{containers}[].env[].valueFrom.secretKeyRef.name", SECRET),
                 Reference(f"{containers}[].env[].valueFrom.configMapKeyRef.name", CONFIG_MAP),
                 Reference(f"{containers}[].envFrom[].secretRef.name", SECRET),
                 Reference(f"{containers}[].envFrom[].configMapRef.name", CONFIG_MAP)]
    refs += [Reference("volumes[].secret.secretName", SECRET),
             Reference("volumes[].configMap.name", CONFIG_MAP),
             Reference("volumes[].projected.sources[].secret.name", SECRET),
             Reference("volumes[].projected.sources[].configMap.name", CONFIG_MAP),
             Reference("volumes[].azureFile.secretName", SECRET),
             Reference("volumes[].csi.nodePublishSecretRef.name", SECRET),
             *(Reference(f"volumes[].{source}.secretRef.name", SECRET) for source in _SECRET_REF_VOLUMES),
             Reference("volumes[].persistentVolumeClaim.claimName", CLAIM),
             Reference("volumes[].ephemeral.volumeClaimTemplate.spec.dataSource.name", TYPED),
             Reference("volumes[].ephemeral.volumeClaimTemplate.spec.dataSourceRef.name", TYPED)]
    return tuple(refs)


#: PodSpec's reference fields.
POD_REFERENCES = _pod_references()
#: Every reference field of an RLTrainingJob's spec (an RLExperiment's spec.template): its custom rewards' modules.
JOB_REFERENCES = (Reference("training.rewards[].source.configMap.name", CONFIG_MAP),)


def _runtime_references() -> tuple[Reference, ...]:
    refs = [Reference("imagePullSecrets[].name", SECRET),
            Reference("checkpoint.credentialsSecret", SECRET),
            Reference("checkpoint.mirrors[].credentialsSecret", SECRET)]
    for backend in backends():  # a location naming an object of the namespace (pvc://claim/prefix)
        if backend.reference_kind:
            refs += [Reference("checkpoint.storage", backend.reference_kind, backend.prefix),
                     Reference("checkpoint.mirrors[].location", backend.reference_kind, backend.prefix)]
    refs += [Reference("podTemplate.spec." + r.path, r.kind) for r in POD_REFERENCES]
    return tuple(refs)


#: Every reference field of a runtime's spec. An RLTrainingRuntime's are checked against its writer at admission;
#: a ClusterRLTrainingRuntime's name objects of each job's namespace, and are the platform's own.
RUNTIME_REFERENCES = _runtime_references()
#: Job fields an experiment's arm may not override at all: the pod shape an experiment compares training on.
FIXED_FIELDS = ("runtimeRef",)


# ------------------------------------------------------------------------- finding them


@dataclass(frozen=True)
class Found:
    """One reference in a document: its field (``spec.workers.volumes[0].secret.secretName``), kind, name."""

    field: str
    kind: str
    name: str


def references(spec: dict[str, Any], prefix: str = "spec.",
               table: tuple[Reference, ...] = JOB_REFERENCES) -> list[Found]:
    """Every reference of ``table`` in ``spec`` (camelCase, as the API holds it: a job's spec by default, a
    runtime's with :data:`RUNTIME_REFERENCES`), in table order."""
    out: list[Found] = []
    for ref in table:
        for field, value in _walk(spec, ref.path.split("."), prefix.rstrip(".")):
            name = _object_name(value, ref.scheme)
            if name is not None:
                out.append(Found(field, ref.kind, name))
    return out


def _object_name(value: Any, scheme: str) -> str | None:
    if value is None or value == "":
        return None
    if not scheme:
        return str(value)
    text = str(value)
    return text[len(scheme):].split("/", 1)[0] if text.startswith(scheme) else None


def _walk(value: Any, parts: list[str], path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) at ``parts`` under ``value``; lists (``key[]``) fan out with their indices."""
    if not parts:
        yield path, value
        return
    if not isinstance(value, dict):
        return
    key = parts[0].removesuffix("[]")
    child = value.get(key)
    where = f"{path}.{key}" if path else key
    if not parts[0].endswith("[]"):
        yield from _walk(child, parts[1:], where)
        return
    for i, item in enumerate(child if isinstance(child, list) else []):
        yield from _walk(item, parts[1:], f"{where}[{i}]")
