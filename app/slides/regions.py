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
from collections import deque

import numpy as np
import shapely
from shapely import affinity
from shapely.geometry import box, mapping
from shapely.geometry.polygon import orient

__all__ = ["tumour_regions", "region_outline", "connected_regions", "AREA", "TUMOUR_COLOUR"]

TUMOUR_COLOUR = (200, 0, 0)
AREA = "Area µm^2"  # QuPath's own name for an annotation's area in micrometres squared


def connected_regions(selected: np.ndarray) -> list[list[tuple[int, int]]]:
    """The 4-connected regions of the ``(rows, cols)`` bool ``selected``, each as its cells ``(i, j)``, in the order
    of their first cell in row-major order."""
    label = np.zeros(selected.shape, dtype=bool)
    regions = []
    for start in map(tuple, np.argwhere(selected)):
        if label[start]:
            continue
        label[start] = True
        region, queue = [], deque([start])
        while queue:
            i, j = queue.popleft()
            region.append((int(i), int(j)))
            for a, b in ((i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)):
                if 0 <= a < selected.shape[0] and 0 <= b < selected.shape[1] and selected[a, b] and not label[a, b]:
                    label[a, b] = True
                    queue.append((a, b))
        regions.append(region)
    return regions


def region_outline(cells: list[tuple[int, int]]) -> shapely.Polygon | shapely.MultiPolygon:
    """The union of cells ``(i, j)`` in grid coordinates (x the column, y the row): a valid polygon with its holes
    for a 4-connected region, its exterior counter-clockwise in (x, y) as numbers (GeoJSON's rule), no vertex in
    the middle of a straight edge."""
    runs = []  # each row's runs of consecutive cells as one rectangle: fewer pieces for the union
    for i in sorted({i for i, _ in cells}):
        columns = sorted(j for row, j in cells if row == i)
        first = previous = columns[0]
        for j in columns[1:] + [None]:
            if j is not None and j == previous + 1:
                previous = j
                continue
            runs.append(box(first, i, previous + 1, i + 1))
            if j is not None:
                first = previous = j
    union = shapely.simplify(shapely.union_all(runs), 0)  # tolerance 0 drops only the vertices on straight edges
    if isinstance(union, shapely.Polygon):
        return orient(union)
    return shapely.MultiPolygon([orient(part) for part in union.geoms])


def tumour_regions(probability: np.ndarray, evaluated: np.ndarray, corners: np.ndarray, size: tuple[float, float],
                   microns_per_pixel: float, threshold: float = 0.5) -> dict:
    """A GeoJSON FeatureCollection of the 4-connected regions of evaluated cells at or above ``threshold``: each an
    annotation classified "Tumor", a valid polygon with holes in level-0 pixels, its mean tumour probability, its
    cell count and its area in µm² (:data:`AREA`) as measurements.

    Args:
        probability: ``(rows, cols)`` tumour probability per cell.
        evaluated: ``(rows, cols)`` bool, the cells evaluated.
        corners: ``(rows, cols, 2)`` each cell's top-left (row, col) in level-0 pixels, a regular grid (the first
            cell's corner and ``size`` place every cell); ``size``: a cell's (rows, cols) there.
        microns_per_pixel: of level 0.
    """
    tumour = evaluated & (np.nan_to_num(probability) >= threshold)
    top, left = (float(v) for v in corners[0, 0])
    height, width = (float(v) for v in size)
    features = []
    for region in connected_regions(tumour):
        outline = affinity.affine_transform(region_outline(region), [width, 0, 0, height, left, top])
        mean = float(np.mean([probability[i, j] for i, j in region]))
        measurements = {"Mean tumour probability": mean, "Cells": len(region),
                        AREA: outline.area * microns_per_pixel ** 2}
        geometry = json.loads(json.dumps(mapping(outline)))  # shapely's tuples as GeoJSON's lists
        features.append(dict(type="Feature", geometry=geometry,
                             properties=dict(objectType="annotation",
                                             classification=dict(name="Tumor", color=list(TUMOUR_COLOUR)),
                                             measurements=measurements)))
    return dict(type="FeatureCollection", features=features)
