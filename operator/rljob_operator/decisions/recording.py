"""An RLExperiment's verdict on its MLflow parent run: the one-shot record pod, decided (pure).

The operator decides an experiment's leaderboard and winner but holds no tracking credentials, so it never
talks to a tracking server. When an experiment whose template tracks to MLflow
(``spec.template.training.tracking.mlflow``) concludes (Succeeded or Failed), it creates, once per generation,
a ConfigMap holding the status and a pod that runs ``python -m rljob_trainer.tracking record`` on it, both owned
by the experiment (the garbage collector deletes them with it). The pod is built from the runtime the trials run
on, so it has what they have to reach the server (image, the podTemplate's ``MLFLOW_*`` env and token Secret,
ServiceAccount, pull secrets, security context) and nothing else: no GPU, no volume but the ConfigMap and /tmp,
small requests, ``restartPolicy: Never``, ``activeDeadlineSeconds``. It is judged as a worker pod is (the
platform's profile, the runtime's bounds, ``decisions.policy``): an experiment never does more than its trials.

It is not queued through Kueue (a few seconds of one CPU, bounded by its deadline; no queue label). Where the
operator gives jobs NetworkPolicies (``networkPolicy.enabled``), it gets one of its own, created before it: no
ingress, and the trainers' egress (DNS, the status API, object storage's ports, the runtime's ``spec.egress.to``,
never the clouds' metadata endpoints), so it reaches the tracking server exactly where the trials do.

The condition ``Recorded`` says how it went: False ``Recording`` while the pod runs, True ``Recorded``, or False
with a final reason (``RecordFailed`` with the pod's exit, ``PolicyViolation``, ``RuntimeNotFound``,
``RecordRefused``: the API server refused the pod). A failed
record never changes the verdict (the phase and winner stay). The marker is the pod itself: it is created
only while the condition is not final and no pod of the generation exists, so a crash between the status write
and the create creates it then, never twice.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from rljob_contract.experiment import ExperimentPhase, RLExperiment, bounded_message
from rljob_contract.runtime import Resolved

from rljob_operator.decisions.children import (
    JobNetwork,
    merge_pod_template,
    pod_security_context,
    runtime_egress,
)
from rljob_operator.decisions.conditions import condition
from rljob_operator.decisions.egress import egress_rules
from rljob_operator.decisions.experiments import owner_reference
from rljob_operator.decisions.podbounds import bound_violations
from rljob_operator.decisions.policy import PodProfile, built_pod_violations, runtime_violations
from rljob_operator.experiments.trials import LABEL_EXPERIMENT
from rljob_operator.names import CONTAINER, LABEL_MANAGED_BY, MANAGED_BY
from rljob_operator.times import parse_time

#: The condition that says whether the verdict reached the MLflow parent run.
RECORDED = "Recorded"
#: Reasons of ``Recorded`` after which nothing more is done for this generation.
FINAL_REASONS = frozenset({"Recorded", "RecordFailed", "RecordRefused", "PolicyViolation", "RuntimeNotFound"})
#: The command the pod runs: the trainer image's ``record`` (``rljob_trainer.tracking``).
RECORD_COMMAND = ("python", "-m", "rljob_trainer.tracking", "record")
#: Where the ConfigMap is mounted, and its one key: the experiment's status as JSON.
RECORD_DIR = "/etc/rljob-record"
STATUS_KEY = "status.json"
#: Seconds the record pod may run (it writes a few tags and one artifact; MLflow's client retries within this).
RECORD_DEADLINE_SECONDS = 300
#: Seconds after which a pod still not finished (never scheduled: its deadline counts from its start) has failed.
RECORD_GIVE_UP_SECONDS = 2 * RECORD_DEADLINE_SECONDS
#: Its resources: importing mlflow and one HTTP session.
RECORD_RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
#: Seconds between looks while the pod runs (pods wake no experiment).
RECORD_RECHECK_SECONDS = 10.0
COMPONENT = "record"


@dataclass
class RecordPlan:
    """What the record step of one reconcile does: its ``Recorded`` condition (None: the experiment has
    nothing to record), the objects to create (ConfigMap, then pod), when to look again."""

    condition: dict[str, Any] | None = None
    create: list[dict[str, Any]] = field(default_factory=list)
    requeue_after: float | None = None


def record_name(experiment: dict[str, Any]) -> str:
    """The record pod's and ConfigMap's name: one per generation of the experiment's spec (a changed spec that
    concludes again is recorded again)."""
    meta = experiment["metadata"]
    return f"{meta['name']}-record-{meta.get('generation') or 0}"


def tracks_mlflow(parsed: RLExperiment) -> bool:
    tracking = parsed.spec.template.training.tracking
    return tracking is not None and tracking.mlflow is not None


def _metadata(experiment: dict[str, Any]) -> dict[str, Any]:
    meta = experiment["metadata"]
    return {"name": record_name(experiment), "namespace": meta["namespace"],
            "labels": {LABEL_EXPERIMENT: meta["name"], "app.kubernetes.io/component": COMPONENT,
                       LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(experiment)]}


def desired_record_configmap(experiment: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap the pod reads: the concluded ``status`` as JSON, owned by the experiment."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(experiment),
            "data": {STATUS_KEY: json.dumps(status, sort_keys=True)}}


def desired_record_network_policy(experiment: dict[str, Any], network: JobNetwork, runtime: Resolved
                                  ) -> dict[str, Any]:
    """The record pod's NetworkPolicy: nothing may reach it; with the platform's egress settings, it reaches what
    a trainer of the runtime may (``decisions.egress``), no more."""
    own = {"matchLabels": {k: v for k, v in _metadata(experiment)["labels"].items() if k != LABEL_MANAGED_BY}}
    spec: dict[str, Any] = {"podSelector": own, "policyTypes": ["Ingress"]}  # Ingress with no rule: none may reach it
    if network.egress is not None:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = egress_rules(own, network.egress) + runtime_egress(runtime)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _metadata(experiment),
            "spec": spec}


def _record_container(experiment: dict[str, Any], parsed: RLExperiment, runtime: Resolved) -> dict[str, Any]:
    meta = experiment["metadata"]
    mlflow = parsed.spec.template.training.tracking.mlflow  # type: ignore[union-attr]  # tracks_mlflow
    args = ["--name", meta["name"], "--namespace", meta["namespace"], "--status", f"{RECORD_DIR}/{STATUS_KEY}"]
    if mlflow is not None and mlflow.experiment:
        args += ["--mlflow-experiment", mlflow.experiment]
    ours = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if mlflow is not None and mlflow.tracking_uri:
        ours.append({"name": "MLFLOW_TRACKING_URI", "value": mlflow.tracking_uri})
    names = {e["name"] for e in ours}
    container: dict[str, Any] = {
        "name": CONTAINER, "image": runtime.image, "command": [*RECORD_COMMAND, *args],
        "env": [dict(e) for e in runtime.env if e["name"] not in names] + ours,
        "resources": json.loads(json.dumps(RECORD_RESOURCES)),
        "volumeMounts": [{"name": "rljob-record", "mountPath": RECORD_DIR, "readOnly": True},
                         {"name": "rljob-tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if runtime.image_pull_policy:
        container["imagePullPolicy"] = runtime.image_pull_policy
    return container


def desired_record_pod(experiment: dict[str, Any], parsed: RLExperiment, runtime: Resolved) -> dict[str, Any]:
    """The one-shot pod that writes the verdict: the trials' runtime (its ``podTemplate`` merged), less what
    only training needs (``_trimmed``)."""
    container = _record_container(experiment, parsed, runtime)
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "activeDeadlineSeconds": RECORD_DEADLINE_SECONDS,
        "terminationGracePeriodSeconds": 10, "enableServiceLinks": False,
        "automountServiceAccountToken": False, "securityContext": pod_security_context(),
        "containers": [container],
        # The trials' nodes may all be GPU nodes, tainted: the record may run beside them (it asks for no GPU).
        "tolerations": [{"key": runtime.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "rljob-record", "configMap": {"name": record_name(experiment)}},
                    {"name": "rljob-tmp", "emptyDir": {}}],
    }
    if runtime.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in runtime.image_pull_secrets]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(experiment), "spec": spec}
    if not runtime.pod_template:
        return pod
    override = {k: v for k, v in runtime.pod_template.items() if k in ("metadata", "spec")}
    return _trimmed(merge_pod_template(pod, override), pod)


def _trimmed(merged: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """The template merged over the pod, with what the pod relies on put back: its name, owner, labels, its one
    container's command, resources and mounts, its volumes, deadline and restart policy. Other containers,
    init containers, the template's volumes and pod-level resources are training's, not the record's."""
    merged["metadata"].update({k: ours["metadata"][k] for k in ("name", "namespace", "ownerReferences")})
    merged["metadata"]["labels"] = {**merged["metadata"].get("labels", {}), **ours["metadata"]["labels"]}
    spec, own = merged["spec"], ours["spec"]
    for key in ("initContainers", "ephemeralContainers", "resources"):
        spec.pop(key, None)
    for key in ("restartPolicy", "activeDeadlineSeconds", "terminationGracePeriodSeconds", "volumes"):
        spec[key] = own[key]
    mine = own["containers"][0]
    container = next(c for c in spec["containers"] if c.get("name") == CONTAINER)
    for key in ("command", "resources", "volumeMounts"):
        container[key] = mine[key]
    container.pop("args", None)
    ours_env = {e["name"] for e in mine["env"]}
    container["env"] = [e for e in container.get("env", []) if e.get("name") not in ours_env] + mine["env"]
    for key in ("ports", "livenessProbe", "readinessProbe", "startupProbe", "volumeDevices"):
        container.pop(key, None)
    spec["containers"] = [container]
    return merged


def record_pod_violations(spec: dict[str, Any], runtime: Resolved, profile: PodProfile | None) -> list[str]:
    """What the record pod (its ``spec``) asks beyond the profile or the runtime's bounds, judged as a worker pod
    of a job asking for no GPU."""
    cpu_only = dataclasses.replace(runtime, gpus_per_worker=0)
    if profile is None:
        return bound_violations(spec, cpu_only)
    return [f"{runtime.ref}: {v}" for v in runtime_violations(runtime, profile)] + \
        built_pod_violations(spec, cpu_only, profile)


def pod_outcome(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of a finished record pod: ``Recorded`` or ``RecordFailed`` with its exit; None while
    it runs."""
    status = pod.get("status") or {}
    name = pod["metadata"]["name"]
    if status.get("phase") == "Succeeded":
        return "Recorded", f"pod {name} wrote the verdict on the experiment's MLflow parent run"
    if status.get("phase") != "Failed":
        return None
    exit_ = next((s.get("state", {}).get("terminated") for s in status.get("containerStatuses") or []
                  if (s.get("state") or {}).get("terminated")), None) or {}
    why = ", ".join(str(x) for x in (status.get("reason"), exit_.get("reason"),
                                     f"exit code {exit_['exitCode']}" if "exitCode" in exit_ else None) if x)
    said = (exit_.get("message") or status.get("message") or "").strip()
    text = f"pod {name} failed ({why or 'no reason given'})" + (f": {said}" if said else "")
    return "RecordFailed", bounded_message(text + "; the verdict stands") or ""


def _is_ours(pod: dict[str, Any], experiment: dict[str, Any]) -> bool:
    """A pod of the record's name is the experiment's only when its controller is this experiment (by UID)."""
    uid = experiment["metadata"].get("uid")
    return any(r.get("controller") and r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or [])


def plan_record(experiment: dict[str, Any], parsed: RLExperiment, status: dict[str, Any], pod: dict[str, Any] | None,
                runtime: Resolved | str, profile: PodProfile | None, now: str,
                network: JobNetwork | None = None) -> RecordPlan:
    """The record step, after the experiment's ``status`` (as this reconcile writes it) is decided; ``pod``: the
    record pod of this generation as observed (None: none); ``runtime``: the trials' runtime resolved, or why
    there is none; ``network``: the jobs' NetworkPolicy settings (None: the operator makes none)."""
    if status.get("phase") not in (ExperimentPhase.succeeded, ExperimentPhase.failed) or not tracks_mlflow(parsed):
        return RecordPlan()
    previous = [c for c in (experiment.get("status") or {}).get("conditions") or [] if c.get("type") == RECORDED]
    old = previous[0] if previous else {}

    def said(true: bool, reason: str, message: str) -> dict[str, Any]:
        made = condition(RECORDED, true, reason, message, previous=previous, now=now,
                         generation=_generation(experiment))
        return made.model_dump(by_alias=True, mode="json", exclude_none=True)

    if old.get("reason") in FINAL_REASONS and old.get("observedGeneration") == _generation(experiment):
        return RecordPlan(condition=dict(old))  # said once for this generation: nothing more to do
    if pod is not None and _is_ours(pod, experiment):
        outcome = pod_outcome(pod)
        if outcome is None and _overdue(old, now):
            outcome = ("RecordFailed", f"pod {record_name(experiment)} did not finish within {RECORD_GIVE_UP_SECONDS} "
                                       "seconds (not scheduled?); the verdict stands")
        if outcome is None:
            return RecordPlan(said(False, "Recording", f"pod {record_name(experiment)} is writing the verdict"),
                              requeue_after=RECORD_RECHECK_SECONDS)
        return RecordPlan(said(outcome[0] == "Recorded", *outcome))
    if pod is not None:
        return RecordPlan(said(False, "RecordFailed", f"pod {record_name(experiment)} exists but the experiment did "
                               "not create it; the verdict stands: delete it to record"))
    if isinstance(runtime, str):
        return RecordPlan(said(False, "RuntimeNotFound", bounded_message(runtime) or ""))
    built = desired_record_pod(experiment, parsed, runtime)
    refused = record_pod_violations(built["spec"], runtime, profile)
    if refused:
        return RecordPlan(said(False, "PolicyViolation",
                               bounded_message("the record pod: " + "; ".join(refused)) or ""))
    policy = [desired_record_network_policy(experiment, network, runtime)] if network is not None else []
    return RecordPlan(said(False, "Recording", f"pod {record_name(experiment)} is writing the verdict"),
                      create=[desired_record_configmap(experiment, status), *policy, built],
                      requeue_after=RECORD_RECHECK_SECONDS)


def _overdue(old: dict[str, Any], now: str) -> bool:
    """Whether the pod has been recording longer than ``RECORD_GIVE_UP_SECONDS``: its deadline counts from its
    start, so a pod never scheduled would otherwise be waited for for ever."""
    since = parse_time(old.get("lastTransitionTime")) if old.get("reason") == "Recording" else None
    current = parse_time(now)
    return since is not None and current is not None and (current - since).total_seconds() > RECORD_GIVE_UP_SECONDS


def _generation(experiment: dict[str, Any]) -> int:
    return int(experiment["metadata"].get("generation") or 0)
