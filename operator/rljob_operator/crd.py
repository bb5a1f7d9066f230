"""The RLTrainingJob CustomResourceDefinition, generated from the API models (pure).

``rljob crd`` prints it; ``crds/rljob.dev_rltrainingjobs.yaml`` holds it and a unit test
fails when that file drifts from the models. The pydantic JSON schema becomes a
structural OpenAPI v3 schema:

* ``$ref``s are inlined, titles dropped, descriptions kept (``kubectl explain`` shows them);
* ``Optional[X]`` becomes plain ``X`` (not ``nullable``): the API server prunes nulls, which
  is what ``None`` means in the models, and CEL ``has()`` guards never meet a null;
* free-form maps (``trl``, ``kwargs``, Kubernetes types such as ``affinity``) keep unknown
  fields; ``int | str`` is ``x-kubernetes-int-or-string``;
* nested sections default to ``{}`` so the API server fills in every nested default;
* cross-field rules the models check in validators are CEL ``x-kubernetes-validations``
  (:data:`CEL_RULES`), so the API server rejects what ``rljob validate`` rejects.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema
from rljob_trainer.builtin.rewards import BUILTIN_REWARDS
from rljob_trainer.config import BUILTIN_DATASETS, BUILTIN_MODELS, CUSTOM_REWARD_RE

from rljob_operator.api import (
    API_VERSION,
    CATEGORIES,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    RLTrainingJobSpec,
    RLTrainingJobStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"crds/{GROUP}_{PLURAL}.yaml"


def _cel_list(values: Any) -> str:
    return "[" + ", ".join(f"'{v}'" for v in sorted(values)) + "]"


def _rule(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


#: CEL rules by schema path (``[]`` = list items). Each mirrors a pydantic validator.
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "": [
        _rule(
            f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters (pods are named <name>-worker-<i>)",
        ),
    ],
    "spec": [
        _rule(
            "has(self.workers.minReplicas) || has(self.workers.maxReplicas) || "
            "(self.training.batchSize * self.workers.replicas * self.workers.procsPerWorker"
            " * self.training.gradientAccumulationSteps) % self.training.numGenerations == 0",
            "spec.training.numGenerations must divide the generation batch "
            "batchSize × replicas × procsPerWorker × gradientAccumulationSteps",
            ".training.numGenerations",
        ),
        _rule(
            "!has(self.autoscaling) || !has(self.autoscaling.policy) || self.autoscaling.policy != 'Capacity' || "
            "(has(self.workers.minReplicas) && has(self.workers.maxReplicas))",
            "spec.workers: autoscaling.policy Capacity needs both minReplicas and maxReplicas",
            ".workers",
        ),
    ],
    "spec.workers": [
        _rule(
            "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            "spec.workers.maxReplicas must be ≥ minReplicas",
            ".maxReplicas",
        ),
        _rule(
            "!has(self.resources) || ("
            "(!has(self.resources.requests) || !(self.gpuResource in self.resources.requests)) && "
            "(!has(self.resources.limits) || !(self.gpuResource in self.resources.limits)))",
            "spec.workers.resources must not set the GPU resource; use spec.workers.gpusPerWorker",
            ".resources",
        ),
    ],
    "spec.training": [
        _rule(
            f"!self.model.startsWith('builtin:') || self.model in {_cel_list(BUILTIN_MODELS)}",
            f"spec.training.model: unknown built-in model; choose one of {', '.join(BUILTIN_MODELS)}",
            ".model",
        ),
    ],
    "spec.training.dataset": [
        _rule(
            f"!self.name.startsWith('builtin:') || self.name in {_cel_list(BUILTIN_DATASETS)}",
            f"spec.training.dataset.name: unknown built-in dataset; choose one of {', '.join(BUILTIN_DATASETS)}",
            ".name",
        ),
    ],
    "spec.training.rewards[]": [
        _rule(
            f"self.name in {_cel_list(BUILTIN_REWARDS)} || self.name.matches(r'{CUSTOM_REWARD_RE.pattern}')",
            "spec.training.rewards[].name must be a built-in reward "
            f"({', '.join(sorted(BUILTIN_REWARDS))}) or package.module:function",
            ".name",
        ),
    ],
    "spec.checkpoint": [
        _rule(
            "!has(self.storage) || self.storage != 's3://'",
            "spec.checkpoint.storage: an s3:// location needs a bucket, for example s3://my-bucket/run1",
            ".storage",
        ),
    ],
}

#: Bounds the models leave open but CEL cost estimation needs (strings and lists CEL walks).
CEL_BOUNDS: dict[str, dict[str, int]] = {
    "spec.training.rewards": {"maxItems": 64},
    "spec.training.rewards[].name": {"maxLength": 256},
    "spec.training.model": {"maxLength": 2048},
    "spec.training.dataset.name": {"maxLength": 2048},
    "spec.checkpoint.storage": {"maxLength": 2048},
    "spec.workers.gpuResource": {"maxLength": 253},
}


def _without_empties(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empties(v) for k, v in value.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_without_empties(v) for v in value]
    return value


class _FactoryDefaults(GenerateJsonSchema):
    """Emit defaults of ``default_factory`` fields that are not empty collections.

    A nested section defaults to its fully defaulted value, not ``{}``: the API server
    checks a default against the section's CEL rules as it stands.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().get_default_value(schema)
        value = factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            value = value.model_dump(by_alias=True, mode="json", exclude_none=True)
        return _without_empties(value) if value else NoDefault


def _openapi(node: Any, defs: dict[str, Any]) -> Any:
    """One pydantic JSON-schema node → a structural OpenAPI v3 node."""
    if isinstance(node, list):
        return [_openapi(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:  # inline; the field's own keys (description, default) win over the model's
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        node = {**target, **node}
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        node = {**_openapi(inner, defs), **node}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = sorted(o.get("type", "") for o in options)
        if len(options) == 1:
            node = {**_openapi(options[0], defs), **node}
        elif types == ["integer", "string"]:
            node["x-kubernetes-int-or-string"] = True
        else:  # a union of scalars: the models validate it
            node["x-kubernetes-preserve-unknown-fields"] = True
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "default" and value is None:
            continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:  # False: unknown fields are pruned (and rejected by strict validation)
                out[key] = _openapi(value, defs)
        elif key == "properties":
            out[key] = {name: _openapi(prop, defs) for name, prop in value.items()}
        elif key == "items":
            out[key] = _openapi(value, defs)
        else:
            out[key] = value
    first = {k: out.pop(k) for k in ("type", "description") if k in out}
    return {**first, **out}


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in filter(None, path.split(".")):
        node = node["properties"][part[:-2]]["items"] if part.endswith("[]") else node["properties"][part]
    return node


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A pydantic model as a structural OpenAPI v3 schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_FactoryDefaults)
    return _openapi(raw, raw.get("$defs", {}))


def openapi_schema() -> dict[str, Any]:
    """The CRD's ``openAPIV3Schema``: the whole object, with CEL rules and bounds applied."""
    spec = model_schema(RLTrainingJobSpec)
    spec["default"] = _without_empties(RLTrainingJobSpec().model_dump(by_alias=True, mode="json"))
    status = model_schema(RLTrainingJobStatus)
    root: dict[str, Any] = {
        "type": "object",
        "description": "An RL post-training job (TRL GRPO/RLOO) run by a gang of torchrun worker pods.",
        "properties": {
            "apiVersion": {"type": "string", "description": "rljob.dev/v1alpha1"},
            "kind": {"type": "string", "description": "RLTrainingJob"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    for path, bounds in CEL_BOUNDS.items():
        _at(root, path).update(bounds)
    for path, rules in CEL_RULES.items():
        _at(root, path).setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
    return root


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "annotations": {"rljob.dev/generated-by": "rljob crd (rljob_operator.crd)"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.workers.replicas",
                            "statusReplicasPath": ".status.workers.active",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Workers",
                            "type": "string",
                            "jsonPath": ".status.workers.summary",
                            "description": "ready/desired worker pods",
                        },
                        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
                        {"name": "Reward", "type": "number", "jsonPath": ".status.progress.reward"},
                        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
                        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML committed in ``crds/``."""
    header = (
        f"# Generated by `rljob crd` from rljob_operator.api ({API_VERSION} {KIND}); do not edit.\n"
        "# Regenerate with `make crd`.\n"
    )
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, allow_unicode=True, width=100)
