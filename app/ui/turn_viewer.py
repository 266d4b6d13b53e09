"""The turn viewer on the page: a Streamlit component (v2: inline HTML, CSS and JS, no iframe, no build step)
that shows every orientation's map and turns or mirrors them in the browser, with no rerun and no request.

The payload is :func:`app.pictures.turn_frames.viewer_payload`; the drawing is ``turn_viewer.js`` beside this
file. Streamlit sends an element whose bytes the browser already holds as a reference to them, so a rerun that
changes something else (a tab, a caption) does not send the maps again.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

__all__ = ["turn_viewer"]

_HERE = Path(__file__).resolve().parent


# Registered when this module is imported (Streamlit registers it again on a runtime that lacks it, as
# AppTest's); the JS and CSS are the files beside this module.
_VIEWER = st.components.v2.component(
    "aagc_turn_viewer",
    html='<div class="turn-viewer-host"></div>',
    css=(_HERE / "turn_viewer.css").read_text(),
    js=(_HERE / "turn_viewer.js").read_text(),
)


def turn_viewer(payload: dict, key: str = "turn_viewer") -> None:
    """Mount the viewer with ``payload`` (it returns no value: turning is the browser's alone)."""
    _VIEWER(key=key, data=payload, height="content")
