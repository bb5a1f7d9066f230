"""The worker pod as built, measured as the scheduler measures it and held to its runtime's bounds (pure).

``rljob_contract.runtime.problems`` checks what the job asks for; the runtime's ``podTemplate`` can still give
the pod resources of its own: container resources, pod-level ``spec.resources`` (Kubernetes' PodLevelResources,
beta and on since 1.34: the scheduler and the kubelet then take the pod's value over its containers' sum), GPUs
and a grace period. So the pod the operator would create is measured whole (:func:`pod_requests`,
:func:`pod_limits`) and held to the runtime's limits (:func:`bound_violations`):

* cpu and memory per worker, requests and limits, within ``limits.cpuPerWorker.max`` and
  ``limits.memoryPerWorker.max``;
* GPUs (the runtime's ``gpuResource``) exactly what the job resolves to (``gpusPerWorker``, within
  ``limits.gpusPerWorker.max``): a template may not add or change them;
* the grace period within ``limits.terminationGracePeriodSeconds.max`` and never beyond ``MAX_GRACE_SECONDS``.

The same measure gives Kueue's Workload the pod-level requests the API server would default
(:func:`defaulted_pod_resources`), so the quota counts what the pod reserves.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from rljob_contract.job import MAX_GRACE_SECONDS
from rljob_contract.quantities import is_quantity, parse_quantity
from rljob_contract.runtime import Resolved

#: Resources a pod may set at pod level (Kubernetes' IsSupportedPodLevelResource).
POD_LEVEL = ("cpu", "memory")
_HUGEPAGES = "hugepages-"
#: Resources whose pod-level request defaults to the containers' sum (overcommittable), else to the pod's limit.
_OVERCOMMITTABLE = frozenset(POD_LEVEL)
TEMPLATE = "spec.podTemplate"


def _quantities(resources: Any, section: str) -> dict[str, Decimal]:
    """``resources[section]`` as numbers; a value that is no quantity counts as nothing (the API server
    refuses such a pod, saying so)."""
    out: dict[str, Decimal] = {}
    for name, value in ((resources or {}).get(section) or {}).items():
        try:
            out[str(name)] = parse_quantity(value)
        except ValueError:
            continue
    return out


def _supported_at_pod_level(name: str) -> bool:
    return name in POD_LEVEL or name.startswith(_HUGEPAGES)


def _container_requests(container: dict[str, Any]) -> dict[str, Decimal]:
    """A container's requests as the API server defaults them: a limit without a request is the request."""
    resources = container.get("resources") or {}
    return {**_quantities(resources, "limits"), **_quantities(resources, "requests")}


def _aggregate(spec: dict[str, Any], measure: Any) -> dict[str, Decimal]:
    """The containers' total as the scheduler counts it (component-helpers' ``AggregateContainerRequests``): the
    regular containers and the sidecars (init containers that keep running) summed, and no less than any init
    container with the sidecars started before it."""
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        _add(total, measure(container or {}))
    sidecars: dict[str, Decimal] = {}
    init: dict[str, Decimal] = {}
    for container in spec.get("initContainers") or []:
        own = measure(container or {})
        if (container or {}).get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            running = dict(sidecars)
        else:
            running = dict(sidecars)
            _add(running, own)
        for name, value in running.items():
            init[name] = max(init.get(name, Decimal(0)), value)
    return {name: max(total.get(name, Decimal(0)), init.get(name, Decimal(0))) for name in {*total, *init}}


def _add(total: dict[str, Decimal], more: dict[str, Decimal]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Decimal(0)) + value


def pod_requests(spec: dict[str, Any]) -> dict[str, Decimal]:
    """What the pod requests of a node (component-helpers' ``PodRequests``): the containers' total, the
    pod-level value instead where the pod sets one, plus the overhead."""
    total = _aggregate(spec, _container_requests)
    for name, quantity in defaulted_pod_resources(spec).get("requests", {}).items():
        if _supported_at_pod_level(name) and is_quantity(quantity):
            total[name] = parse_quantity(quantity)
    for name, value in _quantities({"overhead": spec.get("overhead")}, "overhead").items():
        total[name] = total.get(name, Decimal(0)) + value
    return total


def pod_limits(spec: dict[str, Any]) -> dict[str, Decimal]:
    """The most the pod may use: the pod-level limit where it sets one, else its containers' total."""
    total = _aggregate(spec, lambda c: _quantities(c.get("resources"), "limits"))
    total.update({n: v for n, v in _quantities(spec.get("resources"), "limits").items() if _supported_at_pod_level(n)})
    return total


def defaulted_pod_resources(spec: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The pod-level ``resources`` as the API server stores them (its ``defaultPodRequests``): a pod-level limit
    without a request gets the containers' requests of that resource, else the limit, as its request. Empty
    when the pod sets none."""
    resources = spec.get("resources") or {}
    requests = {str(k): str(v) for k, v in (resources.get("requests") or {}).items()}
    limits = {str(k): str(v) for k, v in (resources.get("limits") or {}).items()}
    if limits:
        containers = _aggregate(spec, _container_requests)
        for name, limit in limits.items():
            if name in requests or not _supported_at_pod_level(name):
                continue
            requests[name] = _format(containers[name], name) if name in _OVERCOMMITTABLE and name in containers \
                else limit
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _format(value: Decimal, name: str = "cpu") -> str:
    """A number as a quantity the API server reads: millis when it has a fraction, bytes in the largest binary
    unit they fill exactly (``256Gi``) for anything but cpu."""
    if value != value.to_integral_value():
        return f"{int(value * 1000)}m"
    if name != "cpu" and value:
        for power, suffix in ((5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
            if value % (1024 ** power) == 0:
                return f"{int(value) // 1024 ** power}{suffix}"
    return str(int(value))


# ----------------------------------------------------------------------------- the bounds


def bound_violations(spec: dict[str, Any], runtime: Resolved) -> list[str]:
    """What the built pod (its ``spec``) asks beyond ``runtime``'s limits, each naming the runtime's field that
    bounds it and where the pod got it."""
    limits = runtime.runtime.spec.limits if runtime.runtime is not None else None
    out: list[str] = []
    if limits is not None:
        requests, most = pod_requests(spec), pod_limits(spec)
        for name, bound, field in (("cpu", limits.cpu_per_worker.max, "cpuPerWorker"),
                                   ("memory", limits.memory_per_worker.max, "memoryPerWorker")):
            for section, measured in (("requests", requests), ("limits", most)):
                if bound is not None and name in measured and measured[name] > parse_quantity(bound):
                    out.append(f"{_source(spec, name, section)}: the worker pod's {name} {section} come to "
                               f"{_format(measured[name], name)} (spec.limits.{field}.max allows at most {bound})")
    out += _gpus(spec, runtime)
    out += _grace(spec, runtime)
    return out


def _source(spec: dict[str, Any], name: str, section: str) -> str:
    """Where a resource of the built pod was set: at pod level (by its request or its limit), else in the
    containers (the trainer's is the job's)."""
    pod_level = spec.get("resources") or {}
    for written in (section, "limits", "requests"):
        if name in (pod_level.get(written) or {}):
            return f"{TEMPLATE}.spec.resources.{written}.{name}"
    return f"spec.workers.resources.{section}.{name} (or {TEMPLATE}.spec.containers[].resources)"


def _gpus(spec: dict[str, Any], runtime: Resolved) -> Iterator[str]:
    """Every container's GPUs (the runtime's ``gpuResource``) together: exactly the job's, within the bound."""
    gpu = runtime.gpu_resource
    counted = {section: _aggregate(spec, lambda c, s=section: _quantities(c.get("resources"), s)).get(gpu, Decimal(0))
               for section in ("requests", "limits")}
    for section, count in counted.items():
        if count != runtime.gpus_per_worker:
            yield (f"{TEMPLATE}.spec.containers[].resources.{section}[{gpu}]: the worker pod's containers ask for "
                   f"{_format(count)} {gpu}, not the job's {runtime.gpus_per_worker} (spec.workers.gpusPerWorker within "
                   "the runtime's spec.limits.gpusPerWorker): a template may not add or change GPUs")


def _grace(spec: dict[str, Any], runtime: Resolved) -> Iterator[str]:
    """The grace period: within the runtime's bound, and never beyond ``MAX_GRACE_SECONDS``."""
    grace = spec.get("terminationGracePeriodSeconds")
    bound = runtime.runtime.spec.limits.termination_grace_period_seconds.max if runtime.runtime is not None else None
    most = min(bound or MAX_GRACE_SECONDS, MAX_GRACE_SECONDS)
    if isinstance(grace, int) and grace > most:
        what = f"spec.limits.terminationGracePeriodSeconds.max allows at most {bound}" if bound is not None and \
            bound <= MAX_GRACE_SECONDS else f"no worker gets more than {MAX_GRACE_SECONDS}"
        yield (f"spec.workers.terminationGracePeriodSeconds: the worker pod's grace period is {grace} seconds ({what}; "
               "a stopped gang keeps its GPUs that long)")
