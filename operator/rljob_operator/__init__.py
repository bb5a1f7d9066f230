"""rljob's operator: reconciles RLTrainingJob resources into torchrun gangs of GPU pods.

Importing this package, and ``rljob_operator.api``, must not import torch.
"""

__version__ = "0.1.0"
