"""The ``rljob`` command line.

* ``rljob train MANIFEST`` — run the job on this machine (CPU: gloo), same manifest as the cluster.
* ``rljob validate MANIFEST...`` — offline validation; non-zero exit with field paths on error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from rljob_operator.api import ManifestError, load_job, load_jobs

EXIT_PERMANENT = 78  # mirrors rljob_trainer.errors without importing the trainer's runtime


def cmd_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.manifests:
        try:
            jobs = load_jobs(path)
        except ManifestError as e:
            failed = True
            print(str(e), file=sys.stderr)
            continue
        for job in jobs:
            print(f"{path}: {job.kind}/{job.metadata.name}: ok")
    return 1 if failed else 0


def cmd_train(args: argparse.Namespace) -> int:
    from rljob_trainer.errors import report_fatal

    try:
        job = load_job(args.manifest)
    except ManifestError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    from rljob_trainer.launch import NodeSettings, launch

    output = args.output or os.path.join("runs", job.metadata.name)
    cfg = job.trainer_config(output_dir=output)
    nproc = args.nproc or job.world_size
    if nproc != job.world_size:
        print(
            f"rljob: running {nproc} processes instead of the manifest's {job.world_size}; "
            "the global batch changes accordingly",
            file=sys.stderr,
        )
        cfg = cfg.model_copy(update={"world_size": nproc})
    node = NodeSettings.local(nproc, run_id=job.metadata.name)
    env = {"RLJOB_METRICS_PORT": str(args.metrics_port)}
    print(f"rljob: training {job.metadata.name} with {nproc} process(es); output in {output}", flush=True)
    code = launch(cfg, node, extra_env=env)
    summary_path = os.path.join(output, "summary.json")
    if code == 0 and os.path.exists(summary_path):
        with open(summary_path, encoding="utf-8") as f:
            s = json.load(f)
        print(
            f"rljob: done: {s['steps']} steps, reward {s['reward_first']:.3f} -> {s['reward_last']:.3f}, "
            f"{s['wall_seconds']:.1f}s; summary in {summary_path}"
        )
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljob", description="RL post-training of language models on Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="run a manifest's job on this machine")
    p.add_argument("manifest")
    p.add_argument("--output", help="output folder (default: runs/<job name>)")
    p.add_argument("--nproc", type=int, help="processes to start (default: replicas × procsPerWorker)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port on rank 0 (0: any free port)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("validate", help="validate manifests offline (a GitOps pre-commit hook)")
    p.add_argument("manifests", nargs="+")
    p.set_defaults(func=cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
