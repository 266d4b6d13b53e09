"""Arrow fields: at a grid of positions, one arrow per orientation, as long as that orientation is preferred there.

Orientation h of a group feature map is the response of the filter moved by
group element h. Its arrow points where h sends an arrow pointing right
(:func:`app.analysis.transforms.arrow_direction`): rotations k = 0..3 point right, up,
left, down as displayed (90 k degrees counter-clockwise, the sense of
``torch.rot90``); the mirrored elements h = 4..7 reflect those in the
horizontal axis and are flagged ``mirrored`` so that a drawing can tell them
apart (h = 0 and h = 4 both point right).

The grid tiles a centred square of the image into cells of ``spacing`` pixels;
each cell's response per orientation is the mean of the upsampled map over it.
What an arrow's length shows is the ``mode``:

- ``"selectivity"`` (default, after the paper's Fig. 3-4): the response minus
  the smallest response over orientations at that cell, both taken above each
  orientation's background level (its median over the cells). A region at
  background level (empty background, a constant patch) gets no arrows; a
  stroke gets long arrows along the orientations that match it.
- ``"dominant"``: one arrow per cell, for the orientation with the largest
  response, as long as its lead over the second largest.
- ``"response"``: the raw mean response (every cell gets arrows).

Lengths share one scale over every transform, orientation and cell (its 98th
percentile: longer arrows are drawn full length), and arrows shorter than
``min_length`` of it are left out, so empty regions stay empty.
The grid is symmetric under quarter turns and flips and every step above
commutes with moving cells and re-indexing orientations, so the field of g.x is
the field of x moved by g, like the maps it comes from.
:func:`arrow_polygons` gives each arrow's outline and :class:`PanelMosaic` lays
panels out side by side; the page draws them as one SVG
(:func:`app.pictures.arrow_svg.arrow_panels_svg`), the PNG export with matplotlib
(:func:`app.pictures.figures.render_arrow_field_png`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..analysis.compute import LayerMaps
from ..analysis.images import to_channels
from ..analysis.padding import border_left_out
from ..analysis.reductions import upsample
from ..analysis.transforms import arrow_direction

__all__ = ["ArrowField", "arrow_field", "arrow_polygons", "PanelMosaic", "ARROW_MODES", "MIN_LENGTH",
           "cell_lengths"]

ARROW_MODES = {
    "selectivity": "each orientation's response minus the weakest orientation's there (above background)",
    "dominant": "the strongest orientation only, as long as its lead over the second (above background)",
    "response": "each orientation's raw mean response",
}
# Arrows shorter than this fraction of the longest are not drawn: background stays empty, not dotted.
MIN_LENGTH = 0.08
SCALE_PERCENTILE = 98.0


@dataclass(frozen=True)
class ArrowField:
    """Arrows of one layer for every transform, on a shared scale.

    Attributes:
        positions: ``(P, 2)`` (row, column) of each cell centre, image pixels.
        directions: ``(H, 2)`` unit (d_row, d_column) of each orientation.
        lengths: ``(T, H, P)`` in [0, 1], 1 the longest arrow of the layer, 0 where no arrow is drawn.
        orientation_ids: ``(H,)`` group element index of each orientation.
        mirrored: ``(H,)`` True for the mirrored orientations of p4m.
        scale: the strength drawn as a full-length arrow (shared by all panels).
        mode: what a length shows (a key of ``ARROW_MODES``).
        min_length: arrows shorter than this fraction of full length were left out.
        spacing: cell side in pixels; a full-length arrow is half of it.
        image_size: side of the image the positions refer to.
    """

    positions: np.ndarray
    directions: np.ndarray
    lengths: np.ndarray
    orientation_ids: np.ndarray
    mirrored: np.ndarray
    scale: float
    spacing: int
    image_size: int
    mode: str = "selectivity"
    min_length: float = 0.0


def cell_lengths(strength: np.ndarray, mode: str) -> np.ndarray:
    """Unscaled arrow lengths ``(T, H, P)`` from the cells' mean responses ``(T, H, P)`` (see ``ARROW_MODES``).

    Selectivity and dominance are measured on the responses above each orientation's background level, its
    median over the cells: attention's global channel weights (and biases) can make orientations respond
    differently even to an empty region, by the same amount everywhere, so that offset is not a preference.
    """
    if mode == "response":
        return strength
    strength = strength - np.median(strength, axis=2, keepdims=True)
    if mode == "selectivity":
        return strength - strength.min(axis=1, keepdims=True)
    if mode == "dominant":
        ranked = np.sort(strength, axis=1)
        lead = ranked[:, -1] - ranked[:, -2]  # (T, P); 0 on a tie, so the tie's winner never matters
        winner = strength.argmax(axis=1)  # (T, P)
        return np.where(np.arange(strength.shape[1])[None, :, None] == winner[:, None, :], lead[:, None, :], 0.0)
    raise ValueError(f"unknown arrow mode {mode!r}; choose one of {', '.join(ARROW_MODES)}")


def arrow_field(
    layer: LayerMaps, image_size: int, spacing: int | None = None, scale: float | None = None,
    mode: str = "selectivity", min_length: float = MIN_LENGTH, border: int = 0,
) -> ArrowField:
    """The arrow field of one layer's per-orientation maps (features or attention).

    Args:
        layer: maps with an orientation axis (H > 1).
        image_size: side of the image the maps are shown on.
        spacing: cell side in pixels; default about a twelfth of the image.
        scale: the length drawn full size (longer arrows are drawn full size); default the 98th percentile over
            all transforms, orientations and cells, so panels compare directly.
        mode: what a length shows, a key of ``ARROW_MODES``.
        min_length: arrows shorter than this fraction of full size are left out.
        border: cells whose centre lies within this many pixels of an edge get no arrows and do not set the
            scale (the padding border of :mod:`app.analysis.padding`; none are left out when too few cells would
            be left, :func:`app.analysis.padding.border_left_out`).

    Raises:
        ValueError: maps without orientations (planar layers, attention on the image); an unknown mode.
    """
    if layer.orientations < 2:
        raise ValueError(f"layer {layer.name} has no orientation axis, so no arrows to draw")
    if mode not in ARROW_MODES:
        raise ValueError(f"unknown arrow mode {mode!r}; choose one of {', '.join(ARROW_MODES)}")
    spacing = spacing or max(2, image_size // 12)
    cells = image_size // spacing
    if (image_size - cells * spacing) % 2:
        cells -= 1  # keep the tiled square centred, so the grid is symmetric under the group
    offset = (image_size - cells * spacing) // 2
    maps = upsample(torch.from_numpy(layer.maps), image_size)  # (T, H, S, S)
    tiled = maps[..., offset:offset + cells * spacing, offset:offset + cells * spacing]
    strength = F.avg_pool2d(tiled.double(), spacing).flatten(2).numpy()  # (T, H, P), cells in row-major order
    raw = cell_lengths(strength, mode)
    centres = offset + spacing * np.arange(cells) + (spacing - 1) / 2
    rows, cols = np.meshgrid(centres, centres, indexing="ij")
    positions = np.stack([rows.ravel(), cols.ravel()], axis=1)  # (P, 2)
    border = border_left_out(border, image_size)
    if border > 0:
        # The grid and the border are symmetric under the group, so leaving cells out keeps the field equivariant.
        depth = np.minimum(positions, image_size - 1 - positions).min(axis=1)  # (P,) from the nearest edge
        raw = np.where(depth < border, 0.0, raw)
    ids = np.arange(layer.orientations)
    if scale is None:
        # The 98th percentile, not the maximum: one strong edge would otherwise shrink every other arrow away.
        scale = float(np.percentile(raw, SCALE_PERCENTILE)) or float(raw.max())
    lengths = np.clip(raw / scale, 0.0, 1.0) if scale > 0 else np.zeros_like(raw)
    lengths[lengths < min_length] = 0.0
    return ArrowField(
        positions=positions.astype(np.float32),
        directions=np.array([arrow_direction(int(h)) for h in ids], dtype=np.float32),
        lengths=lengths.astype(np.float32),
        orientation_ids=ids,
        mirrored=ids >= 4,
        scale=float(scale),
        spacing=spacing,
        image_size=image_size,
        mode=mode,
        min_length=min_length,
    )


# Arrows shaped like matplotlib's quiver arrows: a shaft 0.45 % of a panel wide, a head 3 widths wide and 4 long.
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


def arrow_polygons(field: ArrowField, transform: int, orientation: int, origin: tuple[int, int] = (0, 0)) -> np.ndarray:
    """The drawn arrows of one orientation of one transform as polygons ``(N, 8, 2)`` of (column, row) points.

    Only arrows of nonzero length, N <= P of them. A full-length arrow reaches half a cell. ``origin`` (top, left)
    shifts the panel, e.g. into a :class:`PanelMosaic`.
    """
    top, left = origin
    d_row, d_col = field.directions[orientation]
    drawn = field.lengths[transform, orientation] > 0
    length = field.lengths[transform, orientation][drawn] * (field.spacing / 2)  # (N,)
    positions = field.positions[drawn]
    return _arrow_vertices(positions[:, 1] + left, positions[:, 0] + top, d_col * length,
                           d_row * length, SHAFT_WIDTH * field.image_size)


class PanelMosaic:
    """Square panels of side ``size`` in rows of ``columns`` on one canvas, with a band above each for its title.

    Attributes:
        origins: (top, left) of each panel, pixels of the canvas.
        width, height: of the canvas.
        band: height of the title band above each panel.
    """

    def __init__(self, count: int, size: int, columns: int = 4):
        cols = min(count, columns)
        rows = -(-count // cols)
        gap, self.band = max(2, size // 16), max(6, size // 7)
        self.size = size
        self.width, self.height = cols * size + (cols - 1) * gap, rows * (size + self.band)
        self.origins = [((p // cols) * (size + self.band) + self.band, (p % cols) * (size + gap)) for p in range(count)]

    def background(self, images: list[np.ndarray | None]) -> np.ndarray:
        """``(height, width)`` in [0, 1]: each image ``(C, X, Y)`` as light grey (for arrows), white elsewhere."""
        canvas = np.ones((self.height, self.width), dtype=np.float32)
        for (top, left), image in zip(self.origins, images, strict=True):
            if image is not None:
                grey = to_channels(np.clip(image, 0, 1), 1)[0]
                canvas[top:top + self.size, left:left + self.size] = 0.55 + 0.45 * grey
        return canvas
