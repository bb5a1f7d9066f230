"""``pvc://claim/prefix``: a PersistentVolumeClaim of the job's namespace (block or file storage).

Only the operator can reach a claim: it mounts every claim named (storage and mirrors, each once)
read-write in every worker and gives the trainer the mounted folder instead of the URI
(:meth:`PvcBackend.pod_volume`), so in a pod the trainer sees a folder. Outside the cluster
(``rljob train``, ``rljob checkpoints``) the trainer refuses a pvc:// location rather than guess at it
(its implementation, ``rljob_trainer.checkpoints.backends``, opens none).
"""

from __future__ import annotations

import re

from rljob_contract.plugins.storage.base import PodVolume, StorageBackend

#: A Kubernetes object name (DNS-1123 subdomain), as a regex fragment.
_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_CLAIM_RE = re.compile(f"^{_NAME}$")
#: A checkpoint location on a PersistentVolumeClaim of the job's namespace: ``pvc://<claim>/<prefix>``.
PVC_SCHEME = "pvc://"
#: The CEL/regex form of a pvc:// location: a claim name, then an optional prefix of path segments
#: (no empty, ``.`` or ``..`` segment: the prefix stays inside the claim).
PVC_LOCATION_RE = re.compile(f"^pvc://{_NAME}" r"(/([^/]*[^/.][^/]*|\.\.\.+))*/?$")
#: What a pvc:// location must look like (the CRD's message; :meth:`PvcBackend.check` says it in two).
PVC_FORM = ("use pvc://<claim>/<prefix>: a PersistentVolumeClaim name (lowercase letters, digits, '-' and '.'), "
            "then a relative path without empty, '.' or '..' parts")


def parse_claim(uri: str) -> tuple[str, str] | None:
    """``(claim, prefix)`` of a ``pvc://claim/prefix`` location (prefix without slashes at its ends),
    None for any other location. The location is assumed valid (:meth:`PvcBackend.check`)."""
    if not uri.startswith(PVC_SCHEME):
        return None
    claim, _, prefix = uri[len(PVC_SCHEME):].partition("/")
    return claim, prefix.strip("/")


class PvcBackend(StorageBackend):
    scheme = "pvc"
    form = "pvc://claim/prefix (a PersistentVolumeClaim of the job's namespace)"
    durable = True
    reference_kind = "PersistentVolumeClaim"

    def check(self, uri: str) -> str:
        claim = uri[len(PVC_SCHEME):].split("/", 1)[0]
        if not claim or len(claim) > 253 or not _CLAIM_RE.match(claim):
            raise ValueError(f"{uri!r}: pvc:// needs a PersistentVolumeClaim name (lowercase letters, digits, '-' "
                             "and '.'), for example pvc://checkpoints/run1")
        if not PVC_LOCATION_RE.match(uri):
            raise ValueError(f"{uri!r}: the prefix after the claim must be a relative path without empty, '.' or "
                             "'..' parts, for example pvc://checkpoints/team-a/run1")
        return uri

    def pod_volume(self, uri: str) -> PodVolume | None:
        parsed = parse_claim(uri)
        if parsed is None:
            return None
        claim, prefix = parsed
        return PodVolume(claim, {"persistentVolumeClaim": {"claimName": claim, "readOnly": False}}, prefix)

    def cel_rule(self, expr: str) -> tuple[str, str]:
        return f"!{expr}.startsWith('{PVC_SCHEME}') || {expr}.matches(r'{PVC_LOCATION_RE.pattern}')", PVC_FORM

    def cel_holds(self, uri: str) -> bool:
        return not uri.startswith(PVC_SCHEME) or bool(PVC_LOCATION_RE.match(uri))


PVC = PvcBackend()
