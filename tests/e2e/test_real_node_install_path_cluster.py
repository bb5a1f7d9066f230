"""docs/install.md's install path, run as written: ``make release`` to the dev cluster's registry, ``helm install
oci://`` from it, the default runtime, the quickstart; and a moved tag that changes nothing a job pulls.

The control plane of ``make e2e`` has a registry (``tests/cluster/registry.py``: distribution, plain HTTP on
127.0.0.1) and the real node, whose containerd pulls from it. Every command between the page's
``<!-- install-path -->`` markers runs in order, in a shell at the repository's root, with ``REGISTRY`` the
dev registry, ``VERSION`` pyproject's, ``PLAIN_HTTP=1`` and kubectl and helm on ``PATH``; its YAML block is
``rljob-values.yaml``, to which the test adds what this machine needs (the real node's selector, one operator
replica, the workers' memory). What is asserted is what an operator of the cluster sees: the images by digest
in the pods, the quickstart Succeeded with its reward learned, the kubelet's pulls.

Run by ``make e2e`` (``pytest -m realnode``), never by ``make test``.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import realnode, registry
from tests.cluster.waiting import wait_for
from tests.delivery.test_install_cluster import delete_namespace, hand_crd_to_release
from tests.support.operator_process import create_job, get_job, job_pods, wait_phase
from tests.support.scripts import load_script
from tests.support.trainer import deep_update

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "docs" / "install.md"
VALUES_FILE = REPO / "rljob-values.yaml"
E2E_VALUES = Path(__file__).with_name("real-node-values.yaml")
OPERATOR_NS, JOBS_NS = "rljob-system", "team-a"
VERSION = load_script(REPO / "tools" / "gen_version.py").project_version()
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json")


def install_path(page: Path = INSTALL) -> tuple[list[str], str]:
    """The commands of the page's install path (a ``\\``-continued line joined), and its one YAML block."""
    text = page.read_text()
    section = text.split("<!-- install-path -->", 1)[1].split("<!-- /install-path -->", 1)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", section, flags=re.M | re.S)
    commands = [command for language, body in blocks if language == "sh"
                for command in body.replace("\\\n", " ").splitlines() if command.strip()]
    values = [body for language, body in blocks if language == "yaml"]
    assert len(values) == 1, f"{page}: the install path has {len(values)} YAML blocks, not one"
    return commands, values[0]


def this_machines_values() -> dict[str, Any]:
    """What the real node needs beside a user's values: the e2e values (the chart's pinned images stay), plus
    the operator on the real node, one replica."""
    values = yaml.safe_load(E2E_VALUES.read_text())
    return deep_update(values, {"replicaCount": 1, "nodeSelector": {realnode.REAL_NODE_LABEL: "true"}})


def tag_digest(address: str, repository: str, tag: str) -> str:
    """What ``repository:tag`` resolves to in the registry now (its manifest's digest)."""
    request = urllib.request.Request(f"http://{address}/v2/{repository}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": MANIFEST_TYPES})
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


@dataclass
class Installed:
    """What the install path left: the registry's address, the release's output, the shell's environment."""

    address: str
    output: str
    env: dict[str, str]

    @property
    def registry(self) -> str:
        return f"{self.address}/{registry.NAMESPACE}"

    def digest(self, image: str) -> str:
        """The digest ``make release`` printed for ``image``."""
        found = re.search(rf"{image} image +\S+/{image}@(sha256:[0-9a-f]{{64}})", self.output)
        assert found, self.output
        return found.group(1)


def run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=3600, check=False)
    assert result.returncode == 0, f"`{command}` failed ({result.returncode}):\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(control_plane: Any, kube: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The install path run once, from the page; uninstalled and its namespaces deleted after the module."""
    assert control_plane.registry_address, "run with -m realnode (make e2e): the control plane has no registry"
    commands, values = install_path()
    home = tmp_path_factory.mktemp("helm")
    env = {**os.environ, "REGISTRY": f"{control_plane.registry_address}/{registry.NAMESPACE}",
           "VERSION": VERSION, "PLAIN_HTTP": "1", "COMPRESSION": "zstd",
           "PATH": f"{control_plane.bin}:{os.environ['PATH']}", "KUBECONFIG": str(control_plane.admin_kubeconfig),
           **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}}
    VALUES_FILE.write_text(yaml.safe_dump(deep_update(yaml.safe_load(values), this_machines_values())))
    hand_crd_to_release(kube, "rljob", OPERATOR_NS)  # the session's CRDs predate the release
    output = []
    try:
        for command in commands:
            output.append(run(command, env).stdout)
        yield Installed(control_plane.registry_address, "\n".join(output), env)
    finally:
        VALUES_FILE.unlink(missing_ok=True)
        subprocess.run(["helm", "uninstall", "rljob", "--namespace", OPERATOR_NS], env=env, capture_output=True,
                       check=False)
        for namespace in (JOBS_NS, OPERATOR_NS):
            delete_namespace(kube, namespace)


def image_ids(pods: list[dict[str, Any]]) -> set[str]:
    """The digests the kubelet reports the pods' containers run (``status.containerStatuses[].imageID``)."""
    return {status["imageID"].rsplit("@", 1)[-1] for pod in pods for status in pod["status"]["containerStatuses"]}


@pytest.mark.timeout(3600)  # the module's install path included: `make release` pushes 3 GB when the registry is cold
def test_the_install_path_of_the_docs_runs_as_written_and_the_quickstart_learns_on_pulled_images(
        installed: Installed, kube: Any) -> None:
    trainer, operator = installed.digest("trainer"), installed.digest("operator")
    for image, digest in (("trainer", trainer), ("operator", operator)):
        assert tag_digest(installed.address, f"{registry.NAMESPACE}/{image}", VERSION) == digest
    operator_pod = next(p for p in kube.list_pods(OPERATOR_NS, "app.kubernetes.io/component=operator"))
    container = operator_pod["spec"]["containers"][0]
    assert container["image"] == f"{installed.registry}/operator@{operator}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert operator_pod["spec"]["nodeName"] == realnode.NODE_NAME and image_ids([operator_pod]) == {operator}
    job = get_job(kube, JOBS_NS, "quickstart")
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["progress"]["step"] == 120  # heartbeats reached the status API through its Service
    assert job["status"]["progress"]["reward"] >= 0.9, job["status"]["progress"]
    runtime = kube.request("GET", "/apis/rljob.dev/v1alpha1/clusterrltrainingruntimes/cpu")
    assert runtime["metadata"]["annotations"]["rljob.dev/is-default-runtime"] == "true"
    assert runtime["spec"]["image"] == f"{installed.registry}/trainer@{trainer}"
    log = subprocess.run(["kubectl", "logs", "-n", OPERATOR_NS, operator_pod["metadata"]["name"]],
                         env=installed.env, capture_output=True, text=True, check=True).stdout
    assert "Forbidden" not in log


def node_ctr(control_plane: Any, *args: str) -> str:
    binaries = realnode.real_node_bin_dir(build=False)
    return str(realnode.ctr(binaries, control_plane.real_node, *args, text=True, timeout=300).stdout)


def forget_image(control_plane: Any, digest: str) -> list[str]:
    """Remove every name containerd keeps for the image of manifest ``digest`` (its content with them), so the
    next pod that names it must pull it; returns the names removed."""
    names = [line.split()[0] for line in node_ctr(control_plane, "images", "ls").splitlines()[1:]
             if digest in line.split()]
    if names:
        node_ctr(control_plane, "images", "rm", "--sync", *names)
    return names


@pytest.mark.timeout(1800)
def test_a_tag_moved_to_another_image_does_not_change_what_a_running_jobs_next_gang_pulls(
        installed: Installed, control_plane: Any, kube: Any) -> None:
    trainer = installed.digest("trainer")
    repository = f"{registry.NAMESPACE}/trainer"
    job = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "pinned"},
           "spec": {**yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())["spec"],
                    "workers": {"replicas": 2, "procsPerWorker": 1, "resources": {"limits": {"memory": "3Gi"}}}}}
    job["spec"]["training"]["maxSteps"] = 2000
    create_job(kube, JOBS_NS, job)
    wait_phase(kube, JOBS_NS, "pinned", "Running", timeout=300)
    first = job_pods(kube, JOBS_NS, "pinned")
    assert image_ids(first) == {trainer}
    moved = ["podman", "push", "--quiet", "--tls-verify=false", f"localhost/rljob-operator:{VERSION}",
             f"{installed.registry}/trainer:{VERSION}"]
    try:
        subprocess.run(moved, check=True, capture_output=True, timeout=600)
        assert tag_digest(installed.address, repository, VERSION) != trainer  # the tag names another image now
        assert forget_image(control_plane, trainer), "containerd had no name for the trainer's digest"
        kube.request("DELETE", kube.core_path(JOBS_NS, "pods", "pinned-worker-1"))
        uids = {p["metadata"]["uid"] for p in first}

        def next_gang() -> list[dict[str, Any]] | None:
            pods = job_pods(kube, JOBS_NS, "pinned")
            fresh = len(pods) == 2 and not {p["metadata"]["uid"] for p in pods} & uids
            started = fresh and all(s.get("imageID") for p in pods for s in p["status"].get("containerStatuses", []))
            return pods if started and all(p["status"].get("containerStatuses") for p in pods) else None

        second = wait_for(next_gang, 900, message="the next gang's containers started")
        assert {p["spec"]["containers"][0]["image"] for p in second} == {f"{installed.registry}/trainer@{trainer}"}
        assert image_ids(second) == {trainer}
        # The kubelet pulled it (containerd had forgotten it), by digest, from the registry whose tag moved.
        pulled = [e["message"] for e in kube.request("GET", kube.core_path(JOBS_NS, "events"))["items"]
                  if e["reason"] == "Pulled" and e["involvedObject"]["uid"] in {p["metadata"]["uid"] for p in second}]
        assert any(m.startswith("Successfully pulled image") for m in pulled), pulled
        assert all(f"{installed.registry}/trainer@{trainer}" in m for m in pulled), pulled
        wait_phase(kube, JOBS_NS, "pinned", "Running", timeout=300)
    finally:
        restore = ["podman", "push", "--quiet", "--tls-verify=false", "--compression-format", "zstd",
                   f"localhost/rljob-trainer:{VERSION}", f"{installed.registry}/trainer:{VERSION}"]
        subprocess.run(restore, check=False, capture_output=True, timeout=1200)
        kube.request("DELETE", kube.job_path(JOBS_NS, "pinned"))
    assert tag_digest(installed.address, repository, VERSION) == trainer, "the tag was not restored"
