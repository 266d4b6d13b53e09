"""The code that computed a slide's results, named by a hash, for a cohort's summary.

The same rule as the training cards' ``code_sha256`` (``training.provenance.code_sha256``, which the app may not
import): sha256 of the ``sha256sum`` listing (``DIGEST  PATH`` lines, paths relative to the project with ``/``,
sorted) of the source files that decide the numbers, read from the working tree, not from git, so that a copy of
the tree anywhere hashes the same. Here those files are the library and the app's numbers: ``models/``,
``app/analysis/``, ``app/region/`` and ``app/slides/``. From the project's root the shell gives the same::

    find models app/analysis app/region app/slides -type f \\( -name '*.py' -o -name '*.cpp' \\) \\
        ! -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum | sha256sum
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

__all__ = ["code_sha256", "CODE_DIRS"]

REPO = Path(__file__).resolve().parents[2]
CODE_DIRS = ("models", "app/analysis", "app/region", "app/slides")
# As training's: Python and the C++ of the CPU kernels (models/cpu), which compute forward passes too.
CODE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")


@functools.lru_cache(maxsize=4)
def code_sha256(root: Path = REPO) -> str:
    """Hex sha256 naming the code under :data:`CODE_DIRS` of ``root`` as its files are now (once per process)."""
    listing = []
    for top in CODE_DIRS:
        for folder, dirs, files in os.walk(Path(root) / top):
            dirs[:] = [name for name in dirs if name != "__pycache__" and not name.startswith(".")]
            for name in files:
                if name.endswith(CODE_SUFFIXES) and not name.startswith("."):
                    path = Path(folder) / name
                    listing.append((path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest()))
    text = "".join(f"{digest}  {path}\n" for path, digest in sorted(listing))
    return hashlib.sha256(text.encode()).hexdigest()
