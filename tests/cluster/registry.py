"""The dev cluster's OCI registry: CNCF distribution (``tools/registry``), plain HTTP on loopback.

``make release REGISTRY=<host:port>/rljob PLAIN_HTTP=1`` pushes the images and the chart to it, ``helm install
oci://`` installs from it, and the real node's containerd pulls from it (``hosts.toml`` below: the explicit
insecure-registry setting, HTTP to this one host only). It listens on 127.0.0.1, so nothing beyond this machine
reaches it, and containerd, a host process, does.

Its storage lives in the machine's cache (``$RLJOB_CACHE/registry``), like the real node's containerd root:
a push of an unchanged image sends only the layers the registry lacks (a code change: one small layer, not
the trainer's 7 GB). Started and stopped with the control plane, as one of its processes.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from tests.cluster.processes import cache_dir

#: The repository the images and the chart are pushed under: ``<address>/rljob/{trainer,operator}``,
#: ``oci://<address>/rljob/charts/rljob``.
NAMESPACE = "rljob"


def storage_root() -> Path:
    """Where the registry keeps blobs and manifests, across runs."""
    root = cache_dir() / "registry"
    root.mkdir(parents=True, exist_ok=True)
    return root


def config(address: str, root: Path) -> str:
    """distribution's configuration: filesystem storage, plain HTTP on ``address``, deletes allowed (a test
    may move a tag, never needs to reclaim space), upload purging off (two registries may share ``root``)."""
    return f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {address}
"""


def argv(binary: Path, config_file: Path) -> list[str]:
    return [str(binary), "serve", str(config_file)]


def answers(address: str) -> bool:
    """The registry serves the distribution API (``GET /v2/`` is 200 without credentials)."""
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def hosts_toml(address: str) -> str:
    """containerd's ``certs.d/<address>/hosts.toml``: pull from this registry over plain HTTP."""
    return (f'server = "http://{address}"\n\n'
            f'[host."http://{address}"]\n'
            '  capabilities = ["pull", "resolve"]\n')


def write_hosts(config_path: Path, address: str) -> Path:
    """The node's ``config_path`` folder with this registry's ``hosts.toml``; returns the file."""
    folder = config_path / address
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts.toml").write_text(hosts_toml(address))
    return folder / "hosts.toml"
