"""rljob's trainer: TRL GRPO/RLOO under torchrun, driven by an RLTrainingJob's spec.

Importing this package must stay cheap and torch-free: the contract (``rljob_contract``) imports
its algorithm registry and built-in rewards. Heavy modules (worker, launch) import torch themselves.
"""

from rljob_contract.version import VERSION

__version__ = VERSION
