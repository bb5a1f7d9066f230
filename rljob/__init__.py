"""The ``rljob`` command: one CLI for both programs (see ``rljob.cli``)."""
