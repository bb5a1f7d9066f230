"""The preload of the launcher's fork server: what every rank imports, imported once per node.

On a node without a GPU the launcher (``rljob_trainer.launch``) starts multiprocessing's fork server
before its pre-flight, with this module as the server's preload, and the elastic agent forks each
rank from the server (``rljob_trainer.worker.forked_main``). The node then pays TRL's import
(transformers' trainer stack, torch.distributed, datasets) once, while the pre-flight runs, instead
of once per rank after it. Only the fork server imports this module.
"""

from __future__ import annotations

import contextlib
import os
import signal

from rljob_contract.pod import PARENT_PID_ENV

from rljob_trainer.worker import die_with_parent


def prepare_server() -> None:
    """Tie the server's life to the launcher's, and keep it through the signals meant for the ranks.

    ``die_with_parent``: a launcher killed outright takes the server with it, and each rank (which
    asks the same of the server) with that. SIGTERM is ignored: a kubelet, or ``kill`` on the process
    group, signals the server with the ranks, which save a checkpoint before they exit; the server
    goes when the launcher does. (multiprocessing already ignores SIGINT here.) A forked rank sets
    SIGTERM back first thing.
    """
    die_with_parent()
    os.environ[PARENT_PID_ENV] = str(os.getpid())  # the ranks forked from here are this server's
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def import_stack() -> None:
    """Import what a rank's ``worker.run`` would import first thing."""
    import torch.distributed  # noqa: F401
    import transformers  # noqa: F401

    from rljob_trainer import data, rewards, telemetry  # noqa: F401
    from rljob_trainer.algorithms import BUILDERS
    from rljob_trainer.checkpoints import publisher, resume  # noqa: F401

    for algorithm in BUILDERS.values():  # TRL's trainer and config classes
        algorithm.trl_classes()

    with contextlib.suppress(ImportError):  # LoRA runs only
        import peft  # noqa: F401


prepare_server()
import_stack()
