"""The trainer's half of each storage backend: a ``Location`` factory per scheme.

A backend's descriptor (``rljob_contract.plugins.storage``) says what its URIs look like, whether it
is remote, durable, what the pods mount; here each scheme gets the factory that opens a location of
it, registered under the descriptor's scheme (the folder backend's is the empty one). Everything that
opens a location comes here: a run's checkpoints (``plan.storage_plan``), ``rljob checkpoints`` and
``rljob evaluate`` (:func:`location_for`), and the models and datasets a URI of a remote backend names
(:func:`download_folder`, :func:`download_file`; the trainer asks the descriptor's ``remote``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rljob_contract.plugins.storage import FOLDER, PVC, S3, backend_for, backends

from rljob_trainer.checkpoints.locations import LocalLocation, Location
from rljob_trainer.checkpoints.s3 import S3Location, TransferSettings
from rljob_trainer.errors import PermanentError

#: Opens a location: ``(uri, *, where, endpoint_url, region, credentials, transfer)`` → Location (a
#: PermanentError naming ``where`` when it cannot be opened here).
LocationFactory = Callable[..., Location]


def open_folder(uri: str, *, where: str, **options: Any) -> Location:
    """A :class:`LocalLocation` (``options`` are for object storage)."""
    return LocalLocation(uri, where=where)


def refuse_claim(uri: str, *, where: str, **options: Any) -> Location:
    """A pvc:// location is never opened by the trainer in a pod (it is given the mounted folder): here
    it means a run outside the cluster, where guessing a folder would hide where the checkpoints went."""
    raise PermanentError(where, (
        f"{uri} names a PersistentVolumeClaim, which exists only on a cluster (the operator mounts it "
        "into the job's pods); to run here, set a local folder or an s3:// location"))


#: Each backend's factory, by its descriptor's scheme.
_FACTORIES: dict[str, LocationFactory] = {}


def register(scheme: str, factory: LocationFactory) -> LocationFactory:
    """Add the factory of a backend (a scheme registered twice is a programming error)."""
    if scheme in _FACTORIES:
        raise ValueError(f"checkpoints.backends.register: scheme {scheme!r} is already registered")
    _FACTORIES[scheme] = factory
    return factory


def location_for(
    uri: str,
    *,
    where: str = "spec.checkpoint.storage",
    endpoint_url: str | None = None,
    region: str | None = None,
    credentials: dict[str, str] | None = None,
    transfer: TransferSettings | None = None,
) -> Location:
    """The location a URI names, opened by its backend's factory: ``s3://bucket/prefix`` is object
    storage, anything without a registered scheme a local folder. One that cannot be opened here
    (``pvc://claim/prefix`` outside the cluster) is a PermanentError naming ``where``."""
    scheme = backend_for(uri).scheme
    if scheme not in _FACTORIES:
        raise NotImplementedError(f"storage backend {scheme}:// has a descriptor but no factory in checkpoints.backends")
    return _FACTORIES[scheme](uri, where=where, endpoint_url=endpoint_url, region=region,
                              credentials=credentials, transfer=transfer)


def download_folder(uri: str, dest: str, where: str = "spec.training.model") -> str:
    """Every object under a remote ``uri`` (a model) into ``dest``; returns ``dest``."""
    location_for(uri, where=where).download_folder(Path(dest))
    return dest


def download_file(uri: str, dest: str, where: str = "spec.training.dataset.name") -> str:
    """The object a remote ``uri`` names (a dataset file) to ``dest``; returns ``dest``."""
    location_for(uri, where=where).download_file(Path(dest))
    return dest


def missing() -> list[str]:
    """Schemes with a descriptor and no factory (a test keeps this empty)."""
    return [b.scheme for b in (FOLDER, *backends()) if b.scheme not in _FACTORIES]


register(FOLDER.scheme, open_folder)
register(S3.scheme, S3Location)
register(PVC.scheme, refuse_claim)
