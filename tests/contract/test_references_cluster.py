"""One table of references, against the real API server: every reference field of its PodSpec is in
``rljob_contract.references`` or named as not one (the table itself: ``tests/contract/test_references.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from rljob_contract import references as refs

#: PodSpec fields that name something without granting a namespace object, and why they are not in the table.
NOT_REFERENCES = {
    # A cluster-scoped bundle of public trust anchors (certificates): nothing of another team's to read.
    "volumes[].projected.sources[].clusterTrustBundle.name",
    # The claim template's metadata may hold labels and annotations only: pod validation refuses the rest.
    "volumes[].ephemeral.volumeClaimTemplate.metadata.ownerReferences[].name",
}


#: Types whose ``name`` names another object; fields with these names name one themselves.
_REFERENCE_SUFFIXES = ("Reference", "KeySelector", "EnvSource", "Projection", "VolumeSource")


_NAME_FIELDS = {"serviceAccount", "claimName"}


#: Fields named so name an object of the namespace. Not here, on purpose: nodeName, schedulerName, hostname
#: (not objects) and priorityClassName, runtimeClassName (cluster-scoped classes the platform defines).
_NAME_SUFFIXES = ("AccountName", "SecretName", "secretName", "ClaimName", "ClaimTemplateName", "GroupName")


def _ref_of(prop: dict[str, Any]) -> str | None:
    for candidate in (prop, *(prop.get("allOf") or [])):
        if "$ref" in candidate:
            return str(candidate["$ref"]).rsplit("/", 1)[-1]
    return None


def pod_reference_fields(schemas: dict[str, Any], type_name: str = "io.k8s.api.core.v1.PodSpec",
                         path: str = "", seen: tuple[str, ...] = ()) -> set[str]:
    """Every field under PodSpec (``volumes[].secret.secretName``) that names an object, by the rules above."""
    out: set[str] = set()
    schema = schemas[type_name]
    short = type_name.rsplit(".", 1)[-1]
    for key, prop in (schema.get("properties") or {}).items():
        where = f"{path}.{key}" if path else key
        if key in _NAME_FIELDS or key.endswith(_NAME_SUFFIXES) or (key == "name" and short.endswith(_REFERENCE_SUFFIXES)):
            out.add(where)
        if prop.get("type") == "array":
            prop, where = prop.get("items") or {}, where + "[]"
        child = _ref_of(prop)
        if child and child not in seen and child in schemas:
            out |= pod_reference_fields(schemas, child, where, (*seen, child))
    return out


@pytest.mark.cluster
def test_the_table_has_every_reference_field_of_the_api_servers_pod_spec(kube: Any) -> None:
    """Walks io.k8s.api.core.v1.PodSpec of the API server the tests run (its OpenAPI v3 document): a
    Kubernetes release that adds a field naming a Secret, ConfigMap, ServiceAccount or claim fails here
    until the table (and so the admission policies and the profile) knows it."""
    schemas = kube.request("GET", "/openapi/v3/api/v1")["components"]["schemas"]
    found = pod_reference_fields(schemas)
    # The walk finds what the table was written from (a walk that found nothing would prove nothing).
    assert {"volumes[].csi.nodePublishSecretRef.name", "containers[].env[].valueFrom.secretKeyRef.name",
            "serviceAccountName", "volumes[].persistentVolumeClaim.claimName"} <= found
    table = {r.path for r in refs.POD_REFERENCES}
    assert found - NOT_REFERENCES - table == set(), "reference fields the table lacks"
    assert table - found == set(), "fields in the table the API server does not have"
