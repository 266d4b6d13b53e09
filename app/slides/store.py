"""Finished chunks of a slide's cells, kept on disk as they finish: a run stopped at any point resumes without
redoing them, and two runs of the same slide and model share them.

A store is a folder per (slide, model, grid): its name is a digest of the slide's identity (OpenSlide's quickhash
and the file's size, :func:`app.slides.run.slide_identity`), the checkpoint's weights, the scale and the grid's
geometry, the element of p4m the slide is moved by where it is moved, the stain normalisation of its pixels where
they are normalised, and the precision the network ran in where it is not float32 (:mod:`app.slides.precision`), so
that nothing of another slide, model, scale, orientation, normalisation or precision is ever read back.
Chunks this process has read or written are kept in memory, at most :data:`HELD_BYTES` of them (the least recently
used let go first): a page that draws a slide's overlay asks for the chunks under each tile, and a slide of a million
cells does not fit in a server's memory whole.
Each chunk is one ``.npz`` (its arrays, :class:`app.slides.engine.ChunkResult`) written to a temporary name and
renamed into place (a chunk is there whole or not at all), beside its sha256 in a ``.sha256`` file written after
it. A chunk whose bytes no longer match its checksum (a damaged disk, a copy cut short) is not trusted: it is
reported as missing and computed again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .engine import ChunkResult, SlideGrid

__all__ = ["ChunkStore", "store_key", "file_sha256", "HELD_BYTES"]

ARRAYS = ("tissue", "evaluated", "probabilities")
# The chunks a store holds in memory, at most, in bytes of their arrays: 64 MiB is about 3,500 chunks of 8 x 8 cells
# with two readings of attention (18 KB each), several screens of the finest overlay tiles.
HELD_BYTES = 64 * 2**20
SETTLED_NS = 50_000_000  # a folder unchanged this long before its listing: the listing is kept (ChunkStore._list)


def file_sha256(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        while chunk := file.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def _nbytes(result: ChunkResult) -> int:
    return (result.tissue.nbytes + result.evaluated.nbytes + result.probabilities.nbytes
            + sum(maps.nbytes for maps in result.attention.values()))


def _signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def store_key(slide_identity: str, weights_sha256: str, grid: SlideGrid, element: int = 0, stain=None,
              precision: str = "float32") -> str:
    """The store's name: a digest of what its chunks are a function of, the element of p4m the slide is moved by
    among them (:mod:`app.slides.moved`; a half turn or a mirror has the original's grid), the normalisation of
    its pixels (``stain``, an :class:`app.slides.stain.SlideStain`: its method, the slide's estimate and the target,
    exactly; None, as scanned, gives the name stores had before normalisation existed, so they stay valid), and the
    precision the network ran in (:data:`models.precision.PRECISIONS`' names; float32 gives the name stores had
    before there was a choice)."""
    what = dict(slide=slide_identity, weights=weights_sha256, microns_per_pixel=grid.microns_per_pixel,
                model_microns_per_pixel=grid.model_microns_per_pixel, model_size=grid.model_size,
                cells=[grid.cells.rows, grid.cells.cols, grid.cells.top, grid.cells.left, grid.cells.cell,
                       grid.cells.context], chunk=grid.chunk,
                # chunks cut as palindromes (SlideGrid.chunk_spans): stores of chunks cut from the top-left corner,
                # whose indices name other cells, are never read back
                partition="palindrome")
    if element:  # only where moved: the slide as scanned keeps the names its stores had before moves existed
        what["element"] = int(element)
    if stain is not None:  # an analysis of normalised pixels is never read back as one of the pixels as scanned
        what["stain"] = stain.to_dict()
    if precision != "float32":  # bfloat16's probabilities differ from float32's by its rounding: never mixed
        what["precision"] = precision
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


class ChunkStore:
    """The finished chunks of one slide through one model, under ``root / key``."""

    def __init__(self, root: Path, key: str, held_bytes: int = HELD_BYTES):
        self.folder = Path(root) / key
        self.folder.mkdir(parents=True, exist_ok=True)
        # The chunks this process has put or checked, kept (the least recently used first, at most ``held_bytes``):
        # the overlay's tiles ask for the chunks under them again and again, and should not read and hash their
        # files each time. Each is kept with its file's size and modification time: a file changed since (damaged,
        # replaced) is read and checked again.
        self._held: OrderedDict[tuple[int, int], tuple[tuple[int, int], ChunkResult]] = OrderedDict()
        self._held_bytes, self.held_limit = 0, int(held_bytes)
        # The page's script, the Dask client's callbacks (put) and the overlay tiles' threads share one store.
        self._lock = threading.Lock()
        # The last listing of the folder (versions), under the folder's modification time: the tiles of one view
        # come in a burst, each asking for the versions of the chunks under it (a listing of ~4,000 names on the
        # gigapixel slide is 5-15 ms; a stat is microseconds).
        self._listing: tuple[int, dict[tuple[int, int], tuple[int, int]]] | None = None

    def _hold(self, index: tuple[int, int], signature: tuple[int, int], result: ChunkResult) -> None:
        """Keep ``result`` in memory, letting go of the least recently used chunks beyond :attr:`held_limit`."""
        with self._lock:
            self._let_go(index)
            self._held[index] = (signature, result)
            self._held_bytes += _nbytes(result)
            while self._held_bytes > self.held_limit and len(self._held) > 1:
                self._let_go(next(iter(self._held)))

    def _recall(self, index: tuple[int, int]):
        """``(signature, result)`` of a held chunk, now the most recently used; None if not held."""
        with self._lock:
            held = self._held.get(index)
            if held is not None:
                self._held.move_to_end(index)
            return held

    def _let_go(self, index: tuple[int, int]) -> None:
        held = self._held.pop(index, None)
        if held is not None:
            self._held_bytes -= _nbytes(held[1])

    @property
    def held(self) -> int:
        """How many chunks this process holds in memory now."""
        return len(self._held)

    def _path(self, ci: int, cj: int) -> Path:
        return self.folder / f"chunk-{ci}-{cj}.npz"

    def put(self, result: ChunkResult) -> None:
        """Store ``result`` whole: its bytes under a temporary name, renamed into place, then its checksum."""
        buffer = io.BytesIO()
        arrays = {name: getattr(result, name) for name in ARRAYS}
        arrays.update({f"attention_{reading}": maps for reading, maps in result.attention.items()})
        np.savez(buffer, index=np.array(result.index), **arrays)
        data = buffer.getvalue()
        path = self._path(*result.index)
        handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".part")
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
        path.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
        self._hold(tuple(result.index), _signature(path), result)

    def get(self, ci: int, cj: int) -> ChunkResult | None:
        """Chunk (ci, cj) if it is stored whole and its bytes match their checksum; else None (to be computed)."""
        path, checksum = self._path(ci, cj), self._path(ci, cj).with_suffix(".sha256")
        held = self._recall((ci, cj))
        if held is not None and path.is_file() and held[0] == _signature(path):
            return held[1]
        if not (path.is_file() and checksum.is_file()):
            return None
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != checksum.read_text().strip():
            return None
        with np.load(io.BytesIO(data)) as arrays:
            attention = {name.removeprefix("attention_"): arrays[name] for name in arrays.files
                         if name.startswith("attention_")}
            result = ChunkResult(tuple(int(v) for v in arrays["index"]), arrays["tissue"], arrays["evaluated"],
                                 arrays["probabilities"], attention)
        self._hold((ci, cj), _signature(path), result)
        return result

    def versions(self, chunks=None) -> dict[tuple[int, int], tuple[int, int]]:
        """Each chunk (of ``chunks``; None: all) whose file and checksum are both on disk, unchecked (their checksums
        are checked when they are read, :meth:`get`), with what changes when it is written again: the inodes of its
        file (a new one at every :meth:`put`, renamed into place) and of its checksum. No file is read: what a page
        that refreshes often, and the overlay tiles cached under their chunks' versions, ask. All of them: one listing
        of the folder; a few: one ``stat`` each."""
        listing = self._listing
        if listing is not None and listing[0] == os.stat(self.folder).st_mtime_ns:
            found = listing[1]
        elif chunks is not None and len(chunks) <= 64:
            found = {}
            for ci, cj in chunks:
                path = self._path(ci, cj)
                try:
                    found[ci, cj] = (os.stat(path).st_ino, os.stat(path.with_suffix(".sha256")).st_ino)
                except OSError:
                    continue
            return found
        else:
            found = self._list()
        return dict(found) if chunks is None else {index: found[index] for index in chunks if index in found}

    def _list(self) -> dict[tuple[int, int], tuple[int, int]]:
        """:meth:`versions` of every chunk by one listing of the folder, kept under the folder's modification time
        where that is safe: a name renamed into the folder changes it, unless within the clock's granularity of the
        time it already has (a few ms), so a listing made less than :data:`SETTLED_NS` after the folder's last change
        is not kept (git's "racy" entries, the same rule)."""
        before = os.stat(self.folder).st_mtime_ns
        inodes = {entry.name: entry.inode() for entry in os.scandir(self.folder) if entry.name.startswith("chunk-")}
        found = {}
        for name, inode in inodes.items():
            checksum = inodes.get(name[:-4] + ".sha256") if name.endswith(".npz") else None
            if checksum is not None:
                ci, cj = name[6:-4].split("-")
                found[int(ci), int(cj)] = (inode, checksum)
        self._listing = (before, found) if time.time_ns() - before > SETTLED_NS else None
        return found

    def finished(self) -> set[tuple[int, int]]:
        """The chunks whose file and checksum are both on disk (:meth:`versions`)."""
        return set(self.versions())

    def forget(self) -> None:
        """Let go of the chunks this process holds (a cohort's finished slide): they stay on disk, read again if
        asked for."""
        with self._lock:
            self._held.clear()
            self._held_bytes = 0

    def done(self) -> set[tuple[int, int]]:
        """The chunks stored whole with matching checksums."""
        found = set()
        for path in self.folder.glob("chunk-*-*.npz"):
            ci, cj = (int(v) for v in path.stem.split("-")[1:])
            if self.get(ci, cj) is not None:
                found.add((ci, cj))
        return found
