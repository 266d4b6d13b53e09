"""Slides of one large level read through a pyramid built once (app/slides/pyramid.py), and the sizes refused.

The thresholds are lowered here (a pyramid above 256 pixels, down to 64) so that the files stay small; the server's
are 4,096 and 1,024.
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
from PIL import Image

import app.slides.pyramid as pyramid
from app.slides.http import path_number
from app.slides.moved import moved_slide
from app.slides.reader import SlideError, open_slide
from app.slides.tiles import deep_zoom
from benchmarks.server_limits import tiled_tiff


@pytest.fixture
def small_thresholds(tmp_path, monkeypatch):
    monkeypatch.setattr(pyramid, "PYRAMID_ABOVE", 256)
    monkeypatch.setattr(pyramid, "COARSEST_SIDE", 64)
    monkeypatch.setenv("APP_SLIDE_PYRAMIDS", str(tmp_path / "pyramids"))
    return tmp_path


def noise(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, cols, 3), dtype=np.uint8)


def test_a_large_image_is_read_from_its_pyramid_with_its_exact_pixels(small_thresholds):
    pixels = noise(300, 520)
    path = small_thresholds / "large.png"
    Image.fromarray(pixels).save(path)
    with open_slide(path) as slide:
        assert slide.vendor == "image" and slide.pyramid.parent == small_thresholds / "pyramids"
        assert slide.pyramid.name == f"{pyramid.file_digest(path)}.tif", "named by the file's digest"
        assert slide.level_dimensions == ((520, 300), (130, 75), (33, 19))
        np.testing.assert_array_equal(slide.read_region(0, 0, 0, 520, 300), pixels)
        np.testing.assert_array_equal(slide.read_region(0, 0, 1, 130, 75), pyramid.reduce4(pixels))
        np.testing.assert_array_equal(slide.read_region(500, 290, 0, 30, 20)[:10, :20], pixels[290:, 500:])
        assert (slide.read_region(500, 290, 0, 30, 20)[10:] == 255).all(), "white outside the image"
        assert slide.colour
    built = slide.pyramid.stat().st_mtime_ns
    with open_slide(path) as again, moved_slide(open_slide(path), 3) as moved:
        assert again.pyramid.stat().st_mtime_ns == built, "built once: the second open reads it"
        np.testing.assert_array_equal(moved.read_region(0, 0, 0, 300, 520),
                                      np.rot90(pixels, 3, axes=(0, 1)).copy(), "a moved view reads the pyramid")


def test_the_reduced_levels_are_means_of_4_by_4_blocks():
    pixels = noise(9, 10)
    reduced = pyramid.reduce4(pixels)
    assert reduced.shape == (3, 3, 3)
    np.testing.assert_array_equal(reduced[0, 0], np.round(pixels[:4, :4].reshape(-1, 3).mean(0)).astype(np.uint8))
    edge = pixels[8:, 8:].reshape(-1, 3).mean(0)  # a block cut by the edge: the mean of what it has, to one level
    assert np.abs(reduced[2, 2] - edge).max() <= 1


def test_a_single_level_tiff_keeps_its_level_0_and_gains_coarser_levels(small_thresholds):
    pixels = noise(600, 700, seed=1)
    path = small_thresholds / "one-level.tif"
    tifffile.imwrite(path, pixels, tile=(128, 128), compression="zlib", photometric="rgb")
    with open_slide(path) as slide:
        assert slide.vendor == "generic-tiff" and slide.pyramid is not None
        assert slide.level_dimensions == ((700, 600), (175, 150), (44, 38))
        np.testing.assert_array_equal(slide.read_region(64, 32, 0, 100, 50), pixels[32:82, 64:164])
        np.testing.assert_array_equal(slide.read_region(0, 0, 1, 175, 150), pyramid.reduce4(pixels))
        thumbnail = slide.thumbnail(60)
        assert thumbnail.shape == (51, 60, 3)
    generator = deep_zoom(str(path), path.stat().st_mtime_ns, 0)
    assert generator.level_count == 11 and generator.get_tile(7, (0, 0)).size == (88, 75)


def test_the_thumbnail_of_a_large_level_is_read_in_strips_as_it_would_be_whole(small_thresholds, monkeypatch):
    import app.slides.reader as reader

    pixels = noise(300, 520, seed=2)
    path = small_thresholds / "strips.png"
    Image.fromarray(pixels).save(path)
    with open_slide(path) as slide:
        whole = slide.thumbnail(200)
        monkeypatch.setattr(reader, "THUMBNAIL_STRIP_PIXELS", 9_000)
        strips = slide.thumbnail(200)
    assert strips.shape == whole.shape == (115, 200, 3)
    assert np.abs(strips.astype(int) - whole.astype(int)).max() <= 1, "Pillow's box filter, band by band"


def test_slides_too_large_to_read_in_bounded_memory_are_refused_with_a_sentence(tmp_path):
    huge = tiled_tiff(tmp_path / "huge.tif", 204800)
    assert huge.stat().st_size < 400_000, "crafted small"
    with pytest.raises(SlideError, match=r"huge.tif: its only level is 204,800 x 204,800 pixels, more than this "
                                         r"server reads for an overview \(1,074 MP\); make it a tiled pyramidal TIFF"):
        open_slide(huge)
    sixteen = tmp_path / "deep.png"
    Image.new("I;16", (4200, 4100)).save(sixteen)
    with pytest.raises(SlideError, match=r"deep.png is a 4,200 x 4,100 image of I;16 pixels \(not 8-bit RGB or "
                                         r"grey\), which this server converts only up to 17 MP"):
        open_slide(sixteen)


def test_numbers_of_a_path_are_bounded_before_they_are_read():
    assert path_number("0") == 0 and path_number("123456789") == 123456789
    for text in ("", "1234567890", "9" * 5000, "-1", "1e3", "١٢", " 1", "+1"):
        assert path_number(text) is None, text
