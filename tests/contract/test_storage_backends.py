"""Checkpoint storage backends keyed by URI scheme (issue #32): one registry, asked by everyone.

The descriptors' registry (``rljob_contract.plugins.storage``) picks a backend by scheme and falls back
to a folder; a backend added the way docs/architecture.md's "How to add a storage backend" says (a
descriptor, and a ``Location`` factory registered by the trainer) is validated, opened, judged durable
and checked by the CRD with no other file changed; the descriptors stay free of boto3 (and of the
trainer) for the CLI's validate path and the operator.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rljob_contract.plugins import storage as storage_backends
from rljob_contract.plugins.storage import FOLDER, PVC, S3, StorageBackend, backend_for, check_location
from rljob_contract.spec import CheckpointSpec, TrainerConfig, location_rules
from rljob_operator.decisions.checkpoints import claim_volumes, durability, mounted_location
from rljob_trainer.checkpoints import backends
from rljob_trainer.checkpoints.backends import location_for
from rljob_trainer.checkpoints.compare import split_checkpoint_uri
from rljob_trainer.checkpoints.locations import LocalLocation, Location
from rljob_trainer.checkpoints.plan import storage_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("uri", "backend"), [
    ("s3://b/run", S3), ("pvc://c/run", PVC), ("/data/run", FOLDER), ("run", FOLDER), ("S3://b/run", FOLDER),
    ("gs://b/run", FOLDER), (" s3://b", FOLDER), ("s3:/b", FOLDER),
])
def test_the_scheme_picks_the_backend_and_anything_else_is_a_folder(uri: str, backend: StorageBackend) -> None:
    assert backend_for(uri) is backend


def test_an_unknown_scheme_is_refused_listing_every_backend() -> None:
    with pytest.raises(ValueError) as e:
        check_location("gs://b/run")
    assert str(e.value) == ("'gs://b/run': use s3://bucket/prefix (any S3-compatible endpoint, with endpointUrl), "
                            "pvc://claim/prefix (a PersistentVolumeClaim of the job's namespace) or a local path")


def test_a_scheme_is_registered_once() -> None:
    with pytest.raises(ValueError, match="'s3' is empty or already registered"):
        storage_backends.register(S3)
    with pytest.raises(ValueError, match="'s3' is already registered"):
        backends.register("s3", location_for)


def test_every_descriptor_has_the_trainer_s_factory() -> None:
    assert backends.missing() == []


def test_a_bare_scheme_is_no_location_of_checkpoints() -> None:
    assert split_checkpoint_uri("s3://checkpoint-5") == ("s3://checkpoint-5", None)
    assert split_checkpoint_uri("pvc://checkpoint-5") == ("pvc://checkpoint-5", None)
    assert split_checkpoint_uri("s3://b/checkpoint-5/") == ("s3://b", "checkpoint-5")


class _Shelf(LocalLocation):
    """A toy store ``shelf://name/prefix`` kept in a folder, standing for a new object store."""

    def __init__(self, uri: str, root: Path, where: str) -> None:
        super().__init__(root / uri.removeprefix("shelf://"), where=where)
        self.uri = uri


class _ShelfBackend(StorageBackend):
    """The descriptor."""

    scheme, form = "shelf", "shelf://name/prefix (a test store)"
    remote = durable = True  # an object store's answers

    def check(self, uri: str) -> str:
        if not uri.removeprefix("shelf://"):
            raise ValueError("shelf:// needs a name")
        return uri

    def cel_rule(self, expr: str) -> tuple[str, str]:
        return f"{expr} != 'shelf://'", "shelf:// needs a name"

    def cel_holds(self, uri: str) -> bool:
        return uri != "shelf://"


@pytest.fixture
def shelf(tmp_path: Path) -> Iterator[_ShelfBackend]:
    backend = _ShelfBackend()
    storage_backends.register(backend)

    def open_shelf(uri: str, *, where: str, **options: Any) -> Location:  # the implementation
        return _Shelf(uri, tmp_path / "shelf", where)

    backends.register("shelf", open_shelf)
    try:
        yield backend
    finally:
        storage_backends._BACKENDS.pop("shelf")
        backends._FACTORIES.pop("shelf")


def test_a_registered_backend_is_used_everywhere_without_other_changes(shelf: _ShelfBackend, tmp_path: Path) -> None:
    assert CheckpointSpec(storage="shelf://team/run").storage == "shelf://team/run"
    with pytest.raises(ValidationError, match="shelf:// needs a name"):
        CheckpointSpec(storage="shelf://")
    with pytest.raises(ValidationError, match=r"shelf://name/prefix \(a test store\) or a local path"):
        CheckpointSpec(mirrors=[{"location": "gs://b"}])
    cfg = TrainerConfig.model_validate({"jobName": "j", "outputDir": str(tmp_path / "out"),
                                        "checkpoint": {"storage": "shelf://team/run"}})
    plan = storage_plan(cfg)
    assert plan.primary.uri == "shelf://team/run" and plan.remote_primary
    assert plan.local_root == tmp_path / "out" / "checkpoint-staging" and plan.publish_to == [plan.primary]
    assert isinstance(location_for("shelf://team/run", where="here"), _Shelf)
    spec = cfg.checkpoint
    assert durability(spec, lambda: pytest.fail("a remote location needs no pod")).durable
    assert claim_volumes(spec) == ([], []) and mounted_location("shelf://team/run") == "shelf://team/run"
    rules = location_rules("spec.checkpoint", "storage", storage_backends.backends(), "CheckpointSpec._storage_form")
    shelf_rule = next(r for r in rules if r.name == "spec.checkpoint.storage: the shelf:// rule")
    assert shelf_rule.cel == "!has(self.storage) || self.storage != 'shelf://'"
    assert not shelf_rule.holds(CheckpointSpec.model_construct(storage="shelf://"))
    assert shelf_rule.holds(CheckpointSpec(storage="shelf://team/run"))


def test_the_registry_and_the_config_load_without_boto3_torch_or_the_trainer() -> None:
    code = ("import sys, rljob_contract.spec, rljob_contract.plugins.storage, rljob_operator.crd; "
            "print(sorted(m for m in ('boto3', 'botocore', 'torch', 'rljob_trainer') if m in sys.modules))")
    env_path = f"{REPO}/contract:{REPO}/operator:{REPO}/trainer:{REPO}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"
