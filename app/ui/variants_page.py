"""The Variants page: one image through every attention variant of Table 1 at once, one row each.

Each row shows the layer's attention per orientation over the image, in the reading chosen above the rows (as
on the patch page: what it keeps, what it removes, or alpha_s as the paper's figures draw it; a variant without
spatial attention shows what it removes where alpha_s is asked for, and says so), on the row's own colour range
(so a nearly flat variant is not painted one colour by a livelier neighbour), beside the prediction, the
architecture's Table 1 test error over seeds, this checkpoint's own, the parameter count and the deviation
from equivariance measured on this very image. The sidebar's transform moves the image for every row alike.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import streamlit as st

from ..analysis.checkpoints import CheckpointEntry, CheckpointError
from ..analysis.compute import Analysis, LayerMaps
from ..analysis.readings import BRIGHT, LABELS
from ..analysis.readings import COLOUR_TITLES as READING_TITLES
from ..analysis.variants import (
    FIRST_ORIENTED,
    Variant,
    baselines_of,
    common_layers,
    own_error_text,
    table1_text,
    variant_layer,
)
from ..analysis.variants import variants_of as find_variants
from ..pictures.figures import MapRow, render_map_grid_png
from ..pictures.map_style import display_maps
from ..pictures.plots import map_panels
from .caches import padding_of
from .inputs import LoadedModel, load_entry
from .readings import analysed_in_reading, layer_reading_ui
from .views import FLAT_SPAN, Display, colour_title, orientation_titles, value_range

__all__ = ["variants_page", "ROW_WIDTH_PX"]

ROW_WIDTH_PX = 640  # four orientation panels beside the row's facts, at 1440 px with the sidebar open


def variants_page(loaded: LoadedModel, entries: list[CheckpointEntry], image: np.ndarray, element: int,
                  display: Display) -> None:
    """Every variant of ``loaded``'s dataset on ``image`` (moved by ``element``), one row each."""
    variants = find_variants(loaded.card, entries)
    if len(variants) < 2:
        st.info("The Variants view needs at least two attentive checkpoints trained on the same data; "
                f"{len(variants)} found for {loaded.name}.")
        return
    picker, reading_picker, _ = st.columns([1, 1, 1])
    reading = layer_reading_ui(reading_picker, "variants_reading")
    rows: list[tuple[Variant, LoadedModel, Analysis]] = []
    with st.spinner(f"Analysing the image with {len(variants)} attention variants ..."):
        for variant in variants:
            try:
                model = loaded if variant.entry.name == loaded.name else load_entry(variant.entry)
            except (CheckpointError, OSError) as err:
                st.error(f"Cannot load {variant.entry.name}: {err}")
                continue
            rows.append((variant, model, analysed_in_reading(model, image, element, reading)))
    layers = common_layers([analysis for _, _, analysis in rows])
    choice = picker.selectbox("Layer", [FIRST_ORIENTED] + layers, key="variants_layer",
                              help="The same layer of every variant, or each variant's first layer with an "
                                   "orientation axis (alpha_F and rotation attention act on the image itself "
                                   "first).")
    st.caption(f"Each row: one checkpoint's attention, {LABELS[reading]}. **{BRIGHT[reading]}** The mean over its "
               "channels, per orientation of its filters, over the image, on the row's own "
               f"colour range (a row that varies by less than {FLAT_SPAN} is drawn on a range that wide). Table 1: the "
               "architecture's test error on the 50,000 test digits, mean ± sd over seeds of the paper's recipe "
               "(`python -m training report results/rot_mnist --seeds`); this checkpoint's own error beside it. "
               "Deviation: how far the row's maps and probabilities move from exact equivariance over every "
               "group element, measured on this image.")
    summary, pictures = [], []
    for variant, model, analysis in rows:
        layer = variant_layer(analysis, choice)
        facts, picture = _row(variant, model, analysis, layer, display, reading)
        summary.append(facts)
        pictures.append(picture)
    st.markdown("**All variants**")
    st.dataframe(pd.DataFrame(summary), hide_index=True, key="variants_table",
                 column_config={"maps deviation": st.column_config.NumberColumn(format="%.1e"),
                                "probability deviation": st.column_config.NumberColumn(format="%.1e")})
    st.download_button("All rows (PNG)", functools.partial(render_map_grid_png, pictures, rows[0][2].images[0],
                                                           cmap=display.matplotlib_colormap,
                                                           opacity=display.opacity, dpi=110),
                       file_name=f"variants_{choice.replace(' ', '_')}.png", mime="image/png", key="export_variants",
                       help="Every row's maps over the image, each on its own colour range, in one picture.")
    baselines = baselines_of(loaded.card, entries)
    if baselines:
        st.caption("Without attention, for comparison (Table 1 pairs each attentive model with the P4CNN of its "
                   "size): " + "; ".join(f"{entry.name}, {entry.card['parameters']:,} parameters, "
                                         f"{table1_text(entry.card)}" for entry in baselines) + ".")


def _row(variant: Variant, model: LoadedModel, analysis: Analysis, layer: LayerMaps,
         display: Display, reading: str) -> tuple[dict, MapRow]:
    """One variant's row: its facts on the left, its maps on the right. Returns the row for the summary table and
    its maps for the PNG."""
    shown_reading = layer.selection.reading  # alpha- where alpha_s was asked for and the layer has none
    size = analysis.images.shape[-1]
    border = padding_of(model.model_id, model).get(f"attention/{layer.name}", 0)
    zrange = value_range(layer, display, size, border)
    span = zrange[1] - zrange[0]
    flat = display.range_mode in ("robust", "full") and span < FLAT_SPAN
    if flat:
        # Stretched over the colour bar, round-off would look like attention: a flat row is drawn flat.
        zrange = ((zrange[0] + zrange[1] - FLAT_SPAN) / 2, (zrange[0] + zrange[1] + FLAT_SPAN) / 2)
    probabilities = analysis.probabilities[0]
    top = int(probabilities.argmax())
    deviation = float(layer.relative_error.max())
    card = model.card
    left, right = st.columns([1.25, 4])
    with left:
        st.markdown(f"**{variant.entry.name}**  \n{variant.description}")
        st.markdown(f"Predicts **{analysis.class_names[top]}** (p = {probabilities[top]:.3f})  \n"
                    f"{table1_text(card) or 'no Table 1 row on its card'}; {own_error_text(card)}  \n"
                    f"{card.get('parameters', 0):,} parameters · layer {layer.name}  \n"
                    f"deviation {deviation:.1e} (maps), {analysis.probability_error:.1e} (probabilities)")
        if shown_reading != reading:
            st.caption(f"No α_s in this layer (its attention has no spatial map): {LABELS[shown_reading]} shown.")
        if flat:
            st.caption(f"Nearly flat: these maps vary by {span:.1e}, so they are drawn on a range {FLAT_SPAN} wide "
                       "around their middle (one colour), not stretched over the colour bar.")
    shown = display_maps(layer, size, display.range_mode, border, transform=0)  # (H, S, S)
    with right:
        fig = map_panels(analysis.images[0], shown, orientation_titles(analysis, layer),
                         colorscale=display.shown_colorscale, opacity=display.opacity, zmin=zrange[0],
                         zmax=zrange[1], colour_title=colour_title(READING_TITLES[shown_reading], display),
                         style=display.style, signed=display.signed, border=border, width_px=ROW_WIDTH_PX)
        st.plotly_chart(fig, key=f"variant-{variant.entry.name}", config={"displaylogo": False})
    table1 = card.get("table1") or {}
    picture = MapRow(shown, zrange[0], zrange[1], tuple(orientation_titles(analysis, layer)),
                     f"{variant.entry.name}\n{variant.kind} · {layer.name} · {READING_TITLES[shown_reading]}")
    facts = {"checkpoint": variant.entry.name, "attention": variant.kind, "layer": layer.name,
             "shown": READING_TITLES[shown_reading],
             "prediction": analysis.class_names[top], "p": round(float(probabilities[top]), 4),
             "Table 1 error %": (round(100 * table1["test_error"]["mean"], 3) if table1 else None),
             "sd %": (round(100 * table1["test_error"]["sd"], 3) if table1.get("test_error", {}).get("sd") else None),
             "parameters": card.get("parameters"), "maps deviation": deviation,
             "probability deviation": analysis.probability_error}
    return facts, picture
