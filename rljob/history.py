"""``rljob history LOCATION``: the runs whose records lie under a checkpoint location, after the jobs are gone.

Every finished run leaves a record beside its checkpoints (``rljob_trainer.history``); this lists them
from a folder or an ``s3://`` prefix, at any depth (a runtime's storage prefix holds every job's
``<namespace>/<job>/runs/``). A file that is not a valid record is skipped and named on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def cmd_history(args: argparse.Namespace) -> int:
    from rljob_trainer.checkpoints.backends import location_for
    from rljob_trainer.history import read_records

    location = location_for(args.uri, where="rljob history", endpoint_url=args.endpoint_url, region=args.region)
    records, bad = read_records(location)
    if args.job:
        records = [(uri, r) for uri, r in records if r.job == args.job]
    for problem in bad:
        print(f"rljob: skipped {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps({"location": location.uri, "runs": [
            {"record": uri, **r.model_dump(mode="json", exclude_none=True)} for uri, r in records]}, indent=1))
        return 0
    print(f"{'STARTED':<20} {'JOB':<32} {'PHASE':<9} {'STEPS':>6} {'REWARD':>8} {'BEST':>8}  BEST CHECKPOINT")
    for _, r in records:
        print(_row(r))
    if not records:
        print(f"(no run records under {location.uri})", file=sys.stderr)
    return 0


def _row(r: Any) -> str:
    job = f"{r.namespace}/{r.job}" if r.namespace else r.job
    final, best = r.final.get("reward"), r.best.get("reward")
    where = r.best_checkpoint or r.latest_checkpoint
    return (f"{r.started.strftime('%Y-%m-%d %H:%M:%S'):<20} {job:<32} {r.phase:<9} {r.steps:>6} "
            f"{_num(final):>8} {_num(best):>8}  {where.location or where.name if where else '-'}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def add_history_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       storage_errors: Any) -> None:
    p = sub.add_parser(
        "history", help="list finished runs from the records beside their checkpoints (after the jobs are deleted)",
        description="Runs recorded under URI: s3://bucket/prefix (credentials from the AWS_* environment or the "
        "instance/service-account role) or a folder, at any depth: a runtime's storage prefix lists every job's runs.",
    )
    p.add_argument("uri", help="s3://bucket/prefix or a folder (a job's checkpoint location or any prefix above it)")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="S3 region (default: AWS_REGION)")
    p.add_argument("--job", help="only the runs of the job with this name")
    p.add_argument("--json", action="store_true", help="machine-readable output: every record in full")
    p.set_defaults(func=storage_errors(cmd_history))
