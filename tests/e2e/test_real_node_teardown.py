"""The real node's teardown, without a node: what it removes from the host and what it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import realnode


def _node_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[realnode.RealNodeState, Path]:
    """A state whose node made the device-plugin folder (and its parent), as kubelet fills it."""
    plugins = tmp_path / "var-lib-kubelet" / "device-plugins"
    monkeypatch.setattr(realnode, "DEVICE_PLUGIN_DIR", plugins)
    state = realnode.RealNodeState(directory=str(tmp_path / "node"), bridge="rljob-test0", subnet="10.0.0.0/24")
    state.created_paths = [str(plugins), str(plugins.parent)]
    plugins.mkdir(parents=True)
    for name in realnode.DEVICE_PLUGIN_FILES:
        (plugins / name).write_text("kubelet's")
    return state, plugins


def test_teardown_removes_the_device_plugin_folder_kubelet_made_outside_its_root_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, plugins = _node_made(tmp_path, monkeypatch)
    realnode._restore_host(state)
    assert not plugins.exists() and not plugins.parent.exists()


def test_teardown_keeps_the_folder_when_something_else_put_a_file_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, plugins = _node_made(tmp_path, monkeypatch)
    (plugins / "nvidia.sock").write_text("another device plugin's")
    realnode._restore_host(state)
    assert sorted(p.name for p in plugins.iterdir()) == ["nvidia.sock"]  # kubelet's own files went


def test_a_folder_that_existed_before_the_node_is_not_in_its_record(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    existing = tmp_path / "kubelet" / "device-plugins"
    existing.mkdir(parents=True)
    monkeypatch.setattr(realnode, "DEVICE_PLUGIN_DIR", existing)
    monkeypatch.setattr(realnode, "SYSCTLS", ())
    monkeypatch.setattr(realnode.subprocess, "run", lambda *a, **k: type("R", (), {"stdout": ""})())
    state = realnode.RealNodeState(directory=str(tmp_path / "node"), bridge="rljob-test0", subnet="10.0.0.0/24")
    realnode.save_host_settings(state)
    assert str(existing) not in state.created_paths and str(existing.parent) not in state.created_paths
