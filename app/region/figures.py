"""PNG renderings (matplotlib, Agg) of a region's evaluation: tumour probability or attention over the tissue.

One picture per call, in the image's own pixel coordinates at the model's scale (rows down): the region
underneath and the map blended into it, as :mod:`app.region.overlays` defines them. The probability is a smooth
surface on the tissue with its p = 0.5 contour; the attention is drawn pixel by pixel on the evaluated cells, in
the reading it was computed in, coloured over the 2nd to 98th percentile of its values on tissue. Around them: an
outline of the evaluated area, a colour bar, a scale bar in micrometres and a title naming the class or reading
and the method. Large regions are resampled to the figure's resolution before matplotlib sees them, so that a
2000 x 2000 region renders in about half a second.
"""

from __future__ import annotations

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar
from PIL import Image

from ..analysis.images import to_channels
from ..analysis.pathology import scale_bar_microns
from ..analysis.readings import BRIGHT
from ..cells.evaluation import RegionResult
from ..pictures.figures import png_bytes
from .overlays import (
    ATTENTION_OPACITY,
    PROBABILITY_OPACITY,
    attention_range,
    blend,
    cell_outline,
    display_tissue,
    probability_contour,
    probability_field,
)

__all__ = ["render_region_png", "SHOW", "PROBABILITY_CMAP", "ATTENTION_CMAP"]

SHOW = ("probability", "attention")
# Fixed at 0..1 and diverging at 0.5, where the contour is drawn: blue normal, red tumour. Its blue end stays
# apart from haematoxylin's purple under a light overlay, where viridis's dark purple vanished into it.
PROBABILITY_CMAP = "RdYlBu_r"
ATTENTION_CMAP = "cividis"  # another one (blue to yellow, perceptually uniform), so the two are not mistaken
# Inches around the image: title above, colour bar and its label to the right; at text scale 1 (see _layout).
TOP_IN, BOTTOM_IN, LEFT_IN, RIGHT_IN = 0.75, 0.15, 0.15, 1.45
MIN_IMAGE_IN = 5.0  # a small region is still drawn this large, so the text stays in proportion
MAX_TEXT_SCALE = 1.6  # text (and the margins holding it) grows with the figure, up to this factor


def _to_display(values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``(H, W)`` float (NaN: nothing) or ``(H, W, 3)`` in [0, 1], resampled to ``size`` = (rows, cols) when that
    is smaller (Pillow's antialiased bilinear: far quicker than letting matplotlib resample a large masked array).

    A map's NaN stays NaN where fewer than half of the source pixels under a displayed one are finite, so the
    evaluated area keeps its outline.
    """
    rows, cols = values.shape[:2]
    if size[0] >= rows and size[1] >= cols:
        return values
    target = (max(1, size[1]), max(1, size[0]))  # Pillow: (width, height)
    filter_ = Image.Resampling.BILINEAR
    if values.ndim == 3:
        pixels = Image.fromarray(np.round(np.clip(values, 0, 1) * 255).astype(np.uint8))
        return np.asarray(pixels.resize(target, filter_), dtype=np.float32) / 255.0
    finite = np.isfinite(values)
    total = np.asarray(Image.fromarray(np.where(finite, values, 0).astype(np.float32)).resize(target, filter_))
    share = np.asarray(Image.fromarray(finite.astype(np.float32)).resize(target, filter_))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(share >= 0.5, total / np.maximum(share, 1e-6), np.nan).astype(np.float32)


def _inches_per_px(rows: int, cols: int, dpi: int, max_side_px: int, text: float) -> float:
    """The image at its own size (at least :data:`MIN_IMAGE_IN` on its long side), the whole figure, margins at
    text scale ``text`` included, at most ``max_side_px`` a side."""
    native = max(1.0 / dpi, MIN_IMAGE_IN / max(rows, cols))
    limit_in = max_side_px / dpi
    fit = min((limit_in - text * (LEFT_IN + RIGHT_IN)) / cols, (limit_in - text * (TOP_IN + BOTTOM_IN)) / rows)
    return max(min(native, fit), 0.5 / max(rows, cols))  # never degenerate, even for a tiny max_side_px


def _layout(rows: int, cols: int, dpi: int, max_side_px: int) -> tuple[float, float]:
    """``(inches per image pixel, text scale)``: text grows with a large figure, so that it stays legible when the
    PNG is viewed scaled down to a screen (1 up to a 9-inch figure, then in proportion up to MAX_TEXT_SCALE)."""
    first = _inches_per_px(rows, cols, dpi, max_side_px, 1.0)
    long_in = max(cols * first + LEFT_IN + RIGHT_IN, rows * first + TOP_IN + BOTTOM_IN)
    text = min(MAX_TEXT_SCALE, max(1.0, long_in / 9))
    return _inches_per_px(rows, cols, dpi, max_side_px, text), text


def render_region_png(
    result: RegionResult, *, show: str = "probability", dpi: int = 100, max_side_px: int = 1600,
    outline: bool = True, opacity: float | None = None,
) -> bytes:
    """The region with its tumour probability surface, or its stitched attention map, over it.

    Args:
        result: from :func:`app.cells.evaluation.evaluate_region`.
        show: ``"probability"`` (the last class, interpolated between cell centres, on tissue only, colours fixed
            at 0..1, with its 0.5 contour) or ``"attention"`` (the first attentive layer's map in
            ``result.reading``, colours over the 2nd to 98th percentile of its values on tissue).
        dpi: resolution.
        max_side_px: the PNG is at most this many pixels a side; the image is drawn at its own resolution up to
            that, resampled below it.
        outline: draw the border of the evaluated cells.
        opacity: of the map over the image (default: :data:`~app.region.overlays.PROBABILITY_OPACITY` or
            :data:`~app.region.overlays.ATTENTION_OPACITY`).

    Raises:
        ValueError: unknown ``show``, or ``"attention"`` for a model without attention.
    """
    if show not in SHOW:
        raise ValueError(f"show must be one of {SHOW}, got {show!r}")
    if show == "attention" and result.attention is None:
        raise ValueError("this model has no attention layer: there is no attention map to draw")
    grid = result.grid
    rows, cols = result.image.shape[1:]
    inches_per_px, text = _layout(rows, cols, dpi, max_side_px)
    top_in, bottom_in, left_in, right_in = (text * m for m in (TOP_IN, BOTTOM_IN, LEFT_IN, RIGHT_IN))
    image_w, image_h = cols * inches_per_px, rows * inches_per_px
    panel_h = max(image_h, 2.0)  # room for the colour bar beside a flat region
    fig_w, fig_h = left_in + image_w + right_in, top_in + panel_h + bottom_in
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    image_bottom = bottom_in + (panel_h - image_h) / 2
    ax = fig.add_axes((left_in / fig_w, image_bottom / fig_h, image_w / fig_w, image_h / fig_h))

    # Maps are made at the displayed size (when smaller than the image) and blended in: matplotlib only copies them.
    shown = (round(image_h * dpi), round(image_w * dpi))
    whole = (-0.5, cols - 0.5, rows - 0.5, -0.5)  # imshow's extent of the whole image: pixel centres on integers
    background = _to_display(np.moveaxis(to_channels(result.image, 3), 0, -1), shown)
    rgb = np.round(np.clip(background, 0, 1) * 255).astype(np.uint8)
    scale = rows / rgb.shape[0]  # image pixels per displayed pixel
    tissue = display_tissue(rgb, scale)
    name = result.class_names[-1]
    if show == "probability":
        values, cmap, norm = probability_field(result, rgb.shape[:2], scale), PROBABILITY_CMAP, Normalize(0.0, 1.0)
        alpha = np.where(tissue, PROBABILITY_OPACITY if opacity is None else opacity, 0.0)
        label = f"P({name}), between cell centres; line: p = 0.5"
        heading = f"P({name}) over the tissue"
        subtitle = f"each {grid.cell} x {grid.cell} px cell judged in its {grid.context} x {grid.context} context"
    else:
        values = _to_display(result.attention, rgb.shape[:2])
        norm, cmap = Normalize(*attention_range(values, tissue)), ATTENTION_CMAP
        alpha = np.where(tissue, ATTENTION_OPACITY if opacity is None else opacity, 0.0)
        label = f"{result.reading} (colours: 2nd-98th percentile on tissue)"
        heading = (f"Attention of {result.attention_layer or 'the first attentive layer'}, {result.reading} reading, "
                   "mean over orientations")
        subtitle = BRIGHT[result.reading]
    ax.imshow(blend(rgb, values, alpha, norm.vmin, norm.vmax, cmap), extent=whole, interpolation="nearest")
    top, left = grid.cell_origin(0, 0)
    if outline:
        segments = cell_outline(result.evaluated, top, left, grid.cell) - 0.5  # edges -> imshow's coordinates
        ax.add_collection(LineCollection(segments, colors="#1a1a1a", linewidths=0.7, alpha=0.5), autolim=False)
    if show == "probability":
        lines = [line - 0.5 for line in probability_contour(result)]
        ax.add_collection(LineCollection(lines, colors="black", linewidths=1.2 * text), autolim=False)
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)  # rows grow downwards, as in the image
    ax.set_axis_off()

    # Scale bar at the model's scale, on a light box so it reads over tissue and glass alike.
    microns = scale_bar_microns(cols, result.model_microns_per_pixel)
    bar = AnchoredSizeBar(ax.transData, microns / result.model_microns_per_pixel, f"{microns:g} µm",
                          loc="lower left", pad=0.3, borderpad=0.5, sep=3, color="black", frameon=True,
                          size_vertical=max(rows, cols) * 0.006, fontproperties=FontProperties(size=9 * text))
    bar.patch.set(facecolor="white", alpha=0.8, edgecolor="none")
    ax.add_artist(bar)

    # Colour bar at full opacity (the overlay's colours are these, blended with the tissue), in the map's values.
    bar_h = min(image_h, max(panel_h * 0.8, 2.0)) if image_h >= 2.0 else panel_h * 0.8
    cax = fig.add_axes(((left_in + image_w + 0.15 * text) / fig_w, (bottom_in + (panel_h - bar_h) / 2) / fig_h,
                        0.16 * text / fig_w, bar_h / fig_h))
    colourbar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    colourbar.set_label(label, fontsize=9 * text)
    colourbar.ax.tick_params(labelsize=8 * text)
    if show == "probability":
        colourbar.ax.axhline(0.5, color="black", linewidth=1.2 * text)

    evaluated, total = int(result.evaluated.sum()), result.evaluated.size
    fig.text(left_in / fig_w, 1 - 0.12 * text / fig_h, heading, ha="left", va="top", fontsize=11 * text,
             fontweight="bold")
    fig.text(left_in / fig_w, 1 - 0.42 * text / fig_h,
             f"{subtitle}\nmethod: {result.method} · {evaluated} of {total} cells evaluated · drawn on tissue only · "
             f"at the model's {result.model_microns_per_pixel:g} µm/px",
             ha="left", va="top", fontsize=8 * text, color="#333333")
    return png_bytes(fig, dpi)
