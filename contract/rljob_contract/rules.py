"""Rules a spec must keep, each written once: its CEL for the API server and its pydantic side.

A :class:`Rule` sits next to the model it guards (``spec.EVALUATION_RULES`` beside ``EvaluationSpec``,
…). From it come both checks:

* the CRD's ``x-kubernetes-validations`` (``rljob_operator.crd`` reads every rule list through
  :func:`cel_rules`), so ``kubectl apply`` refuses a bad spec naming the field;
* the model's pydantic validator (:func:`enforce`), for the rules whose ``refusal`` is the model's own
  message. A rule with ``refusal=None`` is enforced by the function its ``enforced_by`` names (a field
  validator or a ``check_*`` function that says more, e.g. with the numbers), and ``holds`` says the
  same thing as the CEL.

``tests/contract/test_rules_cluster.py`` checks every rule case by case: a document that breaks it and one that
keeps it are refused or accepted alike by the models and by the real API server's CEL, both naming
the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """One rule: ``self`` is the object at ``at`` (a CRD schema path; ``[]`` marks list items)."""

    name: str
    at: str
    cel: str
    message: str
    field_path: str | None
    #: The rule over the pydantic model at ``at``: True when the object keeps it (the CEL in Python);
    #: None only for a rule ``enforced_by`` a check too wide to restate (the tests compare its cases).
    holds: Callable[[Any], bool] | None
    #: What the model's validator raises when ``holds`` is False (``@field: …``, a string or a function of
    #: the model); None when ``enforced_by`` raises it instead.
    refusal: str | Callable[[Any], str] | None = None
    enforced_by: str = ""

    def __post_init__(self) -> None:
        if (self.refusal is None) == (not self.enforced_by):
            raise ValueError(f"rule {self.name}: give refusal (enforce() raises it) or enforced_by, exactly one")
        if self.refusal is not None and self.holds is None:
            raise ValueError(f"rule {self.name}: a rule with a refusal needs holds")

    def check(self, model: Any) -> None:
        """Raise the refusal when ``model`` breaks this rule (rules ``enforced_by`` another check pass)."""
        if self.refusal is not None and self.holds is not None and not self.holds(model):
            raise ValueError(self.refusal if isinstance(self.refusal, str) else self.refusal(model))

    def cel_rule(self) -> dict[str, str]:
        """This rule as one ``x-kubernetes-validations`` entry."""
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def enforce(model: Any, rules: Iterable[Rule]) -> None:
    """The pydantic side: raise the refusal of the first rule (with a refusal) ``model`` breaks."""
    for rule in rules:
        rule.check(model)


def cel_rules(*rule_lists: Iterable[Rule]) -> dict[str, list[dict[str, str]]]:
    """CEL entries by schema path, in the order given."""
    out: dict[str, list[dict[str, str]]] = {}
    for rules in rule_lists:
        for rule in rules:
            out.setdefault(rule.at, []).append(rule.cel_rule())
    return out


def cel_list(values: Iterable[str]) -> str:
    """A CEL list literal of ``values``, sorted."""
    return "[" + ", ".join(f"'{v}'" for v in sorted(values)) + "]"
