"""PNG renderings (matplotlib): maps over their image for export, and arrow fields for the page and export.

matplotlib's object API with the Agg canvas (no pyplot), so no global figure
state is shared between the app's sessions, which run in threads.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import PathPatch
from matplotlib.path import Path

from .arrows import ArrowField
from .images import to_channels

__all__ = ["render_map_png", "render_map_row_png", "render_arrow_field_png", "render_arrow_fields_png",
           "ORIENTATION_COLOURS"]

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


def _png(fig: Figure, dpi: int) -> bytes:
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
    return _png(fig, dpi)


# Arrows shaped like matplotlib's quiver arrows (a shaft 0.45 % of a panel wide, a head 3 widths wide and 4 long),
# drawn as one compound path per orientation: thousands of arrows cost one path, not one polygon each.
SHAFT_WIDTH = 0.0045
HEAD_WIDTH, HEAD_LENGTH = 3.0, 4.0


def _arrow_vertices(x: np.ndarray, y: np.ndarray, dx: np.ndarray, dy: np.ndarray, width: float) -> np.ndarray:
    """Polygons of arrows from (x, y) to (x + dx, y + dy), in data units: ``(N, 8, 2)``, the last vertex closing.

    A shaft ``width`` wide, a head 3 widths wide and 4 long; arrows shorter than their head shrink whole.
    """
    length = np.hypot(dx, dy)  # (N,)
    safe = np.where(length > 0, length, 1.0)
    along = np.stack([dx / safe, dy / safe], axis=-1)  # (N, 2) unit vectors
    across = np.stack([-along[:, 1], along[:, 0]], axis=-1)  # (N, 2)
    head = np.minimum(HEAD_LENGTH * width, length)  # (N,)
    shrink = head / (HEAD_LENGTH * width)  # 1 unless the arrow is shorter than its head
    shaft_half, head_half = 0.5 * width * shrink, 0.5 * HEAD_WIDTH * width * shrink
    neck = length - head
    # (along, across) of each corner, (N, 8) each: tail, neck, head, tip, head, neck, tail, back to the start.
    a = np.stack([0 * neck, neck, neck, length, neck, neck, 0 * neck, 0 * neck], axis=1)
    c = np.stack([shaft_half, shaft_half, head_half, 0 * neck, -head_half, -shaft_half, -shaft_half, shaft_half],
                 axis=1)
    base = np.stack([x, y], axis=-1)[:, None, :]  # (N, 1, 2)
    return base + a[..., None] * along[:, None, :] + c[..., None] * across[:, None, :]  # (N, 8, 2)


def _compound_path(polygons: np.ndarray) -> Path:
    """``(N, 8, 2)`` closed polygons as one path."""
    count = len(polygons)
    codes = np.tile(np.array([Path.MOVETO] + [Path.LINETO] * 6 + [Path.CLOSEPOLY], dtype=Path.code_type), count)
    return Path(polygons.reshape(-1, 2), codes)


def render_arrow_fields_png(
    field: ArrowField, images: list[np.ndarray | None], titles: list[str], transforms: list[int] | None = None, *,
    columns: int = 4, inches: float = 3.0, dpi: int = 90,
) -> bytes:
    """The arrows of several transforms, each over its faded image, side by side in rows of ``columns``: one PNG.

    One axes holds every panel, offset in data units, one image all the backgrounds
    and one path per orientation all its arrows, so that a p4m field of 8 x 144 x 8
    arrows is one quick render. Solid arrows are rotations, hollow ones mirrored
    orientations; a full-length arrow (``lengths == 1``) reaches half a cell, so
    neighbouring cells never overlap.

    Args:
        field: from :func:`app.arrows.arrow_field`.
        images: ``(C, X, Y)`` in [0, 1] (or None: white) under each panel.
        titles: one per panel.
        transforms: index t into ``field.lengths`` of each panel; default ``0, 1, ...``.
        columns: panels per row.
        inches: width of a panel.
        dpi: resolution.
    """
    transforms = list(range(len(titles))) if transforms is None else list(transforms)
    count, size = len(transforms), field.image_size
    cols = min(count, columns)
    rows = -(-count // cols)
    gap, band = max(2, size // 16), max(6, size // 7)  # between panels; above each panel, for its title
    width, height = cols * size + (cols - 1) * gap, rows * (size + band)
    background = np.ones((height, width), dtype=np.float32)  # white between panels
    origins = []
    for p in range(count):
        top, left = (p // cols) * (size + band) + band, (p % cols) * (size + gap)
        origins.append((top, left))
        if images[p] is not None:
            grey = to_channels(np.clip(images[p], 0, 1), 1)[0]
            background[top:top + size, left:left + size] = 0.55 + 0.45 * grey
    fig = Figure(figsize=(inches * width / size, inches * height / size))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(background, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    half = field.spacing / 2
    rows_px, cols_px = field.positions[:, 0], field.positions[:, 1]  # (P,)
    for h, (d_row, d_col) in enumerate(field.directions):
        polygons = []
        for p, t in enumerate(transforms):
            length = field.lengths[t, h] * half  # (P,)
            top, left = origins[p]
            polygons.append(_arrow_vertices(cols_px + left, rows_px + top, d_col * length, d_row * length,
                                            SHAFT_WIDTH * size))
        colour = ORIENTATION_COLOURS[int(field.orientation_ids[h]) % len(ORIENTATION_COLOURS)]
        style = (dict(facecolor="none", edgecolor=colour, linewidth=0.8) if field.mirrored[h]
                 else dict(facecolor=colour, edgecolor="none"))
        # add_artist, not add_patch: the limits are set below, and add_patch would walk every vertex for them.
        ax.add_artist(PathPatch(_compound_path(np.concatenate(polygons)), **style))
    for p, title in enumerate(titles):
        top, left = origins[p]
        ax.text(left + size / 2, top - band * 0.2, title, ha="center", va="bottom", fontsize=9)
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.5, -0.5)  # rows grow downwards, as in the image
    ax.set_axis_off()
    return _png(fig, dpi)


def render_arrow_field_png(
    field: ArrowField, transform: int = 0, image: np.ndarray | None = None, *, title: str = "", dpi: int = 100
) -> bytes:
    """The arrows of one transform over its image (a 4-inch panel); see :func:`render_arrow_fields_png`.

    Args:
        field: from :func:`app.arrows.arrow_field`.
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
    count = len(values)
    fig = Figure(figsize=(2.2 * count + 0.6, 2.5))
    axes = fig.subplots(1, count, squeeze=False)[0]
    shown = None
    for p, ax in enumerate(axes):
        _background(ax, image)
        shown = ax.imshow(values[p], cmap=cmap, vmin=vmin, vmax=vmax,
                          alpha=opacity if image is not None else 1.0, interpolation="nearest")
        ax.set_title(titles[p] if titles else "", fontsize=8)
        ax.set_axis_off()
    fig.colorbar(shown, ax=list(axes), fraction=0.02, pad=0.01)
    return _png(fig, dpi)
