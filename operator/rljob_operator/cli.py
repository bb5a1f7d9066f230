"""The ``rljob`` command line.

* ``rljob train MANIFEST`` — run the job on this machine (CPU: gloo), same manifest as the cluster.
* ``rljob validate MANIFEST...`` — offline validation; non-zero exit with field paths on error.
* ``rljob crd`` — print the RLTrainingJob CustomResourceDefinition (generated from the models).
* ``rljob operator`` — run the operator (kopf watches, reconcile, status API, metrics).
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


def cmd_crd(args: argparse.Namespace) -> int:
    from rljob_operator.crd import crd_yaml

    text = crd_yaml()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    from rljob_operator.runner import run
    from rljob_operator.settings import OperatorSettings

    settings = OperatorSettings.from_env(
        kubeconfig=args.kubeconfig,
        namespaces=args.namespace or None,
        status_port=args.status_port,
        status_url=args.status_url,
        metrics_port=args.metrics_port,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        tls_secret=args.tls_secret,
        leader_elect=args.leader_elect,
        identity=args.identity,
        operator_namespace=args.operator_namespace,
        log_level=args.log_level,
    )
    return run(settings)


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

    p = sub.add_parser("crd", help="print the RLTrainingJob CRD (generated from the API models)")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser(
        "operator",
        help="run the operator",
        description="Run one operator replica. Flags override RLJOB_OPERATOR_* environment variables "
        "(see rljob_operator.settings).",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--namespace", action="append", help="watch only this namespace (repeatable; default: all)")
    p.add_argument("--status-port", type=int, help="status API HTTPS port (default 8443)")
    p.add_argument("--status-url", help="base URL trainers send heartbeats to")
    p.add_argument("--metrics-port", type=int, help="/metrics, /healthz, /readyz port (default 8080)")
    p.add_argument("--tls-cert-file", help="status API certificate (default: self-signed)")
    p.add_argument("--tls-key-file", help="status API private key")
    p.add_argument("--tls-secret", help="NAMESPACE/NAME: share one self-signed certificate between replicas")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                   help="hold a Lease so only one replica reconciles (default: on)")
    p.add_argument("--operator-namespace", help="namespace of the operator's Lease, Secret and Service "
                   "(default: its pod's, else the first --namespace)")
    p.add_argument("--identity", help="this replica's Lease holder identity (default: hostname-random)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    p.set_defaults(func=cmd_operator)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
