"""The floors and the contract between them (``rljob_contract``, the pod's side in ``rljob_contract.pod``).

* Floors, lowest first: the contract (``contract/``), then the trainer (``trainer/``) and the operator
  (``operator/``), then the ``rljob`` command (``rljob/``); tests, benchmarks and the chart's generators
  above all. No import, lazy ones inside functions included, runs from a floor to a higher one or
  between the trainer and the operator; the programs' modules form no import circle.
* No ``RLJOB_*`` name is spelled outside the contract (in operator/, trainer/ and the CLI).
* Importing the contract, or the operator's runner, imports no torch, TRL or transformers (nor the trainer).
* What one side writes, the other reads: pod environment, config YAML, heartbeat body and path.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rljob_contract import pod as contract
from rljob_contract.job import API_VERSION, KIND, parse_job
from rljob_operator.decisions.children import desired_configmap, desired_worker_pod
from rljob_operator.names import StatusEndpoint
from rljob_operator.server.statusapi import StatusAPI
from rljob_trainer import errors

from tests.support.operator_process import REPO, job_manifest

#: Each top folder's floor: a file may import from its own folder and from lower floors only.
FLOORS: dict[str, int] = {"contract": 0, "trainer": 1, "operator": 1, "rljob": 2, "tests": 3, "bench": 3, "charts": 3}
#: The floor above all (tests, benchmarks, generators): its folders may also import each other.
ABOVE_ALL = 3
#: Each importable top-level package → the folder that holds it.
PACKAGES: dict[str, str] = {"rljob_contract": "contract", "rljob_trainer": "trainer", "rljob_operator": "operator",
                            "rljob": "rljob", "tests": "tests", "bench": "bench"}
#: The programs' packages (where import circles are looked for): package → its folder's source root.
PROGRAMS: dict[str, str] = {"rljob_contract": "contract/rljob_contract", "rljob_trainer": "trainer/rljob_trainer",
                            "rljob_operator": "operator/rljob_operator", "rljob": "rljob"}
#: A string literal that *is* an RLJOB_ variable name or prefix (prose mentioning one is documentation).
ENV_LITERAL = re.compile(r"RLJOB_[A-Za-z0-9_{}]*")
#: ``RLJOB_`` names outside the contract on purpose, each with why.
NOT_THE_POD_CONTRACT = {
    ("operator/rljob_operator/settings.py", "RLJOB_OPERATOR_"): "the operator process's own settings",
    ("operator/rljob_operator/cluster/kube.py", "RLJOB_FAULT_CRASH_AFTER_WRITES"): "operator fault injection",
    ("operator/rljob_operator/server/statusapi.py", "RLJOB_FAULT_REVIEW_DELAY_SECONDS"): "operator fault injection",
}
ENDPOINT = StatusEndpoint("https://rljob-operator.rljob-system.svc:8443", "-----BEGIN CERTIFICATE-----\nx\n")


def _sources(*roots: str, repo: Path = REPO) -> list[tuple[str, ast.Module]]:
    out = []
    for root in roots:
        for path in sorted((repo / root).rglob("*.py")):
            out.append((path.relative_to(repo).as_posix(), ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return out


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import, in functions and ``TYPE_CHECKING`` blocks too; ``from pkg import mod``
    counts as ``pkg.mod`` (and ``pkg``); ``importlib.import_module("…")`` and ``__import__("…")`` of a
    literal count too. Relative imports stay inside their package and are left out."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) in ("import_module", "__import__"))):
            found.append((node.lineno, node.args[0].value))
    return found


def floor_violations(repo: Path = REPO) -> list[str]:
    """``path:line: module`` for every import that runs from a floor to a higher one, or across one floor
    (the trainer and the operator); the floor above all may import anything."""
    found = []
    for root, floor in FLOORS.items():
        if not (repo / root).is_dir():
            continue
        for path, tree in _sources(root, repo=repo):
            for line, module in _imports(tree):
                target = PACKAGES.get(module.split(".")[0])
                if target is None or target == root or floor == ABOVE_ALL:
                    continue
                if FLOORS[target] >= floor:
                    found.append(f"{path}:{line}: {module}")
    return sorted(set(found))


def import_circles(repo: Path = REPO) -> list[list[str]]:
    """The programs' import circles (lazy imports included): each a sorted list of the modules that import
    one another round (Tarjan's strongly connected components of more than one module)."""
    modules: dict[str, ast.Module] = {}
    for package, root in PROGRAMS.items():
        for path, tree in _sources(root, repo=repo):
            parts = Path(path).relative_to(root).with_suffix("").parts
            modules[".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))] = tree

    def known(name: str) -> str | None:  # the module an imported name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {t for _, name in _imports(tree) if (t := known(name)) not in (None, m)} for m, tree in modules.items()}
    return _strongly_connected(graph)


def _strongly_connected(graph: dict[str, set[str | None]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            assert w is not None
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_runs_from_a_floor_to_a_higher_one() -> None:
    assert floor_violations() == []


def test_the_programs_modules_form_no_import_circle() -> None:
    assert import_circles() == []


def _plant(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)


def test_a_planted_violation_of_the_floors_is_found_lazy_imports_included(tmp_path: Path) -> None:
    """A synthetic source tree: every kind of violation once, beside imports that are allowed."""
    _plant(tmp_path, {
        "contract/rljob_contract/spec.py": (
            "import pydantic\nfrom rljob_contract.rules import Rule\n"
            "def f():\n    from rljob_trainer.storage_backends import backends\n"),
        "contract/rljob_contract/job.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rljob_operator import crd\n"
            "import importlib\nX = importlib.import_module('rljob.cli')\n"),
        "trainer/rljob_trainer/worker.py": "from rljob_contract import spec\nimport rljob_operator.names\n",
        "operator/rljob_operator/crd.py": "from rljob_contract import job\nfrom rljob_trainer.algorithms import X\n",
        "operator/rljob_operator/cli_use.py": "class A:\n    def m(self):\n        import rljob.cli\n",
        "rljob/cli.py": "import rljob_trainer.launch, rljob_operator.crd, rljob_contract\nfrom tests.support import x\n",
        "tests/test_x.py": "import rljob.cli, rljob_trainer, bench.common\n",
    })
    assert floor_violations(tmp_path) == [
        "contract/rljob_contract/job.py:3: rljob_operator",
        "contract/rljob_contract/job.py:3: rljob_operator.crd",
        "contract/rljob_contract/job.py:5: rljob.cli",
        "contract/rljob_contract/spec.py:4: rljob_trainer.storage_backends",
        "contract/rljob_contract/spec.py:4: rljob_trainer.storage_backends.backends",
        "operator/rljob_operator/cli_use.py:3: rljob.cli",
        "operator/rljob_operator/crd.py:2: rljob_trainer.algorithms",
        "operator/rljob_operator/crd.py:2: rljob_trainer.algorithms.X",
        "rljob/cli.py:2: tests.support",
        "rljob/cli.py:2: tests.support.x",
        "trainer/rljob_trainer/worker.py:2: rljob_operator.names",
    ]


def test_a_planted_import_circle_is_found_lazy_imports_included(tmp_path: Path) -> None:
    _plant(tmp_path, {
        "contract/rljob_contract/__init__.py": "",
        "contract/rljob_contract/spec.py": "def f():\n    from rljob_trainer.storage_backends import backends\n",
        "trainer/rljob_trainer/__init__.py": "",
        "trainer/rljob_trainer/storage_backends/__init__.py": "from rljob_trainer.checkpoints import s3\n",
        "trainer/rljob_trainer/checkpoints/__init__.py": "",
        "trainer/rljob_trainer/checkpoints/s3.py": "from rljob_contract.spec import f\n",
        "trainer/rljob_trainer/checkpoints/alone.py": "from rljob_contract import spec\n",
    })
    assert import_circles(tmp_path) == [["rljob_contract.spec", "rljob_trainer.checkpoints.s3",
                                         "rljob_trainer.storage_backends"]]


def test_rljob_variable_names_are_spelled_only_in_the_contract() -> None:
    found = []
    for path, tree in _sources("contract", "operator", "trainer", "rljob"):
        if path == "contract/rljob_contract/pod.py":
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if not ENV_LITERAL.fullmatch(node.value) or (path, node.value) in NOT_THE_POD_CONTRACT:
                continue
            found.append(f"{path}:{node.lineno}: {node.value!r}")
    assert found == [], "use the names in rljob_contract.pod"


def test_checkpoints_use_the_contracts_mirror_prefix() -> None:
    from rljob_trainer.checkpoints.plan import MIRROR_ENV_PREFIX

    assert MIRROR_ENV_PREFIX is contract.MIRROR_ENV_PREFIX
    assert contract.mirror_env_prefix(1) == "RLJOB_MIRROR1_"


def test_the_contract_and_the_operator_import_without_torch() -> None:
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import rljob_contract.job, rljob_contract.experiment, rljob_contract.references\n"
        "contract = sorted({m.split('.')[0] for m in set(sys.modules) - before})\n"
        "import rljob_operator.cluster.runner\n"
        "print(json.dumps({'contract': contract, 'all': sorted(sys.modules)}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    heavy = {"torch", "trl", "transformers", "datasets", "accelerate"}
    assert heavy.isdisjoint(m.split(".")[0] for m in imported["all"])
    # The contract alone: nothing of the trainer's runtime (nor the operator's), only pydantic and PyYAML.
    runtime = heavy | {"boto3", "botocore", "numpy", "requests", "kopf", "kubernetes", "aiohttp", "rljob_operator",
                       "rljob_trainer"}
    assert runtime.isdisjoint(imported["contract"]), imported["contract"]
    assert {"pydantic", "yaml"} <= set(imported["contract"])
    assert "rljob_trainer" not in {m.split(".")[0] for m in imported["all"]}  # nor the operator's


def _job(**spec: Any) -> Any:
    from rljob_contract.job import parse_job

    doc = job_manifest("train", 3, spec or None, namespace="team-a")
    doc["metadata"]["uid"] = "0123456789abcdef"
    return parse_job(doc)


def test_the_pod_environment_is_what_the_launcher_and_heartbeat_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_trainer.heartbeat import Heartbeat
    from rljob_trainer.launch import NodeSettings

    container = desired_worker_pod(_job(), 2, 4, ENDPOINT)["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert {n for n in env if n.startswith("RLJOB_")} == contract.OPERATOR_ENV | contract.RESTARTABLE_ENV
    assert container["command"] == list(contract.TRAINER_COMMAND)
    for name in contract.OPERATOR_ENV | contract.RESTARTABLE_ENV:
        monkeypatch.setenv(name, env[name].get("value", "train-worker-2"))  # the downward API gives the pod name
    node = NodeSettings.from_env(default_nproc=8)
    assert (node.nnodes, node.node_rank, node.nproc_per_node) == (3, 2, 1)
    assert node.rdzv_endpoint == "train-worker-0.train.team-a.svc:29500" and node.run_id.endswith("-g4")
    hb = Heartbeat.from_env()
    assert hb is not None and hb.pod == "train-worker-2" and hb.ca_file == "/etc/rljob/status-ca.crt"
    assert hb.url == ENDPOINT.base_url + contract.heartbeat_path("team-a", "train")
    # The agent may restart its ranks to meet a replaced peer, as often as the job may restart.
    assert node.in_place_restarts == 3


def test_a_tracked_job_s_workers_know_their_image_for_the_tracked_run() -> None:
    tracked = _job(training={"tracking": {"mlflow": {"trackingUri": "http://mlflow:5000"}}})
    env = {e["name"]: e for e in desired_worker_pod(tracked, 0, 1, ENDPOINT)["spec"]["containers"][0]["env"]}
    assert {n for n in env if n.startswith("RLJOB_")} == contract.OPERATOR_ENV | contract.RESTARTABLE_ENV | contract.TRACKING_ENV
    assert env[contract.IMAGE_ENV]["value"] == desired_worker_pod(tracked, 0, 1, ENDPOINT)["spec"]["containers"][0]["image"]


@pytest.mark.parametrize("workers", [{}, {"minReplicas": 2, "maxReplicas": 3}], ids=["fixed-size", "elastic"])
def test_a_job_s_workers_may_restart_their_ranks_as_often_as_its_backoff_limit(
        monkeypatch: pytest.MonkeyPatch, workers: dict[str, int]) -> None:
    from rljob_trainer.launch import NodeSettings, build_launch_config
    from torch.distributed.launcher.api import LaunchConfig

    shape = {"workers": workers} if workers else {}
    job = _job(**shape, runPolicy={"backoffLimit": 4})
    env = {e["name"]: e for e in desired_worker_pod(job, 1, 0, ENDPOINT)["spec"]["containers"][0]["env"]}
    assert {n for n in env if n.startswith("RLJOB_")} == contract.OPERATOR_ENV | contract.RESTARTABLE_ENV
    monkeypatch.setenv(contract.IN_PLACE_RESTARTS_ENV, env[contract.IN_PLACE_RESTARTS_ENV]["value"])
    node = NodeSettings.from_env(default_nproc=1)
    assert node.in_place_restarts == 4
    config, _ = build_launch_config(LaunchConfig, node, 30)
    assert config.max_restarts == 4 and config.min_nodes == config.max_nodes  # the size changes by a resize only
    never = _job(**shape, runPolicy={"restartPolicy": "Never"})
    env = {e["name"] for e in desired_worker_pod(never, 1, 0, ENDPOINT)["spec"]["containers"][0]["env"]}
    assert contract.IN_PLACE_RESTARTS_ENV not in env  # a job that never restarts: any failure ends the node


def test_the_configmap_yaml_loads_back_into_the_same_trainer_config(tmp_path: Path) -> None:
    job = _job(training={"maxSteps": 7, "batchSize": 8})
    text = desired_configmap(job, ENDPOINT)["data"][contract.CONFIG_KEY]
    path = tmp_path / contract.CONFIG_KEY
    path.write_text(text)
    loaded = contract.load_config(path)
    assert loaded == job.trainer_config(output_dir="/workspace/output")
    assert loaded.training.max_steps == 7 and "maxSteps" in text  # camelCase, as a person would write it


def test_a_bad_config_file_names_the_file_and_the_field(tmp_path: Path) -> None:
    from rljob_trainer.launch import load_trainer_config

    good = json.loads(_job().trainer_config(output_dir="/o").model_dump_json(by_alias=True))
    good["training"]["maxSteps"] = -1
    good["training"]["nope"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(good))
    with pytest.raises(contract.ConfigError) as raised:
        contract.load_config(path)
    assert raised.value.where == str(path)
    assert "training.maxSteps: " in raised.value.message and "training.nope: unknown field" in raised.value.message
    with pytest.raises(errors.PermanentError, match=r"bad\.yaml: .*training\.maxSteps"):
        load_trainer_config(str(path))
    with pytest.raises(errors.PermanentError, match="cannot read trainer config"):
        load_trainer_config(str(tmp_path / "missing.yaml"))


def test_the_status_api_routes_the_contracts_heartbeat_path() -> None:
    app = StatusAPI(kube=None, flush_seconds=1.0).app()  # type: ignore[arg-type]
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    assert ("POST", contract.heartbeat_path("{namespace}", "{name}")) in routes
    match = re.fullmatch(r"/api/v1/namespaces/(.+)/rltrainingjobs/(.+)/heartbeat", contract.heartbeat_path("ns", "j"))
    assert match is not None and match.groups() == ("ns", "j")


def test_what_the_trainer_sends_is_what_the_status_api_accepts() -> None:
    body = contract.HeartbeatBody(step=3, reward=0.5, loss=None, checkpoint="s3://b/checkpoint-3", pod="w-0",
                                  final=True, time=1.0)
    wire = json.loads(json.dumps(body.wire()))
    assert "warnings" not in wire and wire["pod"] == "w-0"
    assert contract.HeartbeatBody.model_validate(wire) == body
    warned = contract.HeartbeatBody(step=1, warnings=["checkpoint-40 failed verification"]).wire()
    assert warned["warnings"] == ["checkpoint-40 failed verification"]
    # A newer trainer's extra fields are ignored; what the status API must refuse, it refuses.
    assert contract.HeartbeatBody.model_validate({"step": 1, "newField": 2}).step == 1
    for bad in ({"step": -1}, {}, {"step": 1, "warnings": ["w"] * (contract.MAX_HEARTBEAT_WARNINGS + 1)}):
        with pytest.raises(ValueError):
            contract.HeartbeatBody.model_validate(bad)


def test_exit_codes_are_defined_only_in_the_contract() -> None:
    assert (contract.EXIT_OK, contract.EXIT_PERMANENT, contract.EXIT_CUDA_OOM) == (0, 78, 200)
    assert contract.EXIT_SIGTERM_CHECKPOINTED == contract.exit_code_for_signal(15) == 143
    assert errors.EXIT_PERMANENT == contract.EXIT_PERMANENT  # errors re-exports them for the trainer
    defined = [f"{path}:{node.lineno}" for path, tree in _sources("contract", "operator", "trainer", "rljob")
               if path != "contract/rljob_contract/pod.py"
               for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name) and target.id.startswith("EXIT_")]
    assert defined == []


def test_the_best_metric_default_is_spelled_once() -> None:
    from rljob_contract.spec import DEFAULT_BEST_METRIC, CheckpointSpec
    from rljob_trainer.checkpoints.retention import RetentionPolicy

    assert CheckpointSpec().best_metric == RetentionPolicy(keep_last=1).best_metric == DEFAULT_BEST_METRIC
    # A literal default next to a best-metric name anywhere but the contract's one constant.
    literal = re.compile(r"""(?:best[-_]metric|bestMetric)["']?[^\n=]{0,30}=\s*(?:Field\()?["'][^"']+["']""")
    found = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}" for root in ("contract", "operator", "trainer", "rljob")
             for file in sorted((REPO / root).rglob("*.py"))
             for path, text in [(file.relative_to(REPO).as_posix(), file.read_text(encoding="utf-8"))]
             for m in literal.finditer(text)]
    assert found == [], "use rljob_contract.spec.DEFAULT_BEST_METRIC"


def test_the_operator_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'trl', 'datasets'): sys.modules[name] = None\n"
        "import rljob_operator.cluster.runner, rljob.cli, rljob_operator.crd\n"
        "rljob_operator.crd.crd_yaml()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_trainer_config_round_trips_through_json() -> None:
    from rljob_contract.spec import TrainerConfig

    job = parse_job({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"},
                     "spec": {"workers": {"replicas": 2, "procsPerWorker": 4}, "training": {"batchSize": 4}}})
    cfg = job.trainer_config("/out")
    assert cfg.world_size == 8
    again = TrainerConfig.model_validate_json(cfg.model_dump_json(by_alias=True))
    assert again == cfg
    assert cfg.checkpoint_location() == "/out/checkpoints"
