"""The contract (``rljob_contract``, the pod's side in ``rljob_contract.pod``): one place, no torch.

* ``trainer/`` never imports ``rljob_operator``; ``contract/rljob_contract/`` imports neither program but the
  trainer's torch-free registries; ``operator/`` imports from the trainer only those registries.
* No ``RLJOB_*`` name is spelled outside the contract (in operator/, trainer/ and the CLI).
* Importing the contract, or the operator's runner, imports no torch, TRL or transformers.
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
from rljob_operator.decisions.children import desired_configmap, desired_worker_pod
from rljob_operator.names import StatusEndpoint
from rljob_operator.server.statusapi import StatusAPI
from rljob_trainer import errors

from tests.support.operator import REPO, job_manifest

#: What the operator may import from the trainer (the algorithm registry is torch-free data, for the CRD;
#: the storage backends' registry is stdlib-only, for pod volumes, durability, references and the CRD);
#: the contract itself is ``rljob_contract``, which both import.
OPERATOR_MAY_IMPORT = {"rljob_trainer.builtin.rewards", "rljob_trainer.algorithms", "rljob_trainer.storage_backends"}
#: A string literal that *is* an RLJOB_ variable name or prefix (prose mentioning one is documentation).
ENV_LITERAL = re.compile(r"RLJOB_[A-Za-z0-9_{}]*")
#: ``RLJOB_`` names outside the contract on purpose, each with why.
NOT_THE_POD_CONTRACT = {
    ("operator/rljob_operator/settings.py", "RLJOB_OPERATOR_"): "the operator process's own settings",
    ("operator/rljob_operator/cluster/kube.py", "RLJOB_FAULT_CRASH_AFTER_WRITES"): "operator fault injection",
    ("operator/rljob_operator/server/statusapi.py", "RLJOB_FAULT_REVIEW_DELAY_SECONDS"): "operator fault injection",
}
#: Pending: the checkpoint store is moving to ``rljob_trainer/checkpoints/`` on another branch; its
#: mirror prefix becomes ``contract.MIRROR_ENV_PREFIX`` after that merge (equal until then, see below).
ENDPOINT = StatusEndpoint("https://rljob-operator.rljob-system.svc:8443", "-----BEGIN CERTIFICATE-----\nx\n")


def _sources(*roots: str) -> list[tuple[str, ast.Module]]:
    out = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            out.append((path.relative_to(REPO).as_posix(), ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return out


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import, in functions too; ``from pkg import mod`` counts as ``pkg.mod``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_trainer_never_imports_the_operator() -> None:
    offenders = [f"{path}:{line}: {module}" for path, tree in _sources("trainer")
                 for line, module in _imports(tree) if module.split(".")[0] == "rljob_operator"]
    assert offenders == []


def test_the_contract_imports_neither_program_but_the_trainers_torch_free_registries() -> None:
    offenders = [f"{path}:{line}: {module}" for path, tree in _sources("contract/rljob_contract")
                 for line, module in _imports(tree)
                 if module.split(".")[0] in {"rljob_operator", "kubernetes", "kopf", "torch", "trl", "transformers"}
                 or (module.split(".")[0] == "rljob_trainer"
                     and not any(module.startswith(ok + ".") for ok in OPERATOR_MAY_IMPORT))]
    assert offenders == []


def test_the_operator_imports_only_the_trainers_contract_config_and_reward_registry() -> None:
    def allowed(module: str) -> bool:
        # ``from rljob_trainer.algorithms import X`` is recorded as ``rljob_trainer.algorithms.X``.
        return any(module == ok or module.startswith(ok + ".") for ok in OPERATOR_MAY_IMPORT)

    offenders = [f"{path}:{line}: {module}" for path, tree in _sources("operator")
                 for line, module in _imports(tree)
                 if module.split(".")[0] == "rljob_trainer" and not allowed(module)]
    assert offenders == []


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
    runtime = heavy | {"boto3", "botocore", "numpy", "requests", "kopf", "kubernetes", "aiohttp", "rljob_operator"}
    assert runtime.isdisjoint(imported["contract"]), imported["contract"]
    assert {"rljob_trainer", "pydantic", "yaml"} <= set(imported["contract"])


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
    assert {n for n in env if n.startswith("RLJOB_")} == contract.OPERATOR_ENV
    assert container["command"] == list(contract.TRAINER_COMMAND)
    for name in contract.OPERATOR_ENV:
        monkeypatch.setenv(name, env[name].get("value", "train-worker-2"))  # the downward API gives the pod name
    node = NodeSettings.from_env(default_nproc=8)
    assert (node.nnodes, node.node_rank, node.nproc_per_node) == (3, 2, 1)
    assert node.rdzv_endpoint == "train-worker-0.train.team-a.svc:29500" and node.run_id.endswith("-g4")
    hb = Heartbeat.from_env()
    assert hb is not None and hb.pod == "train-worker-2" and hb.ca_file == "/etc/rljob/status-ca.crt"
    assert hb.url == ENDPOINT.base_url + contract.heartbeat_path("team-a", "train")
    assert node.in_place_restarts == 0  # a fixed-size gang: any failure ends the node, the gang restarts


def test_an_elastic_job_s_workers_may_restart_their_ranks_as_often_as_its_backoff_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rljob_trainer.launch import NodeSettings, build_launch_config
    from torch.distributed.launcher.api import LaunchConfig

    job = _job(workers={"minReplicas": 2, "maxReplicas": 3}, runPolicy={"backoffLimit": 4})
    env = {e["name"]: e for e in desired_worker_pod(job, 1, 0, ENDPOINT)["spec"]["containers"][0]["env"]}
    assert {n for n in env if n.startswith("RLJOB_")} == contract.OPERATOR_ENV | contract.ELASTIC_ENV
    monkeypatch.setenv(contract.IN_PLACE_RESTARTS_ENV, env[contract.IN_PLACE_RESTARTS_ENV]["value"])
    node = NodeSettings.from_env(default_nproc=1)
    assert node.in_place_restarts == 4
    config, _ = build_launch_config(LaunchConfig, node, 30)
    assert config.max_restarts == 4 and config.min_nodes == config.max_nodes  # the size changes by a resize only
    never = _job(workers={"minReplicas": 2, "maxReplicas": 3}, runPolicy={"restartPolicy": "Never"})
    env = {e["name"] for e in desired_worker_pod(never, 1, 0, ENDPOINT)["spec"]["containers"][0]["env"]}
    assert contract.IN_PLACE_RESTARTS_ENV not in env


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
