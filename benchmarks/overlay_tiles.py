"""The overlay tiles of a slide of real size, from a store of synthetic chunks: the time to make a tile at each level
and the server's memory while every overlay is served (:mod:`app.slides.overlay_tiles`).

    python -m benchmarks.overlay_tiles                # the gigapixel benchmark slide's grid: 100,000 px at 0.25 um/px
    python -m benchmarks.overlay_tiles --side 20000

The slide's grid is that of a slide of ``--side`` pixels a side at 0.25 um/px for the shipped PCam model (0.972 um/px,
32-pixel cells in 96-pixel contexts, chunks of 8 x 8 cells); the chunks with tissue are those inside a few round
islands (about a fifth of the chunks, as on ``benchmarks.gigapixel_slide``'s slide: 1,961 of 10,201), each filled with
known values (:mod:`benchmarks.synthetic_store`) without a model. For each overlay it asks for the coarsest tile, then
up to ``--per-level`` tiles over tissue at every level down to the finest, each twice (made, then from the cache), and
prints the times and the process's peak resident memory; then the coarsest tile again as a server started again
draws it (its cell maps read back from beside the chunks, :mod:`app.slides.cell_maps`).
"""

from __future__ import annotations

import argparse
import platform
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from app.slides import overlay_tiles
from app.slides.overlay_tiles import KINDS, TILE, overlay_tile, register

from .synthetic_store import fill, synthetic_plan

MICRONS_PER_PIXEL, MODEL_MICRONS_PER_PIXEL = 0.25, 0.972


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def islands(chunks: tuple[int, int], share: float, seed: int = 0) -> set[tuple[int, int]]:
    """About ``share`` of the ``chunks`` grid, in four round islands."""
    rows, cols = chunks
    rng = np.random.default_rng(seed)
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    inside = np.zeros(chunks, dtype=bool)
    radius = np.sqrt(share * rows * cols / (4 * np.pi))
    for ci, cj in rng.uniform(0.25, 0.75, size=(4, 2)) * (rows, cols):
        inside |= (i - ci) ** 2 + (j - cj) ** 2 < radius**2
    return {(int(a), int(b)) for a, b in zip(*np.nonzero(inside), strict=True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=100_000, help="level-0 pixels a side (default: 100,000)")
    parser.add_argument("--share", type=float, default=0.19, help="share of the chunks with tissue")
    parser.add_argument("--per-level", type=int, default=6, help="tiles over tissue asked for per level")
    args = parser.parse_args(argv)
    model_side = round(args.side * MICRONS_PER_PIXEL / MODEL_MICRONS_PER_PIXEL / 2) * 2
    with tempfile.TemporaryDirectory() as root:
        probe = synthetic_plan(Path(root), model_side, model_side, MODEL_MICRONS_PER_PIXEL / MICRONS_PER_PIXEL)
        tissue = islands(probe.grid.chunks, args.share)
        plan = synthetic_plan(Path(root), model_side, model_side, MODEL_MICRONS_PER_PIXEL / MICRONS_PER_PIXEL,
                              tissue_chunks=tissue)
        started = time.perf_counter()
        fill(plan)
        plan.store.forget()  # the chunks on disk only, as a server that restarts finds them
        filled_s = time.perf_counter() - started
        cells = plan.grid.cells.rows * plan.grid.cells.cols
        print(f"{cpu_name()}; a slide of {args.side:,} px a side: {cells:,} cells, {len(plan.chunks):,} of "
              f"{plan.grid.chunks[0] * plan.grid.chunks[1]:,} chunks with tissue, stored in {filled_s:.1f} s")
        baseline = peak_rss_mb()
        overlay = register(plan)
        geometry = overlay.pyramid
        print(f"overlay pyramid: {geometry.width:,} x {geometry.height:,} px of {geometry.scale} level-0 px, levels "
              f"{geometry.min_level}..{geometry.max_level}, {TILE}-px tiles; peak RSS before serving "
              f"{baseline:.0f} MB")
        centres = np.array([plan.grid.cell_block(*index) for index in plan.chunks], dtype=float)
        corner, (cell_rows, cell_cols) = plan.grid.cell_top_left_px()[0, 0], plan.grid.cell_size_px()
        points = np.stack([corner[0] + (centres[:, 0] + centres[:, 1]) / 2 * cell_rows,
                           corner[1] + (centres[:, 2] + centres[:, 3]) / 2 * cell_cols], axis=1)
        rng = np.random.default_rng(1)
        for kind in KINDS:
            lines = []
            for level in range(geometry.min_level, geometry.max_level + 1):
                px = geometry.pixel_px(level)
                tiles = {(int(x // (px * TILE)), int(y // (px * TILE))) for y, x in points}
                chosen = sorted(tiles)
                chosen = [chosen[k] for k in rng.choice(len(chosen), min(args.per_level, len(chosen)), replace=False)]
                made, cached = [], []
                for col, row in chosen:
                    start = time.perf_counter()
                    overlay_tile(overlay, kind, level, col, row)
                    made.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    overlay_tile(overlay, kind, level, col, row)
                    cached.append(time.perf_counter() - start)
                lines.append(f"  level {level:2d} ({px:5,} px/px): made {np.median(made) * 1e3:7.1f} ms (max "
                             f"{max(made) * 1e3:7.1f}), cached {np.median(cached) * 1e3:.2f} ms, {len(chosen)} tiles")
            print(f"{kind}: peak RSS {peak_rss_mb():.0f} MB (+{peak_rss_mb() - baseline:.0f}); chunks held "
                  f"{plan.store.held:,}")
            print("\n".join(lines))
        # A server started again: the registry and the tiles gone, the chunks and the cell maps on disk.
        overlay_tiles._registry.clear()
        overlay_tiles._tiles.clear()
        plan.store.forget()
        start = time.perf_counter()
        overlay_tile(register(plan), "tumour", geometry.min_level, 0, 0)
        print(f"the coarsest tile from a server started again (cell maps read back): "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
