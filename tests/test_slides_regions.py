"""The tumour regions of ``python -m app.slides``'s GeoJSON (:mod:`app.slides.regions`): valid polygons with holes, as
QuPath (JTS) and shapely read them, each the union of its cells, with its area in µm².

On the CMU slide, the cells are the real grid's, and the evaluated cells the engine's own (its tissue mask and each
chunk's tissue share, exactly as a run evaluates them); the probabilities are a seeded smooth random field, not the
model's: the model over the whole slide takes 30 s here (2-core AMD EPYC), too long for the suite, and the geometry
depends only on which cells are at or above 0.5."""

from __future__ import annotations

import json

import numpy as np
import pytest
import shapely
from shapely.geometry import Point, shape
from test_slides_engine import CHECKPOINT

from app.cells.evaluation import TISSUE_SHARE, RegionGrid, cell_tissue
from app.slides.engine import read_chunk
from app.slides.reader import open_slide
from app.slides.regions import AREA, cell_runs, connected_regions, connected_runs, region_outline, tumour_regions
from app.slides.run import plan_slide
from tests.conftest import REPO, require_shared

CMU = REPO.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"


def unit_grid(rows: int, cols: int, side: float = 10.0) -> np.ndarray:
    """``(rows, cols, 2)`` top-left corners of cells ``side`` pixels a side, from (0, 0)."""
    return np.stack(np.meshgrid(np.arange(rows) * side, np.arange(cols) * side, indexing="ij"), -1)


def flood_fill_regions(selected: np.ndarray) -> list[list[tuple[int, int]]]:
    """The 4-connected regions cell by cell, by a flood fill (the plain way, against the runs' labelling), each
    region's cells in row-major order, the regions in the order of their first cell."""
    seen, regions = np.zeros(selected.shape, dtype=bool), []
    for start in zip(*np.nonzero(selected), strict=True):
        if seen[start]:
            continue
        seen[start], stack, region = True, [start], []
        while stack:
            i, j = stack.pop()
            region.append((int(i), int(j)))
            for a, b in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)):
                if 0 <= a < selected.shape[0] and 0 <= b < selected.shape[1] and selected[a, b] and not seen[a, b]:
                    seen[a, b] = True
                    stack.append((a, b))
        regions.append(sorted(region))
    return regions


def no_vertex_on_a_straight_edge(ring) -> bool:
    """Whether each vertex of the closed ``ring`` turns: no two consecutive edges lie on one line (a square's edge
    shared with a neighbour would leave such a vertex, or a zero-width sliver)."""
    points = np.array(ring.coords)[:-1]
    before, after = points - np.roll(points, 1, axis=0), np.roll(points, -1, axis=0) - points
    return bool(np.all(np.abs(before[:, 0] * after[:, 1] - before[:, 1] * after[:, 0]) > 0))


def test_tumour_regions_are_4_connected_cells_with_their_mean_and_area():
    probability = np.array([[0.9, 0.8, 0.1], [0.1, 0.1, 0.7], [0.6, 0.2, 0.95]])
    evaluated = np.ones((3, 3), dtype=bool)
    regions = tumour_regions(probability, evaluated, unit_grid(3, 3), (10.0, 10.0), 0.5)["features"]
    found = sorted((f["properties"]["measurements"]["Cells"], round(f["properties"]["measurements"][
        "Mean tumour probability"], 3), f["properties"]["measurements"][AREA]) for f in regions)
    assert found == [(1, 0.6, 25.0), (2, 0.825, 50.0), (2, 0.85, 50.0)], "a cell is 10 px = 5 µm a side"
    first = regions[0]  # in the order of their first cells: (0, 0) and (0, 1)
    assert first["geometry"]["type"] == "Polygon", "two cells sharing an edge are one polygon"
    assert sorted(map(tuple, first["geometry"]["coordinates"][0][:-1])) == [(0, 0), (0, 10), (20, 0), (20, 10)], \
        "x is the column, y the row; no vertex where the two squares met"
    assert all(f["properties"]["classification"]["name"] == "Tumor" for f in regions)


def test_a_ring_of_tumour_cells_is_a_polygon_with_its_hole():
    probability = np.full((5, 5), 0.9)
    probability[2, 2] = 0.1  # the ring's middle, below the threshold
    probability[0, :] = probability[:, 0] = 0.2  # a frame of normal cells around the ring
    evaluated = np.ones((5, 5), dtype=bool)
    evaluated[2, 2] = False
    (ring,) = tumour_regions(probability, evaluated, unit_grid(5, 5) + 3.0, (8.0, 6.0), 0.25)["features"]
    polygon = shape(ring["geometry"])
    assert polygon.is_valid and ring["geometry"]["type"] == "Polygon"
    assert len(polygon.interiors) == 1 and shapely.Polygon(polygon.interiors[0]).area == 8 * 6
    assert polygon.exterior.bounds == (3 + 6 * 1, 3 + 8 * 1, 3 + 6 * 5, 3 + 8 * 5), "corners from the first cell's"
    assert len(polygon.exterior.coords) == len(polygon.interiors[0].coords) == 5, "squares, four corners each"
    assert ring["properties"]["measurements"]["Cells"] == 15
    assert ring["properties"]["measurements"][AREA] == pytest.approx(15 * (8 * 0.25) * (6 * 0.25), rel=1e-12)


def test_a_hole_that_touches_the_outline_at_a_corner_is_still_valid():
    selected = np.array([[1, 1, 1], [1, 0, 1], [1, 1, 0]], dtype=bool)  # the hole (1, 1) meets the outside at (2, 2)
    runs = cell_runs(selected)
    assert runs.tolist() == [[0, 0, 3], [1, 0, 1], [1, 2, 3], [2, 0, 2]], "(row, first column, column after the last)"
    assert [len(region) for region in connected_runs(runs)] == [4]
    outline = region_outline(runs)
    assert outline.is_valid and isinstance(outline, shapely.Polygon) and len(outline.interiors) == 1
    assert outline.area == selected.sum() and shapely.is_ccw(outline.exterior)


def test_regions_that_touch_only_at_a_corner_are_two():
    selected = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=bool)
    assert connected_regions(selected) == [[(0, 0), (0, 1), (1, 0)], [(1, 2), (2, 1), (2, 2)], [(3, 3)]]
    evaluated = np.ones(selected.shape, dtype=bool)
    features = tumour_regions(selected * 0.75, evaluated, unit_grid(4, 4), (10.0, 10.0), 1.0)["features"]
    assert [f["properties"]["measurements"]["Cells"] for f in features] == [3, 3, 1]
    assert all(shape(f["geometry"]).is_valid and f["geometry"]["type"] == "Polygon" for f in features)
    assert [f["properties"]["measurements"]["Mean tumour probability"] for f in features] == [0.75] * 3


@pytest.fixture(scope="module")
def cmu_cells(tmp_path_factory):
    """The CMU slide's plan and the cells a run evaluates on it (tissue mask, then each chunk's tissue share)."""
    slide_path = require_shared(CMU, f"{CMU} not found (the real slides live in ../shared/data/slides)")
    plan = plan_slide(slide_path, CHECKPOINT, tmp_path_factory.mktemp("store"))
    grid = plan.grid
    evaluated = np.zeros((grid.cells.rows, grid.cells.cols), dtype=bool)
    with open_slide(slide_path) as slide:
        for ci, cj in plan.chunks:
            i0, i1, j0, j1 = grid.cell_block(ci, cj)
            local = RegionGrid(i1 - i0, j1 - j0, 0, 0, grid.cells.cell, grid.cells.context)
            evaluated[i0:i1, j0:j1] = cell_tissue(read_chunk(slide, grid, ci, cj), local) >= TISSUE_SHARE
    return plan, evaluated


def smooth_field(shape_: tuple[int, int], seed: int = 68) -> np.ndarray:
    """A probability per cell in (0, 1), smooth over a few cells: islands of cells above 0.5, some with holes."""
    z = np.random.default_rng(seed).normal(size=shape_)
    for _ in range(2):
        padded = np.pad(z, 1, mode="edge")
        z = sum(padded[a:a + shape_[0], b:b + shape_[1]] for a in range(3) for b in range(3)) / 9
    return 1 / (1 + np.exp(-8 * z))


def test_the_cmu_slides_regions_are_valid_polygons_of_their_cells(cmu_cells):
    plan, evaluated = cmu_cells
    assert evaluated.shape == (45, 33) and evaluated.sum() == 707, "the cells a run of the CMU slide evaluates"
    probability = smooth_field(evaluated.shape)
    corners, size, mpp = plan.grid.cell_top_left_px(), plan.grid.cell_size_px(), plan.scale.microns_per_pixel
    assert size[0] != round(size[0]), "a cell is not a whole number of level-0 pixels: the float case"
    exported = json.loads(json.dumps(tumour_regions(probability, evaluated, corners, size, mpp)))["features"]
    tumour = evaluated & (probability >= 0.5)
    regions = flood_fill_regions(tumour)
    assert connected_regions(tumour) == regions
    assert len(exported) == len(regions) >= 10
    holes, squares_invalid = 0, 0
    for feature, cells in zip(exported, regions, strict=True):
        polygon = shape(feature["geometry"])
        assert feature["geometry"]["type"] == "Polygon" and polygon.is_valid, shapely.is_valid_reason(polygon)
        assert all(no_vertex_on_a_straight_edge(ring) for ring in [polygon.exterior, *polygon.interiors])
        holes += len(polygon.interiors)
        area = feature["properties"]["measurements"][AREA]
        assert area == pytest.approx(len(cells) * size[0] * size[1] * mpp ** 2, rel=1e-9)
        assert feature["properties"]["measurements"]["Cells"] == len(cells)
        # The polygon is its cells: each centre in its bounds is inside exactly when the cell is in the region.
        rows, cols = zip(*cells, strict=True)
        inside = {(i, j) for i in range(min(rows), max(rows) + 1) for j in range(min(cols), max(cols) + 1)
                  if polygon.contains(Point(corners[i, j, 1] + size[1] / 2, corners[i, j, 0] + size[0] / 2))}
        assert inside == set(cells)
        # What the export wrote before: a MultiPolygon of the cells' squares, sharing edges.
        old = shapely.MultiPolygon([shapely.box(corners[i, j, 1], corners[i, j, 0], corners[i, j, 1] + size[1],
                                                corners[i, j, 0] + size[0]) for i, j in cells])
        squares_invalid += not old.is_valid
    assert holes >= 1, "the field makes islands with holes: the case of interiors is exercised"
    assert squares_invalid >= len(regions) // 2, "the squares of a region with shared edges are invalid"


def test_the_runs_labelling_is_the_flood_fills_on_random_masks():
    rng = np.random.default_rng(3)
    for _ in range(200):
        selected = rng.random((rng.integers(1, 30), rng.integers(1, 30))) < rng.random()
        assert connected_regions(selected) == flood_fill_regions(selected)
