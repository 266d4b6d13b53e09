"""Interactive plotly figures for the UI: maps over images, the proof, predictions, calibration.

Pure builders (arrays in, ``go.Figure`` out, no Streamlit). Every map figure
has ONE colour axis shared by all its panels, with a fixed range, so a colour
means the same value in every orientation; differences get their own
symmetric diverging axis. Images are drawn as ``go.Image`` (rows down, as the
arrays), maps as ``go.Heatmap`` on top, upsampled to the image beforehand.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .images import to_channels

__all__ = ["COLOUR_MAPS", "image_rgb", "map_panels", "proof_figure", "probability_figure", "reliability_figure",
           "PanelMarks"]

COLOUR_MAPS = ("Viridis", "Inferno", "Magma", "Cividis", "Hot", "Jet", "Greys")
WIDTH_PX = 1150  # about the main column of the wide layout; heights are chosen to keep panels square


def image_rgb(image: np.ndarray) -> np.ndarray:
    """``(C, X, Y)`` in [0, 1] -> uint8 ``(X, Y, 3)`` for ``go.Image``."""
    rgb = to_channels(np.clip(image, 0, 1), 3).transpose(1, 2, 0)  # (X, Y, 3)
    return np.round(rgb * 255).astype(np.uint8)


class PanelMarks:
    """Pathology marks drawn on every panel: the centre square and a scale bar.

    Args:
        centre: ``(top, left, side)`` of the outlined region, or None.
        bar_px: scale bar length in pixels, or None.
        bar_label: e.g. ``"20 µm"``.
    """

    def __init__(self, centre: tuple[int, int, int] | None = None, bar_px: float | None = None, bar_label: str = ""):
        self.centre, self.bar_px, self.bar_label = centre, bar_px, bar_label

    def draw(self, fig: go.Figure, size: int, row: int, col: int) -> None:
        if self.centre is not None:
            top, left, side = self.centre
            fig.add_shape(type="rect", x0=left - 0.5, x1=left + side - 0.5, y0=top - 0.5, y1=top + side - 0.5,
                          line=dict(color="#00e5ff", width=1.5, dash="dash"), row=row, col=col)
        if self.bar_px:
            y = size - 0.06 * size
            x1 = size - 0.05 * size
            fig.add_shape(type="line", x0=x1 - self.bar_px, x1=x1, y0=y, y1=y, line=dict(color="white", width=4),
                          row=row, col=col)
            fig.add_annotation(x=x1 - self.bar_px / 2, y=y - 0.03 * size, text=self.bar_label, showarrow=False,
                               font=dict(color="white", size=10), yanchor="bottom", row=row, col=col)


def _grid(rows: int, cols: int, titles: list[str]) -> go.Figure:
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.012,
                        vertical_spacing=0.06 if rows > 1 else 0.0)
    fig.update_xaxes(visible=False, constrain="domain")
    fig.update_yaxes(visible=False, autorange="reversed")
    for i in range(rows * cols):  # square pixels in every panel
        suffix = "" if i == 0 else str(i + 1)
        fig.layout[f"yaxis{suffix}"].scaleanchor = f"x{suffix}"
    fig.update_annotations(font_size=11)
    return fig


def map_panels(
    images: np.ndarray, maps: np.ndarray, titles: list[str], *, colorscale: str = "Viridis", opacity: float = 0.6,
    zmin: float = 0.0, zmax: float = 1.0, colour_title: str = "", marks: PanelMarks | None = None,
    columns: int = 4,
) -> go.Figure:
    """Panels side by side (rows of ``columns``), each a map over its image, on one shared colour scale.

    Args:
        images: ``(P, C, S, S)`` in [0, 1] (or ``(C, S, S)``: the same image under every panel).
        maps: ``(P, S, S)``, already upsampled to the image.
        titles: one per panel.
        colorscale, opacity: of the maps.
        zmin, zmax: the shared colour range.
        colour_title: the colour bar's title.
        marks: pathology marks for every panel.
        columns: panels per row (8 p4m orientations make two rows of 4).
    """
    count, size = len(maps), maps.shape[-1]
    if images.ndim == 3:
        images = np.broadcast_to(images, (count, *images.shape))
    cols = min(count, columns)
    rows = -(-count // cols)
    fig = _grid(rows, cols, titles)
    for p in range(count):
        row, col = p // cols + 1, p % cols + 1
        fig.add_trace(go.Image(z=image_rgb(images[p]), hoverinfo="skip"), row=row, col=col)
        fig.add_trace(go.Heatmap(z=maps[p].astype(np.float32), coloraxis="coloraxis", opacity=opacity, name=titles[p],
                                 hovertemplate="row %{y}, col %{x}: %{z:.3f}<extra></extra>"), row=row, col=col)
        if marks is not None:
            marks.draw(fig, size, row, col)
    side = min(WIDTH_PX // max(cols, 3), 320)
    fig.update_layout(coloraxis=dict(colorscale=colorscale, cmin=zmin, cmax=zmax,
                                     colorbar=dict(title=dict(text=colour_title, side="right"), thickness=12)),
                      height=rows * (side + 25) + 10, margin=dict(l=0, r=0, t=30, b=0))
    return fig


def proof_figure(
    image: np.ndarray, maps: np.ndarray, expected: np.ndarray, titles: list[str], *, colorscale: str = "Viridis",
    zmin: float = 0.0, zmax: float = 1.0, opacity: float = 0.6,
) -> go.Figure:
    """Three rows per orientation: maps(g.x), g.maps(x) (both over g.x, one colour scale) and their difference.

    Args:
        image: ``(C, S, S)`` the transformed image g.x.
        maps, expected: ``(H, S, S)`` upsampled.
        titles: one per orientation.
    """
    count = len(maps)
    difference = maps - expected
    bound = float(np.abs(difference).max()) or 1e-12
    fig = _grid(3, count, list(titles) + [""] * (2 * count))
    rgb = image_rgb(image)
    for h in range(count):
        for row, values in ((1, maps[h]), (2, expected[h])):
            fig.add_trace(go.Image(z=rgb, hoverinfo="skip"), row=row, col=h + 1)
            fig.add_trace(go.Heatmap(z=values.astype(np.float32), coloraxis="coloraxis", opacity=opacity,
                                     hovertemplate="%{z:.4f}<extra></extra>"), row=row, col=h + 1)
        fig.add_trace(go.Heatmap(z=difference[h].astype(np.float32), coloraxis="coloraxis2",
                                 hovertemplate="%{z:.2e}<extra></extra>"), row=3, col=h + 1)
    for row, label in ((1, "maps(g.x)"), (2, "g.maps(x)"), (3, "difference")):
        fig.update_yaxes(visible=True, showticklabels=False, showgrid=False, zeroline=False, title_text=label,
                         row=row, col=1)
    side = min(WIDTH_PX // max(count, 3), 320)
    fig.update_layout(
        coloraxis=dict(colorscale=colorscale, cmin=zmin, cmax=zmax, colorbar=dict(len=0.62, y=0.69, thickness=12)),
        coloraxis2=dict(colorscale="RdBu", cmin=-bound, cmax=bound,
                        colorbar=dict(len=0.3, y=0.14, thickness=12, exponentformat="e")),
        height=3 * (side + 15) + 40, margin=dict(l=0, r=0, t=30, b=0),
    )
    return fig


def probability_figure(probabilities: np.ndarray, class_names: list[str], element_names: list[str]) -> go.Figure:
    """Grouped bars: one group per class, one bar per transform of the image."""
    fig = go.Figure()
    for t, name in enumerate(element_names):
        fig.add_trace(go.Bar(x=list(class_names), y=probabilities[t], name=name,
                             hovertemplate="%{x}: %{y:.4f}<extra>" + name + "</extra>"))
    fig.update_layout(barmode="group", yaxis=dict(range=[0, 1], title="probability"), height=300,
                      margin=dict(l=0, r=0, t=10, b=0), legend=dict(orientation="h", y=-0.2))
    return fig


def reliability_figure(curve: dict, confidence: float | None = None) -> go.Figure:
    """The test set's reliability diagram: accuracy per confidence bin against the diagonal.

    Args:
        curve: ``{"bin_edges", "confidence", "accuracy", "count"}`` as in a card's ``metrics.test_reliability``.
        confidence: the current prediction's confidence, drawn as a vertical line.
    """
    edges = np.asarray(curve["bin_edges"], dtype=float)
    centres, widths = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
    accuracy = [np.nan if a is None else a for a in curve["accuracy"]]
    counts = [c or 0 for c in curve["count"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=centres, y=accuracy, width=widths * 0.95, name="accuracy", customdata=counts,
                         hovertemplate="confidence %{x:.2f}: accuracy %{y:.2f} (%{customdata} patches)<extra></extra>"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                             line=dict(dash="dash", color="grey")))
    if confidence is not None:
        fig.add_vline(x=confidence, line=dict(color="crimson", width=2), annotation_text="this patch")
    low = float(edges[0])
    fig.update_layout(xaxis=dict(range=[low, 1], title="confidence (largest probability)"),
                      yaxis=dict(range=[0, 1], title="accuracy"), height=300, margin=dict(l=0, r=0, t=10, b=0),
                      legend=dict(orientation="h", y=-0.3))
    return fig
