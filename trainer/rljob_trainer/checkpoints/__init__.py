"""Checkpoints a resume can trust, wherever they are kept: one pipeline for local folders and S3.

A checkpoint is a folder ``checkpoint-<step>`` written by the HF Trainer. It counts only once
``rljob-manifest.json`` lists every file with its size and MD5 (and, for object storage, the
ETag S3 will report); the ``latest`` pointer moves after it. Every location — the folder the
Trainer saves into, a bucket, a mirror — follows that protocol through the same code:

* :mod:`.manifest` — the manifest: checksums, building, reading, verifying a folder against it.
* :mod:`.retention` — keepLast + keepBest as pure functions (what a location keeps).
* :mod:`.locations` — :class:`Location` (publish, list, verify, fetch, ``apply_retention``: the one
  place retention is applied) and :class:`LocalLocation`; :mod:`.s3` — :class:`S3Location`.
* :mod:`.backends` — a ``Location`` factory per storage backend (the backends' descriptors are
  ``rljob_contract.plugins.storage``, keyed by scheme): which location a URI opens; models and datasets too.
* :mod:`.plan` — a run's primary, mirrors and the folder the Trainer saves into.
* :mod:`.publisher` — rank 0's pipeline: seal, copy, verify, manifest, ``latest``, retention.
* :mod:`.resume` — the launcher's pre-flight (access checks, fetch) and what each rank resumes from.
* :mod:`.compare` — what ``rljob checkpoints verify`` compares.

The names below are the package's public API, importable from ``rljob_trainer.checkpoints``.
"""

from rljob_trainer.checkpoints.backends import location_for
from rljob_trainer.checkpoints.compare import FileCheck, compare_checkpoint, split_checkpoint_uri
from rljob_trainer.checkpoints.etags import multipart_etag, s3_part_size
from rljob_trainer.checkpoints.locations import (
    CorruptCheckpoint,
    Listing,
    LocalLocation,
    Location,
    StorageError,
    seal_checkpoint,
)
from rljob_trainer.checkpoints.manifest import (
    CHECKPOINT_RE,
    LATEST,
    MANIFEST,
    CheckpointInfo,
    InvalidManifest,
    atomic_write_text,
    build_manifest,
    complete_checkpoints,
    delete_checkpoint,
    file_digests,
    file_md5,
    info_from_manifest,
    listing_problems,
    load_manifest,
    parse_latest,
    parse_manifest,
    read_manifest,
    step_of,
    verify_checkpoint,
)
from rljob_trainer.checkpoints.plan import MIRROR_ENV_PREFIX, StoragePlan, storage_plan
from rljob_trainer.checkpoints.publisher import CheckpointPublisher, checkpoint_ref
from rljob_trainer.checkpoints.resume import (
    RESUME_ENV,
    StorageUnavailable,
    find_resume_checkpoint,
    prepare_checkpoint_storage,
    resume_checkpoint,
)
from rljob_trainer.checkpoints.retention import RetentionPolicy, best_of, retention_keep, retention_plan
from rljob_trainer.checkpoints.s3 import S3Location, TransferSettings, etag_is_opaque

__all__ = [
    "CHECKPOINT_RE",
    "LATEST",
    "MANIFEST",
    "MIRROR_ENV_PREFIX",
    "RESUME_ENV",
    "CheckpointInfo",
    "CheckpointPublisher",
    "CorruptCheckpoint",
    "FileCheck",
    "InvalidManifest",
    "Listing",
    "LocalLocation",
    "Location",
    "RetentionPolicy",
    "S3Location",
    "StoragePlan",
    "StorageError",
    "StorageUnavailable",
    "TransferSettings",
    "atomic_write_text",
    "best_of",
    "build_manifest",
    "checkpoint_ref",
    "compare_checkpoint",
    "complete_checkpoints",
    "delete_checkpoint",
    "etag_is_opaque",
    "file_digests",
    "file_md5",
    "find_resume_checkpoint",
    "info_from_manifest",
    "listing_problems",
    "load_manifest",
    "location_for",
    "multipart_etag",
    "parse_latest",
    "parse_manifest",
    "prepare_checkpoint_storage",
    "read_manifest",
    "resume_checkpoint",
    "retention_keep",
    "retention_plan",
    "s3_part_size",
    "seal_checkpoint",
    "split_checkpoint_uri",
    "step_of",
    "storage_plan",
    "verify_checkpoint",
]
