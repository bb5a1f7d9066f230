"""How a test decides what a pod on a fake (kwok) node does.

kwok plays the kubelet for pods bound to fake nodes (see ``kwok_stages.yaml``).
Without annotations a scheduled pod becomes Running and Ready at once, with a
pod IP from 10.128.0.0/16 and a hostIP of its node, and stays that way. Pods
owned by a batch Job complete with exit code 0, as in kwok's defaults.

Pod annotations (set them at creation, or patch them onto a running pod):

``rljob.dev/fake-exit-code: "<int>"``
    Every container terminates with this exit code. The pod ends ``Succeeded``
    for 0 and ``Failed`` otherwise (what a ``restartPolicy: Never`` pod does;
    kwok does not model container restarts). Container state reason defaults
    to ``Completed`` (0) or ``Error``.
``rljob.dev/fake-reason: "<reason>"``
    Container termination reason instead of the default, e.g. ``OOMKilled``
    (use with exit code 137, as the kubelet reports it).
``rljob.dev/fake-message: "<text>"``
    Container termination message (``state.terminated.message``), what the
    trainer writes to /dev/termination-log.
``rljob.dev/fake-exit-after: "<duration>"``
    Go duration (``"30s"``) or RFC 3339 time: when to exit, counted from the
    moment the pod became Running (or the annotation was added). Default: at once.
``rljob.dev/fake-start-delay: "<duration>"``
    Stay Pending this long after scheduling before turning Running.
``rljob.dev/fake-ready: "false"`` / ``"true"``
    Turn a running pod NotReady (containers keep running, Ready and
    ContainersReady False with reason ContainersNotReady) / Ready again.
    ``"true"`` only undoes ``"false"``; it does not revive pods that the node
    lifecycle controller marked NotReady.
``rljob.dev/fake-stuck-terminating: "true"``
    Once deleted, the pod stays Terminating until force-deleted
    (``grace_period_seconds=0``), like a pod whose kubelet never confirms.

Exit wins: with ``fake-exit-code`` set, ``fake-ready`` is ignored. Setting an
annotation on a pod that already finished changes nothing (terminal phases are
final, as the apiserver enforces).

Node behaviour (``ControlPlane.set_node_ready`` / ``remove_node``), as
observed against the real kube-controller-manager (defaults: 15 s grace,
10 s toleration):

* Unreachable node (``rljob.dev/fake-node-unreachable: "true"`` on the Node):
  kwok stops heartbeating; after ``--node-monitor-grace-period`` the node
  lifecycle controller sets Ready=Unknown, marks its pods Ready=False and
  taints it ``node.kubernetes.io/unreachable:NoExecute``; after the pods'
  toleration (``ClusterConfig.eviction_toleration_s``) the taint-eviction
  controller deletes them with a ``DisruptionTarget`` condition (reason
  ``DeletionByTaintManager``), about 25-30 s after the node went silent. They
  then stay Terminating, because no kubelet confirms, until force-deleted or
  until the node is deleted. ``set_node_ready(name, True)`` brings the node
  back Ready and removes the taints; pods still on it keep their state.
* Deleted node: kwok forgets its pods, which stay as they were until the pod
  GC controller force-deletes them after its fixed 40 s quarantine (it runs
  every 20 s): about 40-60 s after the node went away. A pod that has a
  ``DisruptionTarget`` condition first gets one with reason ``DeletionByPodGC``.
"""

from __future__ import annotations

EXIT_CODE = "rljob.dev/fake-exit-code"
REASON = "rljob.dev/fake-reason"
MESSAGE = "rljob.dev/fake-message"
EXIT_AFTER = "rljob.dev/fake-exit-after"
START_DELAY = "rljob.dev/fake-start-delay"
READY = "rljob.dev/fake-ready"
STUCK_TERMINATING = "rljob.dev/fake-stuck-terminating"


def exit_annotations(
    exit_code: int,
    *,
    reason: str | None = None,
    message: str | None = None,
    after: str | None = None,
) -> dict[str, str]:
    """Annotations that make a pod's containers exit with ``exit_code``.

    ``exit_annotations(137, reason="OOMKilled")`` is an out-of-memory kill.
    """
    annotations = {EXIT_CODE: str(int(exit_code))}
    if reason:
        annotations[REASON] = reason
    if message:
        annotations[MESSAGE] = message
    if after:
        annotations[EXIT_AFTER] = after
    return annotations


def container_termination(pod) -> dict | None:
    """Exit code, reason and message of the first terminated container of a V1Pod."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        terminated = status.state.terminated if status.state else None
        if terminated is not None:
            return {
                "exit_code": terminated.exit_code,
                "reason": terminated.reason,
                "message": terminated.message,
            }
    return None


def pod_is_ready(pod) -> bool:
    """Whether a V1Pod has the Ready condition True."""
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "Ready":
            return condition.status == "True"
    return False
