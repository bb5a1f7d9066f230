"""Names, labels and annotations of what the operator builds, and the status endpoint (pure).

Deterministic names are what let a reconcile that runs twice, or after a crash, find what it
made instead of making a second copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rljob_contract.job import API_VERSION, KIND, RLTrainingJob

# The config mount, the trainer command and the mirror credential prefix are the trainer's contract,
# re-exported here beside the names the operator chooses itself.
from rljob_contract.pod import CONFIG_DIR as CONFIG_DIR
from rljob_contract.pod import CONFIG_KEY as CONFIG_KEY
from rljob_contract.pod import RENDEZVOUS_PORT, heartbeat_path
from rljob_contract.pod import TRAINER_COMMAND as TRAINER_COMMAND

LABEL_JOB = "rljob.dev/job"
LABEL_WORKER_INDEX = "rljob.dev/worker-index"
LABEL_GANG_GENERATION = "rljob.dev/gang-generation"
ANNOTATION_SPEC_HASH = "rljob.dev/spec-hash"
ANNOTATION_JOB_GENERATION = "rljob.dev/job-generation"
#: On a worker pod built with ``RLJOB_IN_PLACE_RESTARTS``: how often its agent may restart its ranks to meet a
#: replaced peer. A pod without it (built by an operator before issue #48) ends when a peer is lost.
ANNOTATION_IN_PLACE_RESTARTS = "rljob.dev/in-place-restarts"
#: On a worker pod built with it ("true"): its launcher dials the rendezvous again when worker 0's store is
#: lost (``rljob_trainer.launch.run_redialling``), so worker 0 may be replaced alone. A pod without it (an
#: operator before issue #48's worker 0) ends with worker 0's store.
ANNOTATION_REDIALS = "rljob.dev/redials-rendezvous"
#: Written on every ConfigMap, Service and NetworkPolicy the operator creates: the uid of the job
#: it was created for. A same-named object is adopted only with this marker (and LABEL_MANAGED_BY):
#: labels can be copied from any job before it exists, its uid cannot.
ANNOTATION_CREATED_FOR = "rljob.dev/created-for-uid"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "rljob-operator"
#: The EndpointSlice labels that make a slice serve a Service (CoreDNS and kube-proxy read it) and keep
#: Kubernetes' own EndpointSlice controllers off it.
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_SLICE_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"

CONTAINER = "trainer"
RDZV_PORT = RENDEZVOUS_PORT  # the contract's: the rendezvous store listens there, in worker 0 or a process of its own
METRICS_PORT = 9400
STATUS_CA_KEY = "status-ca.crt"
OUTPUT_DIR = "/workspace/output"
#: Where the PersistentVolumeClaims named by ``pvc://claim/prefix`` checkpoint locations are mounted,
#: one folder per claim (``<CLAIMS_DIR>/<claim>``); the trainer is given ``<CLAIMS_DIR>/<claim>/<prefix>``.
CLAIMS_DIR = "/var/lib/rljob/checkpoints"
TOKEN_DIR = "/var/run/secrets/rljob.dev/status"
TOKEN_FILE = "token"
#: Audience of the projected token the trainer sends with heartbeats; the status API asks
#: TokenReview for exactly this audience, so the token is useless against the API server.
TOKEN_AUDIENCE = "rljob-status"
TOKEN_EXPIRATION_SECONDS = 3600


@dataclass(frozen=True)
class StatusEndpoint:
    """Where trainers send heartbeats: the operator's status API."""

    base_url: str
    """``https://rljob-operator.rljob-system.svc:8443`` (no trailing slash)."""
    ca_pem: str | None = None
    """PEM the trainer trusts for that URL (shipped in the job's ConfigMap)."""
    audience: str = TOKEN_AUDIENCE

    def heartbeat_url(self, namespace: str, name: str) -> str:
        return self.base_url + heartbeat_path(namespace, name)


# ------------------------------------------------------------------------------ names


def worker_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def service_name(job_name: str) -> str:
    return job_name


def rendezvous_name(job_name: str) -> str:
    """The EndpointSlice of the job's headless Service: worker 0's address (``children.desired_rendezvous``)."""
    return f"{job_name}-rendezvous"


def configmap_name(job_name: str) -> str:
    return f"{job_name}-config"


def networkpolicy_name(job_name: str) -> str:
    """The job's NetworkPolicy (who may reach its worker pods)."""
    return f"{job_name}-workers"


def rendezvous_endpoint(job_name: str, namespace: str) -> str:
    """c10d endpoint: worker 0's stable DNS name through the headless Service."""
    return f"{worker_name(job_name, 0)}.{service_name(job_name)}.{namespace}.svc:{RDZV_PORT}"


def run_id(job: RLTrainingJob, generation: int) -> str:
    """Rendezvous id, unique per job object and gang generation."""
    return f"{job.metadata.name}-{job_uid(job)[:8]}-g{generation}"


def job_uid(job: RLTrainingJob) -> str:
    return str((job.metadata.model_extra or {}).get("uid") or "")


def job_namespace(job: RLTrainingJob) -> str:
    return job.metadata.namespace or "default"


def selector(job_name: str) -> str:
    """Label selector of a job's worker pods (``status.selector``, for the scale subresource)."""
    return f"{LABEL_JOB}={job_name}"


def job_labels(job: RLTrainingJob) -> dict[str, str]:
    return {
        LABEL_JOB: job.metadata.name,
        "app.kubernetes.io/name": "rljob",
        "app.kubernetes.io/instance": job.metadata.name,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def owner_reference(job: RLTrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job_uid(job),
        "controller": True,
        "blockOwnerDeletion": True,
    }
