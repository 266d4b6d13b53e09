"""A slide's tumour regions as QuPath reads them: GeoJSON annotations of valid polygons, with holes.

A region is a 4-connected set of evaluated cells at or above the threshold. Its outline is the union of its cells'
squares, made in the grid's own integer coordinates (a cell (i, j) is the square from column j to j + 1 and row i
to i + 1), where shared edges cancel exactly, and only then mapped onto level-0 pixels: cells that share an edge in
the slide's pixels (62.3 pixels a side on the CMU slide, not a whole number) would otherwise meet at coordinates
that differ in their last bits. The outline is one polygon, its holes the glass or lower-probability cells that it
encloses; a hole may touch the outline at a corner, as OGC's rules (and JTS, QuPath's geometry library) allow, and
no vertex lies in the middle of a straight edge. Squares that share edges, what the export wrote before, are a
self-intersecting MultiPolygon to shapely and JTS.
"""

from __future__ import annotations

import json

import numpy as np
import shapely
from shapely import affinity
from shapely.geometry import mapping
from shapely.geometry.polygon import orient

__all__ = ["tumour_regions", "region_outline", "cell_runs", "connected_runs", "connected_regions", "AREA",
           "TUMOUR_COLOUR"]

TUMOUR_COLOUR = (200, 0, 0)
AREA = "Area µm^2"  # QuPath's own name for an annotation's area in micrometres squared


def cell_runs(selected: np.ndarray) -> np.ndarray:
    """``(n, 3)`` int64: each row's runs of consecutive cells of the ``(rows, cols)`` bool ``selected``, as (row,
    first column, column after the last), in row-major order."""
    rows, cols = selected.shape
    padded = np.zeros((rows, cols + 2), dtype=np.int8)
    padded[:, 1:-1] = selected
    steps = np.diff(padded, axis=1)  # (rows, cols + 1): +1 where a run starts, -1 just after it ends
    run_rows, starts = np.nonzero(steps == 1)
    _, stops = np.nonzero(steps == -1)  # row-major, as the starts: the k-th stop ends the k-th run
    return np.stack([run_rows, starts, stops], axis=1).astype(np.int64)


def connected_runs(runs: np.ndarray) -> list[np.ndarray]:
    """The 4-connected regions of the cells in ``runs`` (:func:`cell_runs`), each as its runs, in the order of their
    first cell in row-major order. Two runs of neighbouring rows are of one region where their columns overlap
    (a shared edge; a shared corner is not enough)."""
    parent = list(range(len(runs)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    first_of_row = {}  # row -> its first run; a row's runs are consecutive and sorted by column
    for k, row in enumerate(runs[:, 0].tolist()):
        first_of_row.setdefault(row, k)
    for row, first in first_of_row.items():
        below = first_of_row.get(row + 1)
        if below is None:
            continue
        a, b = first, below
        while a < len(runs) and runs[a, 0] == row and b < len(runs) and runs[b, 0] == row + 1:
            if runs[a, 1] < runs[b, 2] and runs[b, 1] < runs[a, 2]:
                parent[root(b)] = root(a)
            if runs[a, 2] <= runs[b, 2]:  # the run that ends first meets nothing further on
                a += 1
            else:
                b += 1
    labels = np.array([root(k) for k in range(len(runs))], dtype=np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first)  # regions in the order of their first run, which holds their first cell
    return [runs[inverse == label] for label in order]


def connected_regions(selected: np.ndarray) -> list[list[tuple[int, int]]]:
    """The 4-connected regions of the ``(rows, cols)`` bool ``selected``, each as its cells ``(i, j)`` in row-major
    order, the regions in the order of their first cell."""
    return [[(int(i), j) for i, start, stop in region.tolist() for j in range(start, stop)]
            for region in connected_runs(cell_runs(selected))]


def region_outline(runs: np.ndarray) -> shapely.Polygon | shapely.MultiPolygon:
    """The union of the cells of ``runs`` (:func:`cell_runs`) in grid coordinates (x the column, y the row): a valid
    polygon with its holes for a 4-connected region, its exterior counter-clockwise in (x, y) as numbers (GeoJSON's
    rule), no vertex in the middle of a straight edge."""
    rows, starts, stops = runs.T
    lengths = stops - starts
    i = np.repeat(rows, lengths)
    j = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    # The cells' squares are a coverage (they meet only along whole edges, at shared vertices), whose union GEOS
    # makes by dropping the edges two squares share: 8 times faster than a general union of the squares (or of the
    # rows' runs), measured on 64,000 cells.
    union = shapely.coverage_union_all(shapely.box(j, i, j + 1, i + 1))
    union = shapely.simplify(union, 0)  # tolerance 0 drops only the vertices on straight edges
    if isinstance(union, shapely.Polygon):
        return orient(union)
    return shapely.MultiPolygon([orient(part) for part in union.geoms])


def tumour_regions(probability: np.ndarray, evaluated: np.ndarray, corners: np.ndarray, size: tuple[float, float],
                   microns_per_pixel: float, threshold: float = 0.5, metadata: dict[str, str] | None = None) -> dict:
    """A GeoJSON FeatureCollection of the 4-connected regions of evaluated cells at or above ``threshold``: each an
    annotation classified "Tumor", a valid polygon with holes in level-0 pixels, its mean tumour probability, its
    cell count and its area in µm² (:data:`AREA`) as measurements, and ``metadata`` (what made it: the precision,
    ...) as strings QuPath reads into each annotation's metadata; the collection carries ``metadata`` too, as its
    ``properties`` (a member GeoJSON allows and QuPath ignores), so that a slide without regions names it.

    Args:
        probability: ``(rows, cols)`` tumour probability per cell.
        evaluated: ``(rows, cols)`` bool, the cells evaluated.
        corners: ``(rows, cols, 2)`` each cell's top-left (row, col) in level-0 pixels, a regular grid (the first
            cell's corner and ``size`` place every cell); ``size``: a cell's (rows, cols) there.
        microns_per_pixel: of level 0.
        metadata: names and string values (none by default).
    """
    metadata = {str(name): str(value) for name, value in (metadata or {}).items()}
    tumour = evaluated & (np.nan_to_num(probability) >= threshold)
    top, left = (float(v) for v in corners[0, 0])
    height, width = (float(v) for v in size)
    # Each row's running sum of probabilities: a run's sum is two lookups.
    sums = np.concatenate([np.zeros((tumour.shape[0], 1)), np.cumsum(np.where(tumour, probability, 0), axis=1)], 1)
    features = []
    for runs in connected_runs(cell_runs(tumour)):
        outline = affinity.affine_transform(region_outline(runs), [width, 0, 0, height, left, top])
        rows, starts, stops = runs.T
        cells = int((stops - starts).sum())
        mean = float((sums[rows, stops] - sums[rows, starts]).sum() / cells)
        measurements = {"Mean tumour probability": mean, "Cells": cells, AREA: outline.area * microns_per_pixel ** 2}
        geometry = json.loads(json.dumps(mapping(outline)))  # shapely's tuples as GeoJSON's lists
        properties = dict(objectType="annotation", classification=dict(name="Tumor", color=list(TUMOUR_COLOUR)),
                          measurements=measurements)
        if metadata:
            properties["metadata"] = dict(metadata)
        features.append(dict(type="Feature", geometry=geometry, properties=properties))
    return dict(type="FeatureCollection", features=features, **({"properties": metadata} if metadata else {}))
