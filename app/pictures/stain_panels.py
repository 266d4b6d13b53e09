"""The stain stability view's small multiples: each perturbed patch with its first attentive layer's alpha_s over it,
one row per stain (as scanned, normalised), drawn as the page draws its maps (:mod:`app.pictures.map_style`,
:func:`app.pictures.plots.map_panels`) on one colour range for every panel. Arrays in, ``go.Figure`` out."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..analysis.compute import LayerMaps
from ..analysis.stain_stability import STAIN_LABELS, StainStability
from .map_style import as_displayed, colour_range
from .plots import PanelMarks, map_panels

__all__ = ["stability_maps", "stability_figure"]


def stability_maps(stability: StainStability, range_mode: str) -> tuple[np.ndarray, tuple[float, float], str]:
    """``(M * N, S, S)`` every method's maps (mean over orientations) as the range shows them, the colour range
    shared by all, and the range used: deviations from the mean over orientations have no orientation to deviate
    from in a mean, so they fall back to the robust range (as the composite's picture does). The equalising table
    is the unperturbed patch's map as scanned, so a colour means one value in every panel."""
    mode = "robust" if range_mode == "deviation" else range_mode
    means = np.concatenate([stability.maps[m].mean(axis=1, keepdims=True) for m in stability.methods])  # (M N, 1, S, S)
    reference = means[:1]
    zeros = np.zeros(1)
    # The table of as_displayed is the layer's first map: here the patch itself, as scanned.
    layer = LayerMaps(stability.layer or "", "attention", "stain", "", reference, reference, zeros, zeros)
    shown = as_displayed(means, layer, mode, stability.border)[:, 0]  # (M N, S, S)
    return shown, colour_range(shown, mode, stability.border, attention=True), mode


def stability_figure(stability: StainStability, *, range_mode: str, colorscale: str, opacity: float,
                     marks: PanelMarks | None = None, width_px: int = 1150) -> go.Figure:
    """Rows of panels, one row per method, one panel per perturbation: the patch the model saw with its alpha_s
    over it, titled with the perturbation, its P(tumour) and its map's correlation with the unperturbed one.

    Always over the image, whatever the page's *Maps* choice: each panel's patch is another (image | map would
    show only the row's first)."""
    maps, (low, high), mode = stability_maps(stability, range_mode)
    images = np.concatenate([stability.images[m] for m in stability.methods])  # (M N, 3, S, S)
    titles = []
    for method in stability.methods:
        for p, probability, r in zip(stability.perturbations, stability.probability[method],
                                     stability.correlation[method], strict=True):
            titles.append(f"{p.name}<br>P {probability:.3f} · r {'–' if np.isnan(r) else f'{r:.3f}'}")
    count = len(stability.perturbations)
    title = "α_s: quantile" if mode == "equalised" else "α_s"  # as the page's colour bars name it
    fig = map_panels(images, maps, titles, colorscale=colorscale, opacity=opacity, zmin=low, zmax=high,
                     colour_title=title, marks=marks, columns=count, border=stability.border,
                     width_px=width_px)
    _tighten(fig, len(stability.methods), count)
    # Each row says which stain it is, on its first panel's axis.
    for row, method in enumerate(stability.methods):
        panel = row * count
        name = "yaxis" if panel == 0 else f"yaxis{panel + 1}"
        fig.layout[name].update(visible=True, showticklabels=False, ticks="", showline=False, showgrid=False,
                                zeroline=False,
                                title=dict(text=STAIN_LABELS[method].replace(" (", "<br>("), font=dict(size=11)))
    return fig


PANEL_PX = 112  # the panels' side on a wide page: a 96-pixel patch at about its own size
TITLE_PX = 34  # two lines of 11-point title above each row


def _tighten(fig: go.Figure, rows: int, columns: int) -> None:
    """Rows of ``PANEL_PX`` with ``TITLE_PX`` for their two-line titles between them: map_panels' grid leaves a
    gap of a few percent of the height between rows, too little for two lines, and square panels in a row taller
    than they are wide float in its middle. Narrower pages shrink the panels (square, as before)."""
    plot = rows * PANEL_PX + (rows - 1) * TITLE_PX
    fig.layout.height = plot + TITLE_PX + 8
    fig.layout.margin = dict(l=0, r=0, t=TITLE_PX, b=8)
    tops = [1 - row * (PANEL_PX + TITLE_PX) / plot for row in range(rows)]
    for panel in range(rows * columns):
        top = tops[panel // columns]
        name = "yaxis" if panel == 0 else f"yaxis{panel + 1}"
        fig.layout[name].domain = [max(top - PANEL_PX / plot, 0.0), top]
    titles = [a for a in fig.layout.annotations if a.yref == "paper"]  # the panels' titles, atop their rows
    old_tops = sorted({a.y for a in titles}, reverse=True)  # one per row, top row first
    for annotation in titles:
        annotation.y = tops[old_tops.index(annotation.y)]
