"""``python -m rljob_operator ...`` is the ``rljob`` command."""

import sys

from rljob_operator.cli import main

sys.exit(main())
