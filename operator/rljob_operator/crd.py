"""The RLTrainingJob CustomResourceDefinition, generated from the API models (pure).

``rljob crd`` prints it; ``crds/rljob.dev_rltrainingjobs.yaml`` holds it and a unit test
fails when that file drifts from the models. The pydantic JSON schema becomes a
structural OpenAPI v3 schema:

* ``$ref``s are inlined, titles dropped, descriptions kept (``kubectl explain`` shows them);
* ``Optional[X]`` becomes plain ``X`` (not ``nullable``): the API server prunes nulls, which
  is what ``None`` means in the models, and CEL ``has()`` guards never meet a null;
* free-form maps (Kubernetes types such as ``affinity``) keep unknown fields; ``int | str`` is
  ``x-kubernetes-int-or-string``;
* ``spec.training.trl`` lists every field of TRL's GRPOConfig/RLOOConfig with its type (from the
  generated ``rljob_trainer.trl_fields``), so unknown keys and wrong types are refused; CEL refuses the
  fields rljob manages, the fields of the other algorithm and those ``spec.training.strategy`` sets
  (:func:`trl_schema`, :func:`trl_rules`, :func:`strategy_rules`; algorithms from ``rljob_trainer.algorithms``);
* a built-in reward's ``kwargs`` take only its options, by value validations on the list item
  (``anyOf`` branches by name, no types inside) and CEL; a custom reward's stay free-form
  (:func:`reward_kwargs_schema`);
* nested sections default to ``{}`` so the API server fills in every nested default;
* cross-field rules the models check in validators are CEL ``x-kubernetes-validations``
  (:data:`CEL_RULES`), so the API server rejects what ``rljob validate`` rejects.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema
from rljob_trainer.algorithms import ALGORITHMS, CONFIG_CLASSES, STRATEGY_NAMES
from rljob_trainer.builtin.rewards import BUILTIN_REWARD_OPTIONS, BUILTIN_REWARDS
from rljob_trainer.config import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    CREDENTIAL_TRL_FIELDS,
    CREDENTIAL_TRL_MESSAGE,
    CUSTOM_REWARD_RE,
    MANAGED_TRL_FIELDS,
    TEXT_METRICS,
    describe_type,
    managed_message,
)
from rljob_trainer.storage_backends import PVC, StorageBackend, backends
from rljob_trainer.trl_fields import TRL_FIELDS, TRL_VERSION

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
from rljob_operator.experiments.api import MAX_TRIALS

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


_ELASTIC = "(has(self.workers.minReplicas) || has(self.workers.maxReplicas))"
_GLOBAL_BATCH = "self.training.batchSize * self.workers.replicas * self.workers.procsPerWorker"
#: The generation-batch knobs (config.check_generation_batch / check_elastic_generation), for algorithms
#: whose generation batches hold whole groups of numGenerations (every one so far).
if not all(a.whole_groups for a in ALGORITHMS.values()):
    raise NotImplementedError("rljob_operator.crd: the numGenerations rules below assume whole groups; guard them "
                              "with self.training.algorithm for an algorithm without (docs/architecture.md)")
GENERATION_RULES = [
    _rule(f"!has(self.training.generationBatchSize) || {_ELASTIC} || "
          f"self.training.generationBatchSize % ({_GLOBAL_BATCH}) == 0",
          "spec.training.generationBatchSize must be a multiple of batchSize × replicas × procsPerWorker",
          ".training.generationBatchSize"),
    _rule("!has(self.training.generationBatchSize) || "
          "self.training.generationBatchSize % self.training.numGenerations == 0",
          "spec.training.generationBatchSize must be a multiple of numGenerations", ".training.generationBatchSize"),
    _rule(f"!has(self.training.generationBatchSize) || !{_ELASTIC}",
          "spec.training.generationBatchSize cannot be fixed with elastic workers (the world size changes); "
          "use stepsPerGeneration", ".training.generationBatchSize"),
    _rule(f"!has(self.training.stepsPerGeneration) || {_ELASTIC} || "
          f"({_GLOBAL_BATCH} * self.training.stepsPerGeneration) % self.training.numGenerations == 0",
          "spec.training.numGenerations must divide the generation batch "
          "batchSize × replicas × procsPerWorker × stepsPerGeneration", ".training.stepsPerGeneration"),
    _rule(f"!has(self.training.stepsPerGeneration) || !{_ELASTIC} || "
          "(self.training.batchSize * self.training.stepsPerGeneration) % self.training.numGenerations == 0",
          "spec.training.stepsPerGeneration: with elastic workers, batchSize × stepsPerGeneration must be a "
          "multiple of numGenerations", ".training.stepsPerGeneration"),
]

def _location_rules(path: str, field: str, optional: bool, kinds: list[StorageBackend]) -> list[dict[str, str]]:
    """The CEL rules of a checkpoint location field, one per storage backend that has one."""
    guard = f"!has(self.{field}) || " if optional else ""
    rules = [b.cel_rule(f"self.{field}") for b in kinds]
    return [_rule(guard + rule, f"{path}.{field}: {message}", f".{field}") for rule, message in filter(None, rules)]


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
            "has(self.training.generationBatchSize) || has(self.training.stepsPerGeneration) || "
            "(self.training.batchSize * self.workers.replicas * self.workers.procsPerWorker"
            " * self.training.gradientAccumulationSteps) % self.training.numGenerations == 0",
            "spec.training.numGenerations must divide the generation batch "
            "batchSize × replicas × procsPerWorker × gradientAccumulationSteps",
            ".training.numGenerations",
        ),
        *GENERATION_RULES,
        _rule("!self.checkpoint.bestMetric.startsWith('eval/') || has(self.training.evaluation)",
              "spec.checkpoint.bestMetric: an evaluation metric (eval/...) needs spec.training.evaluation",
              ".checkpoint.bestMetric"),
        _rule(
            "!has(self.autoscaling) || !has(self.autoscaling.policy) || self.autoscaling.policy != 'Capacity' || "
            "(has(self.workers.minReplicas) && has(self.workers.maxReplicas))",
            "spec.workers: autoscaling.policy Capacity needs both minReplicas and maxReplicas",
            ".workers",
        ),
    ],
    "spec.training.lora": [
        _rule("!('all-linear' in self.targetModules) || size(self.targetModules) == 1",
              "spec.training.lora.targetModules: all-linear stands alone: give it or a list of module names, "
              "not both", ".targetModules"),
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
        _rule("!has(self.generationBatchSize) || !has(self.stepsPerGeneration)",
              "spec.training.generationBatchSize: set generationBatchSize or stepsPerGeneration, not both",
              ".generationBatchSize"),
    ],
    "spec.training.evaluation": [
        _rule("has(self.dataset) != has(self.heldOutFraction)",
              "spec.training.evaluation.heldOutFraction: set dataset or heldOutFraction (exactly one)",
              ".heldOutFraction"),
        _rule("self.decoding == 'sampled' || self.numGenerations == 1",
              "spec.training.evaluation.numGenerations: greedy decoding makes one completion per prompt; "
              "set decoding: sampled for more", ".numGenerations"),
        _rule("!has(self.passAtK) || size(self.passAtK) == 0 || self.decoding == 'sampled'",
              "spec.training.evaluation.passAtK: pass@k needs decoding: sampled", ".passAtK"),
        _rule("!has(self.passAtK) || self.passAtK.all(k, k <= self.numGenerations)",
              "spec.training.evaluation.passAtK: each k must be at most numGenerations", ".passAtK"),
    ],
    "spec.training.evaluation.dataset": [
        _rule(
            f"!self.name.startsWith('builtin:') || self.name in {_cel_list(BUILTIN_DATASETS)}",
            "spec.training.evaluation.dataset.name: unknown built-in dataset; choose one of "
            f"{', '.join(BUILTIN_DATASETS)}",
            ".name",
        ),
    ],
    "spec.training.evaluation.metrics[]": [
        _rule(
            f"self.name in {_cel_list((*BUILTIN_REWARDS, *TEXT_METRICS))} || "
            f"self.name.matches(r'{CUSTOM_REWARD_RE.pattern}')",
            "spec.training.evaluation.metrics[].name must be a built-in reward "
            f"({', '.join(sorted(BUILTIN_REWARDS))}), a text metric ({', '.join(TEXT_METRICS)}) or "
            "package.module:function",
            ".name",
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
    "spec.checkpoint": _location_rules("spec.checkpoint", "storage", True, backends()),
    # A bare s3:// mirror is refused by pydantic only (as before the backends): its CEL rule is not here.
    "spec.checkpoint.mirrors[]": _location_rules("spec.checkpoint.mirrors[]", "location", False, [PVC]),
}

def field_node(schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    """A field schema (``trl_fields`` vocabulary) as a structural OpenAPI node.

    ``int | str`` is ``x-kubernetes-int-or-string``; other unions (``dict | str``, ``str | bool``) cannot
    be typed in a structural schema, and CEL cannot see untyped values, so they keep any value here and
    the models check them. Nulls are pruned by the API server, so ``nullable`` is dropped.
    """
    node: dict[str, Any] = {}
    if "anyOf" in schema:
        kinds = sorted(str(s.get("type")) for s in schema["anyOf"])
        key = "x-kubernetes-int-or-string" if kinds == ["integer", "string"] else "x-kubernetes-preserve-unknown-fields"
        node[key] = True
    else:
        node["type"] = schema["type"]
        if "enum" in schema:
            node["enum"] = list(schema["enum"])
        for bound in ("minimum", "minItems", "maxItems"):
            if bound in schema:
                node[bound] = schema[bound]
        if schema["type"] == "array":
            node["items"] = field_node(schema.get("items", {}))
        elif schema["type"] == "object":
            if schema.get("additionalProperties"):
                node["additionalProperties"] = field_node(schema["additionalProperties"])
            else:
                node["x-kubernetes-preserve-unknown-fields"] = True
    if description:
        node = {"description": description, **node}
    return node


def _exposed(node: dict[str, Any]) -> bool:
    """Whether CEL sees this property (``has(self.x)`` compiles): typed or int-or-string."""
    return "type" in node or bool(node.get("x-kubernetes-int-or-string"))


def _trl_description(name: str) -> str:
    field = TRL_FIELDS[name]
    only = "" if len(field["algorithms"]) == len(CONFIG_CLASSES) else f" ({', '.join(field['algorithms'])} only)"
    if name in MANAGED_TRL_FIELDS:
        return f"Not settable: {managed_message(name)}."
    if name in CREDENTIAL_TRL_FIELDS:
        return f"Not settable: {CREDENTIAL_TRL_MESSAGE}."
    return f"{field['description']}{only}"


def trl_schema() -> dict[str, Any]:
    """``spec.training.trl``: every field of TRL's config classes, typed; unknown keys are refused.

    rljob's managed fields are listed (typed loosely where their type is a union, so CEL can see
    them) only so that :func:`trl_rules` can refuse them with the rljob field to use.
    """
    properties: dict[str, Any] = {}
    for name, field in TRL_FIELDS.items():
        if "unsupported" in field["schema"]:
            continue  # not writable in a manifest: left out, so it is an unknown field
        node = field_node(field["schema"], _trl_description(name))
        if name in MANAGED_TRL_FIELDS and not _exposed(node):
            node = {"description": node["description"], "x-kubernetes-int-or-string": True}
        properties[name] = node
    return {
        "type": "object",
        "description": (
            f"Further fields of TRL's {' or '.join(dict.fromkeys(CONFIG_CLASSES.values()))} (trl {TRL_VERSION}), by their TRL "
            "names; fields rljob sets itself are refused with the rljob field to use."
        ),
        "properties": properties,
    }


def trl_rules() -> dict[str, list[dict[str, str]]]:
    """CEL: the fields rljob manages, and each algorithm's foreign fields, are refused under trl."""
    managed = [
        _rule(f"!has(self.{name})", f"spec.training.trl.{name}: {managed_message(name)}", f".{name}")
        for name in MANAGED_TRL_FIELDS if name in TRL_FIELDS
    ] + [
        _rule(f"!has(self.{name})", f"spec.training.trl.{name}: {CREDENTIAL_TRL_MESSAGE}", f".{name}")
        for name in CREDENTIAL_TRL_FIELDS
    ]
    schema = trl_schema()["properties"]
    per_algorithm = []
    for algorithm, config in CONFIG_CLASSES.items():
        foreign = [n for n, f in TRL_FIELDS.items() if algorithm not in f["algorithms"] and n in schema
                   and _exposed(schema[n])]
        if foreign:
            present = " || ".join(f"has(self.trl.{n})" for n in foreign)
            per_algorithm.append(_rule(
                f"!has(self.trl) || self.algorithm != '{algorithm}' || !({present})",
                f"spec.training.trl: {', '.join(foreign)} are not fields of TRL's {config} (algorithm {algorithm})",
                ".trl",
            ))
    return {"spec.training.trl": managed, "spec.training": per_algorithm + strategy_rules(schema)}


def strategy_rules(trl_properties: dict[str, Any]) -> list[dict[str, str]]:
    """CEL: each algorithm takes only its own strategies, and a strategy's TRL fields are refused under trl."""
    rules = [
        _rule(f"self.algorithm != '{name}' || !has(self.strategy)"
              + (f" || self.strategy in {_cel_list(a.strategies)}" if a.strategies else ""),
              f"spec.training.strategy: algorithm {name} has no such strategy "
              f"(its strategies: {', '.join(a.strategies) or 'none'})", ".strategy")
        for name, a in ALGORITHMS.items() if set(a.strategies) != set(STRATEGY_NAMES)
    ]
    for a in ALGORITHMS.values():
        for name, strategy in a.strategies.items():
            fields = [k for k in strategy.trl if _exposed(trl_properties[k])]
            present = " || ".join(f"has(self.trl.{k})" for k in fields)
            rules.append(_rule(
                f"!has(self.strategy) || self.strategy != '{name}' || !has(self.trl) || !({present})",
                f"spec.training.trl: {', '.join(fields)} are set by spec.training.strategy {name}; remove them "
                "from trl, or drop the strategy to set TRL's fields yourself",
                ".trl",
            ))
    return rules


def _options_within(options: list[str]) -> dict[str, Any]:
    """Value validations of a ``kwargs`` object that holds no key outside ``options``.

    Unknown keys are invisible to CEL in an object that keeps unknown fields, so this counts them:
    for some subset T of the options, every key of T is present and there are no more than |T| keys.
    """
    subsets = [list(t) for k in range(len(options) + 1) for t in itertools.combinations(options, k)]
    branches = [{"required": t, "maxProperties": len(t)} if t else {"maxProperties": 0} for t in subsets]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def reward_kwargs_schema(description: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kwargs node, value validations of the list item) for ``spec.training.rewards[]``.

    ``kwargs`` keeps unknown fields (a custom function's are free-form) and types the built-ins'
    options; the item's ``anyOf`` (one branch per built-in, one for custom names; value validations
    only, as structural schemas require) refuses a built-in's unknown keys; CEL
    (:func:`reward_option_rules`) checks option values that only apply to one built-in.
    """
    properties: dict[str, Any] = {}
    for options in BUILTIN_REWARD_OPTIONS.values():
        for option, schema in options.items():
            node = field_node({"type": schema["type"]}, f"Built-in reward option ({schema['description']})")
            if properties.setdefault(option, node)["type"] != node["type"]:
                raise ValueError(f"built-in reward option {option} has two types; rename one")
    # Structural schemas cannot type a key by the sibling name, so the options' types hold for every function.
    description += (f" A custom function's key named like a built-in option ({', '.join(properties)}) must have "
                    "that option's type.")
    kwargs = {"type": "object", "description": description, "properties": properties,
              "x-kubernetes-preserve-unknown-fields": True}
    branches: list[dict[str, Any]] = [{"properties": {"name": {"not": {"enum": sorted(BUILTIN_REWARD_OPTIONS)}}}}]
    branches += [
        {"properties": {"name": {"enum": [reward]}, "kwargs": _options_within(list(options))}}
        for reward, options in BUILTIN_REWARD_OPTIONS.items()
    ]
    return kwargs, {"anyOf": branches}


def reward_option_rules() -> list[dict[str, str]]:
    """CEL on ``spec.training.rewards[]``: a built-in's option values (enum, minimum) that only apply to it."""
    rules = []
    for reward, options in BUILTIN_REWARD_OPTIONS.items():
        for option, schema in options.items():
            guard = f"self.name != '{reward}' || !has(self.kwargs) || !has(self.kwargs.{option})"
            if "enum" in schema:
                rules.append(_rule(f"{guard} || self.kwargs.{option} in {_cel_list(schema['enum'])}",
                                   f"spec.training.rewards[].kwargs.{option} of {reward} must be "
                                   f"{describe_type(schema)}", f".kwargs.{option}"))
            if "minimum" in schema:
                rules.append(_rule(f"{guard} || self.kwargs.{option} >= {schema['minimum']}",
                                   f"spec.training.rewards[].kwargs.{option} of {reward} must be ≥ "
                                   f"{schema['minimum']}", f".kwargs.{option}"))
    return rules


# The generated rules join the hand-written ones (CEL_RULES is the one table openapi_schema applies).
for _path, _rules in [*trl_rules().items(), ("spec.training.rewards[]", reward_option_rules())]:
    CEL_RULES[_path] = [*CEL_RULES.get(_path, []), *_rules]


#: Bounds the models leave open but CEL cost estimation needs (strings and lists CEL walks).
CEL_BOUNDS: dict[str, dict[str, int]] = {
    "spec.training.rewards": {"maxItems": 64},
    "spec.training.rewards[].name": {"maxLength": 256},
    "spec.training.model": {"maxLength": 2048},
    "spec.training.dataset.name": {"maxLength": 2048},
    "spec.training.evaluation.dataset.name": {"maxLength": 2048},
    "spec.checkpoint.storage": {"maxLength": 2048},
    "spec.checkpoint.mirrors[].location": {"maxLength": 2048},
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
    training = _at(root, "spec.training")
    training["properties"]["trl"] = trl_schema()
    item = _at(root, "spec.training.rewards[]")
    kwargs, item_validations = reward_kwargs_schema(item["properties"]["kwargs"]["description"])
    item["properties"]["kwargs"] = kwargs
    item.update(item_validations)
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
                        # The headline metric of spec.training.evaluation (held-out data), latest and best.
                        {"name": "Eval", "type": "number", "jsonPath": ".status.progress.evaluation.value",
                         "description": "latest value of the headline evaluation metric"},
                        {"name": "Best-Eval", "type": "number", "jsonPath": ".status.progress.evaluation.bestValue",
                         "priority": 1},
                        # Durable or Ephemeral: a job that restarts from step 0 after a gang restart shows it.
                        {"name": "Checkpoints", "type": "string",
                         "jsonPath": '.status.conditions[?(@.type=="CheckpointsDurable")].reason'},
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


# ------------------------------------------------------------------------- RLExperiment
# The experiment CRD is generated from the experiment models (rljob_operator.experiments.api) the same
# way; its spec.template is the job CRD's own spec schema (CEL rules included), so a template is checked
# at `kubectl apply` exactly like a job, and the search space gets CEL rules that name the field.

EXPERIMENT_CEL_RULES: dict[str, list[dict[str, str]]] = {
    "spec": [
        _rule("has(self.arms) != has(self.search)",
              "spec: give exactly one of spec.arms (an A/B test) or spec.search (a hyperparameter search)", ".arms"),
        _rule(f"!has(self.arms) || size(self.arms) * (has(self.seeds) ? self.seeds : 1) <= {MAX_TRIALS}",
              f"spec.seeds: arms × seeds must be at most {MAX_TRIALS} trials (the status records each)", ".seeds"),
    ],
    "spec.search.parameters[]": [
        _rule("self.name.startsWith('training.')",
              "spec.search.parameters[].name must name a spec.training field, e.g. training.learningRate", ".name"),
        _rule("self.type == 'categorical' || (has(self.min) && has(self.max))",
              "spec.search.parameters[]: a float or int parameter needs min and max", ".min"),
        # (values holds mixed scalars, untyped in a structural schema and so invisible to CEL: the models
        # check that a categorical parameter has them.)
        _rule("self.type != 'categorical' || (!has(self.min) && !has(self.max))",
              "spec.search.parameters[]: a categorical parameter takes values, not min and max", ".min"),
        _rule("!has(self.min) || !has(self.max) || self.min < self.max",
              "spec.search.parameters[].max must be greater than min", ".max"),
        _rule("!has(self.log) || !self.log || !has(self.min) || self.min > 0.0",
              "spec.search.parameters[].min must be > 0 for a log-scale range (log: true)", ".min"),
    ],
    "spec.objective": [
        _rule("self.reduce != 'atStep' || has(self.step)", "spec.objective.step: reduce atStep needs step", ".step"),
    ],
}
# An eval/ objective (api.check_eval_metric, eval_rung_problem): the template must evaluate, and with early
# stopping every rung below maxSteps must be an evaluation step (the models also check the arms' overrides).
_EVAL_OBJECTIVE = "has(self.objective) && has(self.objective.metric) && self.objective.metric.startsWith('eval/')"
_EVALUATION = "self.template.training.evaluation"
_MAX_STEPS = "(has(self.template.training.maxSteps) ? self.template.training.maxSteps : 100)"
_MIN_STEPS = "(has(self.earlyStopping.minSteps) ? self.earlyStopping.minSteps : 10)"


def _on_schedule(step: str) -> str:
    """CEL: ``step`` is past the rungs that count, or a step where the template evaluates."""
    return f"({step} >= {_MAX_STEPS} || has({_EVALUATION}.everySteps) && {step} % {_EVALUATION}.everySteps == 0)"


EXPERIMENT_CEL_RULES["spec"] += [
    _rule(f"!({_EVAL_OBJECTIVE}) || (has(self.template.training) && has({_EVALUATION}))",
          "spec.objective.metric: an evaluation metric (eval/...) needs spec.template.training.evaluation",
          ".objective.metric"),
    _rule(f"!({_EVAL_OBJECTIVE}) || !has(self.earlyStopping) || !has(self.template.training) || !has({_EVALUATION})"
          f" || (has(self.earlyStopping.rungs) ? self.earlyStopping.rungs.all(r, {_on_schedule('r')})"
          # minSteps, minSteps + interval, …: all on schedule when the first is and so is the interval (or one is due)
          f" : {_on_schedule(_MIN_STEPS)} && (!has(self.earlyStopping.interval)"
          f" || {_MIN_STEPS} + self.earlyStopping.interval >= {_MAX_STEPS}"
          f" || {_on_schedule('self.earlyStopping.interval')}))",
          "spec.earlyStopping: with an eval/ objective every rung (below maxSteps) must be a multiple of "
          "spec.template.training.evaluation.everySteps, the steps where evaluation metrics are logged",
          ".earlyStopping"),
]


def experiment_openapi_schema() -> dict[str, Any]:
    """The experiment CRD's ``openAPIV3Schema``: spec.template is the job CRD's spec schema."""
    from rljob_operator.experiments.api import RLExperimentSpec, RLExperimentStatus

    spec = model_schema(RLExperimentSpec)
    template = copy.deepcopy(openapi_schema()["properties"]["spec"])
    template.pop("default", None)  # required: a template is written, not defaulted
    template["description"] = spec["properties"]["template"].get("description", "")
    spec["properties"]["template"] = template
    arms = spec["properties"]["arms"]
    # Arm names are unique (they name trials): the API server refuses a second arm of the same name.
    arms["x-kubernetes-list-type"], arms["x-kubernetes-list-map-keys"] = "map", ["name"]
    root: dict[str, Any] = {
        "type": "object",
        "description": "An experiment: an A/B/n test of training strategies or a hyperparameter search, "
                       "run as RLTrainingJob trials and judged by their reward curves.",
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": "RLExperiment"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": model_schema(RLExperimentStatus),
        },
    }
    for path, rules in EXPERIMENT_CEL_RULES.items():
        _at(root, path).setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
    return root


def experiment_crd_manifest() -> dict[str, Any]:
    """The RLExperiment CustomResourceDefinition object."""
    from rljob_operator.experiments import api as exp

    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{exp.PLURAL}.{GROUP}",
            "annotations": {"rljob.dev/generated-by": "rljob crd (rljob_operator.crd)"},
        },
        "spec": {
            "group": GROUP,
            "names": {"kind": exp.KIND, "listKind": f"{exp.KIND}List", "plural": exp.PLURAL,
                      "singular": exp.SINGULAR, "shortNames": list(exp.SHORT_NAMES), "categories": list(CATEGORIES)},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": experiment_openapi_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Trials", "type": "string", "jsonPath": ".status.summary",
                     "description": "finished/total trials"},
                    {"name": "Best", "type": "string", "jsonPath": ".status.bestName",
                     "description": "the best arm (arms) or trial (search)"},
                    {"name": "Objective", "type": "number", "jsonPath": ".status.bestObjective"},
                    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }


def experiment_crd_yaml() -> str:
    """The RLExperiment CRD as the YAML committed in ``crds/``."""
    header = (
        f"# Generated by `rljob crd --kind RLExperiment` from rljob_operator.experiments.api ({API_VERSION} "
        "RLExperiment); do not edit.\n# Regenerate with `make crd`.\n"
    )
    return header + yaml.safe_dump(experiment_crd_manifest(), sort_keys=False, allow_unicode=True, width=100)
