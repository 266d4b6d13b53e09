"""A slide's cells at the model's scale, evaluated a chunk of cells at a time, each chunk on its own.

One rule for regions and slides (issue 59): the slide, resampled to the model's micrometres per pixel with its
sides made even (:func:`app.slides.resample.model_side`, region mode's rounding), is cut into region mode's grid
of 32-pixel cells, each judged in its 96-pixel context, centred (:func:`app.cells.evaluation.make_grid`). The
grid is fixed by the slide's size and scale alone, so chunks and stored results line up from one run to the
next, and a quarter turn or a mirror of the slide maps the grid onto itself, as in region mode.

A chunk is at most :data:`CHUNK_CELLS` x :data:`CHUNK_CELLS` cells, the chunks' sides a palindrome along each axis
(:attr:`SlideGrid.chunk_spans`), so that they too map onto themselves under the group. It is read from level 0 with
just the margin its contexts need and resampled by :func:`app.slides.resample.resample_block`, which gives every
pixel exactly as the whole slide's resampling would: so a chunk's cells, their tissue and their probabilities do not
depend on how the slide was cut, and equal region mode's on the same pixels. Cells with too little tissue are not
evaluated (:func:`app.cells.evaluation.cell_tissue`, the same share); the network runs over the rest through
:func:`app.cells.evaluation.evaluate_cells`, one place for regions and slides. The attention kept per chunk is each
evaluated cell's own centre (pooled, :data:`ATTENTION_POOL`), which no other chunk's contexts change.

A chunk of a stain-normalised run (``stain``, :class:`app.slides.stain.SlideStain`) has its level-0 pixels
normalised before they are resampled, with the slide's estimate as source: each pixel's colour alone, so a chunk's
pixels are those of the normalised slide, however it is cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from models import Network

from ..cells.evaluation import (
    BATCH,
    TISSUE_SHARE,
    RegionGrid,
    cell_tissue,
    default_method,
    evaluate_cells,
    make_grid,
    tile_spans,
)
from .reader import Slide
from .resample import input_span, model_side, resample_block

if TYPE_CHECKING:  # the engine only calls its ``apply``
    from .stain import SlideStain

__all__ = ["SlideGrid", "ChunkResult", "CHUNK_CELLS", "ATTENTION_POOL", "slide_grid", "read_chunk", "read_block",
           "cell_context", "evaluate_chunk", "class_count"]

# 8 x 8 cells: a 320-pixel square of contexts at the model's scale, 64 forward passes at most (2.6 s on one thread of
# a Xeon): the first cells of a slide are drawn within a second of asking (the least tissue first, app.slides.run),
# the two threads of a worker stay busy to the end (16 x 16 chunks measured no faster on the CMU slide: 18.2 s against
# 18.3), and a task is still a thousand times the scheduler's cost per task.
CHUNK_CELLS = 8
# The attention kept per chunk: means over 4 x 4 pixels at the model's scale (3.9 um at PCam's), in float16: a
# slide's overlay at a 64th of the pixels' bytes (128 KB a chunk, not 2 MB); a cell opened in the patch page shows
# its maps at full resolution, computed again.
ATTENTION_POOL = 4


@dataclass(frozen=True)
class SlideGrid:
    """The cells of a slide at the model's scale, in chunks.

    Attributes:
        size: ``(rows, cols)`` of level 0.
        model_size: ``(rows, cols)`` of the slide at the model's scale.
        cells: region mode's grid over the slide at the model's scale.
        chunk: cells per chunk side, at most (:attr:`chunk_spans`).
        microns_per_pixel, model_microns_per_pixel: of level 0 and of the model.
    """

    size: tuple[int, int]
    model_size: tuple[int, int]
    cells: RegionGrid
    chunk: int
    microns_per_pixel: float
    model_microns_per_pixel: float

    @cached_property
    def chunk_spans(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(start, length)`` of the chunks along the rows and along the columns: at most :attr:`chunk` cells, an
        odd number of them, their lengths a palindrome (:func:`app.cells.evaluation.tile_spans`), so that a quarter
        turn or a mirror of the slide maps chunks onto chunks, and a moved slide's run evaluates exactly the moved
        cells (which chunks are evaluated is decided per chunk, from the tissue mask). Made once per grid: a plan
        asks for every chunk's block, and making the spans each time took 1.5 of the gigapixel slide's 2.6 s plan."""
        return tile_spans(self.cells.rows, self.chunk), tile_spans(self.cells.cols, self.chunk)

    @property
    def chunks(self) -> tuple[int, int]:
        """``(rows, cols)`` of chunks."""
        rows, cols = self.chunk_spans
        return len(rows), len(cols)

    def cell_block(self, ci: int, cj: int) -> tuple[int, int, int, int]:
        """``(first row, stop row, first col, stop col)`` of chunk (ci, cj)'s cells."""
        rows, cols = self.chunk_spans
        if not (0 <= ci < len(rows) and 0 <= cj < len(cols)):
            raise IndexError(f"chunk ({ci}, {cj}) is outside the {len(rows)} x {len(cols)} chunks")
        (i0, height), (j0, width) = rows[ci], cols[cj]
        return i0, i0 + height, j0, j0 + width

    def context_block(self, ci: int, cj: int) -> tuple[int, int, int, int]:
        """``(top, bottom, left, right)`` at the model's scale of chunk (ci, cj)'s cells' contexts."""
        i0, i1, j0, j1 = self.cell_block(ci, cj)
        top, left = self.cells.context_origin(i0, j0)
        return (top, top + (i1 - i0 - 1) * self.cells.cell + self.cells.context,
                left, left + (j1 - j0 - 1) * self.cells.cell + self.cells.context)

    def cell_top_left_px(self) -> np.ndarray:
        """``(rows, cols, 2)`` float64: each cell's top-left corner (row, col) in level-0 pixels."""
        scale_rows, scale_cols = (m / n for m, n in zip(self.model_size, self.size, strict=True))
        top, left = self.cells.cell_origin(0, 0)
        rows = (top + self.cells.cell * np.arange(self.cells.rows)) / scale_rows
        cols = (left + self.cells.cell * np.arange(self.cells.cols)) / scale_cols
        return np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1)

    def cell_size_px(self) -> tuple[float, float]:
        """A cell's (rows, cols) in level-0 pixels."""
        return tuple(self.cells.cell * n / m for m, n in zip(self.model_size, self.size, strict=True))


@dataclass(frozen=True)
class ChunkResult:
    """One chunk of a slide's cells through one model.

    Attributes:
        index: ``(ci, cj)``.
        tissue: ``(r, c)`` share of each cell's pixels that are stained.
        evaluated: ``(r, c)`` bool, the cells with enough tissue.
        probabilities: ``(r, c, classes)`` float64, NaN where not evaluated.
        attention: per reading of the first attentive layer (``"removed"``, and ``"spatial"`` where it has spatial
            attention), ``(r * 32 / pool, c * 32 / pool)`` float16: each evaluated cell's centre averaged over
            :data:`ATTENTION_POOL` squares, NaN elsewhere.
    """

    index: tuple[int, int]
    tissue: np.ndarray
    evaluated: np.ndarray
    probabilities: np.ndarray
    attention: Mapping[str, np.ndarray]


def class_count(card: dict) -> int:
    """The model's number of classes, from its card (two, PCam's, where the card names none)."""
    return len(card.get("class_names") or []) or 2


def slide_grid(slide: Slide, microns_per_pixel: float, card: dict, model_microns_per_pixel: float,
               chunk: int = CHUNK_CELLS) -> SlideGrid:
    """The grid of ``slide`` at ``microns_per_pixel`` for a model of ``card`` at ``model_microns_per_pixel``.

    Raises:
        RegionError: a slide smaller than one context at the model's scale.
    """
    width, height = slide.dimensions
    scale = microns_per_pixel / model_microns_per_pixel
    model_size = model_side(height, scale), model_side(width, scale)
    cells = make_grid(*model_size, context=int(card["input"]["size"]))
    return SlideGrid((height, width), model_size, cells, chunk, float(microns_per_pixel), model_microns_per_pixel)


def read_chunk(slide: Slide, grid: SlideGrid, ci: int, cj: int, stain: SlideStain | None = None) -> np.ndarray:
    """``(3, H, W)`` float32 in [0, 1]: chunk (ci, cj)'s contexts at the model's scale, from level 0."""
    return read_block(slide, grid, grid.context_block(ci, cj), stain)


def cell_context(slide: Slide, grid: SlideGrid, i: int, j: int, stain: SlideStain | None = None) -> np.ndarray:
    """``(3, 96, 96)`` float32: cell (i, j) in its context at the model's scale, as the engine judged it (with
    ``stain``, normalised as the engine's run normalised it)."""
    top, left = grid.cells.context_origin(i, j)
    return read_block(slide, grid, (top, top + grid.cells.context, left, left + grid.cells.context), stain)


def read_block(slide: Slide, grid: SlideGrid, block: tuple[int, int, int, int],
               stain: SlideStain | None = None) -> np.ndarray:
    """``(3, H, W)`` float32 in [0, 1]: rows ``top..bottom-1`` and columns ``left..right-1`` of the slide at the
    model's scale (``block``), from level 0, its pixels normalised by ``stain`` first where given."""
    top, bottom, left, right = block
    (rows, cols), (model_rows, model_cols) = grid.size, grid.model_size
    r0, r1 = input_span(rows, model_rows, top, bottom)
    c0, c1 = input_span(cols, model_cols, left, right)
    pixels = slide.read_region(c0, r0, 0, c1 - c0, r1 - r0)  # (H, W, 3) uint8
    if stain is not None:
        pixels = stain.apply(pixels)
    image = np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32) / 255.0
    return resample_block(image, (r0, c0), grid.size, grid.model_size, (top, bottom, left, right))


def evaluate_chunk(model: Network, card: dict, slide: Slide, grid: SlideGrid, ci: int, cj: int, *,
                   batch: int = BATCH, method: str | None = None, stain: SlideStain | None = None,
                   dtype: torch.dtype | None = None) -> ChunkResult:
    """Chunk (ci, cj) of ``slide``'s cells through ``model`` (eval mode), by ``method``: by default the fastest that
    is the model's own function (:func:`app.cells.evaluation.default_method`): each cell in its own context
    (``"crops"``) for a model with attention; for one without, the shared trunk over the chunk (``"tiles"``, the
    same function up to round-off and about 5 times less work, as region mode measured); with ``stain``, on the
    slide's pixels normalised (:func:`read_block`); in ``dtype`` (:mod:`models.precision`), by default the model's
    weights' own."""
    image = read_chunk(slide, grid, ci, cj, stain)
    i0, i1, j0, j1 = grid.cell_block(ci, cj)
    cell, context = grid.cells.cell, grid.cells.context
    local = RegionGrid(i1 - i0, j1 - j0, 0, 0, cell, context)
    tissue = cell_tissue(image, local)
    evaluated = tissue >= TISSUE_SHARE
    if not evaluated.any():
        return ChunkResult((ci, cj), tissue, evaluated, np.full((*evaluated.shape, class_count(card)), np.nan), {})
    probabilities, attentions = evaluate_cells(model, card, image, local, evaluated, batch=batch,
                                               method=method or default_method(model), dtype=dtype)
    margin, (rows, cols), pool = local.margin, evaluated.shape, ATTENTION_POOL
    centres = np.kron(evaluated, np.ones((cell, cell), dtype=bool))
    attention = {}
    for reading, maps in attentions.items():
        inside = np.where(centres, maps[margin:margin + rows * cell, margin:margin + cols * cell], np.nan)
        pooled = inside.reshape(rows * cell // pool, pool, cols * cell // pool, pool).mean(axis=(1, 3))
        attention[reading] = pooled.astype(np.float16)  # (r * 32 / pool, c * 32 / pool)
    return ChunkResult((ci, cj), tissue, evaluated, probabilities, attention)
