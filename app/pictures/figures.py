"""PNG renderings (matplotlib) for export: maps over their image, and arrow fields.

matplotlib's object API with the Agg canvas (no pyplot), so no global figure
state is shared between the app's sessions, which run in threads.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import PathPatch
from matplotlib.path import Path

from ..analysis.images import to_channels
from .arrows import ArrowField, PanelMosaic, arrow_polygons

__all__ = ["render_map_png", "render_map_row_png", "render_map_grid_png", "MapRow", "render_arrow_field_png",
           "render_arrow_fields_png", "draw_arrow_panel", "png_bytes", "ORIENTATION_COLOURS"]

# One colour per orientation (tab10 without grey); mirrored ones are also drawn hollow.
ORIENTATION_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22")


def _background(ax, image: np.ndarray | None, faded: bool = False) -> None:
    """Show an image ``(C, X, Y)`` in [0, 1] under whatever comes next; ``faded``: as light grey, for arrows."""
    if image is None:
        return
    if faded:
        grey = to_channels(image, 1)[0]
        ax.imshow(0.55 + 0.45 * np.clip(grey, 0, 1), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        return
    pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)  # (X, Y) or (X, Y, 3)
    ax.imshow(np.clip(pixels, 0, 1), cmap="gray", vmin=0, vmax=1, interpolation="nearest")


def png_bytes(fig: Figure, dpi: int) -> bytes:
    """``fig`` as PNG bytes, drawn on its own Agg canvas; every PNG of the app (and region mode's) comes from here."""
    FigureCanvasAgg(fig)  # attaches the Agg canvas; no pyplot, no global state
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, pil_kwargs={"compress_level": 1})  # zlib's fastest: 3x quicker
    return buffer.getvalue()


def render_map_png(
    values: np.ndarray,
    image: np.ndarray | None = None,
    *,
    cmap: str = "viridis",
    vmin: float = 0.0,
    vmax: float = 1.0,
    opacity: float = 0.6,
    title: str = "",
    dpi: int = 100,
) -> bytes:
    """One 2-D map, overlaid on its image when given, with a colour bar.

    Args:
        values: ``(X, Y)`` map, already upsampled to the image size when overlaid.
        image: ``(C, X, Y)`` in [0, 1] or None.
        cmap, vmin, vmax: colour map and its fixed range (share it across panels).
        opacity: of the map over the image.
        title: drawn above.
        dpi: resolution of the 4-inch-wide figure.
    """
    fig = Figure(figsize=(4, 3.4))
    ax = fig.add_subplot()
    _background(ax, image)
    shown = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, alpha=opacity if image is not None else 1.0,
                      interpolation="nearest")
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()
    return png_bytes(fig, dpi)


def _compound_path(polygons: np.ndarray) -> Path:
    """``(N, 8, 2)`` closed polygons as one path."""
    count = len(polygons)
    codes = np.tile(np.array([Path.MOVETO] + [Path.LINETO] * 6 + [Path.CLOSEPOLY], dtype=Path.code_type), count)
    return Path(polygons.reshape(-1, 2), codes)


def _add_arrows(ax, field: ArrowField, panels: list[tuple[int, tuple[int, int]]]) -> None:
    """The arrows of transforms t at origins (top, left) of ``ax``'s data: one compound path per orientation.

    Solid arrows are rotations, hollow ones mirrored orientations. The caller sets the limits.
    """
    for h in range(len(field.directions)):
        polygons = np.concatenate([arrow_polygons(field, t, h, origin) for t, origin in panels])
        if not len(polygons):
            continue
        colour = ORIENTATION_COLOURS[int(field.orientation_ids[h]) % len(ORIENTATION_COLOURS)]
        style = (dict(facecolor="none", edgecolor=colour, linewidth=0.8) if field.mirrored[h]
                 else dict(facecolor=colour, edgecolor="none"))
        # add_artist, not add_patch: the limits are set by the caller, and add_patch would walk every vertex for them.
        ax.add_artist(PathPatch(_compound_path(polygons), **style))


def draw_arrow_panel(ax, field: ArrowField, transform: int, image: np.ndarray | None) -> None:
    """One transform's arrows over its faded image ``(C, X, Y)`` (or white), filling ``ax``; no title."""
    size = field.image_size
    _background(ax, image, faded=True)
    _add_arrows(ax, field, [(transform, (0, 0))])
    ax.set_xlim(-0.5, size - 0.5)
    ax.set_ylim(size - 0.5, -0.5)  # rows grow downwards, as in the image
    ax.set_axis_off()


def render_arrow_fields_png(
    field: ArrowField, images: list[np.ndarray | None], titles: list[str], transforms: list[int] | None = None, *,
    columns: int = 4, inches: float = 3.0, dpi: int = 90,
) -> bytes:
    """The arrows of several transforms, each over its faded image, side by side in rows of ``columns``: one PNG.

    One axes holds every panel (a :class:`~app.pictures.arrows.PanelMosaic`), one image all the
    backgrounds and one compound path per orientation all its arrows, so that a p4m
    field of 8 x 144 x 8 arrows is one quick render. Solid arrows are rotations, hollow ones mirrored
    orientations; a full-length arrow (``lengths == 1``) reaches half a cell, so
    neighbouring cells never overlap.

    Args:
        field: from :func:`app.pictures.arrows.arrow_field`.
        images: ``(C, X, Y)`` in [0, 1] (or None: white) under each panel.
        titles: one per panel.
        transforms: index t into ``field.lengths`` of each panel; default ``0, 1, ...``.
        columns: panels per row.
        inches: width of a panel.
        dpi: resolution.
    """
    transforms = list(range(len(titles))) if transforms is None else list(transforms)
    size = field.image_size
    mosaic = PanelMosaic(len(transforms), size, columns)
    fig = Figure(figsize=(inches * mosaic.width / size, inches * mosaic.height / size))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(mosaic.background(images), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    _add_arrows(ax, field, [(t, mosaic.origins[p]) for p, t in enumerate(transforms)])
    for (top, left), title in zip(mosaic.origins, titles, strict=True):
        ax.text(left + size / 2, top - mosaic.band * 0.2, title, ha="center", va="bottom", fontsize=9)
    ax.set_xlim(-0.5, mosaic.width - 0.5)
    ax.set_ylim(mosaic.height - 0.5, -0.5)  # rows grow downwards, as in the image
    ax.set_axis_off()
    return png_bytes(fig, dpi)


def render_arrow_field_png(
    field: ArrowField, transform: int = 0, image: np.ndarray | None = None, *, title: str = "", dpi: int = 100
) -> bytes:
    """The arrows of one transform over its image (a 4-inch panel); see :func:`render_arrow_fields_png`.

    Args:
        field: from :func:`app.pictures.arrows.arrow_field`.
        transform: index t into ``field.lengths``.
        image: ``(C, X, Y)`` in [0, 1] or None.
        title: drawn above.
        dpi: resolution.
    """
    return render_arrow_fields_png(field, [image], [title], [transform], inches=4.0, dpi=dpi)


def render_map_row_png(
    values: np.ndarray,
    image: np.ndarray | None = None,
    titles: list[str] | None = None,
    *,
    cmap: str = "viridis",
    vmin: float = 0.0,
    vmax: float = 1.0,
    opacity: float = 0.6,
    dpi: int = 100,
) -> bytes:
    """Maps side by side on one colour scale (one colour bar), each over the image when given.

    Args:
        values: ``(P, X, Y)`` maps, upsampled to the image size when overlaid.
        image: ``(C, X, Y)`` in [0, 1], under every panel, or None.
        titles: one per panel.
        cmap, vmin, vmax, opacity, dpi: as :func:`render_map_png`.
    """
    return render_map_grid_png([MapRow(values, vmin, vmax, titles=tuple(titles or ()))], image, cmap=cmap,
                               opacity=opacity, dpi=dpi)


@dataclass(frozen=True)
class MapRow:
    """One row of :func:`render_map_grid_png`: ``(P, X, Y)`` maps on their own range, a title per panel and a
    label on the left."""

    values: np.ndarray
    vmin: float
    vmax: float
    titles: tuple[str, ...] = ()
    label: str = ""


def render_map_grid_png(
    rows: list[MapRow],
    image: np.ndarray | None = None,
    *,
    cmap: str = "viridis",
    opacity: float = 0.6,
    dpi: int = 100,
) -> bytes:
    """Rows of maps, each on its own colour scale with its colour bar and label, each map over the image.

    Args:
        rows: the rows; one with fewer panels than the widest leaves the rest of its line empty.
        image: ``(C, X, Y)`` in [0, 1], under every panel, or None.
        cmap, opacity, dpi: as :func:`render_map_png`.
    """
    count = max(len(row.values) for row in rows)
    labelled = any(row.label for row in rows)
    fig = Figure(figsize=(2.2 * count + 0.6 + 1.6 * labelled, 2.5 + 2.4 * (len(rows) - 1)))
    grid = fig.subplots(len(rows), count, squeeze=False)
    for row, axes in zip(rows, grid, strict=True):
        shown = None
        for p, ax in enumerate(axes):
            ax.set_axis_off()
            if p >= len(row.values):
                continue
            _background(ax, image)
            shown = ax.imshow(row.values[p], cmap=cmap, vmin=row.vmin, vmax=row.vmax,
                              alpha=opacity if image is not None else 1.0, interpolation="nearest")
            ax.set_title(row.titles[p] if p < len(row.titles) else "", fontsize=8)
        if row.label:
            axes[0].text(-0.08, 0.5, row.label, transform=axes[0].transAxes, ha="right", va="center", fontsize=8)
        fig.colorbar(shown, ax=list(axes), fraction=0.02, pad=0.01)
    return png_bytes(fig, dpi)
