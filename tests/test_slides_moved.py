"""A slide moved by an element of p4m (:mod:`app.slides.moved`), analysed as a slide of its own by the same run
path (:mod:`app.slides.run`), gives the original's heatmap moved (:mod:`app.slides.proof`): on a 704 x 576 crop of
the CMU slide (0.499 um/px, resampled to the model's 0.972) written as a two-level tiled TIFF that OpenSlide reads,
for a quarter turn (g = 1) and a mirrored element (g = 5); and its deep-zoom tiles are the moved slide's."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from starlette.requests import Request

from app.analysis.transforms import apply_element
from app.slides.library import DEMO_FOLDER, list_slides
from app.slides.moved import MovedSlide, move_rectangle, moved_slide
from app.slides.proof import compare_moved
from app.slides.reader import open_slide
from app.slides.run import assemble, chunk_task, plan_slide, start_slide
from app.slides.store import store_key
from app.slides.tiles import JPEG_QUALITY, deep_zoom, descriptor, moved_id, parse_slide_id, tile, tile_bytes
from tests.conftest import require_shared
from tests.test_slides_engine import CHECKPOINT, write_pyramid

CMU = DEMO_FOLDER / "CMU-1-Small-Region.svs"
CROP = (1250, 600, 704, 576)  # left, top, width, height: tissue and glass, 7 x 9 cells at the model's scale
CHUNK = 4  # 3 x 3 chunks of the 7 x 9 cells, palindromes along each side: every element maps them onto each other


def moved_rgb(rgb: np.ndarray, g: int) -> np.ndarray:
    """``(H, W, 3)`` moved by g on its pixel axes."""
    return apply_element(rgb.transpose(2, 0, 1), g).transpose(1, 2, 0)


def crop_of(pixels: np.ndarray, left: int, top: int, width: int, height: int) -> np.ndarray:
    """``pixels[top:top+height, left:left+width]`` with white where it leaves them, indexed pixel by pixel."""
    out = np.full((height, width, 3), 255, dtype=np.uint8)
    rows, cols = np.arange(top, top + height), np.arange(left, left + width)
    inside_rows = (rows >= 0) & (rows < pixels.shape[0])
    inside_cols = (cols >= 0) & (cols < pixels.shape[1])
    out[np.ix_(inside_rows, inside_cols)] = pixels[np.ix_(rows[inside_rows], cols[inside_cols])]
    return out


@pytest.fixture(scope="module")
def crop(tmp_path_factory) -> Path:
    require_shared(CMU, f"{CMU} not found (the demo slides)")
    with open_slide(CMU) as slide:
        rgb = slide.read_region(*CROP[:2], 0, *CROP[2:])
    path = tmp_path_factory.mktemp("moved") / "crop.tif"
    write_pyramid(path, rgb, microns_per_pixel=0.499)
    return path


@pytest.fixture(scope="module")
def original_run(crop):
    plan = plan_slide(crop, CHECKPOINT, crop.parent / "store", chunk=CHUNK, precision="float32")  # the exact path
    return plan, assemble(plan, {index: run_chunk(plan, *index) for index in plan.chunks})


def run_chunk(plan, ci: int, cj: int):
    """Chunk (ci, cj) of ``plan`` as a worker runs it, in this process."""
    return chunk_task(str(plan.slide), plan.scale.microns_per_pixel, str(plan.checkpoint), plan.grid.chunk, ci, cj,
                      plan.element)


def test_a_rectangle_goes_where_apply_element_sends_its_pixels():
    rng = np.random.default_rng(0)
    for shape in ((5, 7), (6, 6), (4, 9)):
        for g in range(8):
            for _ in range(20):
                top, left = (int(v) for v in rng.integers(0, shape, 2))
                bottom = top + int(rng.integers(1, shape[0] - top + 1))
                right = left + int(rng.integers(1, shape[1] - left + 1))
                inside = np.zeros(shape, dtype=bool)
                inside[top:bottom, left:right] = True
                rows, cols = np.nonzero(apply_element(inside, g))
                expected = (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1)
                assert move_rectangle((top, bottom, left, right), shape, g) == expected, (shape, g)


@pytest.mark.parametrize("g", range(1, 8))
def test_a_moved_slides_region_is_that_crop_of_its_moved_level_0_white_outside(crop, g):
    rng = np.random.default_rng(g)
    with open_slide(crop) as slide, moved_slide(open_slide(crop), g) as moved:
        whole = slide.read_region(0, 0, 0, *slide.dimensions)
        expected = moved_rgb(whole, g)
        width, height = moved.dimensions
        assert (height, width) == expected.shape[:2]
        assert moved.level_dimensions[1] == (slide.level_dimensions[1][::-1] if g % 2 else slide.level_dimensions[1])
        for _ in range(25):  # rectangles inside, across the edges, and wholly outside
            left, top = int(rng.integers(-60, width + 20)), int(rng.integers(-60, height + 20))
            w, h = (int(v) for v in rng.integers(1, 200, 2))
            np.testing.assert_array_equal(moved.read_region(left, top, 0, w, h), crop_of(expected, left, top, w, h),
                                          err_msg=f"g={g} ({left}, {top}) {w} x {h}")
        # The half-size level: its sides are exactly half (704 x 576), so it is exactly the original's moved, and so
        # is any read from an even level-0 corner.
        level = moved.read_region(0, 0, 1, *moved.level_dimensions[1])
        np.testing.assert_array_equal(level, moved_rgb(slide.read_region(0, 0, 1, *slide.level_dimensions[1]), g))
        np.testing.assert_array_equal(moved.read_region(-40, 60, 1, 100, 90), crop_of(level, -20, 30, 100, 90))
        np.testing.assert_array_equal(moved.thumbnail(300), moved_rgb(slide.thumbnail(300), g))
        assert moved.properties["openslide.mpp-x"] == slide.properties[f"openslide.mpp-{'y' if g % 2 else 'x'}"]


def test_an_image_slide_moves_too_and_element_0_is_the_slide_itself(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (37, 52, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "odd.png")
    with open_slide(tmp_path / "odd.png") as slide:
        assert moved_slide(slide, 0) is slide
        with pytest.raises(ValueError, match="0 to 7, not 8"):
            moved_slide(slide, 8)
        for g in range(1, 8):
            moved = MovedSlide(slide, g)
            np.testing.assert_array_equal(moved.read_region(-3, -5, 0, 70, 60),
                                          crop_of(moved_rgb(rgb, g), -3, -5, 70, 60), err_msg=f"g={g}")


@pytest.mark.parametrize("g", [1, 5])
def test_the_moved_slides_plan_has_the_moved_grid_thumbnail_and_tissue(crop, original_run, g):
    original, _ = original_run
    plan = plan_slide(crop, CHECKPOINT, crop.parent / "store", chunk=CHUNK, element=g, precision="float32")
    assert plan.element == g and (original.grid.cells.rows, original.grid.cells.cols) == (7, 9)
    assert (plan.grid.cells.rows, plan.grid.cells.cols) == (9, 7), "odd elements swap the grid's sides"
    assert plan.grid.model_size == original.grid.model_size[::-1] and plan.grid.size == original.grid.size[::-1]
    np.testing.assert_array_equal(plan.thumbnail, moved_rgb(original.thumbnail, g))
    np.testing.assert_array_equal(plan.tissue, apply_element(original.tissue, g))
    assert plan.store.folder != original.store.folder


def test_store_keys_name_the_element_and_element_0_keeps_its_key(original_run):
    plan, _ = original_run
    grid = plan.grid
    before = dict(slide="id", weights="w", microns_per_pixel=grid.microns_per_pixel,
                  model_microns_per_pixel=grid.model_microns_per_pixel, model_size=grid.model_size,
                  cells=[grid.cells.rows, grid.cells.cols, grid.cells.top, grid.cells.left, grid.cells.cell,
                         grid.cells.context], chunk=grid.chunk,
                  partition="palindrome")  # the key's contents before moves existed
    old = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:24]
    assert store_key("id", "w", grid) == store_key("id", "w", grid, element=0) == old
    keys = {store_key("id", "w", grid, element=g) for g in range(8)}
    assert len(keys) == 8, "each element its own store, even those whose grid is the original's (g = 2, 4, 6)"


@pytest.mark.parametrize("g", [1, 5])
def test_the_moved_slides_run_gives_the_original_heatmap_and_attention_moved(crop, original_run, g):
    original, arrays = original_run
    plan = plan_slide(crop, CHECKPOINT, crop.parent / "store", chunk=CHUNK, element=g, precision="float32")
    if g == 5:  # through Dask as the page runs it: the element travels with each task
        from dask.distributed import Client, wait

        with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
            wait(start_slide(plan, client))
        results = {index: plan.store.get(*index) for index in plan.chunks}
    else:
        results = {index: run_chunk(plan, *index) for index in plan.chunks}
    moved = assemble(plan, results)
    comparison = compare_moved(arrays, moved, g)
    # Measured: 2.7e-7 (g = 1) and 2.7e-7 (g = 5) on tumour probabilities; the attention, kept in float16, equal.
    assert comparison.probability_difference < 1e-5, comparison
    assert set(comparison.attention_difference) == {"removed", "spatial"}
    for reading, difference in comparison.attention_difference.items():
        assert difference <= 1e-3, (reading, comparison)  # within one float16 step of values below 2
    assert comparison.tissue_difference == 0, "stained pixels are counted exactly"
    assert comparison.cells_compared >= 35, comparison
    assert not comparison.evaluated_differ, "the chunks are palindromes: g maps them, and their cells, onto each other"


def call(endpoint, **params):
    """A route's response to a GET with ``params`` as its path's parameters."""
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b"", "path_params": params}
    return asyncio.run(endpoint(Request(scope)))


def jpeg(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def test_a_moved_slides_tiles_are_the_moved_slides_and_bad_suffixes_are_404(crop, tmp_path, monkeypatch):
    monkeypatch.setenv("APP_SLIDES", str(crop.parent))
    monkeypatch.setenv("APP_SLIDE_UPLOADS", str(tmp_path / "uploads"))
    entry = next(e for e in list_slides() if e.path == crop)
    assert parse_slide_id(moved_id(entry.slide_id, 5)) == (entry.slide_id, 5) and moved_id("x", 0) == "x"
    with open_slide(crop) as slide:
        whole = slide.read_region(0, 0, 0, *slide.dimensions)
    for g in (1, 5):
        response = call(descriptor, slide_id=moved_id(entry.slide_id, g))
        assert response.status_code == 200 and b'Width="576" Height="704"' in response.body
        generator = deep_zoom(str(crop), crop.stat().st_mtime_ns, g)
        deepest = generator.level_count - 1
        expected = moved_rgb(whole, g)
        for col, row in np.ndindex(*generator.level_tiles[deepest]):
            (left, top), level, (width, height) = generator.get_tile_coordinates(deepest, (col, row))
            exact = crop_of(expected, left, top, width, height)
            assert level == 0
            np.testing.assert_array_equal(np.asarray(generator.get_tile(deepest, (col, row))), exact)
            assert tile_bytes(moved_id(entry.slide_id, g), deepest, col, row) == jpeg(exact), "the same JPEG"
    for bad in ("-g0", "-g8", "-g9", "-g-1", "-g01", "-g1x", "-G1", "-g1-g2", "-g", "g1", "-g1/../"):
        for response in (call(descriptor, slide_id=entry.slide_id + bad),
                         call(tile, slide_id=entry.slide_id + bad, level="10", col="0", row="0")):
            assert response.status_code == 404 and b"is listed" in response.body, bad
    assert call(descriptor, slide_id="../" + moved_id(entry.slide_id, 1)).status_code == 404
