"""The turn viewer on the page: a Streamlit component (v2: inline HTML, CSS and JS, no iframe, no build step)
that shows every orientation's map and turns or mirrors them in the browser, with no rerun and no request.

The payload is :func:`app.pictures.turn_frames.viewer_payload`; the drawing is ``turn_viewer.js`` beside this
file. Streamlit sends an element whose bytes the browser already holds as a reference to them, so a rerun that
changes something else (a tab, a caption) does not send the maps again. Its "Watch it turn" button is the one
control that asks the server for something: the image turned through 360 degrees, which the next run sends in
chunks of a batch of angles each (:func:`app.pictures.turn_frames.animation_payload`), as they are computed; the
browser starts playing once the first has arrived.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import streamlit as st

__all__ = ["turn_viewer", "picture_key"]

_HERE = Path(__file__).resolve().parent
PENDING = "pending"

# Registered when this module is imported (Streamlit registers it again on a runtime that lacks it, as
# AppTest's); the JS and CSS are the files beside this module.
_VIEWER = st.components.v2.component(
    "aagc_turn_viewer",
    html='<div class="turn-viewer-host"></div>',
    css=(_HERE / "turn_viewer.css").read_text(),
    js=(_HERE / "turn_viewer.js").read_text(),
)


def picture_key(payload: dict) -> str:
    """What a payload shows (image, maps, colours, marks), as a short digest: an animation asked for one picture
    is not played on another."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _ask_to_turn(state_key: str) -> None:
    st.session_state[state_key] = PENDING


def turn_viewer(payload: dict, key: str = "turn_viewer",
                animation: Callable[[str], tuple[int, Iterator[dict]]] | None = None) -> None:
    """Mount the viewer with ``payload``. With ``animation`` (the picture's key in; the number of frames and their
    chunks out, :func:`app.pictures.turn_frames.animation_payload`) it offers "Watch it turn", and once the user
    has asked for it on this picture, sends the chunks after the viewer, each as soon as it is computed: the viewer
    plays the first frames while the rest are computed (0.5 s to the first frame where the whole took 3.2 s)."""
    state_key = f"{key}-turning"
    chunks = None
    if animation is not None:
        asked = st.session_state.get(state_key)
        # Hashing the payload (hundreds of KB) only once the button was pressed: not on every rerun of the page.
        picture = picture_key(payload) if asked is not None else None
        if asked == PENDING:  # the button was pressed on the picture drawn last run
            st.session_state[state_key] = asked = picture
        payload = dict(payload, canTurn=True)
        if picture is not None and asked == picture:
            frames, chunks = animation(picture)
            payload["animation"] = dict(key=picture, frames=frames)
    _VIEWER(key=key, data=payload, height="content", on_turn_change=functools.partial(_ask_to_turn, state_key))
    if chunks is not None:
        # Each chunk its own element of the same component (it draws nothing, and hands the frames to the viewer),
        # in one row without gaps; a rerun with the same chunks sends them as references, not again.
        with st.container(horizontal=True, gap=None):
            for chunk in chunks:
                _VIEWER(key=f"{key}-frames-{chunk['start']}", data=dict(chunk, viewer=key, feed=True),
                        height="content")
