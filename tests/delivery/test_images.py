"""The images: what they install, and that they run under the restrictions of the pods that run them.

The locks (``tools/images/*.lock``) pin every package an image installs to requirements.lock's
version, with hashes; checked here without a network. The image tests (marker ``images``) build
``rljob-trainer:dev`` and ``rljob-operator:dev`` from this checkout with ``tools/images/build.sh``
(cached layers: seconds after the first build), then run them with podman under exactly what the
operator renders for a worker pod, and what the chart renders for the operator's pod (against the control plane:
``test_images_cluster.py``)
(``tests/support/containers.py`` translates a pod into podman's flags and refuses what it cannot).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.waiting import wait_for
from tests.support import containers
from tests.support.trainer import deep_update

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
IMAGES = containers.IMAGES


def _pins(lock: Path) -> dict[str, str]:
    """Package → version of a pip requirements file (``name==version`` lines)."""
    pins = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


@pytest.mark.parametrize("image", IMAGES)
def test_image_lock_pins_exactly_what_the_tests_ran_with_hashes(image: str) -> None:
    lock = REPO / "tools" / "images" / f"{image}.lock"
    pins, tested = _pins(lock), _pins(REPO / "requirements.lock")
    differ = {name: (version, tested.get(name)) for name, version in pins.items() if tested.get(name) != version}
    assert not differ, f"{lock.name} pins other versions than requirements.lock (run `make locks`): {differ}"
    # Every package of the image's extra (and the base dependencies) is in its lock.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"][image]]
    names = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in wanted}
    assert names - set(pins) == set(), f"{lock.name} lacks direct dependencies (run `make locks`)"
    # Each pin carries at least one hash, so pip's --require-hashes mode accepts the file at all.
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
    unhashed = [b.split("==")[0] for b in blocks if "==" in b.split("\n")[0] and "--hash=sha256:" not in b]
    assert unhashed == []
    assert ("torch" in pins) == (image == "trainer"), "only the trainer image carries torch"


@pytest.mark.parametrize("image", IMAGES)
def test_dockerfile_installs_its_lock_hash_checked_on_a_base_without_torch(image: str) -> None:
    text = (REPO / f"Dockerfile.{image}").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M)
    assert base and base.group(1).startswith("docker.io/library/python:3.11-slim"), "users' default base"
    assert "FROM ${BASE_IMAGE}" in text
    assert f"--require-hashes -r /opt/rljob/{image}.lock" in text
    # The dependency layer comes before the code, so a code change reuses it.
    assert text.index(f"{image}.lock") < text.index("COPY operator")
    # Anything beyond the lock is opt-in: vLLM (the trainer's WITH_VLLM) is off unless asked for. The other
    # arguments only describe the image (its OCI labels and its SBOM's version: tools/images/build.sh passes them).
    described = {"VERSION=dev", "REVISION=unknown", "SOURCE=https://github.com/rljob/rljob"}
    assert [arg for arg in re.findall(r"^ARG (?!BASE_IMAGE)(\S+)", text, re.M) if arg not in described] == \
        (["WITH_VLLM=false"] if image == "trainer" else [])


# ------------------------------------------------------------------------------ built images


def _quickstart_pod(spec: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Worker 0 of the quickstart (``spec`` merged into its spec) and its ConfigMap, as the operator
    renders them (no status API)."""
    from rljob_contract.job import parse_job
    from rljob_operator.decisions.children import desired_configmap, desired_worker_pod

    doc = deep_update(yaml.safe_load(QUICKSTART.read_text()), {"spec": spec or {}})
    doc["metadata"].update(namespace="team-a", uid="7f1c2a52-0000-4000-8000-000000000001", generation=1)
    job = parse_job(doc, str(QUICKSTART))
    return desired_worker_pod(job, 0, 1), desired_configmap(job)


def _run(argv: list[str], name: str, timeout: float) -> subprocess.CompletedProcess[str]:
    containers.remove(name)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _worker_argv(pod: dict[str, Any], configmap: dict[str, Any], work: Path, image: str,
                 name: str) -> list[str]:
    """podman's argv for a rendered worker pod; its rendezvous name resolves to itself, as cluster DNS
    gives worker 0 its own address."""
    container = pod["spec"]["containers"][0]
    rdzv_host = next(e["value"] for e in container["env"] if e["name"] == "RLJOB_RDZV_ENDPOINT").rsplit(":", 1)[0]
    return containers.run_argv(pod, work, image=image, container_name=name,
                               files=containers.VolumeFiles({"rljob-config": configmap["data"]}),
                               hosts={rdzv_host: "127.0.0.1"})


def _container_name(kind: str, tmp_path: Path) -> str:
    return f"rljob-test-{kind}-{tmp_path.name[-12:]}".lower().replace("_", "")


@pytest.mark.images
def test_trainer_image_trains_the_quickstart_under_the_worker_pods_restrictions(
        built_images: dict[str, str], tmp_path: Path) -> None:
    pod, configmap = _quickstart_pod()
    container = pod["spec"]["containers"][0]
    # What a restricted pod is, as rendered: if the operator's pod changes, this run changes with it.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    name = _container_name("trainer", tmp_path)
    argv = _worker_argv(pod, configmap, tmp_path, built_images["trainer"], name)
    try:
        done = _run(argv, name, timeout=1500)
        log = (done.stdout + done.stderr)[-4000:]
        assert done.returncode == 0, log
        # Nothing was written outside the pod's volumes: the read-only root held, and everything
        # the trainer, TRL, transformers, matplotlib or torch wrote found a writable place.
        assert containers.changed_paths(name, argv) == []
    finally:
        containers.remove(name)
    out = containers.volume_folder(tmp_path, "rljob-workspace") / "output"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 120 and summary["reward_first"] <= 0.3, summary
    assert summary["reward_last"] >= 0.9, summary
    assert summary["checkpoints"] == ["checkpoint-80", "checkpoint-120"]
    # Written by the pod's user (uid 1000), not root; and no failure was reported.
    assert (out / "summary.json").stat().st_uid == 1000
    assert (tmp_path / "termination-log").read_text() == ""


# Compiled by inductor's C++ backend on first use (g++, Python's headers), cached under HOME=/tmp.
COMPILE = """
import torch
def f(x, y):
    return torch.sin(x) * y + torch.cos(y)
x, y = torch.randn(256, 256), torch.randn(256, 256)
compiled = torch.compile(f, fullgraph=True)  # a failed compile raises: no silent eager fallback
print("max-difference", float((compiled(x, y) - f(x, y)).abs().max()))
"""


@pytest.mark.images
def test_torch_compile_builds_its_kernels_where_the_worker_pod_may_write(
        built_images: dict[str, str], tmp_path: Path) -> None:
    pod, configmap = _quickstart_pod()
    container = pod["spec"]["containers"][0]
    container.update(command=["python", "-c", COMPILE], args=[])  # the worker pod, another command
    name = _container_name("compile", tmp_path)
    argv = _worker_argv(pod, configmap, tmp_path, built_images["trainer"], name)
    try:
        done = _run(argv, name, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert containers.changed_paths(name, argv) == []
    finally:
        containers.remove(name)
    difference = float(re.search(r"max-difference (\S+)", done.stdout).group(1))  # type: ignore[union-attr]
    assert difference < 1e-4
    # The kernel was compiled to a shared object in the pod's /tmp, by its user.
    kernels = list(containers.volume_folder(tmp_path, "rljob-tmp").glob("torchinductor_*/**/*.so"))
    assert kernels and all(k.stat().st_uid == 1000 for k in kernels)


@pytest.mark.images
def test_trainer_container_stopped_by_sigterm_saves_a_checkpoint_and_exits_143(
        built_images: dict[str, str], tmp_path: Path) -> None:
    """The kubelet signals the container's pid 1, the launcher itself: the ranks save and stop in time."""
    pod, configmap = _quickstart_pod({"training": {"maxSteps": 400}, "checkpoint": {"everySteps": 1000}})
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    name = _container_name("sigterm", tmp_path)
    argv = _worker_argv(pod, configmap, tmp_path, built_images["trainer"], name)
    argv.insert(argv.index("run") + 1, "--detach")
    metrics = containers.volume_folder(tmp_path, "rljob-workspace") / "output" / "metrics.jsonl"

    def stepping() -> int | None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        steps = [json.loads(line).get("step", 0) for line in lines if line.strip()]
        return max(steps) if steps and max(steps) >= 5 else None

    try:
        assert _run(argv, name, timeout=120).returncode == 0
        signalled_at = wait_for(stepping, 400, message="training under way in the container")
        started = time.monotonic()
        subprocess.run([containers.podman(), *containers.ENGINE, "kill", "--signal", "TERM", name], check=True)
        code = subprocess.run([containers.podman(), *containers.ENGINE, "wait", name], capture_output=True,
                              text=True, check=True, timeout=grace + 30).stdout.strip()
        stopped_in = time.monotonic() - started
        log = subprocess.run([containers.podman(), *containers.ENGINE, "logs", name], capture_output=True,
                             text=True).stderr[-3000:]
    finally:
        containers.remove(name)
    assert code == "143", log
    assert stopped_in < grace, f"stopped after {stopped_in:.0f} s, the pod's grace period is {grace} s"
    checkpoints = metrics.parent / "checkpoints"
    latest = (checkpoints / "latest").read_text().strip()
    assert signalled_at <= int(latest.split("-")[1]) < 400  # everySteps 1000: saved because of the signal
    assert (checkpoints / latest / "rljob-manifest.json").exists()
    assert "stopped by SIGTERM" in (tmp_path / "termination-log").read_text()


# --------------------------------------------------------------------- the operator's image
