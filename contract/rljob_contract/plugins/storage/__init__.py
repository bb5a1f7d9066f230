"""Checkpoint storage backends' descriptors, keyed by URI scheme: one module each, one registry.

A checkpoint location (``spec.checkpoint.storage``, a mirror's ``location``, ``rljob checkpoints URI``)
is a URI whose scheme picks its backend (:func:`backend_for`); anything without a registered scheme is
a folder (:mod:`.folder`). A backend's descriptor says everything the contract and the operator need of
its scheme:

* parsing and validating the URI (:meth:`StorageBackend.check`; errors say what to write instead),
* whether the trainer stages checkpoints in a local folder and uploads them (``remote``),
* whether checkpoints there outlive the worker pods whatever their volumes (``durable``),
* what the operator does for it in a worker pod (:meth:`StorageBackend.pod_volume`: a volume mounted,
  the folder the trainer is given instead of the URI) and which object of the job's namespace it names
  (``reference_kind``, checked at admission),
* the CRD's CEL rule for it (:meth:`StorageBackend.cel_rule`, with :meth:`StorageBackend.cel_holds`).

Opening a location is the backend's implementation: the trainer registers a ``Location`` factory per
scheme (``rljob_trainer.checkpoints.backends``), which lists, reads, writes and deletes there (and so
reports the digest a listing has: S3's ETag; none for a folder, whose files are MD5-checked), and which
also fetches models and datasets. The rest of the code asks :func:`backend_for`; it never tests a scheme
itself. These modules import only the standard library.
"""

from __future__ import annotations

from rljob_contract.plugins.storage.base import PodVolume, StorageBackend
from rljob_contract.plugins.storage.folder import FolderBackend
from rljob_contract.plugins.storage.pvc import PVC
from rljob_contract.plugins.storage.s3 import S3

#: The backends with a scheme, in the order error messages list them (the folder backend takes the rest).
_BACKENDS: dict[str, StorageBackend] = {}
#: Any location without a registered scheme.
FOLDER = FolderBackend(_BACKENDS)


def register(backend: StorageBackend) -> StorageBackend:
    """Add a backend for its scheme (a scheme registered twice is a programming error)."""
    if not backend.scheme or backend.scheme in _BACKENDS:
        raise ValueError(f"plugins.storage.register: scheme {backend.scheme!r} is empty or already registered")
    _BACKENDS[backend.scheme] = backend
    return backend


def backends() -> list[StorageBackend]:
    """The registered backends with a scheme, in registration order."""
    return list(_BACKENDS.values())


def backend_for(uri: str) -> StorageBackend:
    """The backend of a location: the one whose ``scheme://`` it starts with, else the folder backend
    (which refuses any other ``scheme://`` when the location is checked)."""
    return next((b for b in _BACKENDS.values() if uri.startswith(b.prefix)), FOLDER)


def check_location(uri: str) -> str:
    """``uri`` when its backend accepts it; else ValueError saying what to write (a field validator)."""
    return backend_for(uri).check(uri)


def is_bare_scheme(text: str) -> bool:
    """Whether ``text`` + ``/`` is a registered ``scheme://`` with nothing after it (``s3:/``): such a
    text is no location, so ``s3://checkpoint-5`` is not the checkpoint ``checkpoint-5`` of ``s3:/``."""
    return any(text + "/" == b.prefix for b in _BACKENDS.values())


register(S3)
register(PVC)

__all__ = ["FOLDER", "PVC", "S3", "PodVolume", "StorageBackend", "backend_for", "backends", "check_location",
           "is_bare_scheme", "register"]
