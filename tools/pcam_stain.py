"""``python -m tools.pcam_stain``: PCam's reference stain into the PCam cards (``experiments/pcam_stain.py``).

Tools import nothing of the code they read (``tools/__init__.py``), so this runs ``python -m experiments.pcam_stain``
with the same arguments as a process, from the repository's root.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    sys.exit(subprocess.run([sys.executable, "-m", "experiments.pcam_stain", *sys.argv[1:]], cwd=root).returncode)
