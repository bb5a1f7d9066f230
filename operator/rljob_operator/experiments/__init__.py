"""RLExperiment: A/B/n tests of training strategies and hyperparameter searches (pure, no I/O).

Everything here is a function of the experiment's spec and what is stored (its status, its
trials' curves); nothing keeps memory between calls, so the operator can rebuild every
decision after a restart and ``rljob experiment`` runs the same file on one machine.

* ``rljob_contract.experiment`` (the contract, outside this package): the pydantic models (spec,
  status) and ``load_experiment``.
* ``trials``: an experiment → its trials' names, labels and full RLTrainingJob specs.
* ``objective``: a trial's curve → one number.  ``stats``: mean ± 95 % interval, Welch's t-test.
* ``search``: the next parameters to try (Optuna, rebuilt from the finished trials).
* ``pruning``: the median stopping rule over curves.  ``leaderboard``: ranks, best trial, winner.

Importing this package imports neither torch nor kopf (optuna and scipy are imported where used).
"""
