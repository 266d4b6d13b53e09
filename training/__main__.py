"""``python -m training``: the training commands (:mod:`training.cli`).

The experiment commands moved to ``python -m experiments`` (``report``, ``table3``, ``intervals``:
:data:`training.cli.MOVED`). The cards and records made before the move, the shipped checkpoints among them, name
them as ``python -m training report|table3|intervals ...``; that form runs ``python -m experiments`` with the same
arguments, in a process of its own, and ends with its exit status. No module of ``training`` imports
``experiments`` (issue 68): the experiments build on training, never the other way.
"""

import subprocess
import sys

from .cli import MOVED, main

if sys.argv[1:2] and sys.argv[1] in MOVED:
    sys.exit(subprocess.call([sys.executable, "-m", "experiments", *sys.argv[1:]]))
sys.exit(main())
