"""The real node's images, kept between runs: containerd's root lives in the machine's cache, and an
image is imported from the local podman storage only when containerd lacks that image ID.

Loading the trainer image (``podman save | ctr images import``: 7 GB written twice, as content and
as unpacked layers) took about 3.5 minutes of every ``make e2e``. containerd's root (its content
store, metadata and snapshots) now stays in ``$RLJOB_CACHE/containerd``, beside a record of the
podman image ID each name was imported from; the next node imports only the names whose ID
changed (a rebuilt image) or that containerd no longer lists.

Only images may outlive a node: the CRI keeps its pods as containerd containers in the same root.
A node's teardown deletes every container while containerd still runs, then marks the root clean;
a node starting on a root without that mark (its last owner crashed, or this is the first use)
empties it first. One real node per machine (``realnode.refuse_second_node``), so one user at a time.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from tests.cluster.processes import cache_dir

#: Written by a teardown that left images only; removed while a node uses the root.
CLEAN_MARK = ".rljob-clean"
#: Image name -> the podman image ID it was imported from.
RECORD = "rljob-images.json"
#: The CRI's per-pod folders in the root (empty once the pods' containers are deleted).
CRI_POD_FOLDERS = (("io.containerd.grpc.v1.cri", "sandboxes"), ("io.containerd.grpc.v1.cri", "containers"))

#: ``ctr`` on the node's containerd in the CRI's namespace: (argv after ``ctr``) -> stdout.
Ctr = Callable[..., str]


def image_root() -> Path:
    """containerd's root for every real node of this machine."""
    return cache_dir() / "containerd"


def claim(root: Path, unmount: Callable[[Path], None]) -> Path:
    """The root for a starting node: kept when the last node left it clean (images only), emptied
    otherwise (its owner crashed with pods in it, an import was cut short, or nothing is there yet)."""
    mark = root / CLEAN_MARK
    if mark.exists():
        mark.unlink()  # in use: a crash from here on leaves it unmarked
    elif root.exists():
        unmount(root)
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    return root


def to_import(wanted: Mapping[str, str], recorded: Mapping[str, str], present: Iterable[str]) -> list[str]:
    """The names of ``wanted`` (name -> podman image ID) containerd lacks as that ID: never imported,
    imported from another build, or no longer listed by containerd."""
    listed = set(present)
    return [name for name, image_id in wanted.items() if recorded.get(name) != image_id or name not in listed]


def read_record(root: Path) -> dict[str, str]:
    try:
        record = json.loads((root / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else {}


def write_record(root: Path, record: Mapping[str, str]) -> None:
    """Atomically: a crash mid-write leaves the old record (and the root unmarked, so emptied anyway)."""
    tmp = root / (RECORD + ".tmp")
    tmp.write_text(json.dumps(dict(sorted(record.items())), indent=1))
    tmp.replace(root / RECORD)


def podman_image_id(image: str) -> str:
    """The ID of ``image`` in the local podman storage (the digest of its configuration)."""
    return subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True,
                          text=True, check=True).stdout.strip()


def load(root: Path, images: Iterable[str], ctr: Ctr, import_image: Callable[[str], None],
         image_id: Callable[[str], str] = podman_image_id) -> tuple[list[str], list[str]]:
    """Import the ``images`` containerd lacks by ID, recording each one once imported.

    Returns (imported, kept)."""
    wanted = {image: image_id(image) for image in images}
    record = read_record(root)
    missing = to_import(wanted, record, ctr("images", "ls", "-q").split())
    for image in missing:
        record.pop(image, None)
        write_record(root, record)  # forgotten before the import: a failed one is not trusted later
        import_image(image)
        record[image] = wanted[image]
        write_record(root, record)
    return missing, [image for image in wanted if image not in missing]


def forget_pods(ctr: Ctr) -> bool:
    """Delete every container (to the CRI, pods' sandboxes are containers too) and its task, so the
    root holds images only. True when none is left."""
    for container in ctr("containers", "ls", "-q").split():
        for argv in (("tasks", "delete", "--force", container), ("containers", "delete", container)):
            # No task (never started, or already deleted): the container's delete still runs.
            with contextlib.suppress(subprocess.CalledProcessError):
                ctr(*argv)
    return not ctr("containers", "ls", "-q").split()


def mark_clean(root: Path) -> None:
    """After containerd stopped with no container left: the CRI's per-pod folders go, the mark is written."""
    for parts in CRI_POD_FOLDERS:
        folder = root.joinpath(*parts)
        if folder.is_dir():
            for entry in folder.iterdir():
                shutil.rmtree(entry, ignore_errors=True)
    (root / CLEAN_MARK).write_text("images only: the next real node keeps them\n")
