"""One value per cell of an analysis, for the overlays' coarse tiles (:mod:`app.slides.overlay_tiles`): P(tumour) and
each reading of attention's mean over the cell, for the chunks brought in so far, with the version each was read at
(:meth:`app.slides.store.ChunkStore.versions`).

A coarse tile covers every chunk of the slide: its first drawing reads each chunk from disk once (the gigapixel
benchmark slide's 1,772 chunks: 10 s on two cores). The maps are kept beside the chunks (:data:`CELL_MAPS`, written
whole under a temporary name and renamed, every :data:`SAVE_EVERY` chunks brought in and once all are), so that a
server started again reads them in one file and reads again only the chunks whose versions changed since. The file is
a cache: one that cannot be read, or is of another grid, is ignored.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["CellMaps", "cell_means", "CELL_MAPS", "SAVE_EVERY"]

CELL_MAPS = "overlay-cells.npz"
SAVE_EVERY = 64


@dataclass
class CellMaps:
    """P(tumour) per cell (NaN: not evaluated), each reading's mean per cell, the version each chunk was read at
    (None: not yet, or damaged), and how many chunks were read since the maps were last kept on disk. A slide of a
    million cells: 12 MB for three maps."""

    tumour: np.ndarray
    readings: dict[str, np.ndarray] = field(default_factory=dict)
    versions: dict[tuple[int, int], tuple | None] = field(default_factory=dict)
    unsaved: int = 0

    @classmethod
    def load(cls, folder: Path, shape: tuple[int, int]) -> CellMaps:
        """The maps kept in ``folder`` for a grid of ``shape`` cells; empty ones where there are none (or they are
        of another grid, or cannot be read)."""
        empty = cls(np.full(shape, np.nan, dtype=np.float32))
        try:
            with np.load(Path(folder) / CELL_MAPS) as kept:
                tumour = kept["tumour"]
                readings = {name.removeprefix("reading_"): kept[name] for name in kept.files
                            if name.startswith("reading_")}
                versions = kept["versions"]  # (n, 4) int64: ci, cj and the two inodes
        except (OSError, ValueError, KeyError):
            return empty
        if tumour.shape != shape or any(maps.shape != shape for maps in readings.values()) or versions.ndim != 2:
            return empty
        return cls(tumour.astype(np.float32), {k: v.astype(np.float32) for k, v in readings.items()},
                   {(int(ci), int(cj)): (int(a), int(b)) for ci, cj, a, b in versions})

    def save(self, folder: Path) -> None:
        """Keep the maps in ``folder`` (whole or not at all); a folder that cannot be written keeps none."""
        versions = np.array([(ci, cj, *version) for (ci, cj), version in self.versions.items()
                             if version is not None], dtype=np.int64).reshape(-1, 4)
        try:
            handle, temporary = tempfile.mkstemp(dir=folder, suffix=".part")
            with os.fdopen(handle, "wb") as file:
                np.savez(file, tumour=self.tumour, versions=versions,
                         **{f"reading_{name}": maps for name, maps in self.readings.items()})
            os.replace(temporary, Path(folder) / CELL_MAPS)
        except OSError:
            return
        self.unsaved = 0


def cell_means(attention: dict, side: int) -> dict[str, np.ndarray]:
    """Each reading's mean over each cell's ``side`` x ``side`` stored pixels (NaN: a cell not evaluated)."""
    means = {}
    for reading, maps in attention.items():
        rows, cols = maps.shape[0] // side, maps.shape[1] // side
        blocks = maps.astype(np.float32).reshape(rows, side, cols, side)  # (cells, side, cells, side)
        finite = np.isfinite(blocks)
        count, total = finite.sum(axis=(1, 3)), np.where(finite, blocks, 0).sum(axis=(1, 3))
        means[reading] = np.where(count > 0, total / np.maximum(count, 1), np.nan).astype(np.float32)
    return means
