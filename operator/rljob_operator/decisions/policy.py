"""The platform's pod profile and the check of a job against it (pure).

Whoever may create an RLTrainingJob must not get, through the operator, a pod they could not
create themselves. The platform team sets a :class:`PodProfile` (operator settings
``RLJOB_OPERATOR_POD_PROFILE`` …, the chart's ``podProfile``); before it builds any pod the
operator calls :func:`violations` and a job that asks for more fails with reason
``PolicyViolation``, naming each offending field (``lifecycle.policy_violation``).

Levels follow the Kubernetes Pod Security Standards:

* ``restricted`` (default): the ``restricted`` standard for everything in the pod, nothing
  host-level, no preset ``nodeName``, no tolerations of control-plane taints, no containers
  besides the trainer;
* ``baseline``: the ``baseline`` standard (root and more volume types allowed, still no host
  namespaces, hostPath, privileged containers or added capabilities beyond the baseline set);
* ``privileged``: no pod-level limits.

At every level the image must match ``allowedImages``, a ServiceAccount other than the
namespace's ``default`` must be in ``allowedServiceAccounts``, Secret references need
``allowSecretReferences`` and ``trust_remote_code`` needs ``allowTrustRemoteCode``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rljob_contract.job import DEFAULT_IMAGE, RLTrainingJob
from rljob_contract.references import SECRET, SERVICE_ACCOUNT, references

from rljob_operator.decisions.children import desired_worker_pod
from rljob_operator.decisions.podschema import unknown_fields
from rljob_operator.names import CONTAINER

LEVELS = ("restricted", "baseline", "privileged")
#: The trainer image rljob ships, any tag or digest (the chart's default as well).
DEFAULT_ALLOWED_IMAGES = (DEFAULT_IMAGE.rsplit(":", 1)[0] + ":*", DEFAULT_IMAGE.rsplit(":", 1)[0] + "@*")
#: Capabilities a container may add under Pod Security "baseline" (restricted: NET_BIND_SERVICE only).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
#: Volume types Pod Security "restricted" allows.
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})
#: Sysctls Pod Security "baseline" allows.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
#: Taints of control-plane nodes: trainers never go there.
CONTROL_PLANE_TAINTS = frozenset({"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
TEMPLATE = "spec.workers.podTemplate"


@dataclass(frozen=True)
class PodProfile:
    """What the platform allows a job's pods (see the module docstring); the default is the safest."""

    level: str = "restricted"
    allowed_images: tuple[str, ...] = DEFAULT_ALLOWED_IMAGES
    """Glob patterns (``fnmatch``) an image must match; ``*`` allows any."""
    allowed_service_accounts: tuple[str, ...] = ()
    """ServiceAccounts a job may run as, besides the namespace's ``default``."""
    allow_secret_references: bool = True
    """Jobs may name Secrets (credentialsSecret, secretKeyRef, secret volumes, imagePullSecrets);
    admission policies check that the job's creator may read them."""
    allow_trust_remote_code: bool = False
    """Jobs may load models whose repository ships Python code (``trust_remote_code``)."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"pod profile {self.level!r} is unknown: set RLJOB_OPERATOR_POD_PROFILE (the chart's "
                             f"podProfile.profile) to one of {', '.join(LEVELS)}")

    @classmethod
    def from_settings(cls, settings: Any) -> PodProfile:
        """The profile of :class:`~rljob_operator.settings.OperatorSettings` (its ``pod_*``/``allow*`` fields)."""
        return cls(
            level=settings.pod_profile,
            allowed_images=tuple(settings.allowed_images or DEFAULT_ALLOWED_IMAGES),
            allowed_service_accounts=tuple(settings.allowed_service_accounts),
            allow_secret_references=settings.allow_secret_references,
            allow_trust_remote_code=settings.allow_trust_remote_code,
        )

    @property
    def restricted(self) -> bool:
        return self.level == "restricted"

    @property
    def baseline(self) -> bool:
        """At least baseline (baseline or restricted)."""
        return self.level != "privileged"

    def refuse(self, path: str, what: str) -> str:
        """The message naming ``path``: ``what`` is not allowed, and how to go on."""
        return f"{path}: {what} is not allowed by the platform profile \"{self.level}\""


def violations(job: RLTrainingJob, profile: PodProfile) -> list[str]:
    """Every field of ``job`` that asks for more than ``profile`` allows, as ``<field path>: why``.

    Empty when the job may run. Checks each field the job sets, naming it (the references by the one
    table, ``rljob_contract.references``), then the worker pod as the operator builds it, with
    ``workers.podTemplate`` merged, so nothing the operator builds escapes the profile.
    """
    spec, workers = job.spec, job.spec.workers
    template_spec = (workers.pod_template or {}).get("spec") or {}
    named_sa = (workers.service_account_name or template_spec.get("serviceAccountName")
                or template_spec.get("serviceAccount"))
    out = unknown_fields(spec.workers.model_dump(by_alias=True, mode="json"))
    out += _image("spec.image", spec.image, profile)
    out += _references(job, profile)
    for i, volume in enumerate(workers.volumes):
        out += _volume(f"spec.workers.volumes[{i}]", volume, profile, named_sa)
    for i, toleration in enumerate(workers.tolerations):
        out += _toleration(f"spec.workers.tolerations[{i}]", toleration, profile)
    if workers.pod_template:
        out += _template(workers.pod_template, profile, named_sa)
    out += _trust_remote_code(job, profile)
    return out or _built_pod(desired_worker_pod(job, 0, 0)["spec"], profile, named_sa)


#: How many bytes the verdicts ``checked`` remembers may take, keys included (the least recently used go first).
CHECKED_BYTES = 4 * 1024 * 1024
#: What one remembered verdict costs besides its messages: the digest, the tuple, the dict's entry.
VERDICT_OVERHEAD = 256


class VerdictCache:
    """Verdicts by the digest of their input, least recently used dropped first once they pass ``max_bytes``.

    The key is a SHA-256 of the input, not the input: a tenant who edits a label or an annotation of a job of
    ~1 MB 500 times (``kubectl annotate``) makes 500 keys of 32 bytes here, not 500 copies of the spec (which
    took a 512 Mi operator down, issue #43 point 4). A verdict is a few messages, counted by their length; one
    larger than a tenth of the bound is not kept at all, so one job's thousand violations cannot evict every
    other job's verdict. Shared by the reconcile threads.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def cost(verdict: tuple[str, ...]) -> int:
        return VERDICT_OVERHEAD + sum(len(message) for message in verdict)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: bytes) -> tuple[str, ...] | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: bytes, verdict: tuple[str, ...]) -> None:
        cost = self.cost(verdict)
        if cost > self.max_bytes // 10:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= self.cost(old)
            self._items[key] = verdict
            self.bytes += cost
            while self.bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self.bytes -= self.cost(dropped)


_checked = VerdictCache(CHECKED_BYTES)


def verdict_key(job: RLTrainingJob, profile: PodProfile) -> bytes:
    """The digest of everything a verdict depends on: the job's uid, namespace, name, labels, annotations and
    spec (its JSON, not ``metadata.generation``: nothing but equal input shares a verdict), and the profile."""
    meta = job.metadata
    digest = hashlib.sha256(json.dumps(
        [(meta.model_extra or {}).get("uid"), meta.namespace, meta.name, sorted(meta.labels.items()),
         sorted(meta.annotations.items()), repr(profile)]).encode())
    digest.update(job.spec.model_dump_json().encode())
    return digest.digest()


def checked(job: RLTrainingJob, profile: PodProfile) -> list[str]:
    """``violations(job, profile)``, remembered for the same input (``verdict_key``) in ``CHECKED_BYTES``.

    Most reconciles (a pod scheduled, ready, a status written) see none of that input change, and the check
    builds and walks the whole worker pod (about a millisecond of the interpreter, in every reconcile).
    """
    key = verdict_key(job, profile)
    found = _checked.get(key)
    if found is None:
        found = tuple(violations(job, profile))
        _checked.put(key, found)
    return list(found)


# ----------------------------------------------------------------------- references


def _image(path: str, image: Any, profile: PodProfile) -> list[str]:
    if image is None or any(fnmatch.fnmatchcase(str(image), p) for p in profile.allowed_images):
        return []
    return [profile.refuse(path, f"image {image!r} (allowed: {', '.join(profile.allowed_images)})")]


def _service_account(path: str, name: Any, profile: PodProfile) -> list[str]:
    if not name or name == "default" or name in profile.allowed_service_accounts:
        return []
    allowed = ", ".join(profile.allowed_service_accounts) or "none besides default"
    return [profile.refuse(path, f"ServiceAccount {name!r} (allowed: {allowed})")]


def _secret(path: str, name: Any, profile: PodProfile) -> list[str]:
    if profile.allow_secret_references or not name:
        return []
    return [profile.refuse(path, f"a reference to Secret {name!r}")]


def _references(job: RLTrainingJob, profile: PodProfile) -> list[str]:
    """Every Secret and ServiceAccount the spec names (the table of references), against the profile."""
    out: list[str] = []
    for ref in references(job.spec.model_dump(by_alias=True, mode="json")):
        if ref.kind == SECRET:
            out += _secret(ref.field, ref.name, profile)
        elif ref.kind == SERVICE_ACCOUNT:
            out += _service_account(ref.field, ref.name, profile)
    return out


def _volume(path: str, volume: dict[str, Any], profile: PodProfile, named_sa: str | None) -> list[str]:
    """A volume's type (hostPath never; restricted: only the restricted types), its Secrets and tokens."""
    kinds = [k for k in volume if k != "name"]
    out: list[str] = []
    for kind in kinds:
        if kind == "hostPath" and profile.baseline:
            out.append(profile.refuse(f"{path}.hostPath", "a hostPath volume"))
        elif profile.restricted and kind not in RESTRICTED_VOLUMES:
            out.append(profile.refuse(f"{path}.{kind}", f"a {kind} volume"))
    for i, source in enumerate(((volume.get("projected") or {}).get("sources")) or []):
        if "serviceAccountToken" in (source or {}) and not _allowed_sa(named_sa, profile):
            out.append(profile.refuse(f"{path}.projected.sources[{i}].serviceAccountToken",
                                      "a ServiceAccount token unless the job names an allowed serviceAccountName"))
    return out


def _allowed_sa(name: str | None, profile: PodProfile) -> bool:
    """The job runs as a ServiceAccount the platform allowed by name (workload identity)."""
    return bool(name) and name in profile.allowed_service_accounts


def _toleration(path: str, toleration: dict[str, Any], profile: PodProfile) -> list[str]:
    if not profile.baseline:
        return []
    key = toleration.get("key")
    if key in CONTROL_PLANE_TAINTS:
        return [profile.refuse(f"{path}.key", f"tolerating the control-plane taint {key}")]
    if not key and toleration.get("operator") == "Exists":
        return [profile.refuse(path, "tolerating every taint (operator Exists without a key)")]
    return []


def flavor_violations(flavor: str, tolerations: list[dict[str, Any]], profile: PodProfile) -> list[str]:
    """Tolerations a Kueue ResourceFlavor would add to the job's pods that the profile refuses.

    Flavors are cluster-scoped and the platform's own, but the resulting pod is held to the same
    profile as the job's own fields.
    """
    out: list[str] = []
    for i, toleration in enumerate(tolerations):
        out += _toleration(f"ResourceFlavor {flavor}: spec.tolerations[{i}]", toleration or {}, profile)
    return out


# ------------------------------------------------------------------ the pod template


def _template(template: dict[str, Any], profile: PodProfile, named_sa: str | None) -> list[str]:
    """``workers.podTemplate``: its annotations and its pod spec, as merged over the built pod."""
    out: list[str] = []
    for key, value in ((template.get("metadata") or {}).get("annotations") or {}).items():
        if profile.baseline and key.startswith(APPARMOR_ANNOTATION) and _apparmor_unsafe(value):
            out.append(profile.refuse(f"{TEMPLATE}.metadata.annotations[{key}]", f"AppArmor profile {value!r}"))
    spec = template.get("spec") or {}
    path = f"{TEMPLATE}.spec"
    out += _host_fields(path, spec, profile)
    if spec.get("automountServiceAccountToken") and not _allowed_sa(named_sa, profile):
        out.append(profile.refuse(f"{path}.automountServiceAccountToken",
                                  "mounting a ServiceAccount token unless the job names an allowed serviceAccountName"))
    out += _security_context(f"{path}.securityContext", spec.get("securityContext") or {}, profile, pod=True)
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for i, container in enumerate(spec.get(kind) or []):
            out += _container(f"{path}.{kind}[{i}]", kind, container or {}, profile)
    for i, volume in enumerate(spec.get("volumes") or []):
        out += _volume(f"{path}.volumes[{i}]", volume or {}, profile, named_sa)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        out += _toleration(f"{path}.tolerations[{i}]", toleration or {}, profile)
    return out


def _built_pod(spec: dict[str, Any], profile: PodProfile, named_sa: str | None) -> list[str]:
    """The worker pod as the operator builds it (``podTemplate`` merged): what the profile requires must be
    there, whatever the template said (null, absent, {}, []); ``violations`` asks this of a job whose own
    fields passed."""
    out: list[str] = []
    if spec.get("automountServiceAccountToken") is not False and not _allowed_sa(named_sa, profile):
        out.append(profile.refuse(f"{TEMPLATE}.spec.automountServiceAccountToken",
                                  "a pod that mounts a ServiceAccount token unless the job names an allowed "
                                  "serviceAccountName"))
    if not profile.restricted:
        return out
    pod_ctx = spec.get("securityContext") or {}
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            ctx = (container or {}).get("securityContext") or {}
            path = f"{TEMPLATE}.spec.{kind}[name={(container or {}).get('name')}].securityContext"
            out += [profile.refuse(f"{path}.{field}", f"a built pod without {what}")
                    for field, what in _restricted_floor(ctx, pod_ctx)]
    return out


def _restricted_floor(ctx: dict[str, Any], pod_ctx: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, what) of each thing Pod Security "restricted" requires that a container (with its pod's
    context) lacks: non-root, a confined seccomp profile, no privilege escalation, every capability dropped."""
    def effective(key: str) -> Any:
        return ctx[key] if ctx.get(key) is not None else pod_ctx.get(key)

    if effective("runAsNonRoot") is not True:
        yield "runAsNonRoot", "runAsNonRoot: true"
    if (effective("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        yield "seccompProfile.type", "seccomp profile RuntimeDefault or Localhost"
    if ctx.get("allowPrivilegeEscalation") is not False:
        yield "allowPrivilegeEscalation", "allowPrivilegeEscalation: false"
    if "ALL" not in ((ctx.get("capabilities") or {}).get("drop") or []):
        yield "capabilities.drop", "capabilities.drop: [ALL]"


def _host_fields(path: str, spec: dict[str, Any], profile: PodProfile) -> list[str]:
    """Host namespaces and a preset node (which skips the scheduler, its taints and its checks)."""
    if not profile.baseline:
        return []
    what = {"hostNetwork": "host networking", "hostPID": "the host's PID namespace",
            "hostIPC": "the host's IPC namespace"}
    out = [profile.refuse(f"{path}.{k}", v) for k, v in what.items() if spec.get(k)]
    if spec.get("nodeName"):
        out.append(profile.refuse(f"{path}.nodeName", "a preset nodeName"))
    return out


def _container(path: str, kind: str, container: dict[str, Any], profile: PodProfile) -> list[str]:
    """One container of the template: only the trainer (restricted, baseline), its image, context and refs."""
    out: list[str] = []
    if profile.baseline and (kind != "containers" or container.get("name") != CONTAINER):
        out.append(profile.refuse(path, f"a container besides {CONTAINER!r} ({kind})"))
    out += _image(f"{path}.image", container.get("image"), profile)
    ctx = container.get("securityContext") or {}
    out += _security_context(f"{path}.securityContext", ctx, profile, pod=False)
    for i, port in enumerate(container.get("ports") or []):
        if profile.baseline and (port or {}).get("hostPort"):
            out.append(profile.refuse(f"{path}.ports[{i}].hostPort", "a host port"))
    return out


def _apparmor_unsafe(value: Any) -> bool:
    value = str(value.get("type") if isinstance(value, dict) else value)
    return not (value in ("runtime/default", "RuntimeDefault", "Localhost") or value.startswith("localhost/"))


def _security_context(path: str, ctx: dict[str, Any], profile: PodProfile, *, pod: bool) -> list[str]:
    """A pod's or container's securityContext against baseline and restricted."""
    out: list[str] = []
    if profile.baseline:
        out += list(_baseline_context(path, ctx, profile, pod=pod))
    if profile.restricted:
        out += list(_restricted_context(path, ctx, profile, pod=pod))
    return out


def _baseline_context(path: str, ctx: dict[str, Any], profile: PodProfile, *, pod: bool) -> Iterator[str]:
    if ctx.get("privileged"):
        yield profile.refuse(f"{path}.privileged", "a privileged container")
    if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield profile.refuse(f"{path}.seccompProfile.type", "seccomp profile Unconfined")
    if ctx.get("appArmorProfile") and _apparmor_unsafe(ctx["appArmorProfile"]):
        yield profile.refuse(f"{path}.appArmorProfile", "an unconfined AppArmor profile")
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        yield profile.refuse(f"{path}.windowsOptions.hostProcess", "a Windows host process")
    se_linux = ctx.get("seLinuxOptions") or {}
    if se_linux.get("user") or se_linux.get("role") or se_linux.get("type") not in (
            None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
        yield profile.refuse(f"{path}.seLinuxOptions", "custom SELinux options")
    if ctx.get("procMount") not in (None, "Default"):
        yield profile.refuse(f"{path}.procMount", f"procMount {ctx['procMount']!r}")
    allowed = {"NET_BIND_SERVICE"} if profile.restricted else BASELINE_CAPABILITIES
    for cap in (ctx.get("capabilities") or {}).get("add") or []:
        if str(cap).upper().removeprefix("CAP_") not in allowed:
            yield profile.refuse(f"{path}.capabilities.add", f"adding capability {cap}")
    if pod:
        for i, sysctl in enumerate(ctx.get("sysctls") or []):
            if (sysctl or {}).get("name") not in SAFE_SYSCTLS:
                yield profile.refuse(f"{path}.sysctls[{i}]", f"sysctl {(sysctl or {}).get('name')!r}")


def _restricted_context(path: str, ctx: dict[str, Any], profile: PodProfile, *, pod: bool) -> Iterator[str]:
    if ctx.get("runAsNonRoot") is False:
        yield profile.refuse(f"{path}.runAsNonRoot", "runAsNonRoot: false")
    if ctx.get("runAsUser") == 0:
        yield profile.refuse(f"{path}.runAsUser", "running as root (runAsUser 0)")
    if pod:
        return
    if ctx.get("allowPrivilegeEscalation") is True:
        yield profile.refuse(f"{path}.allowPrivilegeEscalation", "allowPrivilegeEscalation: true")
    # capabilities.drop: the merge adds to the operator's [ALL]; the built pod is checked (_built_pod).


# -------------------------------------------------------------------- trust_remote_code


def _trust_remote_code(job: RLTrainingJob, profile: PodProfile) -> list[str]:
    """``trust_remote_code`` anywhere under ``spec.training`` (trl, trl.model_init_kwargs, …)."""
    if profile.allow_trust_remote_code:
        return []
    training = job.spec.training.model_dump(by_alias=True, mode="json")
    return [profile.refuse(path, "trust_remote_code (it runs Python code shipped with the model)")
            for path in _true_keys("spec.training", training, {"trust_remote_code", "trustRemoteCode"})]


def _true_keys(path: str, value: Any, keys: set[str]) -> Iterator[str]:
    """Paths of ``keys`` set to a true value anywhere in ``value`` (JSON strings of kwargs included)."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return
    if isinstance(value, dict):
        for k, v in value.items():
            if k in keys and v not in (False, None, "false", "False", 0):
                yield f"{path}.{k}"
            else:
                yield from _true_keys(f"{path}.{k}", v, keys)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _true_keys(f"{path}[{i}]", v, keys)
