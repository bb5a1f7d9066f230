"""The launcher's pre-flight for checkpoints, and what each rank resumes from.

On every node, before any rank starts: check access to the primary and each mirror (a denied or
missing bucket is a PermanentError naming the field; an unreachable endpoint is skipped with a
warning), then fetch the newest complete checkpoint any reachable location holds into the local
folder and verify it against its manifest — a corrupt, partial or unreachable copy falls back to
the previous one, or to a mirror's copy, with a warning. The ranks read the decision from
``RLJOB_RESUME_CHECKPOINT``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from rljob_contract.pod import RESUME_CHECKPOINT_ENV, RESUME_WARNINGS_ENV

from rljob_trainer.checkpoints.locations import CorruptCheckpoint, Listing, Location, StorageError
from rljob_trainer.checkpoints.manifest import (
    MANIFEST,
    CheckpointInfo,
    delete_checkpoint,
    step_of,
    verify_checkpoint,
)
from rljob_trainer.checkpoints.plan import storage_plan
from rljob_trainer.errors import PermanentError

log = logging.getLogger("rljob.checkpoints")

#: Set by the launcher's pre-flight for the ranks: the local checkpoint folder to resume from ("" = none).
RESUME_ENV = RESUME_CHECKPOINT_ENV
DENIED_HINT = (
    "check the bucket name and the trainer's credentials (spec.checkpoint.credentialsSecret, the pod's "
    "service account role, or AWS_* in the environment); retrying cannot help"
)


class StorageUnavailable(Exception):
    """No checkpoint location answered: a transient condition, so the launcher exits retryably."""


def check_locations(locations: list[Location], warnings: list[str] | None = None) -> list[Location]:
    """The reachable ones. A denied or missing bucket is a PermanentError naming the field."""
    reachable = []
    for loc in locations:
        try:
            loc.check_access()
            reachable.append(loc)
        except StorageError as e:
            if e.permanent:
                raise PermanentError(loc.where, f"{e} — {DENIED_HINT}") from e
            log.warning("checkpoint storage %s is unreachable (%s); trying the others", loc.uri, e)
            _note(warnings, f"checkpoint storage {loc.uri} is unreachable ({e}); trying the others")
    return reachable


def _note(warnings: list[str] | None, message: str) -> None:
    if warnings is not None:
        warnings.append(message)


def find_and_fetch(
    locations: list[Location], dest_root: Path, warnings: list[str] | None = None
) -> tuple[Path, Location] | None:
    """The newest complete checkpoint any location holds that downloads and verifies, as a local copy.

    At equal steps the earlier location (the primary) wins. A corrupt, partial or unreachable copy
    is skipped with a warning and the next candidate (older, or on a mirror) is tried; so is one whose
    manifest cannot be trusted (:attr:`Listing.corrupt`: malformed, a file name leaving its folder, a
    name other than its folder's).
    """
    candidates: list[tuple[int, int, Location, Listing, CheckpointInfo | str]] = []
    for idx, loc in enumerate(locations):
        try:
            listing = loc.listing()
        except StorageError as e:
            if e.permanent:
                raise PermanentError(loc.where, f"{e} — {DENIED_HINT}") from e
            log.warning("checkpoint storage %s is unreachable (%s); trying the others", loc.uri, e)
            _note(warnings, f"checkpoint storage {loc.uri} is unreachable ({e}); trying the others")
            continue
        candidates += [(info.step, -idx, loc, listing, info) for info in listing.complete]
        candidates += [(step_of(name) or 0, -idx, loc, listing, name) for name in listing.corrupt]
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    for _, _, loc, listing, info in candidates:
        if isinstance(info, str):  # a corrupt manifest: nothing to fetch, but people should hear of it
            _fallback(warnings, loc.child_uri(info), f"its {MANIFEST} cannot be trusted: {listing.corrupt[info]}")
            continue
        try:
            return loc.fetch(info, listing, dest_root), loc
        except (StorageError, CorruptCheckpoint) as e:
            _fallback(warnings, loc.child_uri(info.name), str(e))
    return None


def _fallback(warnings: list[str] | None, uri: str, why: str) -> None:
    """The warning a resume gives when it skips a checkpoint (an Event ``CheckpointFallback`` too)."""
    message = f"checkpoint {uri} failed verification or download, falling back to the previous complete one: {why}"
    log.warning("%s", message)
    _note(warnings, message)


def prepare_checkpoint_storage(cfg: Any) -> dict[str, str]:
    """Pre-flight for checkpoints on every node: check access to each location, then fetch the
    checkpoint to resume from into the local folder. Returns environment for the ranks.

    Raises PermanentError for a denied or missing bucket, StorageUnavailable when no location answers.
    """
    plan = storage_plan(cfg)
    if not plan.managed:
        return {}
    warnings: list[str] = []
    reachable = check_locations(plan.locations, warnings)
    if not reachable:
        raise StorageUnavailable(
            "no checkpoint location is reachable (" + ", ".join(loc.uri for loc in plan.locations) + "); "
            "retrying later"
        )
    plan.local_root.mkdir(parents=True, exist_ok=True)
    found = find_and_fetch(reachable, plan.local_root, warnings)
    resume = found[0] if found else None
    if found:
        log.warning("resume: using %s (verified local copy %s)", found[1].child_uri(found[0].name), found[0])
    if plan.remote_primary:
        discard_local_after(plan.local_root, resume)
    env = {RESUME_ENV: str(resume) if resume else ""}
    if warnings:
        # Rank 0 forwards these with its first heartbeat; the operator turns them into Events.
        env[RESUME_WARNINGS_ENV] = json.dumps(warnings[:10])
    return env


def discard_local_after(root: Path, resume: Path | None) -> None:
    """Remove staged checkpoints newer than the resume point: only object storage says what is complete,
    and training redoes those steps."""
    limit = step_of(resume.name) if resume is not None else None
    for child in root.iterdir() if root.is_dir() else []:
        step = step_of(child.name)
        newer = step is not None and (limit is None or step > limit)
        if child.is_dir() and (newer or child.name.startswith(".fetch-")):
            delete_checkpoint(child)


def resume_checkpoint(local_root: str | os.PathLike[str]) -> Path | None:
    """What a rank resumes from: the pre-flight's decision when it made one, else the newest verified
    local checkpoint (plain local storage)."""
    decided = os.environ.get(RESUME_ENV)
    if decided is None:
        return find_resume_checkpoint(local_root)
    return Path(decided) if decided else None


def find_resume_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint in a local folder whose files match its manifest, or None.

    A corrupt one (files that do not match, or a manifest that cannot be trusted) is skipped with a
    warning and the previous one is tried; one without a manifest is incomplete and skipped quietly.
    """
    folders = [c for c in Path(root).iterdir() if step_of(c.name) is not None] if Path(root).is_dir() else []
    for path in sorted(folders, key=lambda c: step_of(c.name) or 0, reverse=True):
        if not path.is_dir() or not (path / MANIFEST).exists():
            continue
        problems = verify_checkpoint(path)
        if not problems:
            return path
        log.warning("checkpoint %s failed verification, falling back: %s", path, "; ".join(problems[:3]))
    return None
