"""What ``python -m app.region`` draws over the tissue, as numbers: the probability surface and where it is drawn,
its 0.5 contour, cell outlines and the attention's colour range.

Probability. A cell's probability belongs to its centre. Between centres it is interpolated bilinearly, the way
QuPath and TIAToolbox draw a heat map of tiles, so that the map is one surface instead of a mosaic of squares.
Before that, each cell left out (glass, a mosaic's seams) takes the mean of its evaluated neighbours (3 x 3): the
surface bridges gaps one cell wide, such as the seams between a mosaic's patch centres, and reaches no further.
It is drawn on tissue only (:func:`models.stain.region_tissue_mask`), so glass stays glass. Every step treats the
grid's axes alike, so the surface of a turned or mirrored region is the turned or mirrored surface.

Coordinates are pixel edges of the region at the model's scale: pixel (row, col) spans [col, col + 1) x [row,
row + 1), and cell (i, j)'s centre is at ``(left + (j + 0.5) cell, top + (i + 0.5) cell)`` as ``(x, y)``.
No pictures here: :mod:`app.region.figures` draws these (PNG).
"""

from __future__ import annotations

import contourpy
import numpy as np

from models.stain import region_tissue_mask

from ..cells.evaluation import RegionResult
from ..pictures.map_style import PERCENTILES, colour_lut

__all__ = ["PROBABILITY_OPACITY", "ATTENTION_OPACITY", "filled_cells", "probability_field", "display_tissue", "blend",
           "probability_contour", "cell_outline", "attention_range"]

PROBABILITY_OPACITY = 0.45  # the tissue stays readable under the surface
ATTENTION_OPACITY = 0.75  # strong, and alike for every value (on tissue): its variation is the point of that panel
TISSUE_WINDOW_PX = 11  # region_tissue_mask's window at the model's scale, about a cell nucleus and its cytoplasm


def _neighbour_sum(values: np.ndarray) -> np.ndarray:
    """``(rows, cols)``: the sum over each cell's 3 x 3 neighbourhood, zero beyond the edges."""
    padded = np.pad(values, 1)
    rows, cols = values.shape
    return sum(padded[di:di + rows, dj:dj + cols] for di in range(3) for dj in range(3))


def filled_cells(positive: np.ndarray) -> np.ndarray:
    """``(rows, cols)``: evaluated cells' values; each other cell the mean of its evaluated 3 x 3 neighbours (NaN
    where it has none)."""
    finite = np.isfinite(positive)
    sums = _neighbour_sum(np.where(finite, positive, 0.0))
    counts = _neighbour_sum(finite.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, positive, np.where(counts > 0, sums / counts, np.nan))


def _axis(size: int, scale: float, origin: int, cell: int, count: int):
    """For each displayed pixel along one axis: the cell under its centre (-1 outside the grid), the two cells
    whose centres it lies between, and the weight of the second."""
    centre = (np.arange(size) + 0.5) * scale - origin  # displayed pixel centre, in edges past the grid's start
    own = np.floor(centre / cell).astype(int)
    own[(own < 0) | (own >= count)] = -1
    u = centre / cell - 0.5  # 0 at the first cell's centre
    low = np.floor(u).astype(int)
    return own, np.clip(low, 0, count - 1), np.clip(low + 1, 0, count - 1), u - low


def probability_field(result: RegionResult, shape: tuple[int, int], scale: float) -> np.ndarray:
    """``shape`` float64: P(last class) interpolated between cell centres, at pixels ``scale`` model pixels wide.

    Bilinear between the four nearest centres, over those that have a value only (their weights renormalised),
    and constant beyond the outermost centres; NaN where the cell under a pixel has no value even after
    :func:`filled_cells`, and outside the grid.
    """
    grid = result.grid
    cells = filled_cells(result.positive)
    valid = np.isfinite(cells)
    values = np.where(valid, cells, 0.0)
    top, left = grid.cell_origin(0, 0)
    own_i, i0, i1, wi = _axis(shape[0], scale, top, grid.cell, grid.rows)
    own_j, j0, j1, wj = _axis(shape[1], scale, left, grid.cell, grid.cols)
    total = np.zeros(shape)
    weight = np.zeros(shape)
    for i, a in ((i0, 1 - wi), (i1, wi)):
        for j, b in ((j0, 1 - wj), (j1, wj)):
            w = np.outer(a, b) * valid[np.ix_(i, j)]
            total += w * values[np.ix_(i, j)]
            weight += w
    inside = np.outer(own_i >= 0, own_j >= 0) & valid[np.ix_(np.maximum(own_i, 0), np.maximum(own_j, 0))]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(inside & (weight > 0), total / weight, np.nan)


def display_tissue(rgb: np.ndarray, scale: float) -> np.ndarray:
    """Boolean ``(h, w)``: tissue among displayed pixels (uint8 ``(h, w, 3)``, each ``scale`` model pixels wide)."""
    window = max(1, round(TISSUE_WINDOW_PX / max(scale, 1.0))) | 1  # odd: centred on the pixel
    return region_tissue_mask(rgb, window=window)


def blend(rgb: np.ndarray, values: np.ndarray, alpha: np.ndarray, low: float, high: float, cmap: str) -> np.ndarray:
    """uint8 ``(h, w, 3)``: ``values`` coloured by ``cmap`` over [low, high] (clipped), over ``rgb`` with ``alpha``
    per pixel (0 where a value is NaN)."""
    finite = np.isfinite(values)
    t = np.clip((np.where(finite, values, low) - low) / (high - low), 0.0, 1.0)
    colours = colour_lut(cmap)[np.round(t * 255).astype(np.intp)]
    a = np.where(finite, alpha, 0.0)[..., None]
    mixed = (1.0 - a) * (rgb.astype(np.float64) / 255.0) + a * colours
    return np.round(np.clip(mixed, 0.0, 1.0) * 255).astype(np.uint8)


def probability_contour(result: RegionResult, level: float = 0.5) -> list[np.ndarray]:
    """Lines ``(N, 2)`` of ``(x, y)`` where the surface crosses ``level``: between adjacent cell centres (of
    :func:`filled_cells`) on either side of it, at the linearly interpolated point; none across missing cells."""
    grid = result.grid
    cells = filled_cells(result.positive)
    if np.isfinite(cells).sum() < 2:
        return []
    top, left = grid.cell_origin(0, 0)
    x = left + (np.arange(grid.cols) + 0.5) * grid.cell
    y = top + (np.arange(grid.rows) + 0.5) * grid.cell
    generator = contourpy.contour_generator(x, y, np.ma.masked_invalid(cells), name="serial",
                                            line_type=contourpy.LineType.Separate)
    return [np.asarray(line, dtype=np.float64) for line in generator.lines(level) if len(line) > 1]


def cell_outline(mask: np.ndarray, top: float, left: float, cell: float) -> np.ndarray:
    """``(N, 2, 2)`` segments ``((x0, y0), (x1, y1))`` along the border of the True cells of ``mask``, whose cell
    (0, 0) has its top-left corner at (left, top)."""
    padded = np.pad(mask, 1)
    # Horizontal edges: edge i lies above cell row i (i = rows: below the last), between padded rows i and i+1.
    i, j = np.nonzero(padded[:-1, 1:-1] != padded[1:, 1:-1])
    y, x = top + i * cell, left + j * cell
    horizontal = np.stack([np.stack([x, y], -1), np.stack([x + cell, y], -1)], 1)
    i, j = np.nonzero(padded[1:-1, :-1] != padded[1:-1, 1:])
    y, x = top + i * cell, left + j * cell
    vertical = np.stack([np.stack([x, y], -1), np.stack([x, y + cell], -1)], 1)
    return np.concatenate([horizontal, vertical]).astype(np.float64).reshape(-1, 2, 2)


def attention_range(values: np.ndarray, tissue: np.ndarray | None = None) -> tuple[float, float]:
    """The colour range of an attention map: the 2nd and 98th percentiles of its finite values on ``tissue``
    (of all its finite values where none is on tissue), widened a little when they coincide."""
    finite = np.isfinite(values)
    chosen = values[finite & tissue] if tissue is not None and (finite & tissue).any() else values[finite]
    if not chosen.size:
        return 0.0, 1.0
    low, high = (float(v) for v in np.percentile(chosen, PERCENTILES))
    if not high > low:
        high = low + max(abs(low) * 1e-3, 1e-6)
    return low, high
