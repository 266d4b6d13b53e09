"""The reading controls (the patch page's, and the per-layer one of the pages that compare models) and the
composite view (:mod:`app.analysis.readings` says what each is)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from ..analysis.compute import Analysis
from ..analysis.padding import border_left_out
from ..analysis.pathology import nuclei_masks
from ..analysis.readings import (
    BRIGHT,
    COLOUR_TITLES,
    COMPOSITE,
    DEFAULT_WHY,
    LABELS,
    LAYER_READINGS,
    PageReadings,
    composite_sum,
    layer_selections,
    page_readings,
)
from ..pictures.map_style import RANGE_MODES, colour_range, display_maps
from ..pictures.plots import PanelMarks, map_panels
from .caches import analysed
from .inputs import LoadedModel
from .views import NUCLEI_OUTLINE, Display, colour_title

__all__ = ["reading_ui", "layer_reading_ui", "analysed_in_reading", "show_composite"]


def reading_ui(readings: PageReadings, container) -> str | None:
    """A picker of the readings the model has (in ``container``), its default :attr:`PageReadings.default`;
    None for a model without attention. Why any reading is missing is said under it."""
    if not readings.options:
        return None
    # One widget per set of options: a channel-only model's choice does not carry over to a spatial one's.
    reading = container.selectbox("Attention shown", readings.options, format_func=LABELS.get,
                                  index=readings.options.index(readings.default),
                                  key=f"reading-{'-'.join(readings.options)}",
                                  help=" ".join(f"{LABELS[r]}: {BRIGHT[r]}" for r in readings.options)
                                  + " " + DEFAULT_WHY)
    if readings.missing:
        container.caption(readings.missing)
    return reading


def layer_reading_ui(container, key: str) -> str:
    """The per-layer reading for a page of several models (alpha_s first, as on the patch page); a model without
    alpha_s shows alpha- where it is picked (:func:`app.analysis.readings.layer_selections`), and says so."""
    return container.selectbox("Attention shown", LAYER_READINGS, index=LAYER_READINGS.index("spatial"),
                               format_func=LABELS.get, key=key,
                               help=" ".join(f"{LABELS[r]}: {BRIGHT[r]}" for r in LAYER_READINGS)
                               + " A model without α_s shows α⁻ there. " + DEFAULT_WHY)


def analysed_in_reading(loaded: LoadedModel, image: np.ndarray, element: int, reading: str) -> Analysis:
    """``loaded``'s analysis of ``image`` moved by ``element``, every attentive layer reduced in ``reading``
    (alpha- where a layer has no alpha_s), from the shared cache."""
    return analysed(loaded, image, element, layer_selections(page_readings(loaded.model), reading))[0]


def show_composite(analysis: Analysis, display: Display, marks: PanelMarks | None, border: int = 0,
                   width_px: int = 0) -> tuple[float, float]:
    """The paper's composite as its figures plot it: one panel per transform of the image, each the sum over
    orientations of the product over layers of alpha_s; returns the colour range."""
    size = analysis.images.shape[-1]
    summed = composite_sum(analysis.composite)  # (T, 1, S, S)
    # A sum over orientations has no orientations to deviate from: deviations fall back to the robust range.
    mode = "robust" if display.signed else display.range_mode
    maps = display_maps(summed, size, mode, border)[:, 0]  # (T, S, S)
    zrange = (0.0, 1.0) if mode == "equalised" else colour_range(maps, mode, border, attention=False)
    outlines = nuclei_masks(analysis.images) if display.outline_nuclei else None  # (T, S, S), each g.x's own
    fig = map_panels(analysis.images, maps, list(analysis.element_names), colorscale=display.colorscale,
                     opacity=display.opacity, zmin=zrange[0], zmax=zrange[1],
                     colour_title=colour_title(COLOUR_TITLES[COMPOSITE], display), marks=marks, style=display.style,
                     border=border, outlines=outlines, **({"width_px": width_px} if width_px else {}))
    st.plotly_chart(fig, key="maps", config={"displaylogo": False})
    low, high = (float(v) for v in np.percentile(summed.maps, [2, 98]))
    # The product is as coarse as its coarsest factor: say which, so its blocks are not read as tissue.
    coarsest = min(analysis.attention.values(), key=lambda layer: layer.maps.shape[-1])
    side = coarsest.maps.shape[-1]
    caption = (f"**{BRIGHT[COMPOSITE]}** {analysis.composite.description} Each panel is one transform of the "
               f"image (the paper's Fig. 5 shows them side by side): the picture turns with it; its largest "
               f"deviation from the moved picture is {summed.relative_error.max():.1e} of its maximum (the proof "
               f"tab shows every orientation). "
               + (f"Its coarsest factor, {coarsest.name}, is {side} x {side}: the product is as blocky as that "
                  "factor, stretched over the image. " if side < size // 4 else "")
               + f"Colours: {RANGE_MODES[mode]}; the values' 2nd-98th percentiles are {low:.3g} and {high:.3g}.")
    if border and not border_left_out(border, size):
        caption += (" The deepest layers' zero padding reaches every position, so every position sets the colour "
                    "range.")
    if outlines is not None:
        caption += NUCLEI_OUTLINE
    st.caption(caption)
    return zrange
