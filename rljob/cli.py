"""The ``rljob`` command line.

* ``rljob train MANIFEST [--runtime RUNTIME]`` — run the job on this machine (CPU: gloo), same manifest as the
  cluster; with a runtime, within its bounds and with its checkpoint storage.
* ``rljob validate MANIFEST... [--runtime RUNTIME]`` — offline validation of jobs, experiments and runtimes;
  with ``--runtime``, each job also against the runtime it would run on; non-zero exit with field paths on error.
* ``rljob crd`` — print the RLTrainingJob CustomResourceDefinition (generated from the models).
* ``rljob experiment EXPERIMENT`` — run an RLExperiment's trials (A/B test or search) on this machine.
* ``rljob operator`` — run the operator (watches, reconcile, status API, metrics).
* ``rljob checkpoints list|verify|prune URI`` — inspect, verify (local vs remote checksums) and prune
  checkpoints on object storage (``s3://bucket/prefix``) or in a folder.
* ``rljob evaluate CHECKPOINT --config MANIFEST`` — a checkpoint on the manifest's evaluation prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rljob_contract.job import KIND as JOB
from rljob_contract.job import ManifestError, load_job, parse_job, read_documents
from rljob_contract.pod import EXIT_PERMANENT, METRICS_PORT_ENV
from rljob_contract.spec import DEFAULT_BEST_METRIC

from rljob.history import add_history_parser

if TYPE_CHECKING:
    from rljob_contract.runtime import TrainingRuntime
    from rljob_operator.settings import OperatorSettings
    from rljob_trainer.checkpoints.locations import Location

#: Packages of the optional extras (`pip install 'rljob[trainer]'`): a base install (pydantic and
#: PyYAML only) runs validate and crd; other commands name the extra they need.
EXTRA_OF_MODULE = {
    **dict.fromkeys(("torch", "transformers", "trl", "datasets", "accelerate", "tokenizers"), "trainer"),
    **dict.fromkeys(("kubernetes", "aiohttp", "cryptography", "orjson"), "operator"),
    **dict.fromkeys(("boto3", "botocore", "prometheus_client"), "trainer] or rljob[operator"),
    **dict.fromkeys(("optuna", "scipy"), "trainer] or rljob[operator"),  # experiments: search, statistics
    "matplotlib": "trainer",
}


def _validate_file(path: str, runtimes: list[TrainingRuntime] | None = None) -> list[str]:
    """``kind/name`` of every RLTrainingJob, RLExperiment and runtime in a file; ManifestError on the first bad one
    (with ``runtimes``, a job outside the bounds of the runtime it would run on is one)."""
    from rljob_contract.experiment import KIND as EXPERIMENT
    from rljob_contract.experiment import parse_experiment
    from rljob_contract.runtime import RUNTIME_KINDS, parse_runtime

    parsers: dict[str, Callable[[Any, str], Any]] = {JOB: parse_job, EXPERIMENT: parse_experiment,
                                                     **dict.fromkeys(RUNTIME_KINDS, parse_runtime)}
    found = []
    for document in read_documents(path):
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind in parsers:
            parsed = parsers[kind](document, path)
            if kind == JOB and runtimes is not None:
                _check_on_runtime(parsed, runtimes, path)
            found.append(f"{kind}/{parsed.metadata.name}")
        elif kind is None:
            parse_job(document, path)  # names what is missing
    if not found:
        raise ManifestError(path, [f"no {JOB}, {EXPERIMENT}, {', '.join(sorted(RUNTIME_KINDS))} document found"])
    return found


def runtime_for(job: Any, runtimes: list[TrainingRuntime], source: str) -> TrainingRuntime:
    """The runtime among ``runtimes`` (a ``--runtime`` file's) that ``job`` runs on: the one its runtimeRef
    names, else the default one, else the only one; ManifestError naming the job's field when none is."""
    from rljob_contract.runtime import RuntimeKind, default_runtime

    ref = job.spec.runtime_ref
    if ref is not None:
        match = [r for r in runtimes if r.kind == ref.kind and r.metadata.name == ref.name]
        if not match:
            given = ", ".join(r.ref for r in runtimes)
            raise ManifestError(source, [f"spec.runtimeRef: names {ref.kind}/{ref.name}, which --runtime does not "
                                         f"hold (it holds {given})"])
        return match[0]
    chosen = (default_runtime(runtimes, RuntimeKind.namespaced) or default_runtime(runtimes, RuntimeKind.cluster)
              or (runtimes[0] if len(runtimes) == 1 else None))
    if chosen is None:
        raise ManifestError(source, ["spec.runtimeRef: unset, and --runtime holds several runtimes, none marked "
                                     "default: name one in spec.runtimeRef"])
    return chosen


def _check_on_runtime(job: Any, runtimes: list[TrainingRuntime], source: str) -> None:
    from rljob_contract.runtime import problems

    runtime = runtime_for(job, runtimes, source)
    found = problems(job, runtime)
    if found:
        raise ManifestError(source, [f"{JOB}/{job.metadata.name} on {runtime.ref}: {p}" for p in found])


def _load_runtime_file(path: str | None) -> list[TrainingRuntime] | None:
    """The runtimes of ``--runtime`` (None: not given); ManifestError naming the file when it holds none."""
    if path is None:
        return None
    from rljob_contract.runtime import load_runtimes

    return load_runtimes(path)


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        runtimes = _load_runtime_file(args.runtime)
    except ManifestError as e:
        print(str(e), file=sys.stderr)
        return 1
    failed = False
    for path in args.manifests:
        try:
            found = _validate_file(path, runtimes)
        except ManifestError as e:
            failed = True
            print(str(e), file=sys.stderr)
            continue
        for what in found:
            print(f"{path}: {what}: ok")
    return 1 if failed else 0


def cmd_train(args: argparse.Namespace) -> int:
    from rljob_trainer.errors import report_fatal

    try:
        job = load_job(args.manifest)
        runtimes = _load_runtime_file(args.runtime)
        cfg_of = _trainer_config_on(job, runtimes, args.manifest)
    except ManifestError as e:
        report_fatal(str(e))
        return EXIT_PERMANENT
    from rljob_trainer.launch import NodeSettings, launch

    output = args.output or os.path.join("runs", job.metadata.name)
    cfg = cfg_of(output)
    nproc = args.nproc or job.world_size
    if nproc != job.world_size:
        print(
            f"rljob: running {nproc} processes instead of the manifest's {job.world_size}; "
            "the global batch changes accordingly",
            file=sys.stderr,
        )
        cfg = cfg.model_copy(update={"world_size": nproc})
    node = NodeSettings.local(nproc, run_id=job.metadata.name)
    env = {METRICS_PORT_ENV: str(args.metrics_port)}
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
        for report in s.get("health") or []:  # the health signals that tripped (docs/guides/health.md)
            print(f"rljob: health warning: {report['message']}")
    if code == 0:
        _write_dashboard(Path(output))
    return code


def _write_dashboard(output: Path) -> None:
    """dashboard.png beside reward_curve.png: the dashboard's key panels from the run's metrics log."""
    from rljob_contract.pod import METRICS_LOG

    from rljob.dashboard import write_dashboard

    picture = write_dashboard(output, METRICS_LOG)
    if picture is not None:
        print(f"rljob: the dashboard's key panels in {picture}")


def _trainer_config_on(job: Any, runtimes: list[TrainingRuntime] | None, source: str) -> Callable[[str], Any]:
    """output folder → the trainer config of ``job``: on no runtime (checkpoints in the output folder), or on the
    runtime of ``runtimes`` it runs on (its checkpoint storage; ManifestError when the job is outside its bounds)."""
    if runtimes is None:
        return lambda output: job.trainer_config(output)
    from rljob_contract.runtime import problems, resolve

    runtime = runtime_for(job, runtimes, source)
    found = problems(job, runtime)
    if found:
        raise ManifestError(source, [f"on {runtime.ref}: {p}" for p in found])
    resolved = resolve(job, runtime)
    sources = list(resolved.sources) if resolved.sources is not None else None
    return lambda output: job.trainer_config(output, resolved.checkpoint, sources)


def cmd_experiment(args: argparse.Namespace) -> int:
    """Run an RLExperiment's trials on this machine (``rljob.experiment``)."""
    from rljob_contract.experiment import load_experiment

    try:
        experiment = load_experiment(args.manifest)
    except ManifestError as e:
        print(str(e), file=sys.stderr)
        return EXIT_PERMANENT
    if args.parallel is not None and args.parallel < 1:
        print("rljob: error: --parallel must be at least 1", file=sys.stderr)
        return 2
    from rljob.experiment import run_experiment

    out = Path(args.output or os.path.join("runs", experiment.metadata.name))
    return run_experiment(experiment, out, args.parallel)


def cmd_crd(args: argparse.Namespace) -> int:
    from rljob_operator.crd import CRD_YAML

    text = CRD_YAML[args.kind]()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    from rljob_operator.cluster.runner import run

    return run(operator_settings(args))


def operator_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> OperatorSettings:
    """The settings of ``rljob operator``: defaults ← ``RLJOB_OPERATOR_*`` (``environ``) ← its flags."""
    from rljob_operator.settings import OperatorSettings, setting_infos

    overrides = {name: getattr(args, _dest(info.flag.name)) for name, info in setting_infos().items() if info.flag}
    return OperatorSettings.from_env(environ, **overrides)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _flag_kwargs(kind: str) -> dict[str, Any]:
    """argparse arguments of a setting's flag, by the setting's type: lists repeat, booleans have --no-."""
    if kind.startswith("list"):
        return {"action": "append"}
    if kind == "bool":
        return {"action": argparse.BooleanOptionalAction, "default": None}
    return {"type": {"int": int, "float": float}[kind]} if kind in ("int", "float") else {}


def add_operator_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``rljob operator``: a flag for every setting that declares one (``rljob_operator.settings``)."""
    from rljob_operator.settings import OperatorSettings, setting_infos

    p = sub.add_parser(
        "operator",
        help="run the operator",
        description="Run one operator replica. Flags override RLJOB_OPERATOR_* environment variables "
        "(see rljob_operator.settings).",
    )
    kinds = {f.name: str(f.type) for f in dataclasses.fields(OperatorSettings)}
    for name, info in setting_infos().items():
        if info.flag:
            p.add_argument(info.flag.name, help=info.flag.help, **_flag_kwargs(kinds[name]))
    p.set_defaults(func=cmd_operator)


class DeprecatedSpelling(argparse.Action):
    """An old spelling of a flag: still accepted (scripts keep working), with a warning naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=f"deprecated spelling of {new}", **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"rljob: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_output_flag(p: argparse.ArgumentParser, help: str, deprecated: tuple[str, ...] = ()) -> None:
    """``-o/--output``, the one spelling of every command's output (and its old ``deprecated`` spellings)."""
    p.add_argument("-o", "--output", help=help)
    for old in deprecated:
        p.add_argument(old, dest="output", metavar="OUTPUT", action=DeprecatedSpelling, new="--output")


def _checkpoint_root(args: argparse.Namespace) -> tuple[Location, str | None]:
    """(location, single checkpoint name or None) for a checkpoints command's URI."""
    from rljob_trainer.checkpoints.backends import location_for
    from rljob_trainer.checkpoints.compare import split_checkpoint_uri

    root, name = split_checkpoint_uri(args.uri)
    return location_for(root, endpoint_url=args.endpoint_url, region=args.region), name


def _storage_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A checkpoints command whose storage errors (access denied, no bucket, unreachable, a pvc:// location
    outside the cluster) and corrupt checkpoints (files that differ from the manifest) exit 1 with one line."""

    def run(args: argparse.Namespace) -> int:
        from rljob_trainer.checkpoints.locations import CorruptCheckpoint, StorageError
        from rljob_trainer.errors import PermanentError

        try:
            return command(args)
        except (StorageError, PermanentError, CorruptCheckpoint) as e:
            print(f"rljob: error: {e}", file=sys.stderr)
            return 1

    return run


def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    loc, only = _checkpoint_root(args)
    listing = loc.listing()
    complete = {c.name: c for c in listing.complete}
    rows: list[dict[str, Any]] = []
    for name in sorted(listing.objects, key=lambda n: int(n.rsplit("-", 1)[1])):
        if only and name != only:
            continue
        info, objects = complete.get(name), listing.objects[name]
        rows.append({
            "name": name, "complete": info is not None, "latest": name == listing.latest,
            "files": len(objects), "bytes": sum(size for size, _ in objects.values()),
            "metrics": info.metrics if info else {},
        })
    if args.json:
        print(json.dumps({"location": loc.uri, "latest": listing.latest, "checkpoints": rows}, indent=1))
        return 0
    print(f"{'NAME':<20} {'STATUS':<11} {'FILES':>5} {'MB':>9}  METRICS")
    for r in rows:
        status = "complete" if r["complete"] else "incomplete"
        metrics = " ".join(f"{k}={v:.4g}" for k, v in r["metrics"].items())
        mark = "  <- latest" if r["latest"] else ""
        print(f"{r['name']:<20} {status:<11} {r['files']:>5} {r['bytes'] / 1e6:>9.2f}  {metrics}{mark}")
    return 0


def cmd_checkpoints_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rljob_trainer.checkpoints.compare import compare_checkpoint

    loc, only = _checkpoint_root(args)
    listing = loc.listing()
    targets = [c for c in listing.complete if only is None or c.name == only]
    if not targets:
        print(f"rljob: error: no complete checkpoint {only or ''} at {loc.uri}", file=sys.stderr)
        return 1
    local = Path(args.local) if args.local else None
    bad = 0
    for info in targets:
        local_dir = None
        if local is not None:  # a checkpoint folder itself, or a folder of checkpoints
            local_dir = local if (local / "rljob-manifest.json").exists() or local.name == info.name else local / info.name
            if only is None and not local_dir.is_dir():
                print(f"{info.name}: no local copy under {local}; skipped")
                continue
        for c in compare_checkpoint(loc, listing, info, local_dir):
            bad += not c.ok
            print(f"{'ok' if c.ok else 'MISMATCH':<8} {c.checkpoint}/{c.file}: {c.detail}")
    print(f"{bad} mismatch(es) in {len(targets)} checkpoint(s) at {loc.uri}")
    return 1 if bad else 0


def cmd_checkpoints_prune(args: argparse.Namespace) -> int:
    """Apply retention at a location with the trainer's own code path (``Location.apply_retention``)."""
    from rljob_trainer.checkpoints.retention import RetentionPolicy

    loc, _ = _checkpoint_root(args)
    _, after = loc.apply_retention(
        RetentionPolicy(args.keep_last, args.keep_best, args.best_metric), set(args.protect or ()),
        dry_run=args.dry_run,
        on_delete=lambda name: print(f"{'would delete' if args.dry_run else 'deleting'} {loc.child_uri(name)}"),
    )
    print(f"kept {len(after.complete)} complete checkpoint(s) at {loc.uri}")
    return 0


def cmd_checkpoints_export(args: argparse.Namespace) -> int:
    """A complete checkpoint (verified against its manifest) → a merged model in a new folder."""
    import tempfile
    from pathlib import Path

    from rljob_trainer.checkpoints.export import ExportError, export_merged

    loc, name = _checkpoint_root(args)
    listing = loc.listing()
    name = name or listing.latest
    info = next((c for c in listing.complete if c.name == name), None)
    if info is None:
        print(f"rljob: error: {args.uri}: no complete checkpoint {name or '(no latest)'} at {loc.uri}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="rljob-export-") as tmp:
        local = loc.fetch(info, listing, Path(tmp))  # verified against its manifest
        try:
            out = export_merged(local, Path(args.out), base=args.base)
        except ExportError as e:
            print(f"rljob: error: {e}", file=sys.stderr)
            return 1
    print(f"rljob: merged {loc.child_uri(info.name)} into {out}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """A checkpoint (verified) on the manifest's evaluation prompts: a table, and JSON with --json."""
    from rljob_trainer.checkpoints.evaluate import evaluate_checkpoint, with_dataset
    from rljob_trainer.errors import PermanentError
    from rljob_trainer.known_warnings import silence_known_warnings

    silence_known_warnings()

    try:
        job = load_job(args.config)
    except ManifestError as e:
        print(f"rljob: error: {e}", file=sys.stderr)
        return EXIT_PERMANENT
    try:
        cfg = with_dataset(job.trainer_config(output_dir="."), args.dataset, args.split)
        result = evaluate_checkpoint(args.checkpoint, cfg, base=args.base, endpoint_url=args.endpoint_url,
                                     region=args.region)
    except PermanentError as e:
        print(f"rljob: error: {e}", file=sys.stderr)
        return EXIT_PERMANENT
    print(result.table())
    if args.json:
        Path(args.json).write_text(json.dumps({"checkpoint": result.checkpoint, "step": result.step,
                                               "prompts": result.prompts, "metrics": result.metrics}, indent=2))
    return 0


def add_evaluate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "evaluate", help="evaluate a checkpoint on a manifest's evaluation prompts (spec.training.evaluation)",
        description="CHECKPOINT: a checkpoint folder or s3://bucket/prefix/checkpoint-N (or a location, for its "
        "latest), verified against its manifest. With greedy decoding the values equal the training's at that step.",
    )
    p.add_argument("checkpoint", help="…/checkpoint-N (a folder or s3://), or a location for its latest checkpoint")
    p.add_argument("--config", required=True, help="the job's manifest (its spec.training.evaluation)")
    p.add_argument("--dataset", help="evaluate on this dataset instead (a file, s3:// object or datasets name)")
    p.add_argument("--split", help="split of a datasets-library --dataset (default test)")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.add_argument("--base", help="base model of a LoRA checkpoint (default: the one its manifest records)")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    p.add_argument("--region", help="S3 region (default: AWS_REGION)")
    p.set_defaults(func=_storage_errors(cmd_evaluate))


def add_checkpoints_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "checkpoints", help="list, verify or prune checkpoints on object storage or in a folder",
        description="Checkpoints at URI: s3://bucket/prefix (credentials from the AWS_* environment or "
        "the instance/service-account role) or a local folder; URI may name one checkpoint (…/checkpoint-40).",
    )
    cmds = p.add_subparsers(dest="checkpoints_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("uri", help="s3://bucket/prefix, a folder, or either followed by /checkpoint-N")
    common.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    common.add_argument("--region", help="S3 region (default: AWS_REGION)")

    c = cmds.add_parser("list", parents=[common], help="checkpoints, complete or not, and where latest points")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=_storage_errors(cmd_checkpoints_list))

    c = cmds.add_parser("verify", parents=[common],
                        help="compare stored files with their manifest and, with --local, with a local copy")
    c.add_argument("--local", help="local checkpoint folder (or folder of checkpoints) to compare file by file")
    c.set_defaults(func=_storage_errors(cmd_checkpoints_verify))

    c = cmds.add_parser("prune", parents=[common], help="apply retention: keep the newest N and the best K")
    c.add_argument("--keep-last", type=int, required=True, help="newest complete checkpoints kept (the newest "
                   "is always kept)")
    c.add_argument("--keep-best", type=int, default=0, help="also keep the K best by --best-metric")
    c.add_argument("--best-metric", default=DEFAULT_BEST_METRIC, help="manifest metric ranking checkpoints (higher is better)")
    c.add_argument("--protect", action="append", help="never delete this checkpoint (repeatable)")
    c.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    c.set_defaults(func=_storage_errors(cmd_checkpoints_prune))

    c = cmds.add_parser("export", parents=[common],
                        help="write a LoRA checkpoint merged into its base model (a Hugging Face model folder)")
    c.add_argument("out", help="new folder for the merged model (never overwritten)")
    c.add_argument("--merged", action="store_true", required=True,
                   help="merge the adapter into the base model's weights (the only export form)")
    c.add_argument("--base", help="base model folder or hub id (default: the one recorded in the adapter)")
    c.set_defaults(func=_storage_errors(cmd_checkpoints_export))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljob", description="RL post-training of language models on Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="run a manifest's job on this machine")
    p.add_argument("manifest")
    add_output_flag(p, "output folder (default: runs/<job name>)")
    p.add_argument("--nproc", type=int, help="processes to start (default: replicas × procsPerWorker)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port on rank 0 (0: any free port)")
    p.add_argument("--runtime", help="a ClusterRLTrainingRuntime/RLTrainingRuntime file: train within its bounds, "
                   "checkpoints to its storage (default: no runtime, checkpoints in the output folder)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("validate", help="validate jobs, experiments and runtimes offline (a GitOps pre-commit hook)")
    p.add_argument("manifests", nargs="+")
    p.add_argument("--runtime", help="a file of runtimes: also check each job against the one it would run on "
                   "(its spec.runtimeRef, else the default, else the only one)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("crd", help="print the RLTrainingJob CRD (generated from the API models)")
    add_output_flag(p, "write to this file instead of stdout")
    p.add_argument("--kind", choices=["RLTrainingJob", "RLExperiment", "ClusterRLTrainingRuntime", "RLTrainingRuntime"],
                   default="RLTrainingJob", help="which CRD (default RLTrainingJob)")
    p.set_defaults(func=cmd_crd)

    add_operator_parser(sub)
    add_checkpoints_parser(sub)
    add_evaluate_parser(sub)
    add_history_parser(sub, _storage_errors)

    p = sub.add_parser("experiment", help="run an RLExperiment's trials (A/B test or search) on this machine")
    p.add_argument("manifest")
    add_output_flag(p, "output folder (default: runs/<experiment name>)", deprecated=("--out",))
    p.add_argument("--parallel", type=int, help="trials at once (default: as many as the CPUs hold, at most the "
                   "experiment's parallelism)")
    p.set_defaults(func=cmd_experiment)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``rljob`` command; returns its exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ModuleNotFoundError as e:
        package = (e.name or "").split(".")[0]
        extra = EXTRA_OF_MODULE.get(package)
        if extra is None:
            raise
        print(f"rljob: error: `rljob {args.command}` needs {package}, which this install lacks: "
              f"pip install 'rljob[{extra}]'", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
