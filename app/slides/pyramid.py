"""Coarser levels for a slide whose coarsest level is large, built once and kept beside the uploads.

Deep zoom's coarse tiles, the thumbnail and the tissue mask read a slide's coarsest level whole, or a region of it
as large as the slide: for a slide of one large level (an image of 9,400 pixels a side, a generic TIFF of 20,480)
that is the whole slide for every coarse tile. So where the coarsest level is longer than :data:`PYRAMID_ABOVE`
pixels, this module writes a tiled TIFF of coarser levels, each a quarter of the one before a side (the mean of
each 4 x 4 block), until the longest is :data:`COARSEST_SIDE` pixels at most; the slide's reader
(:mod:`app.slides.reader`) then reads those levels after the slide's own (:class:`LevelsWithPyramid`).

- An ordinary image cannot be read by region: it is decoded once, and its pyramid holds its level 0 too (the exact
  decoded pixels, zlib tiles), so that it is never decoded again, for a rerun or for a moved view.
- A slide OpenSlide reads (a single-level tiled TIFF) keeps its own level 0: the pyramid is made from it by strips
  of :data:`STRIP_PIXELS`, so that building it holds a bounded amount, whatever the slide's size.

The pyramid is named by the file's content digest (``{digest}.tif`` in :func:`pyramids_folder`): the same bytes
under another name share it, and an upload's pyramid is the upload's own name (deleted with it). One pyramid is
built at a time in the process (each holds up to about 0.6 GB while it is made); it is written under a hidden name
and renamed whole, so a reader never sees half of one. Written with ``tifffile`` (levels as top-level pages, as
OpenSlide reads a generic TIFF).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import secrets
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from models.cpu.user_cache import cache_root

__all__ = ["PYRAMID_ABOVE", "COARSEST_SIDE", "STEP", "pyramids_folder", "file_digest", "pyramid_path",
           "build_from_pixels", "build_from_level", "LevelsWithPyramid", "reduce4"]

PYRAMID_ABOVE = 4096  # a coarsest level longer than this (a side) gets coarser levels built
COARSEST_SIDE = 1024  # the pyramid's coarsest level is at most this long
STEP = 4  # each level a quarter of the one before, a side
TILE = 256
STRIP_PIXELS = 2**24  # level pixels read at once while a pyramid is made from a slide's level (64 MB of RGBA)
DESCRIPTION = "aagc pyramid; colour={colour}"
_building = threading.Lock()  # one build at a time: each holds a decoded image or a reduced level


def pyramids_folder() -> Path:
    """``$APP_SLIDE_PYRAMIDS``, else ``slide-pyramids`` in the project's user cache."""
    return Path(os.environ.get("APP_SLIDE_PYRAMIDS") or cache_root() / "slide-pyramids")


@functools.lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # part of the key only: a changed file is read again
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(2**20):
            sha.update(block)
    return sha.hexdigest()[:32]


def file_digest(path: Path) -> str:
    """The first 32 hex digits of the file's SHA-256, read once per file in this process (while it is unchanged)."""
    stat = path.stat()
    return _digest(str(path), stat.st_size, stat.st_mtime_ns)


def pyramid_path(path: Path) -> Path:
    """Where the pyramid of the file ``path`` is (or will be) kept."""
    return pyramids_folder() / f"{file_digest(path)}.tif"


def reduce4(pixels: np.ndarray) -> np.ndarray:
    """RGB uint8 ``(H, W, 3)`` to ``(ceil(H/4), ceil(W/4), 3)``: each pixel the rounded mean of its 4 x 4 block (a
    block cut by the edge: about the mean of the pixels it has, to one level), by Pillow's ``Image.reduce`` (in C:
    0.3 s for 88 MP)."""
    return np.asarray(Image.fromarray(pixels).reduce(STEP))


def _coarser(level: np.ndarray) -> list[np.ndarray]:
    """``level`` reduced again and again until its longer side is :data:`COARSEST_SIDE` at most."""
    levels = []
    while max(level.shape[:2]) > COARSEST_SIDE:  # read at call time: the tests lower it
        level = reduce4(level)
        levels.append(level)
    return levels


def _write(out: Path, levels: list[np.ndarray], colour: bool) -> None:
    import tifffile

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{secrets.token_hex(6)}-{out.name}")  # hidden; another writer has its own
    try:
        with tifffile.TiffWriter(partial, bigtiff=True) as tiff:
            for i, level in enumerate(levels):
                # zlib's fastest level: exact pixels, written twice as fast as its default; tiles compress anyway
                tiff.write(level, tile=(TILE, TILE), compression="zlib", compressionargs={"level": 1},
                           photometric="rgb", metadata=None, subfiletype=1 if i else 0,
                           description=DESCRIPTION.format(colour=int(colour)))
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def build_from_pixels(path: Path, decode) -> Path:
    """The pyramid of the image at ``path``, its level 0 the pixels ``decode()`` gives ``(RGB uint8, colour)``,
    decoded and written here unless it is kept already."""
    out = pyramid_path(path)
    with _building:
        if not out.is_file():
            pixels, colour = decode()
            _write(out, [pixels, *_coarser(pixels)], colour)
            del pixels
            _give_back_memory()
    return out


def build_from_level(path: Path, read_region, width: int, height: int) -> Path:
    """The pyramid of coarser levels of a slide level of ``width`` x ``height`` pixels that
    ``read_region(left, top, width, height)`` reads (RGB uint8, the level's own pixels), made by strips of rows,
    or straight from the file's tiles where it is a plain tiled TIFF of one level (:func:`_reduced_tiff`, 15 times
    faster than OpenSlide's reads); built here unless it is kept already."""
    out = pyramid_path(path)
    with _building:
        if out.is_file():
            return out
        first = _reduced_tiff(path, width, height)
        if first is None:
            first = np.empty((-(-height // STEP), -(-width // STEP), 3), dtype=np.uint8)
            rows = max(STEP, STRIP_PIXELS // max(width, 1) // STEP * STEP)  # a multiple of 4: whole blocks a strip
            for top in range(0, height, rows):
                strip = read_region(0, top, width, min(rows, height - top))
                first[top // STEP:top // STEP + -(-strip.shape[0] // STEP)] = reduce4(strip)
        _write(out, [first, *_coarser(first)], True)
        del first
        _give_back_memory()
    return out


def _reduced_tiff(path: Path, width: int, height: int) -> np.ndarray | None:
    """The first page of the TIFF at ``path`` reduced by :func:`reduce4`, each of its tiles decoded by ``tifffile``
    and reduced in turn (tile sides are multiples of 16: whole blocks); None where the page is not ``width`` x
    ``height`` 8-bit RGB(A) in tiles, or its tiles are in a compression ``tifffile`` cannot decode here (JPEG
    without ``imagecodecs``): the caller reads it through OpenSlide then."""
    import tifffile

    try:
        with tifffile.TiffFile(path) as tiff:
            page = tiff.pages[0]
            if not (page.is_tiled and page.dtype == np.uint8 and page.samplesperpixel in (3, 4)
                    and page.planarconfig == 1 and (page.imagewidth, page.imagelength) == (width, height)
                    and page.tilewidth % STEP == 0 and page.tilelength % STEP == 0):
                return None
            first = np.empty((-(-height // STEP), -(-width // STEP), 3), dtype=np.uint8)
            for data, index in tiff.filehandle.read_segments(page.dataoffsets, page.databytecounts, sort=True):
                tile, (_, _, top, left, _), _ = page.decode(data, index)
                tile = tile[0, :height - top, :width - left]  # (rows, cols, samples), cut at the image's edge
                if tile.shape[-1] == 4:  # RGBA over white, as OpenSlide's pixels are read (reader._over_white)
                    alpha = tile[..., 3:].astype(np.float32) / 255
                    tile = np.round(tile[..., :3] * alpha + 255 * (1 - alpha)).astype(np.uint8)
                reduced = reduce4(np.ascontiguousarray(tile))
                first[top // STEP:top // STEP + reduced.shape[0], left // STEP:left // STEP + reduced.shape[1]] = \
                    reduced
            return first
    except Exception:  # noqa: BLE001 - any codec tifffile lacks, or a damaged tile: OpenSlide's reads decide
        return None


def _give_back_memory() -> None:
    """Hand the build's freed memory back to the system: glibc keeps freed blocks in its arenas, and the server would
    hold a decoded image's worth (0.6 GB) after each build (Linux with glibc; elsewhere nothing is done)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class LevelsWithPyramid:
    """An OpenSlide handle's levels followed by its pyramid's (another OpenSlide handle over :func:`pyramid_path`),
    read as one handle: ``read_region`` in level-0 coordinates of the slide, as OpenSlide's.

    Attributes:
        level_dimensions, level_downsamples: the slide's levels, then the pyramid's.
    """

    def __init__(self, slide, pyramid):
        self._slide, self._pyramid = slide, pyramid
        self._own = slide.level_count
        width = slide.dimensions[0]
        self._ratio = width / pyramid.dimensions[0]  # slide level-0 pixels per pyramid level-0 pixel
        self.level_dimensions = tuple(slide.level_dimensions) + tuple(pyramid.level_dimensions)
        self.level_downsamples = tuple(slide.level_downsamples) + tuple(width / w for w, _ in pyramid.level_dimensions)
        self.associated_images = slide.associated_images
        self.properties = slide.properties

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]):
        if level < self._own:
            return self._slide.read_region(location, level, size)
        x, y = (int(np.floor(c / self._ratio)) for c in location)
        return self._pyramid.read_region((x, y), level - self._own, size)

    def close(self) -> None:
        self._slide.close()
        self._pyramid.close()
