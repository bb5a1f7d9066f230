"""Kueue in the test control plane: its CRDs, webhooks and manager, on loopback.

The manager (``kueue`` from ``tools/kueue``, its CRDs and webhook configurations copied from
the same module version next to the binary) runs as a process like the other components.
kube-apiserver must reach its webhooks (Workloads, queues and flavors are defaulted and
validated by them; the CRDs' versions are converted by it) over TLS on 127.0.0.1:

* Kueue's internal certificate management stays on, because without it v0.17 insists on a
  metrics certificate at the fixed path ``/etc/kueue/metrics/certs``. It keeps certificates
  it finds valid in its Secret, so the harness writes that Secret first: a CA of its own and a
  serving certificate for both the Service name Kueue checks and ``127.0.0.1``
  (``pki.rsa_webhook_authority``), and the same files into the webhook's certificate folder.
* The webhook configurations and CRD conversion webhooks point at
  ``https://127.0.0.1:<port>/<path>`` (``url``) instead of the Service, with that CA. Only
  the webhooks of Kueue's own API are installed: its job integrations (pods, batch Jobs, ...)
  are off here, and a webhook nobody serves would refuse every pod.
* No leader election; health, metrics, webhook and visibility-server ports are free loopback ports.
* Kueue counts DRA claims as a platform that uses them configures it: the feature gate
  DynamicResourceAllocation on and the tests' DeviceClass (``DEVICE_CLASS``) mapped to the resource
  ``DRA_RESOURCE`` its ClusterQueues can give quota of (``tests/operator/test_kueue_cluster.py``).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import pki

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
#: The CA name cert-controller checks a kept CA against (Kueue's ``caName``).
CA_NAME = "kueue-ca"
#: CRDs with a conversion webhook (kustomize's config/components/crd/patches/webhook_in_*).
CONVERTED = ("clusterqueues", "cohorts", "localqueues", "multikueueclusters", "resourceflavors", "workloads")
PORTS = ("kueue-webhook", "kueue-health", "kueue-metrics", "kueue-visibility")
#: The DeviceClass the tests' ResourceClaimTemplates ask devices of, and the resource Kueue counts them as.
DEVICE_CLASS = "gpu.example.com"
DRA_RESOURCE = "example.com/gpu"


def config_dir(binary: Path) -> Path:
    """CRDs and webhook manifests of the Kueue version of ``binary`` (``tools/build-binaries.sh``)."""
    return Path(binary).resolve().parent / "config"


def certificates() -> dict[str, bytes]:
    """The webhook Secret's files: valid for Kueue's Service name and for 127.0.0.1."""
    return pki.rsa_webhook_authority(CA_NAME, (f"{SERVICE}.{NAMESPACE}.svc", "127.0.0.1"))


def configuration(ports: dict[str, int], cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for a loopback test manager."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue-health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue-metrics']}"},
        "webhook": {"port": ports["kueue-webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)},
        # Its default is 0.0.0.0:8082, a fixed port on every interface: a start fails whenever anything
        # else on the machine holds 8082.
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": ports["kueue-visibility"]},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
        "clientConnection": {"qps": 200, "burst": 400},
        # One integration is required; batch/job has no CRD to wait for. Its webhook is not installed.
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"DynamicResourceAllocation": True},
        "resources": {"deviceClassMappings": [{"name": DRA_RESOURCE, "deviceClassNames": [DEVICE_CLASS]}]},
    }


def argv(binary: str, config_file: Path, kubeconfig: Path) -> list[str]:
    """The kueue manager's command line."""
    return [binary, f"--config={config_file}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"]


def _url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def webhook_configurations(manifests: str, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's Mutating/ValidatingWebhookConfigurations for its own API only, pointed at 127.0.0.1."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        kind = "mutating" if doc["kind"].startswith("Mutating") else "validating"
        doc["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}  # the names Kueue injects its CA into
        hooks = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if groups != {"kueue.x-k8s.io"}:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": _url(port, path), "caBundle": bundle}
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def crds(folder: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's CRDs; those with several versions convert through the manager at 127.0.0.1."""
    out = []
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": _url(port, "/convert"), "caBundle": base64.b64encode(ca_pem).decode()},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def secret(files: dict[str, bytes]) -> dict[str, Any]:
    """The Secret Kueue's certificate management reads (and keeps, the certificates being valid)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }
