"""What ``spec.training.trl`` may not hold, each refusal declared once (:class:`TrlRefusal`).

TRL's config takes any of its fields under ``spec.training.trl``, except:

* the fields rljob sets itself (:data:`MANAGED_TRL_FIELDS`: the rljob field to use instead),
* credentials (:data:`CREDENTIAL_TRL_FIELDS`, and any key named like one),
* the fields a named strategy sets (``spec.training.strategy``; the algorithm descriptors' strategies),
* the fields of another algorithm's config class (``trl_fields`` says whose each field is).

Each is one :class:`TrlRefusal`, from which come both checks: the models' (``spec.check_trl``, through
:func:`refused_fields`, one message per key) and the CRD's CEL (:data:`TRL_FIELD_RULES` on
``spec.training.trl`` and :data:`TRL_RULES` on ``spec.training``, contract :class:`~rljob_contract.rules.Rule`
s whose ``holds`` is the same refusal in Python). Beside them, :data:`STRATEGY_RULES`: an algorithm takes
only its own strategies (``TrainingSpec._strategy_of_algorithm`` says it with the strategy's name).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rljob_contract.plugins.algorithms import ALGORITHMS, CONFIG_CLASSES, STRATEGY_NAMES
from rljob_contract.rules import Rule, cel_list
from rljob_contract.trl_fields import TRL_FIELDS

#: TRL config fields rljob sets itself (``worker.trl_arguments`` and ``trainer.train``) and what a user
#: sets instead. The one list: the models and the CRD refuse these under ``spec.training.trl``, and the
#: worker sets no TRL field that is neither here nor in TRL_DEFAULTS.
MANAGED_TRL_FIELDS: dict[str, str] = {
    "output_dir": "spec.checkpoint.subPath (the runtime's checkpoint storage holds each job's checkpoints)",
    "per_device_train_batch_size": "spec.training.batchSize",
    "max_steps": "spec.training.maxSteps",
    "learning_rate": "spec.training.learningRate",
    "num_generations": "spec.training.numGenerations",
    "max_completion_length": "spec.training.maxCompletionLength",
    "gradient_accumulation_steps": "spec.training.gradientAccumulationSteps",
    "seed": "spec.training.seed",
    "bf16": "spec.training.precision",
    "fp16": "spec.training.precision",
    "use_cpu": "spec.workers.gpusPerWorker (0 runs on CPU)",
    "dataloader_num_workers": "spec.training.dataloaderWorkers",
    "beta": "spec.training.beta",
    "save_steps": "spec.checkpoint.everySteps",
    "save_strategy": "spec.checkpoint.everySteps",
    "save_total_limit": "spec.checkpoint.keepLast",
    "logging_steps": "spec.training.loggingSteps",
    "report_to": "spec.training.tracking (MLflow, W&B; TensorBoard is always on)",
    "reward_weights": "spec.training.rewards[].weight",
    "resume_from_checkpoint": "it resumes from the newest complete checkpoint",
    "gradient_checkpointing": "spec.training.gradientCheckpointing",
    "activation_checkpointing": "spec.training.gradientCheckpointing",
    "generation_batch_size": "spec.training.generationBatchSize",
    "steps_per_generation": "spec.training.stepsPerGeneration",
}
#: A name that carries a credential (``hub_token``, ``use_auth_token``, ``api_key``, ``password`` …),
#: TRL's own or a key inside one of its ``*_kwargs`` mappings (``model_init_kwargs.token``).
CREDENTIAL_NAME_RE = re.compile(
    r"(^|_)(token|password|passwd|secret|api_?key|access_?key|private_?key|credentials?)($|_)", re.IGNORECASE
)
#: Why a credential-like field is refused under ``spec.training.trl``.
CREDENTIAL_TRL_MESSAGE = (
    "credentials never go in the manifest (the trainer config is a ConfigMap anyone with `view` reads); "
    "put the token in a Secret that the runtime passes as an environment variable (its spec.podTemplate's "
    "trainer container env[].valueFrom.secretKeyRef, for example HF_TOKEN), or use the pod's service account "
    "(workload identity)"
)
#: TRL config fields that carry credentials: the models and the CRD refuse them under ``spec.training.trl``.
CREDENTIAL_TRL_FIELDS = tuple(sorted(k for k in TRL_FIELDS if CREDENTIAL_NAME_RE.search(k)))


def managed_message(key: str) -> str:
    """Why ``spec.training.trl.<key>`` is refused: the rljob field to use, or what rljob does instead."""
    use = MANAGED_TRL_FIELDS[key]
    return f"set by rljob; use {use}" if use.startswith("spec.") else f"set by rljob ({use}); remove it from trl"


def strategy_message(strategy: str, key: str, value: Any) -> str:
    """Why ``spec.training.trl.<key>`` is refused next to ``spec.training.strategy``, which sets it to ``value``."""
    return (f"set by spec.training.strategy {strategy} ({key}={value!r}); remove it from trl, "
            "or drop the strategy to set TRL's fields yourself")


@dataclass(frozen=True)
class TrlRefusal:
    """TRL fields refused under ``spec.training.trl`` while the training's algorithm is ``algorithm`` and its
    strategy ``strategy`` (None: whatever it is).

    ``says(key)``: the models' message for one key. ``summary``: the CRD's one rule for all the fields,
    on ``spec.training`` (``{fields}`` is replaced by those CEL sees) after ``cel_unless`` (the CEL of
    "the refusal does not apply"); without a summary, one rule per field on ``spec.training.trl``.
    ``pattern``: keys named like this are refused too (the models only: CEL sees declared fields only).
    """

    name: str
    fields: tuple[str, ...]
    says: Callable[[str], str]
    algorithm: str | None = None
    strategy: str | None = None
    summary: str = ""
    cel_unless: str = ""
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    def applies(self, algorithm: str | None, strategy: str | None) -> bool:
        """Whether the refusal holds for a training with this algorithm (None: unknown) and strategy."""
        return ((self.algorithm is None or self.algorithm == algorithm)
                and (self.strategy is None or self.strategy == strategy))

    def cel_applies(self, training: Any) -> bool:
        """``applies`` as the CEL says it: by the strategy alone when there is one (its name says the algorithm;
        another algorithm's strategy is refused by :data:`STRATEGY_RULES`), else by the algorithm."""
        if self.strategy is not None:
            return bool(training.strategy == self.strategy)
        return self.algorithm is None or training.algorithm == self.algorithm

    def refuses(self, key: Any) -> bool:
        return key in self.fields or (self.pattern is not None and isinstance(key, str) and bool(self.pattern.search(key)))

    def rules(self) -> list[Rule]:
        """The CRD's side: one rule per field, or one for all (only the fields CEL sees, :func:`cel_visible`)."""
        if not self.summary:
            return [Rule(f"spec.training.trl.{name}: {self.name}", "spec.training.trl", f"!has(self.{name})",
                         f"spec.training.trl.{name}: {self.says(name)}", f".{name}", holds=_absent(name),
                         enforced_by="check_trl")
                    for name in self.fields if name in TRL_FIELDS]
        shown = tuple(name for name in self.fields if cel_visible(name))
        if not shown:
            return []
        present = " || ".join(f"has(self.trl.{name})" for name in shown)
        return [Rule(f"spec.training.trl: {self.name}", "spec.training", f"{self.cel_unless} || !({present})",
                     self.summary.format(fields=", ".join(shown)), ".trl",
                     holds=lambda t: not self.cel_applies(t) or not set(shown) & set(t.trl),
                     enforced_by="check_trl")]


def _absent(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda trl: name not in trl


def cel_visible(name: str) -> bool:
    """Whether the CRD types ``spec.training.trl.<name>`` so that CEL can test it (``rljob_operator.crd.trl_schema``):
    a field it lists (not ``unsupported``) with one type or ``int | str``; a managed field always."""
    schema: dict[str, Any] = TRL_FIELDS[name]["schema"] if name in TRL_FIELDS else {"unsupported": "not a TRL field"}
    if "unsupported" in schema:
        return False
    if name in MANAGED_TRL_FIELDS or "anyOf" not in schema:
        return True
    return sorted(str(s.get("type")) for s in schema["anyOf"]) == ["integer", "string"]


MANAGED = TrlRefusal("managed by rljob", tuple(MANAGED_TRL_FIELDS), managed_message)
CREDENTIALS = TrlRefusal("a credential", CREDENTIAL_TRL_FIELDS, lambda _: CREDENTIAL_TRL_MESSAGE,
                         pattern=CREDENTIAL_NAME_RE)


def _foreign(algorithm: str) -> TrlRefusal:
    config = CONFIG_CLASSES[algorithm]

    def says(key: str) -> str:
        others = "/".join(CONFIG_CLASSES[a] for a in TRL_FIELDS[key]["algorithms"])
        return f"a field of TRL's {others} only; {config} (algorithm {algorithm}) has no such field"

    return TrlRefusal(f"fields of another algorithm than {algorithm}",
                      tuple(n for n, f in TRL_FIELDS.items() if algorithm not in f["algorithms"]), says,
                      algorithm=algorithm, summary=f"spec.training.trl: {{fields}} are not fields of TRL's {config} "
                                                   f"(algorithm {algorithm})",
                      cel_unless=f"!has(self.trl) || self.algorithm != '{algorithm}'")


def _of_strategy(algorithm: str, name: str) -> TrlRefusal:
    trl = ALGORITHMS[algorithm].strategies[name].trl
    return TrlRefusal(f"set by strategy {name}", tuple(trl), lambda key: strategy_message(name, key, trl[key]),
                      algorithm=algorithm, strategy=name,
                      summary=f"spec.training.trl: {{fields}} are set by spec.training.strategy {name}; remove them "
                              "from trl, or drop the strategy to set TRL's fields yourself",
                      cel_unless=f"!has(self.strategy) || self.strategy != '{name}' || !has(self.trl)")


FOREIGN = tuple(_foreign(a) for a in ALGORITHMS)
OF_STRATEGY = tuple(_of_strategy(a.name, s) for a in ALGORITHMS.values() for s in a.strategies)
#: The refusals of fields every config class has: a key they refuse is not searched for nested credentials.
OWN_REFUSALS: tuple[TrlRefusal, ...] = (CREDENTIALS, *OF_STRATEGY, MANAGED)
#: Every refusal, in the order the models apply them: a key refused twice gets the first one's message.
REFUSALS: tuple[TrlRefusal, ...] = (*OWN_REFUSALS, *FOREIGN)


def refused_fields(trl: dict[str, Any], algorithm: str | None, strategy: str | None,
                   refusals: tuple[TrlRefusal, ...] = REFUSALS) -> dict[str, str]:
    """The models' side: each key of ``trl`` that a refusal applying to this algorithm (None: unknown, so
    only the refusals of any algorithm apply) and strategy refuses → why."""
    refused: dict[str, str] = {}
    for refusal in refusals:
        if refusal.applies(algorithm, strategy):
            for key in trl:
                if refusal.refuses(key):
                    refused.setdefault(key, refusal.says(key))
    return refused


def _strategy_rule(name: str) -> Rule:
    strategies = ALGORITHMS[name].strategies
    return Rule(f"spec.training.strategy: one of {name}'s", "spec.training",
                f"self.algorithm != '{name}' || !has(self.strategy)"
                + (f" || self.strategy in {cel_list(strategies)}" if strategies else ""),
                f"spec.training.strategy: algorithm {name} has no such strategy "
                f"(its strategies: {', '.join(strategies) or 'none'})", ".strategy",
                holds=lambda t: t.algorithm != name or t.strategy is None or t.strategy in strategies,
                enforced_by="TrainingSpec._strategy_of_algorithm")


#: An algorithm takes only its own strategies (none for an algorithm that takes every strategy name).
STRATEGY_RULES = [_strategy_rule(name) for name, a in ALGORITHMS.items() if set(a.strategies) != set(STRATEGY_NAMES)]
#: The CRD's rules on ``spec.training.trl``: the managed fields and the credentials, one rule each.
TRL_FIELD_RULES = [*MANAGED.rules(), *CREDENTIALS.rules()]
#: The CRD's rules on ``spec.training``: each algorithm's foreign fields, the strategies, their fields.
TRL_RULES = [*(r for f in FOREIGN for r in f.rules()), *STRATEGY_RULES, *(r for s in OF_STRATEGY for r in s.rules())]
