"""The error boundary every page runs inside: a user sees a short message, the server log the traceback.

Bad input has its own messages where it is read (images, checkpoints). What reaches the boundary is a fault of
the app itself, so the message names where it happened (the innermost function of the project in the traceback),
what went wrong in one line, and what to do; an incident id ties it to the log entry with the full traceback.
Streamlit's own control flow (``st.rerun``, ``st.stop``) derives from ``BaseException`` and passes through.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

import streamlit as st

__all__ = ["run_page", "failure_message", "where_it_failed"]

LOG = logging.getLogger("app")
PROJECT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "models")  # the project's own code, as against Streamlit's or torch's
ADVICE = ("Pick another image or model, or reload the page. If it happens again, report it with the incident id: "
          "the server log holds the details.")


def where_it_failed(err: BaseException) -> str:
    """The innermost frame of the project's own code in ``err``'s traceback, e.g.
    ``"show_true_label (app/ui/views.py)"``; the innermost frame of all where none is the project's."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if any(Path(f.filename).resolve().is_relative_to(PROJECT / package)
                                     for package in PACKAGES)]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "the page"
    path = Path(frame.filename).resolve()
    shown = path.relative_to(PROJECT).as_posix() if path.is_relative_to(PROJECT) else path.name
    return f"{frame.name} ({shown})"


def failure_message(err: BaseException, incident: str) -> str:
    """What the user reads: where it failed, the error in one line, what to do."""
    text = str(err).strip().splitlines()
    detail = f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__
    return f"Something went wrong in {where_it_failed(err)}: {detail}. {ADVICE} (incident {incident})"


def run_page(page: Callable[[], None]) -> None:
    """Run ``page``; an exception becomes :func:`failure_message` on the page and a traceback in the server log."""
    try:
        page()
    except Exception as err:
        incident = uuid.uuid4().hex[:8]
        LOG.error("incident %s: the page failed in %s", incident, where_it_failed(err), exc_info=err)
        st.error(failure_message(err, incident), icon="⚠️")
