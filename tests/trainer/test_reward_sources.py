"""A custom reward's module from its typed ``source`` (issue #42): a ConfigMap the operator mounts, or an s3:// object
the launcher fetches (size-bounded, under the runtime's ``sources.allowed``); each problem a PermanentError (exit 78)
naming the field. The operator's half (the ConfigMap mounted read-only) is in ``tests/operator/test_runtimes.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from rljob_contract import pod as contract
from rljob_contract.pod import validate_document
from rljob_contract.spec import MAX_REWARD_MODULE_BYTES, TrainerConfig
from rljob_trainer.errors import PermanentError
from rljob_trainer.rewards import prepare_reward_sources, resolve_rewards

from tests.support.s3_server import (  # noqa: F401 - fixtures register by import
    MotoServer,
    bucket_fixture,
    s3_env_fixture,
    s3_server_fixture,
)

MODULE = "def score(prompts, completions, **kwargs):\n    return [0.25 for _ in completions]\n"


def config(tmp_path: Path, source: dict[str, Any], *, name: str = "team_rewards.scoring:score",
           endpoint: str | None = None, sources: list[str] | None = None) -> TrainerConfig:
    return validate_document(TrainerConfig, {
        "jobName": "j", "outputDir": str(tmp_path / "out"), "sources": sources,
        "training": {"rewards": [{"name": name, "source": source}]},
        "checkpoint": {"endpointUrl": endpoint} if endpoint else {}})


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test imports its own ``team_rewards`` from its own folder."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m.split(".")[0] == "team_rewards"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv(contract.REWARD_PATH_ENV, raising=False)


def _score(funcs: list[Any]) -> list[float | None]:
    return list(funcs[0](prompts=["p", "q"], completions=["a", "b"]))


def test_a_configmap_module_is_imported_from_the_mounted_folder_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_imports: None) -> None:
    mounted = tmp_path / "rewards"
    (mounted / "team_rewards").mkdir(parents=True)
    (mounted / "team_rewards" / "scoring.py").write_text(MODULE)  # as the projected volume lays it out
    shadow = tmp_path / "image"  # a module of the same name elsewhere on the path loses
    (shadow / "team_rewards").mkdir(parents=True)
    (shadow / "team_rewards" / "scoring.py").write_text(MODULE.replace("0.25", "0.75"))
    monkeypatch.syspath_prepend(str(shadow))
    monkeypatch.setattr(contract, "REWARDS_DIR", str(mounted))
    environ: dict[str, str] = {}
    cfg = config(tmp_path, {"configMap": {"name": "team-rewards", "key": "scoring.py"}})
    assert prepare_reward_sources(cfg, environ) == {contract.REWARD_PATH_ENV: str(mounted)}
    monkeypatch.setenv(contract.REWARD_PATH_ENV, environ[contract.REWARD_PATH_ENV])  # what a rank is given
    funcs, _ = resolve_rewards(cfg.training.rewards)
    assert _score(funcs) == [0.25, 0.25]


def test_a_configmap_module_not_mounted_is_a_permanent_error_naming_the_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_imports: None) -> None:
    monkeypatch.setattr(contract, "REWARDS_DIR", str(tmp_path / "nothing-mounted"))
    cfg = config(tmp_path, {"configMap": {"name": "team-rewards", "key": "scoring.py"}})
    with pytest.raises(PermanentError, match=r"^spec\.training\.rewards\[0\]\.source\.configMap: .*team_rewards/"
                                             r"scoring\.py is not there: the operator mounts ConfigMap team-rewards"):
        prepare_reward_sources(cfg, {})


@pytest.mark.s3
def test_an_s3_module_is_fetched_through_the_runtimes_endpoint_and_imported(
        s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, clean_imports: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.client().put_object(Bucket=bucket, Key="modules/scoring.py", Body=MODULE.encode())
    uri = f"s3://{bucket}/modules/scoring.py"
    cfg = config(tmp_path, {"uri": uri}, endpoint=s3_server.endpoint, sources=[f"s3://{bucket}/modules/"])
    environ: dict[str, str] = {}
    env = prepare_reward_sources(cfg, environ)
    fetched = tmp_path / "out" / ".cache" / "rewards"
    assert env == {contract.REWARD_PATH_ENV: str(fetched)}
    assert (fetched / "team_rewards" / "scoring.py").read_text() == MODULE
    monkeypatch.setenv(contract.REWARD_PATH_ENV, env[contract.REWARD_PATH_ENV])
    assert _score(resolve_rewards(cfg.training.rewards)[0]) == [0.25, 0.25]


@pytest.mark.s3
@pytest.mark.parametrize("case", ["not-allowed", "too-large", "absent"])
def test_an_s3_module_that_cannot_be_had_is_a_permanent_error_naming_the_uri(
        s3_server: MotoServer, bucket: str, tmp_path: Path, s3_env: None, clean_imports: None, case: str) -> None:
    body = b"#" * (MAX_REWARD_MODULE_BYTES + 1) if case == "too-large" else MODULE.encode()
    if case != "absent":
        s3_server.client().put_object(Bucket=bucket, Key="modules/scoring.py", Body=body)
    allowed = [f"s3://{bucket}/other/"] if case == "not-allowed" else [f"s3://{bucket}/"]
    cfg = config(tmp_path, {"uri": f"s3://{bucket}/modules/scoring.py"}, endpoint=s3_server.endpoint, sources=allowed)
    says = {"not-allowed": "is not under the runtime's sources", "too-large": "a reward module may have at most",
            "absent": "on s3://"}[case]
    with pytest.raises(PermanentError, match=r"^spec\.training\.rewards\[0\]\.source\.uri: ") as error:
        prepare_reward_sources(cfg, {})
    assert says in str(error.value)
    assert not (tmp_path / "out" / ".cache" / "rewards" / "team_rewards").exists()  # nothing half-written


def test_without_sources_the_path_is_left_alone(tmp_path: Path, clean_imports: None) -> None:
    cfg = validate_document(TrainerConfig, {"jobName": "j", "outputDir": str(tmp_path)})
    before = list(sys.path)
    assert prepare_reward_sources(cfg, {}) == {} and sys.path == before
    assert os.environ.get(contract.REWARD_PATH_ENV) is None
