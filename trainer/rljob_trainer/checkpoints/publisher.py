"""Rank 0's checkpoint pipeline: every checkpoint the HF Trainer saves is sealed where it was saved,
copied to every other location, verified, made complete there (manifest), pointed at (``latest``),
and retention is applied at each location — by the same :class:`~rljob_trainer.checkpoints.locations.Location`
methods whether the location is a folder or a bucket.

Copies run in a thread, so training never waits on the network (only at the very end, bounded).
A failed location is retried with exponential backoff, then skipped for that checkpoint; a location
that failed its last checkpoint gets one attempt per checkpoint until it recovers (an outage does not
build a backlog), and the newest checkpoint gets a last full round of retries when training ends.
Failures count in ``rljob_trainer_checkpoint_upload_failures_total``; a checkpoint complete on the
first location copied to sets ``rljob_trainer_last_checkpoint_upload_timestamp_seconds``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rljob_trainer.checkpoints.etags import s3_part_size
from rljob_trainer.checkpoints.locations import Listing, Location, StorageError
from rljob_trainer.checkpoints.manifest import (
    MANIFEST,
    CheckpointInfo,
    build_manifest,
    file_digests,
)
from rljob_trainer.checkpoints.plan import StoragePlan
from rljob_trainer.checkpoints.retention import RetentionPolicy, best_of
from rljob_trainer.checkpoints.s3 import TransferSettings

#: The staging folder in front of object storage keeps its newest checkpoint (a fast resume after
#: a container restart) and those still being uploaded.
STAGING_POLICY = RetentionPolicy(keep_last=1)

log = logging.getLogger("rljob.checkpoints")


def checkpoint_ref(info: CheckpointInfo | None, location: Location | None, metric: str | None = None) -> Any:
    """How summary.json names a checkpoint."""
    if info is None:
        return None
    ref: dict[str, Any] = {"name": info.name, "step": info.step, "metrics": info.metrics}
    if location is not None:
        ref["location"] = location.child_uri(info.name)
    if metric is not None:
        ref["metric"] = metric
        ref["value"] = info.metrics.get(metric)
    return ref


@dataclass
class _Job:
    ckpt_dir: Path
    step: int
    metrics: dict[str, float]


class CheckpointPublisher:
    """Rank 0's checkpoint pipeline for the folder the HF Trainer saves into (``folder``) and the
    locations each checkpoint is copied to (``locations``, in order), all under one ``policy``.

    With ``folder_is_primary`` (a local primary), :meth:`save` seals the checkpoint in the folder
    (manifest, ``latest``) and applies retention there — keeping checkpoints still being copied —
    before training goes on, as a checkpoint counts once it is sealed; the copies to ``locations``
    (the mirrors) follow in the background. Otherwise (object storage), :meth:`save` returns at once;
    the background thread seals the staging copy (with the ETags S3 will report), publishes it to
    every location, and trims the folder to its newest checkpoint and those still pending.

    A location is retried ``retries`` times with exponential backoff before it is skipped for that
    checkpoint; one that failed its last checkpoint gets one attempt per checkpoint until it
    recovers, so an outage does not build a backlog; :meth:`close` gives the newest checkpoint a
    last full round where it is missing. Training only waits in :meth:`close`, bounded.
    """

    def __init__(
        self,
        folder: Location,
        locations: list[Location],
        policy: RetentionPolicy,
        *,
        transfer: TransferSettings,
        folder_is_primary: bool,
        protect: set[str] | None = None,
        retries: int = 3,
        backoff: float = 2.0,
        metrics: Any = None,
        heartbeat: Any = None,
        base_model: dict[str, str] | None = None,
    ) -> None:
        self.folder = folder
        self.locations = locations
        self.policy = policy
        self.transfer = transfer
        self.folder_is_primary = folder_is_primary
        self.protect = set(protect or ())
        self.retries = retries
        self.backoff = backoff
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.base_model = base_model  # recorded in every manifest (adapter checkpoints)
        self.failures = 0
        self.listings: dict[int, Listing] = {}
        self._healthy = [True] * len(locations)
        self._newest: tuple[_Job, dict[str, Any]] | None = None  # the last job and its manifest
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if locations:
            self._thread = threading.Thread(target=self._run, name="rljob-checkpoint-upload", daemon=True)
            self._thread.start()

    @classmethod
    def for_plan(cls, plan: StoragePlan, policy: RetentionPolicy, **kwargs: Any) -> CheckpointPublisher:
        """The publisher of a run's :class:`StoragePlan`: its folder, the locations copied to, its transfer settings."""
        return cls(plan.folder, plan.publish_to, policy, transfer=plan.transfer,
                   folder_is_primary=not plan.remote_primary, **kwargs)

    def save(self, ckpt_dir: Path, step: int, metrics: dict[str, float]) -> None:
        """A checkpoint the HF Trainer has just saved (every rank done): seal it now when the folder is
        the primary, and hand it to the background thread for the other locations."""
        if self.folder_is_primary:
            self._seal_in_folder(Path(ckpt_dir), step, metrics)
        if self.locations:
            self.submit(Path(ckpt_dir), step, metrics)

    def _seal_in_folder(self, ckpt_dir: Path, step: int, metrics: dict[str, float]) -> None:
        """Seal a checkpoint in the primary folder and apply retention there (the calling thread)."""
        self.folder.publish(ckpt_dir, build_manifest(ckpt_dir, step, metrics, base_model=self.base_model))
        deleted, listing = self.folder.apply_retention(self.policy, self.pending() | self.protect)
        if deleted:
            log.info("checkpoint retention at %s deleted %s", self.folder.uri, ", ".join(deleted))
        self._announce(ckpt_dir.name, step, best_of(listing.complete, self.policy.best_metric))

    def submit(self, ckpt_dir: Path, step: int, metrics: dict[str, float]) -> None:
        """Queue a saved checkpoint for the background thread (returns at once)."""
        if self._thread is None:
            raise RuntimeError("CheckpointPublisher.submit: no locations to publish to")
        with self._lock:
            self._pending.append(ckpt_dir.name)
        self._queue.put(_Job(Path(ckpt_dir), step, dict(metrics)))

    def pending(self) -> set[str]:
        """Checkpoints queued or being copied."""
        with self._lock:
            return set(self._pending)

    def close(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for pending uploads; True when all finished."""
        if self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%d checkpoint upload(s) still pending after %.0fs; abandoning them (an unfinished "
                        "upload has no manifest and is ignored)", len(self.pending()), timeout)
            return False
        if 0 not in self.listings:  # nothing published this run (a resume at the last step): look once
            with contextlib.suppress(StorageError):
                self.listings[0] = self.locations[0].listing()
        return True

    def _run(self) -> None:
        for loc in self.locations:  # build clients now, not on the first checkpoint's clock
            loc.warm_up()
        while True:
            job = self._queue.get()
            if job is None:
                self._retry_newest()
                return
            try:
                self._publish(job)
            except Exception as e:  # never let the uploader die: the next checkpoint may succeed
                log.warning("checkpoint %s: not published: %s: %s", job.ckpt_dir.name, type(e).__name__, e)
            finally:
                with self._lock:
                    self._pending.remove(job.ckpt_dir.name)

    def _manifest(self, job: _Job) -> dict[str, Any]:
        if not self.folder_is_primary:  # sealed here, off the training thread, with the ETags S3 will report
            self.folder.publish(job.ckpt_dir, build_manifest(job.ckpt_dir, job.step, job.metrics,
                                                             part_size=self.transfer.part_size,
                                                             base_model=self.base_model))
        manifest: dict[str, Any] = json.loads((job.ckpt_dir / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("part_size") != self.transfer.part_size:  # sealed without ETags (a local primary)
            for rel, meta in manifest["files"].items():
                part = s3_part_size(self.transfer.part_size, meta["size"])
                meta["etag"] = meta["md5"] if part is None else file_digests(job.ckpt_dir / rel, part)[1]
            manifest["part_size"] = self.transfer.part_size
        return manifest

    def _publish(self, job: _Job) -> None:
        manifest = self._manifest(job)
        self._newest = (job, manifest)
        for i, loc in enumerate(self.locations):
            self._publish_to(i, loc, job, manifest)
        if not self.folder_is_primary:
            self.folder.apply_retention(STAGING_POLICY, self.pending() | self.protect)
        self._report()

    def _retry_newest(self) -> None:
        """At the end of training, give the newest checkpoint another full round of retries at every
        location that missed it (the endpoint may be back, and the final checkpoint matters most)."""
        if self._newest is None or not self._newest[0].ckpt_dir.is_dir():
            return
        job, manifest = self._newest
        retried = False
        for i, loc in enumerate(self.locations):
            if not self._healthy[i]:
                self._healthy[i] = True
                retried |= self._publish_to(i, loc, job, manifest)
        if retried:
            self._report()

    def _publish_to(self, i: int, loc: Location, job: _Job, manifest: dict[str, Any]) -> bool:
        attempts = 1 + (self.retries if self._healthy[i] else 0)
        for attempt in range(attempts):
            try:
                loc.publish(job.ckpt_dir, manifest)
                deleted, self.listings[i] = loc.apply_retention(self.policy, self.protect)
                if deleted:
                    log.info("checkpoint retention at %s deleted %s", loc.uri, ", ".join(deleted))
                self._healthy[i] = True
                if i == 0 and self.metrics is not None:
                    self.metrics.last_checkpoint_upload.set(time.time())
                return True
            except Exception as e:
                self.failures += 1
                if self.metrics is not None:
                    self.metrics.checkpoint_upload_failures.inc()
                last = attempt + 1 == attempts
                delay = min(60.0, self.backoff * 2**attempt)
                log.warning("checkpoint %s: upload to %s failed (attempt %d of %d)%s: %s", job.ckpt_dir.name,
                            loc.uri, attempt + 1, attempts,
                            "; skipped there" if last else f"; retrying in {delay:.0f}s", e)
                if not last:
                    time.sleep(delay)
        self._healthy[i] = False
        return False

    def state(self) -> tuple[Location | None, CheckpointInfo | None, CheckpointInfo | None]:
        """(location, latest, best) from the highest-priority location published to."""
        for i, loc in enumerate(self.locations):
            listing = self.listings.get(i)
            if listing is not None and listing.complete:
                return loc, listing.complete[-1], best_of(listing.complete, self.policy.best_metric)
        return None, None, None

    def _report(self) -> None:
        """Announce the primary's state after a background publish. A primary folder was announced when
        the checkpoint was sealed there; a mirror's state (which lags) must not overwrite it."""
        if self.folder_is_primary:
            return
        loc, latest, best = self.state()
        if latest is not None:
            self._announce(latest.name, latest.step, best)

    def _announce(self, latest: str, step: int, best: CheckpointInfo | None) -> None:
        """The newest and best checkpoints, to Prometheus and the operator (with the next heartbeat)."""
        if self.metrics is not None:
            self.metrics.last_checkpoint.set(step)
        if self.heartbeat is not None:
            self.heartbeat.checkpoint = latest
            self.heartbeat.best_checkpoint = best.name if best else None
            self.heartbeat.best_metric = best.metrics.get(self.policy.best_metric) if best else None

    def summary_fields(self) -> dict[str, Any]:
        """summary.json's checkpoint fields, from the primary: what it holds, latest, best, and the
        failed copies (absent when nothing is copied anywhere)."""
        if self.folder_is_primary:
            complete = self.folder.listing().complete
            fields = {
                "checkpoints": [c.name for c in complete],
                "latest_checkpoint": checkpoint_ref(complete[-1] if complete else None, self.folder),
                "best_checkpoint": checkpoint_ref(best_of(complete, self.policy.best_metric), self.folder,
                                                  self.policy.best_metric),
            }
            if self.locations:
                fields["checkpoint_upload_failures"] = self.failures
            return fields
        loc, latest, best = self.state()
        listing = self.listings.get(self.locations.index(loc)) if loc is not None else None
        return {
            "checkpoints": [c.name for c in listing.complete] if listing else [],
            "latest_checkpoint": checkpoint_ref(latest, loc),
            "best_checkpoint": checkpoint_ref(best, loc, self.policy.best_metric),
            "checkpoint_upload_failures": self.failures,
        }

