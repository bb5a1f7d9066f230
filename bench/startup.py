"""Start-up imports of rljob's processes, with the virtualenv's compiled bytecode and without it.

Every process rljob starts pays for its imports before it does anything: each torchrun rank
(TRL, transformers, torch), the launcher of each node, the operator (kopf, the Kubernetes
client), the ``rljob`` command. uv installs packages without compiling them, and with
``PYTHONDONTWRITEBYTECODE`` set (as on this CI machine) Python never caches what it compiles, so
until ``tools/venv.sh`` compiled the venv every one of those processes compiled its imports from
source. This measures both sides, each in a fresh interpreter:

* ``bytecode``: the venv as ``tools/venv.sh`` leaves it (``__pycache__`` next to every module);
* ``source``: the same venv with ``PYTHONPYCACHEPREFIX`` pointing at an empty folder and
  ``PYTHONDONTWRITEBYTECODE=1``, so Python neither finds nor writes a ``.pyc``: every module is
  compiled from source, as before.

The sides alternate over ``--repeats`` (medians reported); the ratio is source ÷ bytecode.

    python -m bench.startup [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, median, write_result
from bench.common import env as bench_env

#: What each process imports before its first useful line, as it imports it.
PROCESSES = {
    "rank": "import rljob_trainer.worker; from rljob_trainer.algorithms import BUILDERS; [b.trl_classes() for b in BUILDERS.values()]",
    "launcher": "import rljob_trainer.launch; import torch.distributed.launcher.api",
    "operator": "import rljob_operator.cluster.runner",
    "cli": "import rljob.cli",
}


def has_bytecode() -> bool:
    """True when the venv's TRL has compiled modules next to its sources (tools/venv.sh's step)."""
    spec = importlib.util.find_spec("trl")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(Path(spec.submodule_search_locations[0]).glob("__pycache__/*.pyc"))


def timed_import(code: str, side: str, empty_prefix: str) -> float:
    env = bench_env(PYTHONPATH=os.pathsep.join(str(REPO / p) for p in ("contract", "operator", "trainer", ".")),
                    PYTHONWARNINGS="ignore")
    if side == "source":
        env.update({"PYTHONPYCACHEPREFIX": empty_prefix, "PYTHONDONTWRITEBYTECODE": "1"})
    else:
        env.pop("PYTHONPYCACHEPREFIX", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"bench.startup: {code!r} failed ({proc.returncode}) on the {side} side")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs per side and process")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not has_bytecode():
        raise SystemExit("bench.startup: the venv has no compiled bytecode; run tools/venv.sh first")

    samples: dict[str, dict[str, list[float]]] = {p: {"bytecode": [], "source": []} for p in PROCESSES}
    with tempfile.TemporaryDirectory(prefix="rljob-no-pyc-") as empty:
        for repeat in range(args.repeats):
            for name, code in PROCESSES.items():
                sides = ("bytecode", "source") if repeat % 2 == 0 else ("source", "bytecode")
                for side in sides:
                    samples[name][side].append(timed_import(code, side, empty))
                    if any(Path(empty).iterdir()):
                        raise SystemExit("bench.startup: the source side wrote bytecode; the comparison is void")
            print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(
                f"{n} {samples[n]['bytecode'][-1]:.1f}/{samples[n]['source'][-1]:.1f} s" for n in PROCESSES),
                flush=True)

    results = {}
    summary = []
    for name in PROCESSES:
        compiled, source = median(samples[name]["bytecode"]), median(samples[name]["source"])
        results[name] = {"import": PROCESSES[name], "bytecode_s": samples[name]["bytecode"],
                         "source_s": samples[name]["source"], "bytecode_median_s": round(compiled, 2),
                         "source_median_s": round(source, 2), "ratio_source_over_bytecode": round(source / compiled, 2)}
        summary.append({"metric": f"{name} start-up imports, bytecode vs source (median)",
                        "value": f"{compiled:.1f} vs {source:.1f} s ({source / compiled:.2f}x)", "unit": ""})
    path = write_result("startup", {"repeats": args.repeats, "processes": results, "summary": summary})
    for row in summary:
        print(f"{row['metric']}: {row['value']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
