"""The attention-map explorer: ``streamlit run app/main.py``, the page every visitor's session runs.

The page itself is :func:`app.ui.page.main`, inside one error boundary (:mod:`app.ui.boundary`): a fault shows a
short message, never a traceback. ``make run`` and the Docker image serve it through ``app/server.py``, which
prepares the first visitor's page before the server answers; this file alone serves the same page without that.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # `streamlit run app/main.py` puts app/ on sys.path, not the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.ui.boundary import run_page  # noqa: E402
from app.ui.page import main  # noqa: E402

run_page(main)
