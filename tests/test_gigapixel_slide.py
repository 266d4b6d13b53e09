"""The benchmarks' gigapixel slide (:mod:`benchmarks.gigapixel_slide`), built small through the same builder: a real
pyramidal TIFF that OpenSlide reads with halving levels and the scale written, each level the box downsample of
level 0 (exactly as drawn, within JPEG's error as read), and a tissue mask that finds the islands and not the glass,
planned without reading level 0."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.slides.reader import Slide, open_slide
from app.slides.run import THUMBNAIL_SIDE, plan_slide, tissue_share, tissue_shares
from app.slides.scale import slide_scale
from benchmarks.gigapixel_slide import SOURCE, GigapixelSpec, build_slide, draw_levels, gigapixel_slide, island_mask
from tests.conftest import REPO, require_shared

tifffile = pytest.importorskip("tifffile")
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
# 4,096 pixels a side, down to 64: levels 1 to 4 drawn tile by tile from the 16-pixel mask cells, levels 5 and 6
# from the whole level at the cell's downsample, as the gigapixel slide's levels past its 64-pixel cells are.
SPEC = GigapixelSpec(size=4096, mask_cell=16, smallest=100)
SIDES = [4096, 2048, 1024, 512, 256, 128, 64]


@pytest.fixture(scope="module")
def small_slide(tmp_path_factory) -> Path:
    require_shared(SOURCE, f"{SOURCE} not found (the real slides live in ../shared/data/slides)")
    path = tmp_path_factory.mktemp("gigapixel") / "small.tif"
    built = build_slide(path, SPEC)
    assert built["level_sizes"] == SIDES and built["tiles"] == sum(math.ceil(s / 256) ** 2 for s in SIDES)
    assert built["encoded"] < built["tiles"] / 2, "tiles inside an island and of glass are encoded once"
    return path


def box_means(pixels: np.ndarray, levels: int) -> list[np.ndarray]:
    """``pixels``'s means over 2**k x 2**k blocks, float64, for k = 0 to ``levels - 1``: each the last's means over
    2 x 2 (exact: sums of integers over powers of two)."""
    means = [pixels.astype(np.float64)]
    for _ in range(1, levels):
        rows, cols = means[-1].shape[0] // 2, means[-1].shape[1] // 2
        means.append(means[-1].reshape(rows, 2, cols, 2, 3).mean(axis=(1, 3)))  # (rows, 2, cols, 2, 3)
    return means


def test_openslide_reads_halving_jpeg_levels_and_the_scale_written(small_slide):
    with open_slide(small_slide) as slide:
        assert slide.vendor == "generic-tiff"
        assert slide.level_dimensions == tuple((s, s) for s in SIDES)
        assert slide.level_downsamples == tuple(float(2**k) for k in range(len(SIDES)))
        scale = slide_scale(slide.properties)
        assert (scale.source, scale.microns_per_pixel) == ("slide", 0.25)
    with tifffile.TiffFile(small_slide) as tiff:
        assert tiff.is_bigtiff and len(tiff.pages) == len(SIDES)
        for k, page in enumerate(tiff.pages):
            assert (page.compression, page.photometric, page.tilewidth, page.tilelength) == (7, 6, 256, 256), k
            assert page.subfiletype == (1 if k else 0)


def test_every_level_is_level_0s_box_downsample(small_slide):
    # As drawn, before JPEG: exactly, rounded once.
    drawn = draw_levels(SPEC)
    expected = box_means(drawn[0], len(SIDES))
    for k in range(1, len(SIDES)):
        np.testing.assert_array_equal(drawn[k], np.round(expected[k]), err_msg=f"level {k}")
    # As read: JPEG's error at quality 80 only. Each level is encoded on its own, so both sides carry it, largest
    # on the coarsest levels, where a pixel holds the most detail.
    with open_slide(small_slide) as slide:
        expected = box_means(slide.read_region(0, 0, 0, 4096, 4096), len(SIDES))
        for k in range(1, len(SIDES)):
            error = np.abs(slide.read_region(0, 0, k, SIDES[k], SIDES[k]) - expected[k])
            assert error.mean() < 5 and np.percentile(error, 99) < 30, (k, error.mean())


def test_the_tissue_mask_finds_the_islands_and_not_the_glass(small_slide, monkeypatch):
    read = []
    real_read = Slide.read_region

    def recorded(self, left, top, level, width, height):
        read.append((level, width * height))
        return real_read(self, left, top, level, width, height)

    monkeypatch.setattr(Slide, "read_region", recorded)
    plan = plan_slide(small_slide, CHECKPOINT, small_slide.parent / "store")
    # Planning reads the thumbnail's level, never level 0: its cost does not grow with the slide.
    assert all(level > 0 for level, _ in read) and sum(n for _, n in read) <= 4 * THUMBNAIL_SIDE**2
    islands = island_mask(SPEC)  # 256 x 256 cells of 16 pixels; the thumbnail is 1,024 x 1,024
    islands = np.repeat(np.repeat(islands, 4, axis=0), 4, axis=1)
    inside, outside = _eroded(islands, 8), ~_dilated(islands, 8)  # 8 thumbnail pixels: 32 um at 4 um/px
    assert plan.tissue.shape == islands.shape
    assert plan.tissue[inside].mean() > 0.95, "the islands are tissue"
    assert plan.tissue[outside].mean() < 0.001, "the glass is not"
    # the plan's shares, from one summed-area table, are each chunk's block mean to the last bit
    shares = tissue_shares(plan.grid, plan.tissue)
    assert shares == {index: tissue_share(plan.grid, plan.tissue, *index) for index in np.ndindex(*plan.grid.chunks)}
    assert set(plan.chunks) == {index for index, share in shares.items() if share > 0}


def _dilated(mask: np.ndarray, by: int) -> np.ndarray:
    out = mask.copy()
    for shift in range(1, by + 1):
        out[shift:] |= mask[:-shift]
        out[:-shift] |= mask[shift:]
    grown = out.copy()
    for shift in range(1, by + 1):
        grown[:, shift:] |= out[:, :-shift]
        grown[:, :-shift] |= out[:, shift:]
    return grown


def _eroded(mask: np.ndarray, by: int) -> np.ndarray:
    return ~_dilated(~mask, by)


def test_a_built_slide_is_found_again_in_the_cache_by_its_parameters(tmp_path, monkeypatch):
    require_shared(SOURCE, f"{SOURCE} not found (the real slides live in ../shared/data/slides)")
    monkeypatch.setenv("AAGC_CACHE", str(tmp_path))
    spec = GigapixelSpec(size=1024, smallest=600)
    path, built = gigapixel_slide(spec)
    assert built is not None and path.is_relative_to(tmp_path) and path.is_file()
    assert gigapixel_slide(spec) == (path, None), "the second run reuses the file"
    assert GigapixelSpec(size=1024, smallest=600, seed=1).key() != spec.key(), "other parameters, another slide"
