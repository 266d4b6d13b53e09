"""``python -m training``: the training commands (:mod:`training.cli`).

The experiment commands moved to ``python -m experiments`` (:data:`experiments.cli.COMMANDS`: ``report``,
``table3``, ``intervals``). The cards and records made before the move, the shipped checkpoints among them, name
them as ``python -m training report|table3|intervals ...``, so that form is handed to :mod:`experiments.cli`
unchanged. Only this entry does so: no module of ``training`` imports ``experiments``.
"""

import sys

from experiments.cli import COMMANDS
from experiments.cli import main as experiments_main

from .cli import main

sys.exit(experiments_main() if sys.argv[1:2] and sys.argv[1] in COMMANDS else main())
