"""Which of a slide's chunks come first: a spread-out order over the slide (:func:`spread_order`, coarse to fine), a
viewer's view as the browser sends it made safe (:func:`clamp_view`), and the chunks a view meets in the order they go
first (:class:`ChunkLayout`), in level-0 pixels of the slide as its plan sees it (a moved slide's own pixels): all
functions of a plan's grid and chunks, used by :mod:`app.slides.schedule` and by the cohort (:mod:`app.slides.cohort`).
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["spread_order", "clamp_view", "chunk_edges", "ChunkLayout", "Index", "View"]

Index = tuple[int, int]
View = tuple[float, float, float, float]


def spread_order(chunks: Iterable[Index], first: Index | None = None) -> list[Index]:
    """``chunks`` in a coarse-to-fine order over the square of their index range: one chunk (``first``, else the one
    nearest the centre), then one in each quarter that holds any, then one in each sixteenth that lacks one, ...
    halving, until every chunk is listed. After the blocks of one level are served, every block of that level that
    holds chunks has exactly one listed, so the first k chunks are spread over the slide: no block of a level gets a
    second before every block of it has one. Within a level the blocks come in bit-reversed quadrant order
    (consecutive ones in different quarters); within a block, the chunk nearest its centre."""
    chunks = sorted(set(chunks))
    if not chunks:
        return []
    rows = [ci for ci, _ in chunks]
    cols = [cj for _, cj in chunks]
    r0, c0, r_end, c_end = min(rows), min(cols), max(rows) + 1, max(cols) + 1
    depth = (max(r_end - r0, c_end - c0) - 1).bit_length()  # 2 ** depth >= the side of the index range
    chosen: set[Index] = set()
    order: list[Index] = []
    if first is not None and first in chunks:
        chosen.add(first)
        order.append(first)
    for level in range(depth + 1):
        size = 1 << (depth - level)  # the blocks' side in chunks
        blocks: dict[Index, list[Index]] = {}
        for index in chunks:
            blocks.setdefault(((index[0] - r0) // size, (index[1] - c0) // size), []).append(index)
        for block in sorted(blocks, key=lambda b, level=level: _quadrant_key(*b, level)):
            members = blocks[block]
            if any(index in chosen for index in members):
                continue
            top, left = r0 + block[0] * size, c0 + block[1] * size
            centre = ((top + min(top + size, r_end) - 1) / 2, (left + min(left + size, c_end) - 1) / 2)
            pick = min(members, key=lambda m, c=centre: ((m[0] - c[0]) ** 2 + (m[1] - c[1]) ** 2, m))
            chosen.add(pick)
            order.append(pick)
    return order


# A 2 x 2 block's quarters in the order that puts the second far from the first: top left, bottom right, top right,
# bottom left.
_QUADRANT_DIGIT = {(0, 0): 0, (1, 1): 1, (0, 1): 2, (1, 0): 3}


def _quadrant_key(bi: int, bj: int, level: int) -> int:
    """Block (bi, bj) of a level of 2**level x 2**level blocks, as a base-4 number whose leading digit is the quarter
    of its finest bit: blocks in key order jump between the slide's quarters (bit reversal in two dimensions)."""
    key = 0
    for bit in range(level):
        key = key * 4 + _QUADRANT_DIGIT[(bi >> bit) & 1, (bj >> bit) & 1]
    return key


def clamp_view(view, size: tuple[int, int]) -> View | None:
    """A view ``(left, top, width, height)`` in level-0 pixels, from a browser and so not trusted, clamped to a slide
    of ``size`` ``(rows, cols)``: each edge moved inside ``[0, cols] x [0, rows]`` (a negative width or height
    counts from the other edge; an infinite or huge one reaches the slide's edge), as ``(left, top, width, height)``
    floats, of zero area where the view is off the slide. None where it is not four numbers, or an edge is NaN (text,
    a wrong length, NaN): no view. A mapping with ``left``, ``top``, ``width`` and ``height`` is read as well."""
    if isinstance(view, dict):
        view = [view.get(name) for name in ("left", "top", "width", "height")]
    try:
        values = list(view)
    except TypeError:
        return None
    if len(values) != 4 or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return None
    try:
        left, top, width, height = (float(value) for value in values)
    except OverflowError:  # an integer beyond any float: no view
        return None
    rows, cols = size
    edges = []
    for start, extent, limit in ((left, width, cols), (top, height, rows)):
        end = start + extent
        if math.isnan(start) or math.isnan(end):
            return None
        low, high = sorted((min(max(start, 0.0), float(limit)), min(max(end, 0.0), float(limit))))
        edges.append((low, high))
    (x0, x1), (y0, y1) = edges
    return x0, y0, x1 - x0, y1 - y0


def chunk_edges(grid) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk row's ``(top, bottom)`` and each chunk column's ``(left, right)`` in level-0 pixels of the slide as
    the grid sees it (a moved slide's own pixels): ``(chunk rows, 2)`` and ``(chunk cols, 2)`` float64, from its
    cells' corners (:meth:`app.slides.engine.SlideGrid.cell_top_left_px`)."""
    corners = grid.cell_top_left_px()  # (rows, cols, 2)
    cell_rows, cell_cols = grid.cell_size_px()
    row_spans, col_spans = grid.chunk_spans
    rows = np.array([(corners[s, 0, 0], corners[s + n - 1, 0, 0] + cell_rows) for s, n in row_spans])
    cols = np.array([(corners[0, s, 1], corners[0, s + n - 1, 1] + cell_cols) for s, n in col_spans])
    return rows, cols


class ChunkLayout:
    """A plan's chunks with tissue where they lie in level-0 pixels, and the order its views put them in
    (:meth:`in_views`; safe from any thread)."""

    def __init__(self, grid, chunks: Sequence[Index]):
        """``grid`` a :class:`app.slides.engine.SlideGrid`, ``chunks`` its chunks with tissue."""
        self.size = grid.size
        self.chunks = tuple(chunks)
        self.rows, self.cols = chunk_edges(grid)
        index = np.array(self.chunks).reshape(-1, 2)
        self.index = index
        self.centres = np.stack([self.rows[index[:, 0]].mean(axis=1), self.cols[index[:, 1]].mean(axis=1)], axis=1)
        # The last few views' orders: a whole slide's spread order is 60 ms for 1,614 chunks with tissue of 101 x 101
        # (the gigapixel slide's grid; 2-core AMD EPYC), and a page sends a view for every pan and zoom.
        self.orders: dict[tuple, list[Index]] = {}
        self.lock = threading.Lock()

    def in_views(self, views: Sequence[View]) -> tuple[list[Index], frozenset[Index]]:
        """The chunks with tissue that meet any of ``views``, in the order they go first (each view's own spread
        order from its centre, the views taking turns), and as a set."""
        per_view = []
        for left, top, width, height in views:
            inside = ((self.rows[self.index[:, 0], 0] < top + height) & (self.rows[self.index[:, 0], 1] > top)
                      & (self.cols[self.index[:, 1], 0] < left + width) & (self.cols[self.index[:, 1], 1] > left))
            if width <= 0 or height <= 0 or not inside.any():
                continue
            positions = np.flatnonzero(inside)
            distance = np.hypot(self.centres[positions, 0] - (top + height / 2),
                                self.centres[positions, 1] - (left + width / 2))
            first = int(positions[np.argmin(distance)])
            memo = (first, positions.tobytes())
            with self.lock:  # two sessions' pages may ask at once
                if memo not in self.orders:  # a small pan, or a zoom within one island, meets the same chunks
                    if len(self.orders) >= 8:
                        self.orders.pop(next(iter(self.orders)))
                    self.orders[memo] = spread_order([self.chunks[p] for p in positions], first=self.chunks[first])
                per_view.append(self.orders[memo])
        order, seen = [], set()
        for turn in range(max((len(o) for o in per_view), default=0)):
            for each in per_view:
                if turn < len(each) and each[turn] not in seen:
                    seen.add(each[turn])
                    order.append(each[turn])
        return order, frozenset(seen)
