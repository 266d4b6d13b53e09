"""Analyses of known values without a model, for the overlay tiles' tests and benchmark
(:mod:`benchmarks.overlay_tiles`): a slide's grid, a plan of it whose chunks with tissue are those named, and a store
filled with chunks whose every value is a function of the cell (P(tumour) and the attention readings), so that a tile
can be compared with what it covers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.cells.evaluation import make_grid
from app.slides.engine import ATTENTION_POOL, ChunkResult, SlideGrid
from app.slides.run import SlidePlan
from app.slides.scale import Scale
from app.slides.store import ChunkStore

CARD = {"class_names": ["no_tumor", "tumor"], "input": {"size": 96}}


def synthetic_plan(root: Path, model_rows: int, model_cols: int, level0_per_model: float = 2.0,
                   tissue_chunks=None, key: str = "0123456789abcdef01234567") -> SlidePlan:
    """A plan of a slide of ``model_rows`` x ``model_cols`` pixels at the model's scale (level 0:
    ``level0_per_model`` times larger), whose chunks with tissue are ``tissue_chunks`` (a set of (ci, cj); None:
    all), its store under ``root / key``."""
    cells = make_grid(model_rows, model_cols, context=96)
    size = (round(model_rows * level0_per_model), round(model_cols * level0_per_model))
    grid = SlideGrid(size, (model_rows, model_cols), cells, 8, 0.972 / level0_per_model, 0.972)
    chunks = tuple(np.ndindex(*grid.chunks)) if tissue_chunks is None else tuple(sorted(tissue_chunks))
    mask = np.zeros((64, 64), dtype=bool)
    mask[16:48, 16:48] = True
    scale = Scale(grid.microns_per_pixel, "slide", "test")
    return SlidePlan(Path("synthetic.tif"), Path("synthetic.safetensors"), scale, CARD, grid,
                     np.zeros((64, 64, 3), dtype=np.uint8), mask, chunks, ChunkStore(root, key))


def tumour_of(i, j):
    """The P(tumour) the synthetic chunks give cell (i, j)."""
    return ((np.asarray(i) * 7 + np.asarray(j) * 3) % 101) / 100.0


def evaluated_of(i, j):
    """Whether the synthetic chunks evaluate cell (i, j): all but every fifth along the diagonals."""
    return (np.asarray(i) + np.asarray(j)) % 5 != 4


def spatial_of(a, b):
    """The α_s the synthetic chunks store at attention pixel (a, b) (4 x 4 model pixels)."""
    return ((np.asarray(a) * 5 + np.asarray(b) * 11) % 64) / 63.0


def synthetic_chunk(plan: SlidePlan, ci: int, cj: int) -> ChunkResult:
    """Chunk (ci, cj) of ``plan`` with the values above: removed = spatial / 2, NaN where not evaluated."""
    i0, i1, j0, j1 = plan.grid.cell_block(ci, cj)
    i, j = np.meshgrid(np.arange(i0, i1), np.arange(j0, j1), indexing="ij")
    evaluated = evaluated_of(i, j)
    tumour = np.where(evaluated, tumour_of(i, j), np.nan)
    probabilities = np.stack([1 - tumour, tumour], axis=-1)
    side = plan.grid.cells.cell // ATTENTION_POOL
    a, b = np.meshgrid(np.arange(i0 * side, i1 * side), np.arange(j0 * side, j1 * side), indexing="ij")
    shown = np.kron(evaluated, np.ones((side, side), dtype=bool))
    spatial = np.where(shown, spatial_of(a, b), np.nan).astype(np.float16)
    removed = (spatial.astype(np.float32) / 2).astype(np.float16)
    return ChunkResult((ci, cj), np.where(evaluated, 0.9, 0.0), evaluated, probabilities,
                       {"spatial": spatial, "removed": removed})


def fill(plan: SlidePlan, chunks=None) -> None:
    """Put ``chunks`` of ``plan`` (None: all with tissue) into its store."""
    for index in plan.chunks if chunks is None else chunks:
        plan.store.put(synthetic_chunk(plan, *index))
