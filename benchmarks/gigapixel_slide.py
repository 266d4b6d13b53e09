"""A gigapixel slide for the benchmarks: a real pyramidal TIFF of real tissue and glass, built in seconds.

    python -m benchmarks.gigapixel_slide                 # 100,000 x 100,000 px at 0.25 um/px, cached; prints where
    python -m benchmarks.gigapixel_slide --size 8192 --out small.tif

What it is:
- a BigTIFF of tiled levels, each a top-level IFD (OpenSlide ignores SubIFD pyramids), level ``k`` of
  ``ceil(size / 2**k)`` pixels a side, halving down to the first level under :data:`SMALLEST` pixels; 256-pixel
  JPEG tiles (YCbCr 4:2:0, quality 80, as scanners write them), the scale in the resolution tags in centimetres,
  so that OpenSlide reads it as a ``generic-tiff`` slide with ``openslide.mpp-x``;
- tissue in a few large islands (wobbly ellipses, like sections on a glass), drawn on a mask of
  :data:`MASK_CELL`-pixel cells; the tissue itself is a 4,096-pixel periodic mosaic of 16 crops of the real H&E
  of ``CMU-1-Small-Region.svs`` (where it is densest, each crop turned or mirrored, resampled from the slide's
  0.499 um/px to the stated scale); the glass is a crop of that slide's own glass, repeated.

Why it is fast: a JPEG encoder on 2 cores would take many minutes for 30 GB of raw pixels. Here every tile inside
an island is one of the mosaic's (4,096 / 256)**2 = 256 positions, and every tile of glass the same one, so those
are encoded once per level and their bytes written again wherever they recur; only tiles on an island's edge
(a few thousand) are encoded one by one. Every tile still has its own bytes in the file: a reader pays for the
whole slide as for a scanned one.

How consistent the levels are: level ``k`` is drawn from the 2**k-fold box downsample of the mosaic and of the
glass, masked by the island mask at that level. Up to level log2(MASK_CELL) every block of 2**k level-0 pixels lies
in one mask cell, and beyond it the level is the box downsample of that level's whole image, so every level is
exactly the box downsample of level 0 (before JPEG), except in the last row and column of blocks where the size is
not a multiple of 2**k (glass: cut blocks are drawn as whole ones). What a reader sees differs by JPEG's error
only: a few grey levels (``tests/test_gigapixel_slide.py`` states the tolerance).

The built file is cached under the project's user cache (``cache_root()/gigapixel``), named by a digest of every
parameter and of this builder's version, so a second benchmark run reuses it; it never goes in the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from app.slides.library import DEMO_FOLDER
from models.cpu.user_cache import cache_root

__all__ = ["GigapixelSpec", "build_slide", "draw_levels", "gigapixel_slide", "island_mask", "level_sizes", "SOURCE"]

SOURCE = DEMO_FOLDER / "CMU-1-Small-Region.svs"
SOURCE_MPP = 0.499  # the CMU slide's own scale (its openslide.mpp-x)
SMALLEST = 1000  # the pyramid ends with the first level whose longer side is under this many pixels
MASK_CELL = 64  # level-0 pixels per island-mask cell: a 16 um staircase at 0.25 um/px, a power of two
PERIOD = 4096  # level-0 pixels of the tissue mosaic's period: 4 x 4 crops of 1,024 pixels
BUILDER_VERSION = 2  # part of the cache key: a change to how the slide is drawn builds it again


@dataclass(frozen=True)
class GigapixelSpec:
    """What the slide is; every field is part of its cache key.

    Attributes:
        size: level 0's width and height in pixels.
        microns_per_pixel: level 0's scale, written in the resolution tags.
        islands: how many islands of tissue.
        tile: tile side in pixels (a multiple of 16 for JPEG's 4:2:0 blocks).
        quality: JPEG quality of every tile.
        mask_cell: level-0 pixels per island-mask cell (a power of two).
        smallest: the pyramid stops at the first level under this many pixels a side.
        seed: the islands' shapes and the mosaic's crops.
    """

    size: int = 100_000
    microns_per_pixel: float = 0.25
    islands: int = 5
    tile: int = 256
    quality: int = 80
    mask_cell: int = MASK_CELL
    smallest: int = SMALLEST
    seed: int = 0

    def key(self) -> str:
        what = dict(asdict(self), version=BUILDER_VERSION)
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def level_sizes(size: int, smallest: int) -> list[int]:
    """Side of each level: ``ceil(size / 2**k)`` for k = 0, 1, ... up to the first under ``smallest``."""
    sizes = [size]
    while sizes[-1] >= smallest and sizes[-1] > 1:
        sizes.append(math.ceil(size / 2 ** len(sizes)))
    return sizes


def island_mask(spec: GigapixelSpec) -> np.ndarray:
    """Boolean ``(cells, cells)``, one per :attr:`GigapixelSpec.mask_cell` level-0 pixels: where tissue is.

    ``spec.islands`` wobbly ellipses (five harmonics on the radius) on a jittered grid, cut where they would come
    within 4 % of the slide's side of its edge, so that the edges of every level are glass.
    """
    cells = math.ceil(spec.size / spec.mask_cell)
    rng = np.random.default_rng(spec.seed)
    margin = math.ceil(0.04 * cells)
    inner = cells - 2 * margin  # the islands' slots tile the slide within the margin
    per_row = math.ceil(math.sqrt(spec.islands))
    slot_y, slot_x = inner / math.ceil(spec.islands / per_row), inner / per_row
    slot = min(slot_y, slot_x)
    y, x = np.mgrid[0:cells, 0:cells].astype(np.float32) + 0.5
    mask = np.zeros((cells, cells), dtype=bool)
    for index in range(spec.islands):
        row, col = divmod(index, per_row)
        radius = slot * rng.uniform(0.34, 0.42)  # the semi-major axis; with the wobble, within the slot
        centre_y = margin + slot_y * (row + 0.5) + rng.uniform(-0.05, 0.05) * slot
        centre_x = margin + slot_x * (col + 0.5) + rng.uniform(-0.05, 0.05) * slot
        squash, turn = rng.uniform(0.65, 0.95), rng.uniform(0, np.pi)
        dy, dx = y - centre_y, x - centre_x
        u = dx * np.cos(turn) + dy * np.sin(turn)  # along the major axis
        v = (-dx * np.sin(turn) + dy * np.cos(turn)) / squash
        angle = np.arctan2(v, u)
        wobble = 1 + sum(rng.uniform(0, 0.12 / k) * np.cos(k * angle + rng.uniform(0, 2 * np.pi))
                         for k in range(2, 7))
        mask |= np.hypot(u, v) <= radius * wobble
    mask[:margin], mask[-margin:], mask[:, :margin], mask[:, -margin:] = False, False, False, False
    return mask


def _box_mean(pixels: np.ndarray, factor: int) -> np.ndarray:
    """``(H / factor, W / factor, 3)`` float64: means over ``factor`` x ``factor`` blocks (a power of two dividing
    H and W), by halving: sums of integers over powers of two, so exact, whatever the order."""
    means = np.asarray(pixels, dtype=np.float64)  # no copy when it is float64 already
    while factor > 1:
        means = (means[0::2, 0::2] + means[1::2, 0::2] + means[0::2, 1::2] + means[1::2, 1::2]) / 4
        factor //= 2
    return means


def _box_down(pixels: np.ndarray, factor: int) -> np.ndarray:
    """:func:`_box_mean` rounded to uint8."""
    return pixels if factor == 1 else np.round(_box_mean(pixels, factor)).astype(np.uint8)


def _source_pixels(source: Path) -> np.ndarray:
    import openslide

    with openslide.OpenSlide(str(source)) as slide:
        rgba = np.asarray(slide.read_region((0, 0), 0, slide.dimensions))
    return np.ascontiguousarray(rgba[..., :3])


def _density(rgb: np.ndarray) -> np.ndarray:
    """Optical density, the largest over R, G and B, by a table of the 256 values (float32)."""
    table = -np.log(np.maximum(np.arange(256), 1) / 255.0).astype(np.float32)
    return table[rgb.min(axis=-1)]  # the darkest channel has the largest density


def tissue_mosaic(source_rgb: np.ndarray, microns_per_pixel: float, seed: int) -> np.ndarray:
    """``(PERIOD, PERIOD, 3)`` uint8 at ``microns_per_pixel``: 4 x 4 crops of the source's densest H&E, each turned
    or mirrored at random, resampled (Lanczos) from the source's scale."""
    crop = round(PERIOD / 4 * microns_per_pixel / SOURCE_MPP)  # source pixels per crop side
    density = _density(source_rgb)
    stained = density > 0.15
    # Stained share of every crop on a 64-pixel lattice, by a summed-area table: the crops to draw from.
    table = np.pad(stained.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    tops = np.arange(0, stained.shape[0] - crop, 64)
    lefts = np.arange(0, stained.shape[1] - crop, 64)
    t, left = np.meshgrid(tops, lefts, indexing="ij")
    share = (table[t + crop, left + crop] - table[t, left + crop] - table[t + crop, left] + table[t, left]) / crop**2
    dense = np.argwhere(share >= min(0.8, share.max() * 0.95))
    rng = np.random.default_rng(seed)
    side = PERIOD // 4
    mosaic = np.empty((PERIOD, PERIOD, 3), dtype=np.uint8)
    for i in range(4):
        for j in range(4):
            a, b = dense[rng.integers(len(dense))]
            piece = source_rgb[tops[a]:tops[a] + crop, lefts[b]:lefts[b] + crop]
            piece = np.rot90(piece, int(rng.integers(4)))
            if rng.integers(2):
                piece = piece[:, ::-1]
            resized = Image.fromarray(np.ascontiguousarray(piece)).resize((side, side), Image.Resampling.LANCZOS)
            mosaic[i * side:(i + 1) * side, j * side:(j + 1) * side] = np.asarray(resized)
    return mosaic


def glass_tile(source_rgb: np.ndarray, microns_per_pixel: float, tile: int) -> np.ndarray:
    """``(tile, tile, 3)`` uint8: the source's cleanest patch of glass, resampled to ``microns_per_pixel``."""
    crop = max(8, round(tile * microns_per_pixel / SOURCE_MPP))
    density = _density(source_rgb)
    best, where = np.inf, (0, 0)
    for top in range(0, source_rgb.shape[0] - crop, crop):
        for left in range(0, source_rgb.shape[1] - crop, crop):
            darkest = density[top:top + crop, left:left + crop].max()  # a speck anywhere rules the patch out
            if darkest < best:
                best, where = darkest, (top, left)
    piece = source_rgb[where[0]:where[0] + crop, where[1]:where[1] + crop]
    return np.asarray(Image.fromarray(np.ascontiguousarray(piece)).resize((tile, tile), Image.Resampling.LANCZOS))


def _jpeg(pixels: np.ndarray, quality: int) -> bytes:
    buffer = io.BytesIO()
    # subsampling=2 is 4:2:0, as the YCbCrSubSampling tag says; PIL writes YCbCr, as PhotometricInterpretation says
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality, subsampling=2)
    return buffer.getvalue()


class _Level:
    """One level's tiles, in row-major order, as JPEG bytes; counts what it encoded and what it reused."""

    def __init__(self, spec: GigapixelSpec, k: int, side: int, mosaic: np.ndarray, glass: np.ndarray,
                 mask: np.ndarray, coarse: np.ndarray | None):
        self.spec, self.k, self.side, self.tiles = spec, k, side, math.ceil(side / spec.tile)
        factor = 2**k
        self.mosaic = mosaic  # already at this level (None past the mosaic's period)
        reps = max(1, factor // spec.tile)  # the glass tile's period is under one pixel past level log2(tile)
        self.glass = _box_down(np.tile(glass, (reps, reps, 1)), factor)  # (tile / factor, ...) at least 1 pixel
        self.coarse = coarse  # levels past the mask cell: the level's whole image (see _coarse_image)
        # Each mask cell covers cell / 2**k level-k pixels; a tile covers tile / that many cells.
        self.cell_px = spec.mask_cell // factor if factor <= spec.mask_cell else 0
        if self.cell_px:
            per_tile = spec.tile // self.cell_px
            padded = np.zeros((self.tiles * per_tile, self.tiles * per_tile), dtype=bool)
            padded[:mask.shape[0], :mask.shape[1]] = mask[:self.tiles * per_tile, :self.tiles * per_tile]
            self.mask = padded
            blocks = padded.reshape(self.tiles, per_tile, self.tiles, per_tile)  # (tile rows, cells, tile cols, cells)
            self.kind = np.where(blocks.all(axis=(1, 3)), 1, np.where(blocks.any(axis=(1, 3)), 2, 0))
        self.encoded = self.reused = 0
        self._cache: dict[tuple, bytes] = {}

    def _periodic(self, pattern: np.ndarray, top: int, left: int) -> np.ndarray:
        rows = (top + np.arange(self.spec.tile)) % pattern.shape[0]
        cols = (left + np.arange(self.spec.tile)) % pattern.shape[1]
        return pattern[np.ix_(rows, cols)]

    def draw(self, ti: int, tj: int) -> tuple[tuple | None, np.ndarray]:
        """Tile (ti, tj)'s pixels ``(tile, tile, 3)`` uint8 and the key of the tiles equal to it (None: a tile of
        its own)."""
        top, left = ti * self.spec.tile, tj * self.spec.tile
        if not self.cell_px:  # past the mask cell: a crop of the level's whole image, glass beyond it
            return None, self._crop(top, left)
        kind = self.kind[ti, tj]
        if kind == 0:
            return ("glass",), self._glass(top, left)
        if kind == 1:
            period = self.mosaic.shape[0]
            return ("tissue", top % period, left % period), self._tissue(top, left)
        return None, self._edge(top, left)

    def tile_bytes(self) -> Iterator[bytes]:
        """Every tile as JPEG, row by row; a tile equal to one already encoded is given its bytes again."""
        for ti in range(self.tiles):
            for tj in range(self.tiles):
                key = self._key(ti, tj)
                if key is not None and key in self._cache:
                    self.reused += 1
                    yield self._cache[key]
                    continue
                key, pixels = self.draw(ti, tj)
                data = _jpeg(pixels, self.spec.quality)
                self.encoded += 1
                if key is not None:
                    self._cache[key] = data
                yield data

    def _key(self, ti: int, tj: int) -> tuple | None:
        """:meth:`draw`'s key without drawing the tile."""
        if not self.cell_px or self.kind[ti, tj] == 2:
            return None
        if self.kind[ti, tj] == 0:
            return ("glass",)
        period = self.mosaic.shape[0]
        return ("tissue", ti * self.spec.tile % period, tj * self.spec.tile % period)

    def pixels(self) -> np.ndarray:
        """The whole level ``(side, side, 3)`` uint8, unencoded (for small slides: tests)."""
        tile = self.spec.tile
        out = np.empty((self.tiles * tile, self.tiles * tile, 3), dtype=np.uint8)
        for ti in range(self.tiles):
            for tj in range(self.tiles):
                out[ti * tile:(ti + 1) * tile, tj * tile:(tj + 1) * tile] = self.draw(ti, tj)[1]
        return out[:self.side, :self.side]

    def _glass(self, top: int, left: int) -> np.ndarray:
        return self._periodic(self.glass, top, left)

    def _tissue(self, top: int, left: int) -> np.ndarray:
        return self._periodic(self.mosaic, top, left)

    def _edge(self, top: int, left: int) -> np.ndarray:
        """A tile on an island's edge: tissue where the mask says, glass elsewhere, drawn pixel by pixel."""
        cells = self.spec.tile // self.cell_px
        block = self.mask[top // self.cell_px:top // self.cell_px + cells, left // self.cell_px:
                          left // self.cell_px + cells]
        inside = np.repeat(np.repeat(block, self.cell_px, axis=0), self.cell_px, axis=1)[..., None]
        return np.where(inside, self._tissue(top, left), self._glass(top, left))

    def _crop(self, top: int, left: int) -> np.ndarray:
        tile = self.spec.tile
        out = np.tile(self._periodic(self.glass, 0, 0)[:1, :1], (tile, tile, 1))  # beyond the image: glass
        piece = self.coarse[top:top + tile, left:left + tile]
        out[:piece.shape[0], :piece.shape[1]] = piece
        return out


def _coarse_image(spec: GigapixelSpec, mosaic: np.ndarray, glass: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The whole level at the mask cell's downsample, float64, one pixel per mask cell: every pixel is exactly one
    cell's mean (of mosaic or glass), so coarser levels are its box means, rounded once."""
    cell = spec.mask_cell
    tissue = _box_mean(mosaic, cell)  # (PERIOD / cell, ...): periodic
    reps = max(1, cell // spec.tile)
    plain = _box_mean(np.tile(glass, (reps, reps, 1)), cell)
    rows = np.arange(mask.shape[0])
    tissue = tissue[np.ix_(rows % tissue.shape[0], rows % tissue.shape[1])]
    plain = plain[np.ix_(rows % plain.shape[0], rows % plain.shape[1])]
    return np.where(mask[..., None], tissue, plain)


def _coarse_level(image: np.ndarray, factor: int) -> np.ndarray:
    """``image`` (float) box-downsampled by ``factor`` and rounded to uint8, its last cut block padded by repeating
    its edge (glass)."""
    rows = math.ceil(image.shape[0] / factor) * factor
    padded = np.pad(image, ((0, rows - image.shape[0]), (0, rows - image.shape[1]), (0, 0)), mode="edge")
    return np.round(_box_mean(padded, factor)).astype(np.uint8)


def _levels(spec: GigapixelSpec, source: Path) -> tuple[list[_Level], float]:
    """Every level's drawer, and the island mask's share of the slide."""
    rgb = _source_pixels(source)
    mosaic = tissue_mosaic(rgb, spec.microns_per_pixel, spec.seed)
    glass = glass_tile(rgb, spec.microns_per_pixel, spec.tile)
    mask = island_mask(spec)
    sizes = level_sizes(spec.size, spec.smallest)
    coarse = _coarse_image(spec, mosaic, glass, mask) if 2 ** (len(sizes) - 1) > spec.mask_cell else None
    levels, means = [], mosaic.astype(np.float64)
    for k, side in enumerate(sizes):
        factor = 2**k
        image = _coarse_level(coarse, factor // spec.mask_cell) if factor > spec.mask_cell else None
        # The mosaic's 2**k box means by halving the last level's unrounded means: exact (sums of integers over
        # powers of two) and a third of the work of averaging the whole mosaic again for every level.
        if k:
            means = _box_mean(means, 2) if means.shape[0] > 1 else means
        drawn = (np.round(means).astype(np.uint8) if k else mosaic) if factor <= PERIOD else None
        levels.append(_Level(spec, k, side, drawn, glass, mask, image))
    return levels, float(mask.mean())


def draw_levels(spec: GigapixelSpec, source: Path = SOURCE) -> list[np.ndarray]:
    """Every level of the slide ``spec`` describes, as drawn before JPEG: ``(side, side, 3)`` uint8 each (for
    small slides: tests)."""
    return [level.pixels() for level in _levels(spec, source)[0]]


def build_slide(path: Path, spec: GigapixelSpec, source: Path = SOURCE) -> dict:
    """Write the slide ``spec`` describes to ``path`` (a temporary name renamed into place). Returns what was
    built: level sizes, tiles written, tiles encoded, bytes, seconds, and the island mask's tissue share."""
    start = time.perf_counter()
    levels, share = _levels(spec, source)
    sizes = [level.side for level in levels]
    partial = path.with_name(path.name + ".partial")
    description = (f"gigapixel benchmark slide: {spec.islands} islands of CMU-1-Small-Region H&E in glass, "
                   f"{spec.microns_per_pixel} um/px, builder {BUILDER_VERSION}, seed {spec.seed}")
    write_pyramidal_tiff(partial, [(side, level.tile_bytes()) for side, level in zip(sizes, levels, strict=True)],
                         spec.tile, spec.microns_per_pixel, description)
    os.replace(partial, path)
    return dict(path=str(path), level_sizes=sizes, tiles=sum(level.tiles**2 for level in levels),
                encoded=sum(level.encoded for level in levels), bytes=path.stat().st_size,
                tissue_share=share, build_s=time.perf_counter() - start)


def write_pyramidal_tiff(path: Path, levels: list[tuple[int, Iterator[bytes]]], tile: int, microns_per_pixel: float,
                         description: str) -> None:
    """A little-endian BigTIFF of square levels, each a top-level IFD of ``tile``-pixel JPEG tiles (YCbCr 4:2:0)
    given as their encoded bytes in row-major order, with the scale as pixels per centimetre.

    tifffile writes pre-encoded tiles only where ``imagecodecs`` is installed (it looks the JPEG encoder up even
    for bytes it will not encode), which this project does not need otherwise; a TIFF of tiles is small to write.
    """
    with open(path, "wb") as out:
        out.write(b"II" + struct.pack("<HHHQ", 43, 8, 0, 0))
        link = 8  # where the offset of the next IFD goes: the header's, then each IFD's last 8 bytes
        for k, (side, tiles) in enumerate(levels):
            offsets, counts = [], []
            for data in tiles:
                offsets.append(out.tell())
                counts.append(len(data))
                out.write(data)
            per_cm = Fraction(1e4 / microns_per_pixel / 2**k).limit_denominator(1 << 20)
            entries = [  # (tag, type, values): SHORT 3, LONG 4, RATIONAL 5, LONG8 16, ASCII 2
                (254, 4, [1 if k else 0]), (256, 4, [side]), (257, 4, [side]), (258, 3, [8, 8, 8]), (259, 3, [7]),
                (262, 3, [6]), (270, 2, description.encode() + b"\0"), (277, 3, [3]),
                (282, 5, [(per_cm.numerator, per_cm.denominator)]), (283, 5, [(per_cm.numerator, per_cm.denominator)]),
                (284, 3, [1]), (296, 3, [3]), (322, 4, [tile]), (323, 4, [tile]), (324, 16, offsets),
                (325, 16, counts), (530, 3, [2, 2]),
                (532, 5, [(0, 1), (255, 1), (128, 1), (255, 1), (128, 1), (255, 1)]),  # ReferenceBlackWhite
            ]
            link = _write_ifd(out, entries, link)


def _write_ifd(out, entries: list[tuple[int, int, list]], link: int) -> int:
    """Values over 8 bytes first, then the IFD pointing at them; the previous link is pointed at this IFD. Returns
    where this IFD's own link is."""
    formats = {2: "B", 3: "H", 4: "I", 5: "II", 16: "Q"}
    packed = []
    for tag, kind, values in entries:
        if kind == 2:
            data, count = bytes(values), len(values)
        elif kind == 5:
            data, count = b"".join(struct.pack("<II", *v) for v in values), len(values)
        else:
            data, count = struct.pack(f"<{len(values)}{formats[kind]}", *values), len(values)
        if len(data) > 8:
            if out.tell() % 2:
                out.write(b"\0")  # TIFF offsets are on word boundaries
            place = out.tell()
            out.write(data)
            data = struct.pack("<Q", place)
        packed.append(struct.pack("<HHQ", tag, kind, count) + data.ljust(8, b"\0"))
    if out.tell() % 2:
        out.write(b"\0")
    here = out.tell()
    out.write(struct.pack("<Q", len(packed)) + b"".join(packed) + struct.pack("<Q", 0))
    end = out.tell()
    out.seek(link)
    out.write(struct.pack("<Q", here))
    out.seek(end)
    return end - 8


def gigapixel_slide(spec: GigapixelSpec = GigapixelSpec(), folder: Path | None = None,
                    source: Path = SOURCE) -> tuple[Path, dict | None]:
    """The slide ``spec`` describes, built once into ``folder`` (default ``cache_root()/gigapixel``) under its
    cache key. Returns its path and the build's record (None when it was there already)."""
    folder = folder or cache_root() / "gigapixel"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gigapixel-{spec.size}-{spec.key()}.tif"
    if path.is_file():
        return path, None
    return path, build_slide(path, spec, source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=GigapixelSpec.size, help="level 0's side in pixels")
    parser.add_argument("--mpp", type=float, default=GigapixelSpec.microns_per_pixel, help="level 0's um/px")
    parser.add_argument("--out", type=Path, help="write here instead of the cache (built again every time)")
    args = parser.parse_args(argv)
    spec = GigapixelSpec(size=args.size, microns_per_pixel=args.mpp)
    if args.out:
        built = build_slide(args.out, spec)
    else:
        path, built = gigapixel_slide(spec)
        built = built or dict(path=str(path), cached=True)
    print(json.dumps(built, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
