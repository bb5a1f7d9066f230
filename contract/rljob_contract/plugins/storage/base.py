"""What a checkpoint storage backend's descriptor is: the questions the contract and the operator ask
about a location, without opening it (its ``Location`` is the trainer's implementation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PodVolume:
    """A volume the operator mounts in every worker for a location: ``source`` (a pod volume source,
    without its name), shared by every location with the same ``key`` and mounted at ``<root>/<key>``;
    the trainer is given the folder ``<root>/<key>/<subpath>`` instead of the URI."""

    key: str
    source: dict[str, Any]
    subpath: str


class StorageBackend:
    """One kind of checkpoint location. Subclasses set the attributes and override what differs.

    Opening a location (listing, reading, writing) is not here: the trainer registers a ``Location``
    factory for each scheme (``rljob_trainer.checkpoints.backends``)."""

    #: The URI scheme (``s3`` for ``s3://…``); empty for the folder backend, which takes the rest.
    scheme: str = ""
    #: How messages describe the form of its locations, with an example.
    form: str = ""
    #: Whether the trainer writes checkpoints to a local staging folder and uploads each one in the
    #: background (object storage), and downloads models and datasets named by such a URI. A backend
    #: that is not remote is a folder the trainer writes into.
    remote: bool = False
    #: Whether checkpoints there outlive the worker pods whatever volumes the pods have.
    durable: bool = False
    #: The kind of object of the job's namespace a location names (admission checks the user may use
    #: it); empty when it names none.
    reference_kind: str = ""

    @property
    def prefix(self) -> str:
        """``scheme://`` (empty for the folder backend)."""
        return f"{self.scheme}://" if self.scheme else ""

    def check(self, uri: str) -> str:
        """``uri`` when it is a valid location of this backend; else ValueError saying what to write."""
        return uri

    def pod_volume(self, uri: str) -> PodVolume | None:
        """What the operator mounts in every worker for ``uri`` (None: nothing, the URI is passed as is)."""
        return None

    def cel_rule(self, expr: str) -> tuple[str, str] | None:
        """(CEL rule, message) the CRD checks ``expr`` (a location field) with, or None."""
        return None

    def cel_holds(self, uri: str) -> bool:
        """``cel_rule``'s rule in Python: does ``uri`` keep it? (the contract's rules test one against the other)"""
        return True
