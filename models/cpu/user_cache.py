"""Where this project keeps what it builds or decodes on a machine (compiled kernels, decoded datasets).

``$AAGC_CACHE``, else ``$XDG_CACHE_HOME/aagc``, else ``~/.cache/aagc``: outside any work tree, so nothing
derived from data or from this machine is ever committed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """The project's cache folder (not created here)."""
    root = os.environ.get("AAGC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "aagc"
    )
    return Path(root)
