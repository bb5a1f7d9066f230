"""The real node's kept images (tests/cluster/nodeimages.py), without a node: which images a start
imports, which it keeps, and when a kept containerd root is trusted or emptied."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cluster import nodeimages, realnode
from tests.cluster.processes import ProcessRecord

TRAINER, OPERATOR, BASE = "localhost/rljob-trainer:dev", "localhost/rljob-operator:dev", "localhost/rljob-base:b1"


class FakeContainerd:
    """What ``ctr`` answers about images and containers, and the imports done through it."""

    def __init__(self) -> None:
        self.images: set[str] = set()
        self.containers: dict[str, bool] = {}  # id -> has a task
        self.undeletable: set[str] = set()
        self.imported: list[str] = []

    def ctr(self, *args: str) -> str:
        kind, verb, *rest = args
        if verb == "ls":
            return "".join(f"{name}\n" for name in sorted(self.images if kind == "images" else self.containers))
        target = rest[-1]
        if kind == "tasks":
            if not self.containers.get(target):
                raise subprocess.CalledProcessError(1, ["ctr", *args], stderr=b"no running task found")
            self.containers[target] = False
        elif target not in self.undeletable:
            del self.containers[target]
        return ""

    def import_image(self, image: str) -> None:
        self.images.add(image)
        self.imported.append(image)


def ids(**changed: str) -> dict[str, str]:
    return {TRAINER: "sha256-trainer-1", OPERATOR: "sha256-operator-1", BASE: "sha256-base-1", **changed}


def load(root: Path, containerd: FakeContainerd, image_ids: dict[str, str]) -> tuple[list[str], list[str]]:
    return nodeimages.load(root, [BASE, TRAINER, OPERATOR], containerd.ctr, containerd.import_image,
                           image_id=image_ids.__getitem__)


def test_a_second_node_imports_nothing_and_a_rebuilt_image_alone(tmp_path: Path) -> None:
    containerd = FakeContainerd()
    assert load(tmp_path, containerd, ids()) == ([BASE, TRAINER, OPERATOR], [])
    assert json.loads((tmp_path / nodeimages.RECORD).read_text()) == ids()
    assert load(tmp_path, containerd, ids()) == ([], [BASE, TRAINER, OPERATOR])
    # `make images` after a code change: the trainer image has a new ID, the others are the same build.
    assert load(tmp_path, containerd, ids(**{TRAINER: "sha256-trainer-2"})) == ([TRAINER], [BASE, OPERATOR])
    assert containerd.imported == [BASE, TRAINER, OPERATOR, TRAINER]
    assert json.loads((tmp_path / nodeimages.RECORD).read_text())[TRAINER] == "sha256-trainer-2"


def test_an_image_containerd_no_longer_lists_is_imported_again_whatever_the_record_says(tmp_path: Path) -> None:
    containerd = FakeContainerd()
    load(tmp_path, containerd, ids())
    containerd.images.discard(OPERATOR)  # deleted by hand, or collected
    assert load(tmp_path, containerd, ids()) == ([OPERATOR], [BASE, TRAINER])


def test_a_failed_import_is_not_recorded_so_the_next_node_imports_it_again(tmp_path: Path) -> None:
    containerd = FakeContainerd()
    load(tmp_path, containerd, ids())

    def broken(image: str) -> None:
        raise realnode.RealNodeError(f"podman save {image} failed")

    with pytest.raises(realnode.RealNodeError):
        nodeimages.load(tmp_path, [TRAINER], containerd.ctr, broken,
                        image_id=ids(**{TRAINER: "sha256-trainer-2"}).__getitem__)
    assert TRAINER not in json.loads((tmp_path / nodeimages.RECORD).read_text())  # the old build is forgotten too
    assert load(tmp_path, containerd, ids(**{TRAINER: "sha256-trainer-2"}))[0] == [TRAINER]


def test_to_import_is_by_image_id_not_by_name() -> None:
    recorded = {TRAINER: "a", OPERATOR: "b"}
    assert nodeimages.to_import({TRAINER: "a", OPERATOR: "b"}, recorded, [TRAINER, OPERATOR]) == []
    assert nodeimages.to_import({TRAINER: "a2", OPERATOR: "b"}, recorded, [TRAINER, OPERATOR]) == [TRAINER]
    assert nodeimages.to_import({BASE: "c"}, recorded, [TRAINER, OPERATOR, BASE]) == [BASE]  # never recorded


def test_a_root_left_clean_is_kept_and_an_unmarked_one_emptied(tmp_path: Path) -> None:
    root, unmounted = tmp_path / "containerd", []
    assert nodeimages.claim(root, unmounted.append) == root and root.is_dir()  # first use
    (root / "blob").write_text("an image's layer")
    nodeimages.mark_clean(root)
    nodeimages.claim(root, unmounted.append)
    assert (root / "blob").exists() and not (root / nodeimages.CLEAN_MARK).exists()  # in use: unmarked
    assert unmounted == []
    # The node that used it crashed (no teardown marked it): pods may be in it, so it starts empty.
    nodeimages.claim(root, unmounted.append)
    assert list(root.iterdir()) == [] and unmounted == [root]


def test_marking_clean_removes_the_cri_pod_folders_and_keeps_the_images(tmp_path: Path) -> None:
    for parts in nodeimages.CRI_POD_FOLDERS:
        tmp_path.joinpath(*parts, "0123abcd").mkdir(parents=True)
    (tmp_path / "io.containerd.content.v1.content").mkdir()
    nodeimages.mark_clean(tmp_path)
    assert all(list(tmp_path.joinpath(*parts).iterdir()) == [] for parts in nodeimages.CRI_POD_FOLDERS)
    assert (tmp_path / "io.containerd.content.v1.content").is_dir() and (tmp_path / nodeimages.CLEAN_MARK).exists()


def test_forgetting_pods_deletes_every_container_with_or_without_a_task() -> None:
    containerd = FakeContainerd()
    containerd.containers = {"sandbox-a": True, "trainer-a": False, "sandbox-b": True}
    assert nodeimages.forget_pods(containerd.ctr) is True and containerd.containers == {}
    containerd.containers, containerd.undeletable = {"stuck": False}, {"stuck"}
    assert nodeimages.forget_pods(containerd.ctr) is False  # the root will not be marked clean


def _state(tmp_path: Path) -> realnode.RealNodeState:
    return realnode.RealNodeState(directory=str(tmp_path / "node"), bridge="rljob-test0", subnet="10.0.0.0/24",
                                  image_root=str(tmp_path / "containerd"))


def test_teardown_forgets_pods_only_while_containerd_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    containerd = FakeContainerd()
    containerd.containers = {"sandbox": True}
    monkeypatch.setattr(realnode, "ctr", lambda _binaries, _state, *args, **_kw: type(
        "Done", (), {"stdout": containerd.ctr(*args)})())
    dead = ProcessRecord(name="containerd", pid=2**22 + 1, exe="/usr/bin/containerd")  # beyond pid_max
    assert realnode._forget_pods(_state(tmp_path), dead) is False and containerd.containers == {"sandbox": True}
    monkeypatch.setattr(realnode, "is_running", lambda pid, exe=None: True)
    assert realnode._forget_pods(_state(tmp_path), dead) is True and containerd.containers == {}
    no_kept_root = realnode.RealNodeState(directory=str(tmp_path / "node"), bridge="rljob-test0", subnet="10.0.0.0/24")
    assert realnode._forget_pods(no_kept_root, dead) is False  # a node without a kept root forgets nothing


def test_containerd_keeps_its_root_in_the_cache_and_its_state_in_the_node_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pause.tag").write_text("3.10.2\n")
    monkeypatch.setattr(realnode.NodeBinaries, "__getitem__", lambda self, name: f"/usr/bin/{name}")
    state = _state(tmp_path)
    config = realnode.containerd_config(state, realnode.NodeBinaries(tmp_path / "bin"))
    assert f'root = "{tmp_path / "containerd"}"' in config
    assert f'state = "{tmp_path / "node" / "containerd" / "state"}"' in config
    monkeypatch.setenv("RLJOB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(realnode, "_unmount_under", lambda path: None)
    fresh = realnode.RealNodeState(directory=str(tmp_path / "node"), bridge="rljob-test0", subnet="10.0.0.0/24")
    realnode.claim_image_root(fresh)
    assert fresh.containerd_root == tmp_path / "cache" / "containerd" and fresh.containerd_root.is_dir()


def test_containerd_pulls_from_the_dev_registry_over_plain_http_named_in_its_hosts_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    from tests.cluster import registry

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pause.tag").write_text("3.10.2\n")
    monkeypatch.setattr(realnode.NodeBinaries, "__getitem__", lambda self, name: f"/usr/bin/{name}")
    state = _state(tmp_path)
    state.registry = "127.0.0.1:5000"
    config = tomllib.loads(realnode.containerd_config(state, realnode.NodeBinaries(tmp_path / "bin")))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["registry"] == {"config_path": str(tmp_path / "node" / "certs.d")}
    hosts = tomllib.loads(registry.write_hosts(state.registry_config_path, state.registry).read_text())
    # Plain HTTP to that host and port only: containerd reads <config_path>/<host:port>/hosts.toml.
    assert (tmp_path / "node" / "certs.d" / "127.0.0.1:5000" / "hosts.toml").is_file()
    assert hosts == {"server": "http://127.0.0.1:5000",
                     "host": {"http://127.0.0.1:5000": {"capabilities": ["pull", "resolve"]}}}
