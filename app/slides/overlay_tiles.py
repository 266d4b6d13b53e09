"""A slide's overlays as deep-zoom tiles made from its chunk store on request: P(tumour), each reading of the
first attentive layer's attention (``"spatial"``, ``"removed"``, ``"kept"`` = 1 − removed) and the tissue outline,
PNG tiles in RGBA (:mod:`app.slides.overlay_colours`), served beside the slide's tiles
(:mod:`app.slides.overlay_routes`) and drawn by the viewer as tiled layers over the slide. The viewer draws P(tumour)
and the readings from one tile of them all (``"values"``: each one's colour index, :func:`overlay_colours.values_tile`),
coloured in the browser, so that switching between them fetches nothing; the coloured tiles are for any other client
and the tests (the viewer's colours are theirs, tested).

The overlay's pyramid is its own, coarser than the slide's (:class:`OverlayPyramid`): its finest pixel is the
largest power of two of level-0 pixels within one pixel of the stored attention (a cell is 8 of those), so that
nothing finer than what is stored is ever made, and the viewer stretches the finest tiles when zoomed in further.
The slide's own tiles are 254 pixels with an overlap, at every pixel of the slide: with the overlay's pixel 4 level-0
pixels (the CMU slide) or 8 (the gigapixel benchmark slide), the finest level has 16 or 64 times fewer tiles.

A tile is made from the chunks its pixels fall in, and only those: each pixel shows the cell (or the attention
pixel) under its centre. Where a cell is less than four pixels (the coarse levels) and for P(tumour), the tile reads
a cell's value from the analysis's per-cell maps (:class:`app.slides.cell_maps.CellMaps`: one number per cell and
reading, brought up to date from the chunks under the tile, each chunk read once per version, and kept beside the
chunks for the next server); only where a cell is four pixels or more does a tile of attention read its chunks' own
maps (:meth:`app.slides.store.ChunkStore.get`). Tiles are kept (an LRU of :data:`TILE_CACHE_BYTES`) under the
versions of the chunks they show: a chunk that finishes changes only the tiles over it.

The routes name an analysis by its store's key; the page registers its plan (:func:`register`), a few of the latest
kept (:data:`PLANS`).
"""

from __future__ import annotations

import io
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from .cell_maps import SAVE_EVERY, CellMaps, cell_means
from .engine import ATTENTION_POOL, SlideGrid
from .overlay_colours import OUTLINE, REVERSED, coloured, values_tile, waiting_pattern

if TYPE_CHECKING:
    from .run import SlidePlan

__all__ = ["OverlayPyramid", "Overlay", "register", "registered", "overlay_tile", "cell_value", "chunk_rect",
           "first_corner", "pyramid", "KINDS", "READINGS", "VALUES", "TILE", "PLANS", "TILE_CACHE_BYTES",
           "FINE_CELL_PX"]

TILE = 256
READINGS = ("spatial", "removed", "kept")
VALUES = "values"  # every reading at once, as colour indices
KINDS = ("tumour", *READINGS, VALUES, "outline")
PLANS = 16  # analyses the routes know at once: the latest registered
TILE_CACHE_BYTES = 32 * 2**20  # PNG bytes of tiles kept, over every analysis
FINE_CELL_PX = 4  # tile pixels a cell must span before a tile of attention reads the chunks' own maps
GLASS, WAITING, DONE = 0, 1, 2  # a chunk's state


@dataclass(frozen=True)
class OverlayPyramid:
    """The Deep Zoom geometry of a slide's overlays: an image of ``width`` x ``height`` pixels of ``scale`` level-0
    pixels each (a power of two), in :data:`TILE`-pixel tiles without overlap, levels ``min_level`` (the whole image
    in one tile) to ``max_level`` (full resolution), as Deep Zoom numbers them (level L is 2^(max_level − L) times
    smaller)."""

    width: int
    height: int
    scale: int
    max_level: int
    min_level: int

    def level_size(self, level: int) -> tuple[int, int]:
        """``(width, height)`` of ``level`` in pixels."""
        factor = 2 ** (self.max_level - level)
        return math.ceil(self.width / factor), math.ceil(self.height / factor)

    def level_tiles(self, level: int) -> tuple[int, int]:
        """``(cols, rows)`` of tiles of ``level``."""
        width, height = self.level_size(level)
        return math.ceil(width / TILE), math.ceil(height / TILE)

    def pixel_px(self, level: int) -> int:
        """Level-0 pixels across one pixel of ``level``."""
        return self.scale * 2 ** (self.max_level - level)

    def descriptor(self) -> dict:
        """What the viewer needs to draw the overlays as a tiled layer (OpenSeadragon's custom tile source)."""
        return dict(width=self.width, height=self.height, tileSize=TILE, minLevel=self.min_level,
                    maxLevel=self.max_level, scale=self.scale)


def pyramid(grid: SlideGrid) -> OverlayPyramid:
    """The overlay pyramid of ``grid`` (:class:`OverlayPyramid`)."""
    attention_px = min(grid.cell_size_px()) * ATTENTION_POOL / grid.cells.cell  # level-0 px of a stored pixel
    scale = 2 ** max(0, math.floor(math.log2(max(attention_px, 1.0))))
    rows, cols = grid.size
    width, height = math.ceil(cols / scale), math.ceil(rows / scale)
    max_level = math.ceil(math.log2(max(width, height, 2)))
    min_level = max(0, max_level - math.ceil(math.log2(max(width, height, TILE) / TILE)))
    return OverlayPyramid(width, height, scale, max_level, min_level)


def _axis(grid: SlideGrid, axis: int, positions: np.ndarray, step: float) -> np.ndarray:
    """The index along ``axis`` (0: rows, 1: columns) of what lies at level-0 ``positions`` on a lattice of
    ``step`` model pixels from the grid's first cell (a cell: ``step`` = 32), -1 outside the grid."""
    origin = grid.cells.cell_origin(0, 0)[axis]
    model = positions * grid.model_size[axis] / grid.size[axis]
    index = np.floor((model - origin) / step).astype(np.int64)
    count = (grid.cells.rows, grid.cells.cols)[axis] * grid.cells.cell // step
    return np.where((index >= 0) & (index < count), index, -1)


def _chunk_of(starts: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The chunk index of each of ``cells`` along an axis whose chunks start at ``starts`` (-1 stays -1)."""
    return np.where(cells >= 0, np.searchsorted(starts, cells, side="right") - 1, -1)


def first_corner(grid: SlideGrid) -> tuple[float, float]:
    """The first cell's top-left corner (row, col) in level-0 pixels: :meth:`SlideGrid.cell_top_left_px`'s first,
    without the array of every cell's (10 MB on the gigapixel slide)."""
    top, left = grid.cells.cell_origin(0, 0)
    return tuple(float(v * n / m) for v, m, n in zip((top, left), grid.model_size, grid.size, strict=True))


def chunk_rect(grid: SlideGrid, ci: int, cj: int) -> list[float]:
    """``[x, y, width, height]`` in level-0 pixels of chunk (ci, cj)'s cells."""
    i0, i1, j0, j1 = grid.cell_block(ci, cj)
    (cell_rows, cell_cols), corner = grid.cell_size_px(), first_corner(grid)
    top, left = corner[0] + i0 * cell_rows, corner[1] + j0 * cell_cols
    return [round(float(left), 2), round(float(top), 2), round((j1 - j0) * cell_cols, 2),
            round((i1 - i0) * cell_rows, 2)]


@dataclass
class Overlay:
    """A registered analysis: its plan, the overlays' pyramid, its cell maps, the chunks with tissue."""

    plan: SlidePlan
    pyramid: OverlayPyramid
    maps: CellMaps
    tissue_chunks: np.ndarray  # (chunk rows, chunk cols) bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    starts: tuple[np.ndarray, np.ndarray] = ()  # the first cell of each chunk, along rows and along columns

    def __post_init__(self):
        # SlideGrid.chunk_spans is computed anew each time it is asked: a tile asks for every chunk it covers.
        self.starts = tuple(np.array([start for start, _ in spans] + [total]) for spans, total in
                            zip(self.plan.grid.chunk_spans, (self.plan.grid.cells.rows, self.plan.grid.cells.cols),
                                strict=True))

    def block(self, ci: int, cj: int) -> tuple[int, int, int, int]:
        """``(first row, stop row, first col, stop col)`` of chunk (ci, cj)'s cells."""
        return (int(self.starts[0][ci]), int(self.starts[0][ci + 1]), int(self.starts[1][cj]),
                int(self.starts[1][cj + 1]))

    @property
    def key(self) -> str:
        return self.plan.store.folder.name

    def bring_in(self, chunks) -> dict[tuple[int, int], tuple | None]:
        """The versions of ``chunks`` (those with tissue), the cell maps brought up to date with any that changed."""
        store, maps, grid = self.plan.store, self.maps, self.plan.grid
        on_disk, found = store.versions(chunks), {}
        for index in chunks:
            version = on_disk.get(index)
            if version is not None and maps.versions.get(index) != version:
                result = store.get(*index)
                if result is None:  # a damaged chunk: waiting for its run again
                    version = None
                else:
                    i0, i1, j0, j1 = self.block(*index)
                    maps.tumour[i0:i1, j0:j1] = np.where(result.evaluated, result.probabilities[..., -1], np.nan)
                    for reading, means in cell_means(result.attention, grid.cells.cell // ATTENTION_POOL).items():
                        if reading not in maps.readings:
                            maps.readings[reading] = np.full_like(maps.tumour, np.nan)
                        maps.readings[reading][i0:i1, j0:j1] = means
                    maps.unsaved += 1
            maps.versions[index] = version
            found[index] = version
        if maps.unsaved >= SAVE_EVERY or (maps.unsaved and all(
                maps.versions.get(index) is not None for index in self.plan.chunks)):
            maps.save(store.folder)  # for the next server (cell_maps' docstring)
        return found

    def state(self, index: tuple[int, int]) -> int:
        if not self.tissue_chunks[index]:
            return GLASS
        return DONE if self.maps.versions.get(index) is not None else WAITING


_registry: OrderedDict[str, Overlay] = OrderedDict()
_registry_lock = threading.Lock()


def register(plan: SlidePlan) -> Overlay:
    """Make ``plan``'s overlays servable under its store's key (its cell maps kept while it stays registered); the
    least recently registered of more than :data:`PLANS` is forgotten."""
    key = plan.store.folder.name
    with _registry_lock:
        found = _registry.get(key)
        if found is None or found.plan.grid != plan.grid or found.plan.store.folder != plan.store.folder:
            tissue = np.zeros(plan.grid.chunks, dtype=bool)
            tissue[tuple(np.array(plan.chunks).T)] = True
            maps = CellMaps.load(plan.store.folder, (plan.grid.cells.rows, plan.grid.cells.cols))
            found = Overlay(plan, pyramid(plan.grid), maps, tissue)
            _registry[key] = found
        _registry.move_to_end(key)
        while len(_registry) > PLANS:
            _registry.popitem(last=False)
        return found


def registered(key: str) -> Overlay | None:
    """The analysis registered under ``key``, or None."""
    with _registry_lock:
        return _registry.get(key)


_tiles: OrderedDict[tuple, bytes] = OrderedDict()
_tiles_bytes = 0
_tiles_lock = threading.Lock()


def _recall(key: tuple) -> bytes | None:
    with _tiles_lock:
        found = _tiles.get(key)
        if found is not None:
            _tiles.move_to_end(key)
        return found


def _keep(key: tuple, made: bytes) -> bytes:
    global _tiles_bytes
    with _tiles_lock:
        if key not in _tiles:
            _tiles[key] = made
            _tiles_bytes += len(made)
        while _tiles_bytes > TILE_CACHE_BYTES and len(_tiles) > 1:
            _tiles_bytes -= len(_tiles.popitem(last=False)[1])
    return made


def _cached(key: tuple, make) -> bytes:
    found = _recall(key)
    return found if found is not None else _keep(key, make())


def _png(rgba: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG", compress_level=1)  # 12 % faster than 3, as small
    return buffer.getvalue()


def overlay_tile(overlay: Overlay, kind: str, level: int, col: int, row: int) -> bytes | str:
    """PNG bytes of tile (col, row) of ``level`` of ``overlay``'s ``kind`` (:data:`KINDS`), or why there is none."""
    geometry, grid = overlay.pyramid, overlay.plan.grid
    if kind not in KINDS:
        return f"an overlay is one of {', '.join(KINDS)}, not {kind}"
    if not geometry.min_level <= level <= geometry.max_level:
        return f"the overlays have levels {geometry.min_level} to {geometry.max_level}, not {level}"
    cols, rows = geometry.level_tiles(level)
    if not (0 <= col < cols and 0 <= row < rows):
        return f"level {level} of the overlays has {cols} x {rows} tiles, not ({col}, {row})"
    width, height = geometry.level_size(level)
    ys = np.arange(row * TILE, min((row + 1) * TILE, height))  # the tile's pixels, global on the level
    xs = np.arange(col * TILE, min((col + 1) * TILE, width))
    px = geometry.pixel_px(level)
    y0, x0 = (ys + 0.5) * px, (xs + 0.5) * px  # their centres in level-0 pixels
    if kind == "outline":
        return _cached((overlay.key, kind, level, col, row), lambda: _png(_outline(overlay, y0, x0, px)))
    cell_i, cell_j = _axis(grid, 0, y0, grid.cells.cell), _axis(grid, 1, x0, grid.cells.cell)
    chunk_i, chunk_j = _chunk_of(overlay.starts[0][:-1], cell_i), _chunk_of(overlay.starts[1][:-1], cell_j)
    # The chunks the tile's pixels fall in, and for each pixel row (column) its place among them (-1: outside).
    (rows_in, at_i), (cols_in, at_j) = (_places(chunks) for chunks in (chunk_i, chunk_j))
    tissue = overlay.tissue_chunks[np.ix_(rows_in, cols_in)]
    covered = [(int(rows_in[a]), int(cols_in[b])) for a, b in zip(*np.nonzero(tissue), strict=True)]
    fine = min(grid.cell_size_px()) >= FINE_CELL_PX * px  # a reading read from the chunks' own maps
    readings = ("spatial", "removed") if kind == VALUES else () if kind == "tumour" else (_reading(kind),)
    with overlay.lock:
        versions = overlay.bring_in(covered)
        key = (overlay.key, kind, level, col, row, hash(tuple(sorted(versions.items()))))
        found = _recall(key)
        if found is not None:
            return found
        values = (_fine_values(overlay, readings, y0, x0, chunk_i, chunk_j) if fine else
                  {reading: _cell_values(overlay, reading, cell_i, cell_j) for reading in readings})
        if kind in ("tumour", VALUES):
            values["tumour"] = _cell_values(overlay, "tumour", cell_i, cell_j)
        states = np.full(tissue.shape, GLASS, dtype=np.uint8)  # covered is tissue's True entries, in their order
        states[tissue] = [WAITING if versions.get(index) is None else DONE for index in covered]
    # Coloured and encoded out of the lock: the other tiles of the view need it only for the cell maps.
    waiting = (at_i[:, None] >= 0) & (at_j[None, :] >= 0)
    waiting &= states[np.ix_(np.maximum(at_i, 0), np.maximum(at_j, 0))] == WAITING
    if kind == VALUES:
        return _keep(key, _png(values_tile(values, waiting)))
    rgba = coloured(values["tumour" if kind == "tumour" else _reading(kind)], reverse=kind in REVERSED)
    if waiting.any():
        np.copyto(rgba, waiting_pattern(ys, xs), where=waiting[..., None])
    return _keep(key, _png(rgba))


def _reading(kind: str) -> str:
    """The stored reading an overlay of attention shows: α⁺ ("kept") is α⁻ ("removed") at the reversed colours."""
    return REVERSED.get(kind, kind)


def _places(chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct chunk indices of ``chunks`` (-1 left out), and each entry's place among them (-1 for -1)."""
    inside = chunks >= 0
    distinct, places = np.unique(chunks[inside], return_inverse=True)
    at = np.full(len(chunks), -1, dtype=np.int64)
    at[inside] = places
    return distinct, at


def _cell_values(overlay: Overlay, name: str, cell_i: np.ndarray, cell_j: np.ndarray) -> np.ndarray:
    """``(len(cell_i), len(cell_j))`` float32: each pixel's cell's ``"tumour"`` or stored reading (NaN: none)."""
    maps = overlay.maps
    source = maps.tumour if name == "tumour" else maps.readings.get(name)
    if source is None:
        return np.full((len(cell_i), len(cell_j)), np.nan, dtype=np.float32)
    values = source[np.ix_(np.maximum(cell_i, 0), np.maximum(cell_j, 0))]
    return np.where((cell_i[:, None] >= 0) & (cell_j[None, :] >= 0), values, np.nan)


def _fine_values(overlay: Overlay, readings: tuple[str, ...], y0: np.ndarray, x0: np.ndarray, chunk_i: np.ndarray,
                 chunk_j: np.ndarray) -> dict[str, np.ndarray]:
    """Each of the stored ``readings`` at each pixel, ``(len(y0), len(x0))`` float32, read from the pixel's chunk's
    own maps, each chunk read once (NaN: none)."""
    grid = overlay.plan.grid
    side = grid.cells.cell // ATTENTION_POOL  # stored pixels per cell side
    at_i, at_j = _axis(grid, 0, y0, ATTENTION_POOL), _axis(grid, 1, x0, ATTENTION_POOL)
    values = {reading: np.full((len(y0), len(x0)), np.nan, dtype=np.float32) for reading in readings}
    if not readings:
        return values
    for ci in np.unique(chunk_i[chunk_i >= 0]):
        for cj in np.unique(chunk_j[chunk_j >= 0]):
            if overlay.state((ci, cj)) != DONE:
                continue
            result = overlay.plan.store.get(int(ci), int(cj))
            if result is None:
                continue
            i0, _, j0, _ = overlay.block(int(ci), int(cj))
            rows, cols = np.flatnonzero(chunk_i == ci), np.flatnonzero(chunk_j == cj)
            at = np.ix_(at_i[rows] - i0 * side, at_j[cols] - j0 * side)
            for reading, found in values.items():
                maps = result.attention.get(reading)
                if maps is not None:
                    found[np.ix_(rows, cols)] = maps[at]
    return values


def _outline(overlay: Overlay, y0: np.ndarray, x0: np.ndarray, px: int) -> np.ndarray:
    """RGBA of the tissue mask's edge at the level-0 points ``y0`` x ``x0``, a pixel of the tile ``px`` level-0
    pixels, two pixels wide at whichever is the finer: a tile pixel that covers several of the mask's shows the edge
    max-pooled from the mask (:func:`_edge_pyramid`); where a mask pixel covers several tile pixels (a view zoomed in
    past the thumbnail's resolution, ~100 level-0 px a mask pixel on the gigapixel slide), the edge is found on the
    mask as the tile samples it, so that it stays two tile pixels wide and a small hole in the mask shows as a ring,
    not as a cyan blot over what lies under it."""
    mask = overlay.plan.tissue
    rows_px, cols_px = (n / m for n, m in zip(overlay.plan.grid.size, mask.shape, strict=True))  # per mask px
    rgba = np.zeros((len(y0), len(x0), 4), dtype=np.uint8)
    if px >= min(rows_px, cols_px):
        edges = _edge_pyramid(overlay)
        k = min(len(edges) - 1, max(0, math.floor(math.log2(max(px / max(rows_px, cols_px), 1)))))
        edge = edges[k]
        rows = np.clip((y0 / (rows_px * 2**k)).astype(np.int64), 0, edge.shape[0] - 1)
        cols = np.clip((x0 / (cols_px * 2**k)).astype(np.int64), 0, edge.shape[1] - 1)
        rgba[edge[np.ix_(rows, cols)]] = OUTLINE
        return rgba
    # Two tile pixels of margin on each side: the edge and its widening look past the tile, so tiles meet.
    margin = np.arange(1, 3) * px
    ys = np.concatenate([y0[0] - margin[::-1], y0, y0[-1] + margin])
    xs = np.concatenate([x0[0] - margin[::-1], x0, x0[-1] + margin])
    rows = np.clip((ys / rows_px).astype(np.int64), 0, mask.shape[0] - 1)
    cols = np.clip((xs / cols_px).astype(np.int64), 0, mask.shape[1] - 1)
    rgba[_edge(mask[np.ix_(rows, cols)])[2:-2, 2:-2]] = OUTLINE
    return rgba


def _edge(mask: np.ndarray) -> np.ndarray:
    """The pixels of ``mask`` with a 4-neighbour outside it, each widened to the 2 x 2 square down and right of it
    (the edge two pixels wide); the border rows and columns have no outside."""
    inner = mask.copy()
    inner[1:-1, 1:-1] = mask[1:-1, 1:-1] & mask[:-2, 1:-1] & mask[2:, 1:-1] & mask[1:-1, :-2] & mask[1:-1, 2:]
    edge = mask & ~inner
    edge[1:] |= edge[:-1].copy()
    edge[:, 1:] |= edge[:, :-1].copy()
    return edge


_edges: dict[str, list[np.ndarray]] = {}


def _edge_pyramid(overlay: Overlay) -> list[np.ndarray]:
    """The tissue mask's edge (two pixels wide), then max-pooled by 2 until one pixel is left."""
    found = _edges.get(overlay.key)
    if found is not None:
        return found
    levels = [_edge(overlay.plan.tissue)]
    while max(levels[-1].shape) > 1:
        last = levels[-1]
        padded = np.pad(last, ((0, last.shape[0] % 2), (0, last.shape[1] % 2)))
        levels.append(padded.reshape(padded.shape[0] // 2, 2, padded.shape[1] // 2, 2).any(axis=(1, 3)))
    if len(_edges) >= PLANS:
        _edges.pop(next(iter(_edges)))
    _edges[overlay.key] = levels
    return levels


def cell_value(overlay: Overlay, i: int, j: int) -> dict | str:
    """Cell (i, j) of ``overlay``'s analysis for the viewer's hover: ``state`` (``"evaluated"``, ``"waiting"``,
    ``"not evaluated"``: glass or too little tissue) and its P(tumour); or why there is no such cell."""
    grid = overlay.plan.grid
    if not (0 <= i < grid.cells.rows and 0 <= j < grid.cells.cols):
        return f"the grid has {grid.cells.rows} x {grid.cells.cols} cells, not ({i}, {j})"
    index = (int(_chunk_of(overlay.starts[0][:-1], np.array([i]))[0]),
             int(_chunk_of(overlay.starts[1][:-1], np.array([j]))[0]))
    answer = dict(cell=[i, j], state="not evaluated", tumour=None)
    if not overlay.tissue_chunks[index]:
        return answer
    result = overlay.plan.store.get(*index)
    if result is None:
        return {**answer, "state": "waiting"}
    i0, _, j0, _ = overlay.block(*index)
    if result.evaluated[i - i0, j - j0]:
        return {**answer, "state": "evaluated", "tumour": round(float(result.probabilities[i - i0, j - j0, -1]), 4)}
    return answer
