"""Run a Kubernetes pod's container with podman, under exactly the restrictions the pod declares.

The pod is the one the operator (or the chart) renders, never a copy of its fields: ``run_argv``
reads its user, security contexts, volumes, mounts, environment, command and memory limit, and
turns each into the podman flag a kubelet's runtime would apply. Anything it does not know how to
translate is refused (``Untranslatable``), so a field the pod gains can never be dropped silently.
What a node provides from outside the pod is supplied by the caller: the files of a ConfigMap,
Secret or projected volume (``VolumeFiles``) and the values of downward-API fields.

This machine's limits, measured: runc (crun refuses the hybrid cgroup layout), cgroupfs, and
rlimits within what the process may raise (no CAP_SYS_RESOURCE: podman's defaults are refused).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Flags every podman call here needs on this kind of machine (see the module docstring).
#: The two images of the repository, by their Dockerfile's suffix (``Dockerfile.<image>``).
IMAGES = ("trainer", "operator")

ENGINE = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
#: Where Kubernetes puts a container's termination message unless the container says otherwise.
TERMINATION_LOG = "/dev/termination-log"
#: Container securityContext fields this translation honours (anything else is refused).
CONTAINER_SECURITY = {"allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities", "runAsUser",
                      "runAsGroup", "runAsNonRoot", "seccompProfile", "privileged"}
POD_SECURITY = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "seccompProfile", "supplementalGroups"}
#: Container fields that need no flag: ports (the network is the caller's), probes (the caller
#: checks them itself), the termination message policy (the file is mounted either way).
INERT_CONTAINER_FIELDS = {"name", "image", "ports", "startupProbe", "livenessProbe", "readinessProbe",
                          "terminationMessagePolicy", "imagePullPolicy"}


class Untranslatable(ValueError):
    """A pod field this translation cannot give the container; named by its path in the pod."""


@dataclass
class VolumeFiles:
    """What the node would put in the pod's non-empty volumes: volume name → {file name: content}."""

    files: dict[str, dict[str, str]] = field(default_factory=dict)


def podman() -> str:
    """The podman binary, or a clear error naming how to get it."""
    path = shutil.which("podman")
    if path is None:
        raise FileNotFoundError("podman is not installed: `make images` installs it (tools/images/engine.sh)")
    return path


def _security(pod_spec: dict[str, Any], container: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod_sc = pod_spec.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    for key in set(pod_sc) - POD_SECURITY:
        raise Untranslatable(f"spec.securityContext.{key}")
    for key in set(sc) - CONTAINER_SECURITY:
        raise Untranslatable(f"spec.containers[{container['name']}].securityContext.{key}")
    return pod_sc, sc


def _user_flags(pod_sc: dict[str, Any], sc: dict[str, Any]) -> list[str]:
    """--user and groups as the kubelet resolves them: the container's fields over the pod's."""
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    if non_root and (uid is None or int(uid) == 0):
        raise Untranslatable("runAsNonRoot needs a numeric non-zero runAsUser here (the image's USER is not read)")
    flags: list[str] = []
    if uid is not None:
        flags += ["--user", f"{uid}:{gid if gid is not None else uid}"]
    for group in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])]:
        if group is not None:
            flags += ["--group-add", str(group)]
    return flags


def _hardening_flags(pod_sc: dict[str, Any], sc: dict[str, Any]) -> list[str]:
    """Capabilities, privilege escalation, seccomp and the read-only root."""
    if sc.get("privileged"):
        raise Untranslatable("securityContext.privileged")
    flags: list[str] = []
    caps = sc.get("capabilities") or {}
    flags += [f"--cap-drop={c.lower()}" for c in caps.get("drop") or []]
    flags += [f"--cap-add={c.lower()}" for c in caps.get("add") or []]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    elif seccomp not in (None, "RuntimeDefault"):  # podman's default profile is the runtime default
        raise Untranslatable(f"seccompProfile.type {seccomp}")
    if sc.get("readOnlyRootFilesystem"):
        # Podman adds writable tmpfs at /tmp, /var/tmp and /run to a read-only root unless told not
        # to; a kubelet adds none, so only the pod's own volumes are writable.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    return flags


def _volume_sources(pod_spec: dict[str, Any], work: Path, files: VolumeFiles,
                    fs_group: int | None) -> dict[str, tuple[str, Path | None, dict[str, Any]]]:
    """Volume name → (kind, host folder or None for tmpfs, the volume), each made as a kubelet would."""
    out: dict[str, tuple[str, Path | None, dict[str, Any]]] = {}
    for volume in pod_spec.get("volumes") or []:
        name = volume["name"]
        if "emptyDir" in volume:
            if (volume["emptyDir"] or {}).get("medium") == "Memory":
                out[name] = ("tmpfs", None, volume)
                continue
            folder = work / "volumes" / name
            folder.mkdir(parents=True)
            folder.chmod(0o777)  # a kubelet's emptyDir is world-writable (and group fsGroup)
            if fs_group is not None:
                os.chown(folder, 0, fs_group)
            out[name] = ("dir", folder, volume)
        elif {"configMap", "secret", "projected"} & set(volume):
            if name not in files.files:
                raise Untranslatable(f"spec.volumes[{name}]: the caller supplies no files for it")
            folder = work / "volumes" / name
            folder.mkdir(parents=True)
            for file_name, content in files.files[name].items():
                (folder / file_name).write_text(content)
                (folder / file_name).chmod(0o644)
            out[name] = ("files", folder, volume)
        else:
            raise Untranslatable(f"spec.volumes[{name}]: kind {sorted(set(volume) - {'name'})}")
    return out


def _mount_flags(container: dict[str, Any], sources: dict[str, tuple[str, Path | None, dict[str, Any]]]) -> list[str]:
    flags: list[str] = []
    for mount in container.get("volumeMounts") or []:
        unknown = set(mount) - {"name", "mountPath", "readOnly"}
        if unknown:
            raise Untranslatable(f"volumeMounts[{mount['name']}].{sorted(unknown)[0]}")
        kind, folder, volume = sources[mount["name"]]
        target = mount["mountPath"]
        if kind == "tmpfs":
            size = (volume["emptyDir"] or {}).get("sizeLimit")
            flags += ["--mount", f"type=tmpfs,destination={target},tmpfs-mode=1777"
                      + (f",tmpfs-size={_bytes(size)}" if size else "")]
        else:
            # ConfigMap, Secret and projected volumes are read-only in every pod.
            read_only = mount.get("readOnly") or kind == "files"
            flags += ["--volume", f"{folder}:{target}:{'ro' if read_only else 'rw'}"]
    return flags


def _env_flags(container: dict[str, Any], fields: dict[str, str], node_env: dict[str, str]) -> list[str]:
    """-e for each variable; downward-API fields from ``fields`` (metadata.name → value); ``node_env``
    replaces or adds what differs on this machine (what a kubelet adds, such as KUBERNETES_SERVICE_HOST)."""
    if container.get("envFrom"):
        raise Untranslatable(f"spec.containers[{container['name']}].envFrom")
    flags: list[str] = []
    for key, value in node_env.items():
        flags += ["--env", f"{key}={value}"]
    for entry in container.get("env") or []:
        if entry["name"] in node_env:
            continue
        if "value" in entry or "valueFrom" not in entry:  # the API server stores value "" as no value at all
            flags += ["--env", f"{entry['name']}={entry.get('value', '')}"]
            continue
        ref = (entry.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        if ref not in fields:
            raise Untranslatable(f"env {entry['name']}: valueFrom {entry.get('valueFrom')}")
        flags += ["--env", f"{entry['name']}={fields[ref]}"]
    return flags


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity (``16Mi``) in bytes, as podman's flags want it."""
    from kubernetes.utils import parse_quantity

    return int(parse_quantity(quantity))


def _memory_flags(container: dict[str, Any]) -> list[str]:
    limits = (container.get("resources") or {}).get("limits") or {}
    flags: list[str] = []
    if "memory" in limits:
        flags += ["--memory", str(_bytes(limits["memory"]))]
    if "cpu" in limits:
        from kubernetes.utils import parse_quantity

        flags += ["--cpus", str(float(parse_quantity(limits["cpu"])))]
    return flags


def run_argv(pod: dict[str, Any], work: Path, *, image: str | None = None, files: VolumeFiles | None = None,
             network: list[str] | None = None, hosts: dict[str, str] | None = None,
             node_env: dict[str, str] | None = None, container_name: str | None = None) -> list[str]:
    """``podman run`` argv for the pod's first container, with its host folders made under ``work``.

    ``image`` replaces the container's image (a locally built tag for the image a pod names);
    ``network`` is the network flags (default: none, so nothing is downloaded); ``hosts`` are
    names the container resolves (name → address), standing in for the cluster's DNS; ``node_env``
    is the environment a node adds or must change here (free ports on a shared host network).
    """
    spec = pod["spec"]
    container = spec["containers"][0]
    unknown = set(container) - INERT_CONTAINER_FIELDS - {"command", "args", "env", "envFrom", "resources",
                                                         "volumeMounts", "securityContext", "workingDir",
                                                         "terminationMessagePath"}
    if unknown:
        raise Untranslatable(f"spec.containers[{container['name']}].{sorted(unknown)[0]}")
    pod_sc, sc = _security(spec, container)
    sources = _volume_sources(spec, work, files or VolumeFiles(), pod_sc.get("fsGroup"))
    termination = work / "termination-log"
    termination.touch(mode=0o666)
    termination.chmod(0o666)
    meta = pod["metadata"]
    # --passwd=false: podman adds a password-database entry for a --user the image lacks; a kubelet's
    # runtime does not (kopf's identity lookup failed on exactly that, under containerd only).
    argv = [podman(), *ENGINE, "run", "--rm=false", "--passwd=false", "--name", container_name or meta["name"],
            *ULIMITS,
            *(network if network is not None else ["--network", "none"]),
            *_user_flags(pod_sc, sc), *_hardening_flags(pod_sc, sc), *_mount_flags(container, sources),
            "--volume", f"{termination}:{container.get('terminationMessagePath', TERMINATION_LOG)}:rw",
            *_env_flags(container, {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", "")},
                        node_env or {}),
            *_memory_flags(container)]
    for host, address in (hosts or {}).items():
        argv += ["--add-host", f"{host}:{address}"]
    if spec.get("hostname"):
        argv += ["--hostname", spec["hostname"]]
    if container.get("workingDir"):
        argv += ["--workdir", container["workingDir"]]
    if container.get("command"):
        argv += ["--entrypoint", json.dumps(container["command"])]
    return [*argv, image or container["image"], *(container.get("args") or [])]


def volume_folder(work: Path, name: str) -> Path:
    """The host folder behind the pod's volume ``name`` (an emptyDir the container wrote to)."""
    return work / "volumes" / name


def remove(name: str) -> None:
    """Remove a container by name, running or not (no error when it does not exist)."""
    subprocess.run([podman(), *ENGINE, "rm", "--force", "--ignore", name], check=False, capture_output=True)


#: Files the runtime itself writes into every container (a kubelet's runtime does the same).
RUNTIME_FILES = frozenset({"/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv"})


def _mount_points(argv: list[str]) -> set[str]:
    """Every mount destination of a ``run_argv`` argv, with its parents (the runtime makes them)."""
    points: set[str] = set()
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--volume":
            target = value.split(":")[1]
        elif flag == "--mount":
            target = dict(p.split("=", 1) for p in value.split(",") if "=" in p)["destination"]
        else:
            continue
        # /var/run is a link to /run in Debian, so a mount under it shows under /run.
        for path in {target, target.replace("/var/run/", "/run/", 1)}:
            parts = Path(path).parts
            points.update(str(Path(*parts[:i])) for i in range(2, len(parts) + 1))
    return points


def changed_paths(name: str, argv: list[str]) -> list[str]:
    """What the container changed in its root file system (``podman diff``), beyond what the runtime
    makes for it (its mount points and ``RUNTIME_FILES``, with their folders)."""
    out = subprocess.run([podman(), *ENGINE, "diff", "--format", "json", name], check=True,
                         capture_output=True, text=True).stdout
    changes = json.loads(out or "{}")
    made = _mount_points(argv) | RUNTIME_FILES | {"/etc", "/run", "/dev"}
    return sorted({*changes.get("changed", []), *changes.get("added", []), *changes.get("deleted", [])} - made)
