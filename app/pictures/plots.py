"""Interactive plotly figures for the UI: maps over images, the proof, predictions, calibration.

Pure builders (arrays in, ``go.Figure`` out, no Streamlit). Every map figure
has ONE colour axis shared by all its panels, with a fixed range, so a colour
means the same value in every orientation; differences get their own
symmetric diverging axis. Images are drawn as ``go.Image`` (rows down, as the
arrays), maps as ``go.Heatmap`` on top, upsampled to the image beforehand.
Panel figures are written out as one dict of traces and one of layout and
built in one go (see :func:`_grid`), without plotly's validation (see :func:`_figure`).
"""

from __future__ import annotations

import functools

import numpy as np
import plotly.graph_objects as go

from ..analysis.images import to_channels
from ..analysis.padding import border_left_out
from .encode import png_data_url
from .map_style import DIVERGING, MPL_COLOUR_MAPS, overlay

__all__ = ["COLOUR_MAPS", "image_rgb", "map_panels", "proof_figure", "probability_figure",
           "reliability_figure", "nuclei_figure", "PanelMarks"]

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

    def draw(self, layout: dict, size: int, panel: int) -> None:
        """Add the marks of one panel (0-based, row-major) to a layout dict from :func:`_grid`."""
        refs = dict(xref=_axis("x", panel), yref=_axis("y", panel))
        if self.centre is not None:
            top, left, side = self.centre
            layout["shapes"].append(dict(type="rect", x0=left - 0.5, x1=left + side - 0.5, y0=top - 0.5,
                                         y1=top + side - 0.5, line=dict(color="#00e5ff", width=1.5, dash="dash"),
                                         **refs))
        if self.bar_px:
            y = size - 0.06 * size
            x1 = size - 0.05 * size
            layout["shapes"].append(dict(type="line", x0=x1 - self.bar_px, x1=x1, y0=y, y1=y,
                                         line=dict(color="white", width=4), **refs))
            layout["annotations"].append(dict(x=x1 - self.bar_px / 2, y=y - 0.03 * size, text=self.bar_label,
                                              showarrow=False, font=dict(color="white", size=10), yanchor="bottom",
                                              **refs))


def _figure(data: list[dict], layout: dict) -> go.Figure:
    """``go.Figure(data=data, layout=layout)`` without plotly's validation.

    Validation checks (and copies) every property of every trace again for each new image: half of building
    the page's figures for a new H&E patch (77 against 39 ms; serialising them takes as long either way). The
    builders write every value as validation would leave it (colour scales spelled out, :func:`_colour_scale`;
    empty lists of shapes or annotations dropped here); tests/test_app_plots.py checks that each builder's
    figure serialises as its validated twin.
    """
    layout = {key: value for key, value in layout.items() if not (isinstance(value, list) and not value)}
    return go.Figure(data=data, layout=layout, _validate=False)


@functools.cache
def _colour_scale(name: str) -> tuple:
    """The colour scale ``name`` as plotly's validation spells it out: (position, colour) pairs."""
    return go.layout.Coloraxis(colorscale=name).colorscale


def _axis(letter: str, panel: int) -> str:
    """The axis of a panel (0-based, row-major) as traces and shapes name it: ``"x"``, ``"x2"``, ..."""
    return letter if panel == 0 else f"{letter}{panel + 1}"


def _grid(rows: int, cols: int, titles: list[str]) -> dict:
    """The layout of ``rows`` x ``cols`` square image panels, as a dict, with ``shapes`` and ``annotations`` lists.

    What ``make_subplots`` lays out (same domains, titles above the panels), written
    out in one dict: building a figure from it in one go validates it once, where
    ``make_subplots`` and one ``add_trace`` per panel take several times as long.
    """
    h_space, v_space = 0.012, (0.06 if rows > 1 else 0.0)
    width, height = (1 - h_space * (cols - 1)) / cols, (1 - v_space * (rows - 1)) / rows
    layout: dict = {"shapes": [], "annotations": []}
    for panel in range(rows * cols):
        row, col = divmod(panel, cols)
        x0, y1 = col * (width + h_space), 1 - row * (height + v_space)
        x, y = _axis("x", panel), _axis("y", panel)
        layout[f"xaxis{x[1:]}"] = dict(anchor=y, domain=[x0, x0 + width], visible=False, constrain="domain")
        layout[f"yaxis{y[1:]}"] = dict(anchor=x, domain=[y1 - height, y1], visible=False, autorange="reversed",
                                       scaleanchor=x)  # square pixels in every panel
        if panel < len(titles) and titles[panel]:
            layout["annotations"].append(dict(text=titles[panel], x=x0 + width / 2, y=y1, xref="paper", yref="paper",
                                              xanchor="center", yanchor="bottom", showarrow=False,
                                              font=dict(size=11)))
    return layout


def _image(rgb: np.ndarray, panel: int) -> dict:
    """An image trace from uint8 pixels, shipped as a PNG (``source``): a fifth to a half of the same pixels as
    JSON numbers (``z``), drawn on the same pixel grid."""
    return dict(type="image", source=png_data_url(rgb), hoverinfo="skip", xaxis=_axis("x", panel),
                yaxis=_axis("y", panel))


def _heatmap(values: np.ndarray, panel: int, **style) -> dict:
    return dict(type="heatmap", z=values.astype(np.float32), xaxis=_axis("x", panel), yaxis=_axis("y", panel),
                **style)


def map_panels(
    images: np.ndarray, maps: np.ndarray, titles: list[str], *, colorscale: str = "Viridis", opacity: float = 0.6,
    zmin: float = 0.0, zmax: float = 1.0, colour_title: str = "", marks: PanelMarks | None = None,
    columns: int = 4, style: str = "overlay", signed: bool = False, border: int = 0, width_px: int = WIDTH_PX,
    outlines: np.ndarray | None = None,
) -> go.Figure:
    """Panels side by side (rows of ``columns``), each a map over its image or beside it, on one colour scale.

    Args:
        images: ``(P, C, S, S)`` in [0, 1] (or ``(C, S, S)``: the same image under every panel).
        maps: ``(P, S, S)``, already upsampled to the image.
        titles: one per panel.
        colorscale: plotly's name of the colour map (``MPL_COLOUR_MAPS`` gives matplotlib's), or ``DIVERGING``.
        opacity: of the maps at the top of their range (``"overlay"``; see :func:`app.pictures.map_style.overlay`).
        zmin, zmax: the shared colour range.
        colour_title: the colour bar's title.
        marks: pathology marks for every panel.
        columns: maps per row (8 p4m orientations make two rows of 4).
        style: ``"overlay"``: each map blended over its image, opaque where high, clear where low;
            ``"side"``: each row starts with the image and the maps follow, opaque.
        signed: the values are deviations (opacity grows with their size either way).
        border: the padding border in pixels, outlined (dotted) on every map when it is left out
            (:func:`app.analysis.padding.border_left_out`).
        width_px: about the width the figure gets on the page, to keep its panels square.
        outlines: bool ``(P, S, S)`` (or ``(S, S)`` for every panel): regions outlined by a thin line on each map
            (nuclei, :func:`app.analysis.pathology.nuclei_masks`), the map left visible inside and out.
    """
    if style not in ("overlay", "side"):
        raise ValueError(f"style must be 'overlay' or 'side', not {style!r}")
    count, size = len(maps), maps.shape[-1]
    shared = images.ndim == 3
    cmap = DIVERGING if colorscale == DIVERGING else MPL_COLOUR_MAPS.get(colorscale, "viridis")
    cols = min(count, columns)
    rows = -(-count // cols)
    # Where each map goes: its own panel, or (side by side) one column over, after the row's image.
    slots = [p + (p // cols + 1 if style == "side" else 0) for p in range(count)]
    width = cols + (style == "side")
    panel_titles = [""] * (rows * width)
    for p, slot in enumerate(slots):
        panel_titles[slot] = titles[p]
    layout = _grid(rows, width, panel_titles)
    data = []
    hover = "row %{y}, col %{x}: %{z:.3f}<extra></extra>"
    for p, slot in enumerate(slots):
        rgb = image_rgb(images if shared else images[p])
        if style == "side":
            if slot % width == 1:
                data.append(_image(rgb, slot - 1))
                layout["annotations"].append(_title_of(layout, slot - 1, "image"))
            data.append(_heatmap(maps[p], slot, coloraxis="coloraxis", hovertemplate=hover))
        else:
            data.append(_image(overlay(rgb, maps[p], zmin, zmax, cmap, opacity, signed), slot))
            # Invisible, for the values under the pointer and the colour bar.
            data.append(_heatmap(maps[p], slot, coloraxis="coloraxis", opacity=0.0, hovertemplate=hover))
        if outlines is not None:
            data.append(_outline(outlines if outlines.ndim == 2 else outlines[p], slot))
        if marks is not None:
            marks.draw(layout, size, slot)
        if border_left_out(border, size):
            layout["shapes"].append(dict(type="rect", x0=border - 0.5, x1=size - border - 0.5, y0=border - 0.5,
                                         y1=size - border - 0.5, line=dict(color="#d0d0d0", width=1, dash="dot"),
                                         xref=_axis("x", slot), yref=_axis("y", slot)))
    side = min(width_px // max(width, 3), 320)
    layout.update(coloraxis=dict(colorscale=_colour_scale(colorscale), cmin=zmin, cmax=zmax,
                                 colorbar=dict(title=dict(text=colour_title, side="right"), thickness=12)),
                  height=rows * (side + 25) + 35, margin=dict(l=0, r=0, t=55, b=0))
    return _figure(data, layout)


OUTLINE_COLOUR = "rgba(255, 255, 255, 0.9)"  # reads on viridis' dark and middle colours and on H&E


def _outline(mask: np.ndarray, panel: int) -> dict:
    """The boundary of a bool ``(S, S)`` mask as a line: the contour at 0.5 between pixels in and out."""
    return dict(type="contour", z=mask.astype(np.uint8), xaxis=_axis("x", panel), yaxis=_axis("y", panel),
                autocontour=False, contours=dict(start=0.5, end=0.5, size=1, coloring="none"),
                line=dict(color=OUTLINE_COLOUR, width=1), showscale=False, showlegend=False,
                hoverinfo="skip")


def _title_of(layout: dict, panel: int, text: str) -> dict:
    """A panel title annotation like :func:`_grid`'s, for a panel it left untitled."""
    x_domain = layout[f"xaxis{_axis('x', panel)[1:]}"]["domain"]
    y_domain = layout[f"yaxis{_axis('y', panel)[1:]}"]["domain"]
    return dict(text=text, x=(x_domain[0] + x_domain[1]) / 2, y=y_domain[1], xref="paper", yref="paper",
                xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=11))


def proof_figure(
    image: np.ndarray, maps: np.ndarray, expected: np.ndarray, titles: list[str], *, colorscale: str = "Viridis",
    zmin: float = 0.0, zmax: float = 1.0,
) -> go.Figure:
    """The image g.x once, then three rows per orientation: maps(g.x), g.maps(x) (one colour scale) and their
    difference, at the maps' own resolution (each map pixel over the image pixels it stands for).

    Args:
        image: ``(C, S, S)`` the transformed image g.x.
        maps, expected: ``(H, X, Y)``, not upsampled (what the proof's numbers are measured on).
        titles: one per orientation.
    """
    count, size = len(maps), image.shape[-1]
    difference = maps - expected
    bound = float(np.abs(difference).max()) or 1e-12
    columns = count + 1  # the image, then one column per orientation
    titles = ["g.x"] + list(titles)
    layout = _grid(3, columns, titles + [""] * (2 * columns))
    step = size / maps.shape[-1]
    place = dict(x0=(step - 1) / 2, dx=step, y0=(step - 1) / 2, dy=step)  # map pixel centres on the image grid
    data = [_image(image_rgb(image), 0)]
    for h in range(count):
        for row, values in ((0, maps[h]), (1, expected[h])):
            data.append(_heatmap(values, row * columns + h + 1, coloraxis="coloraxis",
                                 hovertemplate="%{z:.4f}<extra></extra>", **place))
        data.append(_heatmap(difference[h], 2 * columns + h + 1, coloraxis="coloraxis2",
                             hovertemplate="%{z:.2e}<extra></extra>", **place))
    for row, label in ((0, "maps(g.x)"), (1, "g.maps(x)"), (2, "difference")):
        axis = _axis("y", row * columns + 1)
        layout[f"yaxis{axis[1:]}"].update(visible=True, showticklabels=False, showgrid=False, zeroline=False,
                                          title=dict(text=label))
    side = min(WIDTH_PX // max(columns, 3), 320)
    layout.update(
        coloraxis=dict(colorscale=_colour_scale(colorscale), cmin=zmin, cmax=zmax,
                       colorbar=dict(len=0.62, y=0.69, thickness=12)),
        coloraxis2=dict(colorscale=_colour_scale("RdBu"), cmin=-bound, cmax=bound,
                        colorbar=dict(len=0.3, y=0.14, thickness=12, exponentformat="e")),
        height=3 * (side + 15) + 65, margin=dict(l=0, r=0, t=55, b=0),
    )
    return _figure(data, layout)


def probability_figure(probabilities: np.ndarray, class_names: list[str], element_names: list[str]) -> go.Figure:
    """Grouped bars: one group per class, one bar per transform of the image."""
    data = [dict(type="bar", x=list(class_names), y=probabilities[t], name=name,
                 hovertemplate="%{x}: %{y:.4f}<extra>" + name + "</extra>")
            for t, name in enumerate(element_names)]
    layout = dict(barmode="group", yaxis=dict(range=[0, 1], title=dict(text="probability")), height=300,
                  margin=dict(l=0, r=0, t=10, b=0), legend=dict(orientation="h", y=-0.2))
    return _figure(data, layout)


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
    data = [dict(type="bar", x=centres, y=accuracy, width=widths * 0.95, name="accuracy", customdata=counts,
                 hovertemplate="confidence %{x:.2f}: accuracy %{y:.2f} (%{customdata} patches)<extra></extra>"),
            dict(type="scatter", x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                 line=dict(dash="dash", color="grey"))]
    layout = dict(xaxis=dict(range=[float(edges[0]), 1], title=dict(text="confidence (largest probability)")),
                  yaxis=dict(range=[0, 1], title=dict(text="accuracy")), height=300, margin=dict(l=0, r=0, t=10, b=0),
                  legend=dict(orientation="h", y=-0.3), shapes=[], annotations=[])
    if confidence is not None:  # a vertical line over the plot's height, labelled at its top
        layout["shapes"].append(dict(type="line", x0=confidence, x1=confidence, xref="x", y0=0, y1=1,
                                     yref="y domain", line=dict(color="crimson", width=2)))
        layout["annotations"].append(dict(text="this patch", x=confidence, xref="x", y=1, yref="y domain",
                                          xanchor="left", yanchor="top", showarrow=False))
    return _figure(data, layout)


def nuclei_figure(image: np.ndarray, haematoxylin: np.ndarray, attention: np.ndarray, tissue: np.ndarray,
                  titles: list[str]) -> go.Figure:
    """Four panels: the patch, its haematoxylin concentration, the attention map, and the map on tissue only.

    Args:
        image: ``(3, S, S)`` in [0, 1].
        haematoxylin, attention: ``(S, S)``; each on its own colour scale (2nd to 98th percentile), since they
            are compared by rank, not by value.
        tissue: ``(S, S)`` bool; in the last panel the patch itself shows where there is no tissue.
        titles: one per panel.
    """
    layout = _grid(1, 4, titles)
    rgb = image_rgb(image)
    data = [_image(rgb, 0), _image(rgb, 3)]
    for panel, values, scale in ((1, haematoxylin, "Blues"), (2, attention, "Viridis"),
                                 (3, np.where(tissue, attention, np.nan), "Viridis")):
        finite = values[np.isfinite(values)]
        low, high = np.percentile(finite, [2, 98]) if finite.size else (0.0, 1.0)
        data.append(_heatmap(values, panel, colorscale=_colour_scale(scale), zmin=float(low),
                             zmax=float(max(high, low + 1e-6)), showscale=False,
                             hovertemplate="row %{y}, col %{x}: %{z:.3f}<extra></extra>"))
    side = WIDTH_PX // 4
    layout.update(height=side + 40, margin=dict(l=0, r=0, t=30, b=0))
    return _figure(data, layout)
