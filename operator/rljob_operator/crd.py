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
  generated ``rljob_contract.trl_fields``), so unknown keys and wrong types are refused; CEL refuses the
  fields rljob manages, the fields of the other algorithm and those ``spec.training.strategy`` sets
  (:func:`trl_schema`; the rules are ``rljob_contract.trl_rules``'s, declared once for the models and
  the CRD; algorithms from their descriptors, ``rljob_contract.plugins.algorithms``);
* a built-in reward's ``kwargs`` take only its options, by value validations on the list item
  (``anyOf`` branches by name, no types inside) and CEL; a custom reward's stay free-form
  (:func:`reward_kwargs_schema`);
* nested sections default to ``{}`` so the API server fills in every nested default;
* the rules the models check (each written once as a :class:`rljob_contract.rules.Rule`, beside its
  model) are CEL ``x-kubernetes-validations`` (:data:`CEL_RULES`), so the API server rejects what
  ``rljob validate`` rejects.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_snake
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema
from rljob_contract import runtime as rt
from rljob_contract import version, yamltext
from rljob_contract.experiment import (
    EXPERIMENT_ROOT_RULES,
    EXPERIMENT_RULES,
    OBJECTIVE_RULES,
    PARAMETER_RULES,
)
from rljob_contract.job import (
    API_VERSION,
    CATEGORIES,
    GROUP,
    KIND,
    MOVED_TO_RUNTIME,
    PLURAL,
    ROOT_RULES,
    SHORT_NAMES,
    SINGULAR,
    SPEC_RULES,
    VERSION,
    WORKER_RULES,
    RLTrainingJobSpec,
    RLTrainingJobStatus,
    moved_message,
)
from rljob_contract.plugins.algorithms import CONFIG_CLASSES
from rljob_contract.plugins.rewards import BUILTIN_REWARD_OPTIONS
from rljob_contract.rules import cel_list, cel_rules
from rljob_contract.spec import (
    CHECKPOINT_RULES,
    EVAL_METRIC_RULES,
    EVALUATION_RULES,
    LORA_RULES,
    MIRROR_RULES,
    REWARD_RULES,
    REWARD_SOURCE_RULES,
    TRAINING_RULES,
    dataset_rules,
    describe_type,
)
from rljob_contract.trl_fields import TRL_FIELDS, TRL_VERSION
from rljob_contract.trl_rules import (
    CREDENTIAL_TRL_FIELDS,
    CREDENTIAL_TRL_MESSAGE,
    MANAGED_TRL_FIELDS,
    TRL_FIELD_RULES,
    TRL_RULES,
    managed_message,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"crds/{GROUP}_{PLURAL}.yaml"


def _rule(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


#: CEL rules by schema path (``[]`` = list items): every rule list of the contract, each rule written once
#: beside the model it guards (rljob_contract.rules), the TRL refusals and strategies declared once in
#: rljob_contract.trl_rules; the generated reward options join them below.
CEL_RULES: dict[str, list[dict[str, str]]] = cel_rules(
    ROOT_RULES, SPEC_RULES, LORA_RULES, WORKER_RULES, TRAINING_RULES, EVALUATION_RULES,
    dataset_rules("spec.training.evaluation.dataset"), EVAL_METRIC_RULES, dataset_rules("spec.training.dataset"),
    REWARD_RULES, REWARD_SOURCE_RULES, TRL_FIELD_RULES, TRL_RULES,
)

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
    them) only so that ``trl_rules.TRL_FIELD_RULES`` can refuse them with the rljob field to use
    (``trl_rules.cel_visible`` says which fields CEL sees, as this builds them).
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
                rules.append(_rule(f"{guard} || self.kwargs.{option} in {cel_list(schema['enum'])}",
                                   f"spec.training.rewards[].kwargs.{option} of {reward} must be "
                                   f"{describe_type(schema)}", f".kwargs.{option}"))
            if "minimum" in schema:
                rules.append(_rule(f"{guard} || self.kwargs.{option} >= {schema['minimum']}",
                                   f"spec.training.rewards[].kwargs.{option} of {reward} must be ≥ "
                                   f"{schema['minimum']}", f".kwargs.{option}"))
    return rules


# The generated rules join the declared ones (CEL_RULES is the one table openapi_schema applies).
CEL_RULES["spec.training.rewards[]"] = [*CEL_RULES.get("spec.training.rewards[]", []), *reward_option_rules()]


#: Bounds the models leave open but CEL cost estimation needs (strings and lists CEL walks).
CEL_BOUNDS: dict[str, dict[str, int]] = {
    "spec.training.rewards": {"maxItems": 64},
    "spec.training.rewards[].name": {"maxLength": 256},
    "spec.training.model": {"maxLength": 2048},
    "spec.training.dataset.name": {"maxLength": 2048},
    "spec.training.evaluation.dataset.name": {"maxLength": 2048},
    "spec.workers.resources.requests": {"maxProperties": 2},
    "spec.workers.resources.limits": {"maxProperties": 2},
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
        if isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):  # no nulls: the API prunes them
            return [v.model_dump(by_alias=True, mode="json", exclude_none=True) for v in value]
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
    add_tombstones(root)
    return root


# ------------------------------------------------------------------------ moved fields


def add_tombstones(root: dict[str, Any]) -> None:
    """Each field of ``MOVED_TO_RUNTIME``, in both spellings, declared only so that a CEL rule can refuse it
    naming where it went (an undeclared field would be pruned silently, and the job would run without it)."""
    for path, runtime_path in MOVED_TO_RUNTIME.items():
        parent, _, name = path.rpartition(".")
        node = _at(root, parent)
        for key in dict.fromkeys((name, to_snake(name))):
            node["properties"][key] = {"description": f"Not a job's field: {moved_message(path)}.",
                                       **tombstone_type(runtime_path)}
            node.setdefault("x-kubernetes-validations", []).append(
                _rule(f"!has(self.{key})", f"{parent}.{key}: {moved_message(path)}", f".{key}"))


def tombstone_type(runtime_path: str) -> dict[str, Any]:
    """The loosest typed node CEL can see for a moved field: the type its runtime field has (any content)."""
    pod = "spec.podTemplate.spec."
    if runtime_path.startswith(pod):
        kind = _pod_field_type(runtime_path[len(pod):].split("."))
    else:
        kind = _at(runtime_spec_schema(), runtime_path.removeprefix("spec.")).get("type", "object")
    if kind == "array":
        return {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    if kind == "object":
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {"type": kind}


#: JSON types of the Pod fields moved fields went to, by name (``rljob crd`` runs without the Kubernetes client;
#: ``tests/operator/test_runtime_crd.py`` checks these against its models).
POD_FIELD_TYPES = {"nodeSelector": "object", "tolerations": "array", "affinity": "object", "priorityClassName": "string",
                   "serviceAccountName": "string", "volumes": "array", "volumeMounts": "array", "valueFrom": "object"}


def _pod_field_type(parts: list[str]) -> str:
    """The JSON type of a Pod field (``containers[name=trainer].volumeMounts``)."""
    return POD_FIELD_TYPES[parts[-1]]


def crd_labels() -> dict[str, str]:
    """Every CRD's labels: which product, and which release of it (pyproject's version, through
    ``rljob_contract.version``), so ``kubectl get crd -l app.kubernetes.io/name=rljob`` shows what is installed."""
    return {"app.kubernetes.io/name": "rljob", "app.kubernetes.io/version": version.VERSION}


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": crd_labels(),
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
        f"# Generated by `rljob crd` from rljob_contract.job ({API_VERSION} {KIND}); do not edit.\n"
        "# Regenerate with `make crd`.\n"
    )
    return header + yamltext.dump(crd_manifest(), sort_keys=False, allow_unicode=True, width=100)


# ------------------------------------------------------------------------- RLExperiment
# The experiment CRD is generated from the experiment models (rljob_contract.experiment) the same
# way; its spec.template is the job CRD's own spec schema (CEL rules included), so a template is checked
# at `kubectl apply` exactly like a job, and the search space gets CEL rules that name the field.

EXPERIMENT_CEL_RULES: dict[str, list[dict[str, str]]] = cel_rules(
    EXPERIMENT_ROOT_RULES, EXPERIMENT_RULES, PARAMETER_RULES, OBJECTIVE_RULES)


def experiment_openapi_schema() -> dict[str, Any]:
    """The experiment CRD's ``openAPIV3Schema``: spec.template is the job CRD's spec schema."""
    from rljob_contract.experiment import RLExperimentSpec, RLExperimentStatus

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
    from rljob_contract import experiment as exp

    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{exp.PLURAL}.{GROUP}",
            "labels": crd_labels(),
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
        f"# Generated by `rljob crd --kind RLExperiment` from rljob_contract.experiment ({API_VERSION} "
        "RLExperiment); do not edit.\n# Regenerate with `make crd`.\n"
    )
    return header + yamltext.dump(experiment_crd_manifest(), sort_keys=False, allow_unicode=True, width=100)


# ---------------------------------------------------------------------------- runtimes
# ClusterRLTrainingRuntime and RLTrainingRuntime share one spec model (rljob_contract.runtime.RuntimeSpec)
# and so one schema; the namespaced kind refuses a namespaceSelector (rljob_contract.runtime.NAMESPACED_RULES).

RUNTIME_CEL_RULES: dict[str, list[dict[str, str]]] = cel_rules(rt.LIMIT_RULES, CHECKPOINT_RULES, MIRROR_RULES)
#: Bounds CEL cost estimation needs on the runtimes' strings and lists.
RUNTIME_CEL_BOUNDS: dict[str, dict[str, int]] = {
    "spec.checkpoint.storage": {"maxLength": 2048},
    "spec.checkpoint.mirrors[].location": {"maxLength": 2048},
}
#: kind → (plural, singular, short names, scope).
RUNTIME_NAMES = {
    rt.CLUSTER_KIND: (rt.CLUSTER_PLURAL, rt.CLUSTER_SINGULAR, rt.CLUSTER_SHORT_NAMES, "Cluster"),
    rt.NAMESPACED_KIND: (rt.NAMESPACED_PLURAL, rt.NAMESPACED_SINGULAR, rt.NAMESPACED_SHORT_NAMES, "Namespaced"),
}


def runtime_spec_schema() -> dict[str, Any]:
    """The runtimes' spec schema, CEL rules and bounds applied (the kinds' own rules come on top)."""
    spec = model_schema(rt.RuntimeSpec)
    for path, bounds in RUNTIME_CEL_BOUNDS.items():
        _at(spec, path.removeprefix("spec.")).update(bounds)
    for path, rules in RUNTIME_CEL_RULES.items():
        _at(spec, path.removeprefix("spec")).setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
    return spec


def runtime_openapi_schema(kind: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of a runtime kind."""
    spec = runtime_spec_schema()
    if kind == rt.NAMESPACED_KIND:
        spec.setdefault("x-kubernetes-validations", []).extend(cel_rules(rt.NAMESPACED_RULES)["spec"])
    what = ("cluster-wide, for jobs of every namespace its namespaceSelector matches" if kind == rt.CLUSTER_KIND
            else "for the jobs of its own namespace")
    return {
        "type": "object",
        "description": f"What the platform sets for an RLTrainingJob's pods ({what}): image, pod template, GPU "
                       "resource, bounds on what a job asks, checkpoint storage, sources, egress and queue.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": kind},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }


def runtime_crd_manifest(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of ``kind`` (ClusterRLTrainingRuntime or RLTrainingRuntime)."""
    plural, singular, short, scope = RUNTIME_NAMES[kind]
    default = rt.DEFAULT_RUNTIME_ANNOTATION.replace(".", "\\.")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}",
                     "labels": crd_labels(),
                     "annotations": {"rljob.dev/generated-by": "rljob crd (rljob_operator.crd)"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": singular,
                      "shortNames": list(short), "categories": list(CATEGORIES)},
            "scope": scope,
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": runtime_openapi_schema(kind)},
                "additionalPrinterColumns": [
                    {"name": "Image", "type": "string", "jsonPath": ".spec.image"},
                    {"name": "GPUs-Max", "type": "integer", "jsonPath": ".spec.limits.gpusPerWorker.max",
                     "description": "the most GPUs a worker may ask for (empty: no bound)"},
                    {"name": "Default", "type": "string", "jsonPath": f".metadata.annotations.{default}",
                     "description": "serves jobs that name no runtime"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }


def runtime_crd_yaml(kind: str) -> str:
    """A runtime kind's CRD as the YAML committed in ``crds/``."""
    header = (f"# Generated by `rljob crd --kind {kind}` from rljob_contract.runtime ({API_VERSION} {kind}); do not "
              "edit.\n# Regenerate with `make crd`.\n")
    return header + yamltext.dump(runtime_crd_manifest(kind), sort_keys=False, allow_unicode=True, width=100)


#: ``rljob crd --kind``: every CRD rljob ships, by kind.
CRD_YAML: dict[str, Callable[[], str]] = {
    KIND: crd_yaml, "RLExperiment": experiment_crd_yaml,
    **{kind: functools.partial(runtime_crd_yaml, kind) for kind in RUNTIME_NAMES},
}
