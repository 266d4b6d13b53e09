"""Plotly figures of a region: the tumour probability or the stitched attention over the tissue, clickable per cell.

Coordinates are pixels of the region at the model's scale (rows down). The background is the region as a PNG
(downsampled to at most ``max_px`` a side, so the page stays light) with the map blended into it: the probability
as a smooth surface on the tissue with its 0.5 contour (:mod:`app.region.overlays`), the attention pixel by pixel
on the evaluated cells over the 2nd to 98th percentile of its values on tissue. A transparent marker on every
evaluated cell makes it clickable (``st.plotly_chart(on_select="rerun")``): :func:`clicked_cell` turns the event
back into a cell.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from ..pictures.map_style import colour_lut
from ..pictures.plots import image_rgb
from .evaluation import RegionResult
from .figures import ATTENTION_CMAP, PROBABILITY_CMAP
from .overlays import (
    ATTENTION_OPACITY,
    PROBABILITY_OPACITY,
    attention_range,
    blend,
    display_tissue,
    probability_contour,
    probability_field,
    truth_outline,
)

__all__ = ["region_figure", "clicked_cell", "TRUTH_COLOUR", "CONTOUR_COLOUR"]

TRUTH_COLOUR = "#00e5ff"  # cyan: apart from the probability map's colours and from H&E's
CONTOUR_COLOUR = "#111111"
SELECTED_COLOUR = "#ffd400"
COLOURBAR_PX = 80  # the colour bar with its ticks and title, beside the plot


def _downsampled(result: RegionResult, max_px: int) -> tuple[np.ndarray, int]:
    """uint8 ``(h, w, 3)`` of the region, averaged over ``factor`` x ``factor`` blocks, and that factor."""
    height, width = result.image.shape[1:]
    factor = max(1, -(-max(height, width) // max_px))
    rgb = image_rgb(result.image).astype(np.float32)
    h, w = height // factor, width // factor
    blocks = rgb[:h * factor, :w * factor].reshape(h, factor, w, factor, 3).mean(axis=(1, 3))
    return np.round(blocks).astype(np.uint8), factor


def _png_uri(rgb: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG", optimize=False, compress_level=3)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _block_means(values: np.ndarray, factor: int, shape: tuple[int, int]) -> np.ndarray:
    """``(h, w)``: the mean of the finite values of each ``factor`` x ``factor`` block (NaN where none)."""
    h, w = shape
    blocks = values[:h * factor, :w * factor].reshape(h, factor, w, factor)
    finite = np.isfinite(blocks)
    counts = finite.sum(axis=(1, 3))
    sums = np.where(finite, blocks, 0).sum(axis=(1, 3), dtype=np.float64)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _cell_centres(result: RegionResult, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel ``(x, y)`` of the centres of ``cells`` ``(N, 2)`` (row, col)."""
    grid = result.grid
    top, left = grid.cell_origin(0, 0)
    return left + (cells[:, 1] + 0.5) * grid.cell, top + (cells[:, 0] + 0.5) * grid.cell


def _polyline(lines: list[np.ndarray]) -> tuple[list, list]:
    """``x`` and ``y`` of several lines as one trace, broken by None."""
    x, y = [], []
    for line in lines:
        x += [*line[:, 0], None]
        y += [*line[:, 1], None]
    return x, y


def _colourscale(cmap: str, steps: int = 11) -> list:
    """The matplotlib colour map as a plotly colourscale, so the colour bar shows exactly the blended colours."""
    lut = colour_lut(cmap)
    return [[t, "rgb({},{},{})".format(*np.round(lut[round(t * 255)] * 255).astype(int))]
            for t in np.linspace(0.0, 1.0, steps)]


def region_figure(result: RegionResult, show: str = "probability", labels: np.ndarray | None = None,
                  selected: tuple[int, int] | None = None, max_px: int = 900, width_px: int = 640) -> go.Figure:
    """The region with its probability surface (``show="probability"``) or stitched attention (``"attention"``).

    Args:
        result: an evaluated region.
        labels: ``(rows, cols)`` true labels (1, 0; -1 none): the contexts of the tumour-labelled cells (a
            mosaic's tumour patches) outlined, dashed.
        selected: a cell to outline in yellow (its 96 x 96 context).
        max_px: longest side of the background image sent to the browser.
        width_px: the figure's width on the page (sets marker sizes and the height).
    """
    rgb, factor = _downsampled(result, max_px)
    height, width = result.image.shape[1:]
    grid = result.grid
    tissue = display_tissue(rgb, factor)
    if show == "attention" and result.attention is not None:
        values, cmap = _block_means(result.attention, factor, rgb.shape[:2]), ATTENTION_CMAP
        low, high = attention_range(values, tissue)
        alpha = np.where(tissue, ATTENTION_OPACITY, 0.0)
        title = f"{result.reading} ({result.attention_layer})"
    else:
        values, (low, high), cmap = probability_field(result, rgb.shape[:2], factor), (0.0, 1.0), PROBABILITY_CMAP
        alpha = np.where(tissue, PROBABILITY_OPACITY, 0.0)
        title = f"P({result.class_names[-1]})"
    figure = go.Figure()
    figure.add_trace(go.Image(source=_png_uri(blend(rgb, values, alpha, low, high, cmap)), x0=0, y0=0, dx=factor,
                              dy=factor, hoverinfo="skip"))
    # An invisible two-value heatmap carries the colour bar of the values blended into the image.
    colourbar = dict(title=dict(text=title, side="right"), thickness=12, len=0.8)
    figure.add_trace(go.Heatmap(z=[[low, high]], x=[0, 1], y=[0], zmin=low, zmax=high, colorscale=_colourscale(cmap),
                                opacity=0, hoverinfo="skip", colorbar=colourbar))
    if show != "attention":
        x, y = _polyline(probability_contour(result))
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines", name="p = 0.5", hoverinfo="skip",
                                    line=dict(color=CONTOUR_COLOUR, width=1.5)))
    scale = width_px / width  # screen pixels per region pixel
    cells = np.argwhere(result.evaluated)
    x, y = _cell_centres(result, cells)
    p = result.positive[result.evaluated]
    figure.add_trace(go.Scatter(
        x=x, y=y, mode="markers", name="cells", showlegend=False,
        marker=dict(size=max(4.0, grid.cell * scale), symbol="square", color="rgba(0,0,0,0)"),
        customdata=np.column_stack([cells, p]),
        hovertemplate="cell (%{customdata[0]}, %{customdata[1]})<br>P = %{customdata[2]:.3f}<extra></extra>"))
    if labels is not None and (labels == 1).any():
        segments = truth_outline(grid, labels)
        x, y = _polyline(list(segments))
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines", name="labelled tumour", hoverinfo="skip",
                                    line=dict(color=TRUTH_COLOUR, width=1, dash="dash")))
    if selected is not None:
        sx, sy = _cell_centres(result, np.array([selected]))
        figure.add_trace(go.Scatter(x=sx, y=sy, mode="markers", name="opened cell", hoverinfo="skip",
                                    marker=dict(size=max(6.0, 3 * grid.cell * scale), symbol="square-open",
                                                line=dict(width=2.5, color=SELECTED_COLOUR), color=SELECTED_COLOUR)))
    figure.update_xaxes(range=[0, width], visible=False, constrain="domain")
    figure.update_yaxes(range=[height, 0], visible=False, scaleanchor="x", constrain="domain")
    # A dark legend, so that the cyan and yellow marks show in it.
    legend = dict(orientation="h", y=-0.02, x=0, bgcolor="#555555", font=dict(color="white"))
    # The colour bar takes its width from the plot: the height follows the image's width left, so no band is empty.
    plot_px = width_px - COLOURBAR_PX
    figure.update_layout(width=width_px, height=int(plot_px * height / width) + 40, margin=dict(l=0, r=0, t=10, b=30),
                         legend=legend, dragmode="pan", clickmode="event+select", plot_bgcolor="white")
    return figure


def _field(value, name: str):
    """``value[name]`` or ``value.name``: Streamlit's events read both ways, session state holds plain dicts."""
    if value is None:
        return None
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def clicked_cell(event, result: RegionResult) -> tuple[int, int] | None:
    """The evaluated cell under the first clicked point of a plotly selection event, or None."""
    for point in _field(_field(event, "selection"), "points") or []:
        x, y = point.get("x"), point.get("y")
        if x is None or y is None:
            continue
        cell = result.grid.cell_at(float(y), float(x))
        if cell is not None and result.evaluated[cell]:
            return cell
    return None
