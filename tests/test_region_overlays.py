"""Region mode's overlays (:mod:`app.region.overlays`), which ``python -m app.region --out`` draws: the probability
as one surface through the cells' centres and its p = 0.5 contour, on results made without a network."""

from __future__ import annotations

import numpy as np

from app.cells.evaluation import RegionResult, make_grid
from app.region.overlays import probability_contour, probability_field


def synthetic(p: np.ndarray, image: np.ndarray) -> RegionResult:
    """A RegionResult without a network: ``p`` per cell (NaN: not evaluated) over ``image`` ``(3, H, W)``."""
    grid = make_grid(*image.shape[1:])
    assert p.shape == (grid.rows, grid.cols)
    attention = np.random.default_rng(1).random(image.shape[1:]).astype(np.float32)
    return RegionResult(image=image, grid=grid, tissue=np.isfinite(p).astype(float), evaluated=np.isfinite(p),
                        probabilities=np.stack([1 - p, p], -1), attentions={"spatial": attention}, attention_layer="c1",
                        class_names=("no_tumor", "tumor"), method="crops", microns_per_pixel=0.972,
                        model_microns_per_pixel=0.972, seconds=0.0)


def test_the_surface_is_each_cells_probability_at_its_centre_and_contiguous_between():
    p = np.random.default_rng(0).random((4, 6))
    p[1, 2] = np.nan  # left out: its neighbours fill it
    result = synthetic(p, np.ones((3, 192, 256), np.float32))
    field = probability_field(result, (192, 256), 1.0)
    grid = result.grid
    # Pixels 32 wide: displayed pixel (i + 1, j + 1) is centred on cell (i, j)'s centre (the grid starts at 32).
    at_centres = probability_field(result, (6, 8), 32.0)[1:5, 1:7]
    finite = np.isfinite(p)
    np.testing.assert_allclose(at_centres[finite], p[finite], atol=1e-12)
    top, left = grid.cell_origin(0, 0)
    inside = field[top:top + 4 * 32, left:left + 6 * 32]
    assert np.isfinite(inside).all(), "one surface: no hole where a single cell is missing"
    assert np.abs(np.diff(inside, axis=1)).max() < np.nanmax(np.abs(np.diff(p, axis=1))) / 32 * 2.01, "no jumps"
    assert np.isnan(field[:top]).all() and np.isnan(field[:, :left]).all(), "nothing outside the grid"


def test_the_half_contour_crosses_between_cells_on_either_side_of_one_half():
    p = np.random.default_rng(2).random((7, 8))
    p[3, 3] = np.nan
    result = synthetic(p, np.ones((3, 288, 320), np.float32))
    cells = np.where(np.isfinite(p), p, 0.5)
    cells[3, 3] = np.nanmean(p[2:5, 2:5])  # the filled value the surface uses there
    grid = result.grid
    top, left = grid.cell_origin(0, 0)
    lines = probability_contour(result)
    assert lines and sum(len(line) for line in lines) > 10
    for x, y in np.concatenate(lines):
        u, v = (x - left) / grid.cell - 0.5, (y - top) / grid.cell - 0.5  # in cell-centre units
        if abs(u - round(u)) < 1e-9:
            j, i = round(u), int(np.floor(v))
            a, b, t = cells[i, j], cells[i + 1, j], v - i
        else:
            assert abs(v - round(v)) < 1e-9, f"({x}, {y}) is not on a line between cell centres"
            i, j = round(v), int(np.floor(u))
            a, b, t = cells[i, j], cells[i, j + 1], u - j
        assert min(a, b) <= 0.5 <= max(a, b), f"({x}, {y}) between {a:.3f} and {b:.3f}"
        np.testing.assert_allclose(a + t * (b - a), 0.5, atol=1e-9)
