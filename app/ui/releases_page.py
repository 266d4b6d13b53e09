"""Ours against the paper's: a release of the paper's code and one of our shipped checkpoints on the same image,
their predictions and maps side by side (what to compare is chosen by :mod:`app.analysis.releases`), the
attention in the reading picked here (as on the patch page; alpha_s by default)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from ..analysis.checkpoints import CheckpointEntry, CheckpointError, error_text
from ..analysis.releases import counterparts, verdict
from .comparison import comparable_layer
from .inputs import LoadedModel, load_entry
from .readings import analysed_in_reading, layer_reading_ui
from .views import Display, panel_marks, show_maps, value_range

__all__ = ["show_ours_against_paper"]


def _what_it_is(loaded: LoadedModel) -> str:
    card = loaded.card
    return f"{card['arch']}, {card['group'] or 'planar'}, {error_text(card)}"


def show_ours_against_paper(release: LoadedModel, entries: list[CheckpointEntry], image: np.ndarray, element: int,
                            display: Display) -> None:
    """The release on the page beside a shipped checkpoint of ours picked here, on the image as the page shows it.

    Args:
        release: the uploaded release of the paper's code.
        entries: our shipped checkpoints (:func:`app.analysis.checkpoints.list_checkpoints`).
        image: ``(C, S, S)`` in [0, 1], the image as fitted; ``element`` the group element it is moved by.
        display: how maps are drawn.
    """
    found = counterparts(release.card, entries)
    if not found:
        spec = release.card["input"]
        st.info(f"None of our shipped checkpoints is trained on this release's data and takes {spec['size']} x "
                f"{spec['size']} images with {spec['channels']} channel(s): nothing of ours to put beside it.")
        return
    by_name = {entry.name: entry for entry in found}
    ours_picker, reading_picker = st.columns([2, 1])
    name = ours_picker.selectbox("Ours", list(by_name), format_func=lambda n: by_name[n].label,
                                 key="paper_vs_ours", help="Our shipped checkpoints on the same data and images; the "
                                                           "same group and attention first.")
    reading = layer_reading_ui(reading_picker, "paper_vs_ours_reading")
    try:
        ours = load_entry(by_name[name])
    except (CheckpointError, OSError) as err:
        st.error(f"Cannot load {name}: {err}. Pick another of ours.")
        return
    with st.spinner(f"Analysing the image with {ours.name} ..."):
        theirs, mine = (analysed_in_reading(model, image, element, reading) for model in (release, ours))
    said = verdict(theirs, mine)
    st.markdown(said.text)
    size = image.shape[-1]
    for loaded, analysis, heading, key in ((release, theirs, "The paper's release", "paper_maps"),
                                           (ours, mine, "Ours", "ours_maps")):
        layer = comparable_layer(analysis)
        probabilities = analysis.probabilities[0]
        top = int(probabilities.argmax())
        st.markdown(f"**{heading}: {loaded.name}** ({_what_it_is(loaded)}): predicts **{analysis.class_names[top]}**"
                    f" (p = {probabilities[top]:.3f}); {layer.kind} of **{layer.name}** per orientation")
        if not analysis.attention:
            st.info(f"{loaded.name} ({loaded.card['arch']}) has no attention layer. {_lack(loaded.card)}Shown is "
                    f"what it has: the response strength of {layer.name}, its first convolution with an orientation "
                    "axis.")
        show_maps(analysis, layer, display, value_range(layer, display, size), panel_marks(loaded.card, size, None),
                  key=key)
    st.caption("Both models see the same image (as the sidebar moves it), each normalised as its own card says. "
               "Each row has its own colour range; the rows show the first attentive layer with orientations, "
               "or, without attention, the first convolution with orientations.")


def _lack(card: dict) -> str:
    """Why a model has no attention, in its card's words (a sentence and a space), where it gives them."""
    said = [note for note in card.get("notes", []) if "no attention" in note]
    return said[0] + " " if said else ""
