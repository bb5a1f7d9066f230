"""The plug-ins' descriptors: what the contract, the CRD and the operator know of each plug-in.

A plug-in (an algorithm, a checkpoint storage backend, a built-in reward) is split in two:

* its **descriptor**, here, torch-free and importing nothing but the contract: its name, its options,
  the CEL rules and refusals the models and the CRD derive from it, and for a storage backend its
  scheme, form, check, durability and what the pods mount
  (:mod:`.algorithms`, :mod:`.storage`, :mod:`.rewards`);
* its **implementation**, registered by the trainer under the same name: a trainer builder per
  algorithm (``rljob_trainer.algorithms``), a ``Location`` factory per storage scheme
  (``rljob_trainer.checkpoints.backends``), the built-in reward functions
  (``rljob_trainer.builtin.rewards``).

So the CRD's rules come from the descriptors alone, and the operator imports nothing of the trainer.
docs/architecture.md ("How to add an algorithm", "How to add a storage backend") lists the steps.
"""
