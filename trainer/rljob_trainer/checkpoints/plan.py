"""Where one run's checkpoints go: the primary location, the mirrors, the folder the HF Trainer saves into."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rljob_contract.plugins.storage import backend_for
from rljob_contract.pod import CREDENTIALS_DIR_ENV, credentials_folder, mirror_env_prefix
from rljob_contract.pod import MIRROR_ENV_PREFIX as MIRROR_ENV_PREFIX  # re-exported

from rljob_trainer.checkpoints.backends import location_for
from rljob_trainer.checkpoints.locations import LocalLocation, Location
from rljob_trainer.checkpoints.s3 import MiB, TransferSettings
from rljob_trainer.storage import credentials_from_env, credentials_from_folder

log = logging.getLogger("rljob.checkpoints")



@dataclass
class StoragePlan:
    """Where a run's checkpoints go: the primary, the mirrors, and the folder the HF Trainer writes to
    (a staging folder when the primary is remote, the primary itself when it is a local path)."""

    primary: Location
    mirrors: list[Location]
    local_root: Path
    transfer: TransferSettings

    @property
    def remote_primary(self) -> bool:
        """Whether the primary is object storage (the HF Trainer then writes to a staging folder)."""
        return backend_for(self.primary.uri).remote

    @property
    def folder(self) -> Location:
        """The folder the HF Trainer saves into, as a location: checkpoints are sealed there in place.
        A local primary is that folder; in front of object storage it is the staging folder."""
        if not self.remote_primary and self.primary.uri == str(self.local_root):
            return self.primary
        return LocalLocation(self.local_root)

    @property
    def locations(self) -> list[Location]:
        """The primary, then the mirrors (the order resume prefers at equal steps)."""
        return [self.primary, *self.mirrors]

    @property
    def publish_to(self) -> list[Location]:
        """Where rank 0's background publisher copies each checkpoint (a local primary is sealed in place)."""
        return self.locations if self.remote_primary else self.mirrors

    @property
    def managed(self) -> bool:
        """Whether object storage or mirrors are involved (else the plain local behaviour applies)."""
        return self.remote_primary or bool(self.mirrors)


def local_staging_dir(cfg: Any) -> str:
    """Local folder where checkpoints are written before upload to object storage."""
    return os.path.join(cfg.output_dir, "checkpoint-staging")


def storage_plan(cfg: Any, environ: Mapping[str, str] | None = None) -> StoragePlan:
    """The :class:`StoragePlan` of a TrainerConfig (``spec.checkpoint``); mirror ``i``'s credentials
    come from its Secret mounted under ``RLJOB_CREDENTIALS_DIR`` (in a pod), else from
    ``RLJOB_MIRROR<i>_AWS_*`` in ``environ`` (default: the process environment)."""
    spec = cfg.checkpoint
    transfer = TransferSettings(part_size=spec.part_size_mib * MiB, concurrency=spec.upload_concurrency)
    location = cfg.checkpoint_location()
    primary = location_for(location, endpoint_url=spec.endpoint_url, region=spec.region, transfer=transfer)
    mirrors = []
    env = os.environ if environ is None else environ
    mounted = env.get(CREDENTIALS_DIR_ENV)
    for i, m in enumerate(spec.mirrors):
        creds = None
        if m.credentials_secret:
            field = f"spec.checkpoint.mirrors[{i}].credentialsSecret"
            creds = (credentials_from_folder(Path(mounted) / credentials_folder(i), field) if mounted else None) \
                or credentials_from_env(mirror_env_prefix(i), env)
            if creds is None:
                log.warning("mirror %s: credentialsSecret %s is neither mounted nor given as %sAWS_* in the "
                            "environment; using the default credentials", m.location, m.credentials_secret,
                            mirror_env_prefix(i))
        mirrors.append(location_for(
            m.location, where=f"spec.checkpoint.mirrors[{i}].location",
            endpoint_url=m.endpoint_url or spec.endpoint_url,  # used by object storage only
            region=m.region or spec.region, credentials=creds, transfer=transfer,
        ))
    local_root = Path(local_staging_dir(cfg)) if backend_for(location).remote else Path(location)
    return StoragePlan(primary, mirrors, local_root, transfer)
