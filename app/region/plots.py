"""Plotly figures of a region: the tumour heatmap or the stitched attention over the tissue, clickable per cell.

Coordinates are pixels of the region at the model's scale (rows down). The background is the region as a PNG
(downsampled to at most ``max_px`` a side, so the page stays light); the probability is a heatmap of one value
per cell, placed so that cell (i, j) covers exactly its 32 x 32 pixels; cells that were not evaluated (glass)
stay uncoloured. A transparent marker on every evaluated cell makes it clickable
(``st.plotly_chart(on_select="rerun")``): :func:`clicked_cell` turns the event back into a cell.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from ..pictures.map_style import overlay
from ..pictures.plots import image_rgb
from .evaluation import RegionResult
from .figures import ATTENTION_CMAP, PROBABILITY_CMAP, attention_range

__all__ = ["region_figure", "clicked_cell"]

OPACITY = 0.9
TRUTH_COLOURS = {1: "#00e5ff", 0: "#ffffff"}  # cyan: tumour, white: normal; both read on the maps and H&E
SELECTED_COLOUR = "#ffd400"


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


def _cell_values(result: RegionResult, factor: int, shape: tuple[int, int]) -> np.ndarray:
    """``(h, w)``: the positive-class probability of the cell under each displayed pixel's centre (NaN: none)."""
    grid = result.grid
    top, left = grid.cell_origin(0, 0)
    i = np.floor(((np.arange(shape[0]) + 0.5) * factor - top) / grid.cell).astype(int)
    j = np.floor(((np.arange(shape[1]) + 0.5) * factor - left) / grid.cell).astype(int)
    rows, cols = (i >= 0) & (i < grid.rows), (j >= 0) & (j < grid.cols)
    values = np.full(shape, np.nan)
    values[np.ix_(rows, cols)] = result.positive[np.ix_(i[rows], j[cols])]
    return values


def _cell_centres(result: RegionResult, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel ``(x, y)`` of the centres of ``cells`` ``(N, 2)`` (row, col)."""
    grid = result.grid
    top, left = grid.cell_origin(0, 0)
    return left + (cells[:, 1] + 0.5) * grid.cell, top + (cells[:, 0] + 0.5) * grid.cell


def region_figure(result: RegionResult, show: str = "probability", labels: np.ndarray | None = None,
                  selected: tuple[int, int] | None = None, max_px: int = 900, width_px: int = 640) -> go.Figure:
    """The region with its heatmap (``show="probability"``) or stitched attention (``"attention"``).

    Args:
        result: an evaluated region.
        labels: ``(rows, cols)`` true labels (1, 0; -1 none): outlined, cyan for tumour, white for normal.
        selected: a cell to outline in yellow (its 96 x 96 context).
        max_px: longest side of the background image sent to the browser.
        width_px: the figure's width on the page (sets marker sizes and the height).
    """
    rgb, factor = _downsampled(result, max_px)
    height, width = result.image.shape[1:]
    grid = result.grid
    if show == "attention" and result.attention is not None:
        values, cmap = _block_means(result.attention, factor, rgb.shape[:2]), ATTENTION_CMAP
        low, high = attention_range(result.attention)
        title = f"attention ({result.attention_layer})"
    else:
        values, (low, high), cmap = _cell_values(result, factor, rgb.shape[:2]), (0.0, 1.0), PROBABILITY_CMAP
        title = f"P({result.class_names[-1]})"
    # Opacity grows with the value: tissue shows through where the value is low, high values glow.
    background = overlay(rgb, np.where(np.isfinite(values), values, low), low, high, cmap, OPACITY)
    figure = go.Figure()
    figure.add_trace(go.Image(source=_png_uri(background), x0=0, y0=0, dx=factor, dy=factor, hoverinfo="skip"))
    # An invisible two-value heatmap carries the colour bar of the values drawn into the image.
    figure.add_trace(go.Heatmap(z=[[low, high]], x=[0, 1], y=[0], zmin=low, zmax=high, colorscale=cmap.capitalize(),
                                opacity=0, hoverinfo="skip", colorbar=dict(title=dict(text=title, side="right"),
                                                                           thickness=12, len=0.8)))
    scale = width_px / width  # screen pixels per region pixel
    cells = np.argwhere(result.evaluated)
    x, y = _cell_centres(result, cells)
    p = result.positive[result.evaluated]
    figure.add_trace(go.Scatter(
        x=x, y=y, mode="markers", name="cells", showlegend=False,
        marker=dict(size=max(4.0, grid.cell * scale), symbol="square", color="rgba(0,0,0,0)"),
        customdata=np.column_stack([cells, p]),
        hovertemplate="cell (%{customdata[0]}, %{customdata[1]})<br>P = %{customdata[2]:.3f}<extra></extra>"))
    if labels is not None:
        for value, name in ((1, "true tumour"), (0, "true normal")):
            where = np.argwhere(labels == value)
            if len(where):
                tx, ty = _cell_centres(result, where)
                figure.add_trace(go.Scatter(
                    x=tx, y=ty, mode="markers", name=name, hoverinfo="skip",
                    marker=dict(size=max(4.0, grid.cell * scale), symbol="square-open",
                                line=dict(width=1.5, color=TRUTH_COLOURS[value]), color=TRUTH_COLOURS[value])))
    if selected is not None:
        sx, sy = _cell_centres(result, np.array([selected]))
        figure.add_trace(go.Scatter(x=sx, y=sy, mode="markers", name="opened cell", hoverinfo="skip",
                                    marker=dict(size=max(6.0, 3 * grid.cell * scale), symbol="square-open",
                                                line=dict(width=2.5, color=SELECTED_COLOUR), color=SELECTED_COLOUR)))
    figure.update_xaxes(range=[0, width], visible=False, constrain="domain")
    figure.update_yaxes(range=[height, 0], visible=False, scaleanchor="x", constrain="domain")
    # A dark legend, so that the white outline of "true normal" shows in it.
    legend = dict(orientation="h", y=-0.02, x=0, bgcolor="#555555", font=dict(color="white"))
    figure.update_layout(width=width_px, height=int(width_px * height / width) + 40, margin=dict(l=0, r=0, t=10, b=30),
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
