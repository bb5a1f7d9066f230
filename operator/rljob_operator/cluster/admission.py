"""Are the admission policies this operator relies on in force? Asked of the API server (``admission``
decides from what it answers).

The operator builds a job's pods with its own rights; what stops a job's creator from naming a Secret,
ConfigMap, PersistentVolumeClaim or ServiceAccount they may not use, or from taking a queued job out of
its queue, is the chart's ValidatingAdmissionPolicies, which only the API server can apply (they ask its
authorizer about the requesting user, whom the operator never sees). So the operator refuses to start
without them, answers ``/readyz`` with 503 and pauses every reconcile (creates and deletes nothing) while
they are gone, and starts again when they are back; docs/security-policies.md says why. The setting
``without_admission_policies`` runs without them, knowingly and loudly (an ERROR line at start, the gauge
``rljob_operator_admission_policies_in_force`` at 0, and the chart's alert).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from rljob_operator import metrics
from rljob_operator.admission import enforcement_problems
from rljob_operator.cluster.kube import Kube, count_resources

log = logging.getLogger("rljob.operator")
API = "/apis/admissionregistration.k8s.io/v1"
RESOURCES = ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
#: How soon a job is looked at again while the policies are not in force.
PAUSED_REQUEUE_SECONDS = 15.0
UNCHECKED = ("running WITHOUT admission policies (without_admission_policies): any job creator can name every "
             "Secret, ConfigMap, PersistentVolumeClaim and ServiceAccount of their namespace through this operator, "
             "and take a queued job out of its queue, and anyone who may create pods in a namespace can make one "
             "that counts as a job's worker and reports its progress; run so only where the same rules are enforced "
             "another way (docs/security-policies.md)")

count_resources(*RESOURCES)


def _policy(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", f"{API}/validatingadmissionpolicies/{name}")
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def policy_problems(kube: Kube, names: list[str]) -> list[str]:
    """Why the policies ``names`` are not in force on the cluster (``admission.enforcement_problems``), or
    cannot be seen to be (this identity may not read them); empty: they are. Other API errors raise."""
    try:
        policies = {name: _policy(kube, name) for name in names}
        bindings = kube.request("GET", f"{API}/validatingadmissionpolicybindings").get("items") or []
    except ApiException as e:
        if e.status != 403:
            raise
        return [f"cannot read the admission policies ({e.reason}): grant get on validatingadmissionpolicies and list "
                "on validatingadmissionpolicybindings (the chart's <operator>-admission ClusterRole)"]
    return enforcement_problems(policies, bindings)


class AdmissionPolicies:
    """What this replica last learnt of the policies: ``in_force`` gates reconciles and ``/readyz``."""

    def __init__(self, kube: Kube, names: list[str], unchecked: bool) -> None:
        self.kube, self.names, self.unchecked = kube, list(names), unchecked
        self.problems: list[str] = []
        self._checked = False
        metrics.ADMISSION_POLICIES_IN_FORCE.set(0 if unchecked else 1)

    @property
    def in_force(self) -> bool:
        """True when the policies were in force at the last look, or are knowingly not checked."""
        return self.unchecked or not self.problems

    def check(self) -> list[str]:
        """Ask the API server again (blocking: run it in a thread); log a change of answer. Returns the problems."""
        if self.unchecked:
            return []
        problems = policy_problems(self.kube, self.names)
        if self._checked and problems and problems != self.problems:
            log.error("admission policies not in force: %s; reconciles paused (nothing is created or deleted) and "
                      "/readyz answers 503 until they are back", "; ".join(problems))
        elif self.problems and not problems:
            log.info("admission policies %s in force again: reconciling", ", ".join(self.names))
        self.problems, self._checked = problems, True
        metrics.ADMISSION_POLICIES_IN_FORCE.set(0 if problems else 1)
        return problems

    async def at_start(self) -> bool:
        """May the operator start? The policies in force, or knowingly not checked (said loudly); else the
        reason is logged and the answer is no."""
        if self.unchecked:
            log.error("%s", UNCHECKED)
            return True
        problems = await asyncio.to_thread(self.check)
        if problems:
            log.error("refusing to start: the admission policies this operator relies on are not in force: %s. "
                      "Install them (the chart's admissionPolicies.enabled, or manifests/base/admission-policies.yaml)"
                      ", or, only where the same rules are enforced another way, set without_admission_policies "
                      "(--without-admission-policies)", "; ".join(problems))
            return False
        log.info("admission policies %s in force", ", ".join(self.names))
        return True

    async def keep_checking(self, interval: float) -> None:
        """Ask again every ``interval`` seconds; an API error keeps the last answer (and is logged)."""
        while not self.unchecked:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.check)
            except Exception as e:  # noqa: BLE001 - the API server away for a moment: keep the last answer
                log.warning("cannot check the admission policies: %r; keeping the last answer", e)
