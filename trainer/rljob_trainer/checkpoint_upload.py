"""Rank 0's background uploader: each saved checkpoint is sealed, copied to every location, verified,
made complete (manifest), pointed at (``latest``) and retention is applied there — all in a
thread, so training never waits on the network (only at the very end, bounded).

A failed location is retried with exponential backoff, then skipped for that checkpoint; a location
that failed its last checkpoint gets one attempt per checkpoint until it recovers (an outage does not
build a backlog), and the newest checkpoint gets a last full round of retries when training ends.
Failures count in ``rljob_trainer_checkpoint_upload_failures_total``; a checkpoint complete on the
primary sets ``rljob_trainer_last_checkpoint_upload_timestamp_seconds``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rljob_trainer import checkpoints as ck
from rljob_trainer.checkpoint_store import (
    CheckpointInfo,
    Listing,
    LocalLocation,
    Location,
    RetentionPolicy,
    S3Location,
    StorageError,
    TransferSettings,
    best_of,
)
from rljob_trainer.checkpoints import MANIFEST

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
    """Rank 0's background uploader: for each saved checkpoint, seal it (when ``seal``), then publish
    it to every location in order (files, verify, manifest, ``latest``, retention), retrying a failed
    location ``retries`` times with exponential backoff before skipping it for that checkpoint.

    A location that failed its last checkpoint gets one attempt per checkpoint until it recovers, so
    an outage does not build a backlog; :meth:`close` gives the newest checkpoint a last full round
    where it is missing. With ``staging`` (a remote primary), the local folder is trimmed to the newest
    checkpoint and those still pending. Training only waits in :meth:`close`, bounded.
    """

    def __init__(
        self,
        locations: list[Location],
        policy: RetentionPolicy,
        *,
        transfer: TransferSettings,
        seal: bool,
        staging: Path | None = None,
        protect: set[str] | None = None,
        retries: int = 3,
        backoff: float = 2.0,
        metrics: Any = None,
        heartbeat: Any = None,
    ) -> None:
        self.locations = locations
        self.policy = policy
        self.transfer = transfer
        self.seal = seal
        self.staging = staging
        self.protect = set(protect or ())
        self.retries = retries
        self.backoff = backoff
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.failures = 0
        self.listings: dict[int, Listing] = {}
        self._healthy = [True] * len(locations)
        self._newest: tuple[_Job, dict[str, Any]] | None = None  # the last job and its manifest
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rljob-checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, ckpt_dir: Path, step: int, metrics: dict[str, float]) -> None:
        """Hand over a saved checkpoint (returns at once)."""
        with self._lock:
            self._pending.append(ckpt_dir.name)
        self._queue.put(_Job(Path(ckpt_dir), step, dict(metrics)))

    def pending(self) -> set[str]:
        with self._lock:
            return set(self._pending)

    def close(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for pending uploads; True when all finished."""
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
            if isinstance(loc, S3Location):
                with contextlib.suppress(Exception):
                    _ = loc.client
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
        if self.seal:
            ck.seal_checkpoint(job.ckpt_dir, job.step, job.metrics, part_size=self.transfer.part_size)
        manifest: dict[str, Any] = json.loads((job.ckpt_dir / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("part_size") != self.transfer.part_size:  # sealed without ETags (a local primary)
            for rel, meta in manifest["files"].items():
                part = ck.s3_part_size(self.transfer.part_size, meta["size"])
                meta["etag"] = meta["md5"] if part is None else ck.file_digests(job.ckpt_dir / rel, part)[1]
            manifest["part_size"] = self.transfer.part_size
        return manifest

    def _publish(self, job: _Job) -> None:
        manifest = self._manifest(job)
        self._newest = (job, manifest)
        for i, loc in enumerate(self.locations):
            self._publish_to(i, loc, job, manifest)
        if self.staging is not None:
            # Keep the newest staged checkpoint (a fast resume after a container restart) and pending ones.
            ck.apply_retention(self.staging, keep_last=1, protect=self.pending() | self.protect)
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
        loc, latest, best = self.state()
        if latest is None:
            return
        if self.metrics is not None:
            self.metrics.last_checkpoint.set(latest.step)
        if self.heartbeat is not None:
            self.heartbeat.checkpoint = latest.name
            self.heartbeat.best_checkpoint = best.name if best else None
            self.heartbeat.best_metric = best.metrics.get(self.policy.best_metric) if best else None

    def summary_fields(self) -> dict[str, Any]:
        loc, latest, best = self.state()
        listing = self.listings.get(self.locations.index(loc)) if loc is not None else None
        return {
            "checkpoints": [c.name for c in listing.complete] if listing else [],
            "latest_checkpoint": checkpoint_ref(latest, loc),
            "best_checkpoint": checkpoint_ref(best, loc, self.policy.best_metric),
            "checkpoint_upload_failures": self.failures,
        }


def local_summary_fields(root: str | os.PathLike[str], best_metric: str) -> dict[str, Any]:
    """summary.json's checkpoint fields for checkpoints kept in a local folder."""
    complete = ck.complete_checkpoints(root)
    loc = LocalLocation(root)
    return {
        "checkpoints": [c.name for c in complete],
        "latest_checkpoint": checkpoint_ref(complete[-1] if complete else None, loc),
        "best_checkpoint": checkpoint_ref(best_of(complete, best_metric), loc, best_metric),
    }
