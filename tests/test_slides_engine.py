"""The slide engine (:mod:`app.slides.engine`) on a real pyramidal TIFF of known truth: PCam test patches laid side
by side (:func:`app.cells.mosaic.pcam_test_mosaic`) and written as a tiled, two-level TIFF with its scale in its
resolution tags, which OpenSlide reads as a generic TIFF. Evaluated a chunk of cells at a time, the slide gives
region mode's probabilities over the same pixels, each patch-centre cell the model's own prediction on that patch,
and a quarter-turned slide the quarter-turned heatmap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.analysis.pathology import model_microns_per_pixel
from app.cells.evaluation import default_method, evaluate_region
from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.engine import evaluate_chunk, slide_grid
from app.slides.reader import open_slide
from app.slides.scale import slide_scale
from models import load_checkpoint
from tests.conftest import REPO, require_shared

tifffile = pytest.importorskip("tifffile")
PCAM = REPO.parent / "shared" / "data" / "pcam_public"
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


def write_pyramid(path: Path, rgb: np.ndarray, microns_per_pixel: float) -> None:
    """``rgb`` ``(H, W, 3)`` uint8 as a tiled TIFF: level 0 and a half-size level, top-level IFDs (OpenSlide ignores
    SubIFD pyramids), zlib tiles (exact pixels), the scale in pixels per centimetre."""
    per_cm = 1e4 / microns_per_pixel
    with tifffile.TiffWriter(path) as tiff:
        for level, pixels in enumerate((rgb, rgb[::2, ::2])):
            tiff.write(np.ascontiguousarray(pixels), tile=(128, 128), compression="zlib", photometric="rgb",
                       resolution=(per_cm / 2**level, per_cm / 2**level), resolutionunit="CENTIMETER",
                       subfiletype=1 if level else 0)


@pytest.fixture(scope="module")
def model_and_mosaic():
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    model, card = load_checkpoint(CHECKPOINT)
    mosaic = pcam_test_mosaic(card, PCAM, count=9)  # 3 x 3 patches: 7 x 7 cells, the 9 patch centres labelled
    return model, card, mosaic


def evaluate_slide(model, card, path: Path, chunk: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Tumour probability per cell, evaluated chunk by chunk, the cells evaluated, and how many chunks."""
    with open_slide(path) as slide:
        scale = slide_scale(slide.properties)
        assert (scale.source, round(scale.microns_per_pixel, 6)) == ("slide", PCAM_MPP)
        grid = slide_grid(slide, scale.microns_per_pixel, card, model_microns_per_pixel(card), chunk=chunk)
        tumour = np.full((grid.cells.rows, grid.cells.cols), np.nan)
        evaluated = np.zeros(tumour.shape, dtype=bool)
        for ci in range(grid.chunks[0]):
            for cj in range(grid.chunks[1]):
                result = evaluate_chunk(model, card, slide, grid, ci, cj)
                i0, i1, j0, j1 = grid.cell_block(ci, cj)
                tumour[i0:i1, j0:j1] = result.probabilities[..., -1]
                evaluated[i0:i1, j0:j1] = result.evaluated
                assert set(result.attention) == ({"removed", "spatial"} if result.evaluated.any() else set())
        return tumour, evaluated, grid.chunks[0] * grid.chunks[1]


def test_chunks_of_a_pcam_slide_give_region_modes_heatmap_and_each_patchs_own_prediction(model_and_mosaic, tmp_path):
    model, card, mosaic = model_and_mosaic
    rgb = np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8)
    write_pyramid(tmp_path / "mosaic.tif", rgb, PCAM_MPP)
    with open_slide(tmp_path / "mosaic.tif") as slide:
        assert (slide.vendor, slide.level_count, slide.dimensions) == ("generic-tiff", 2, (288, 288))
    tumour, evaluated, chunks = evaluate_slide(model, card, tmp_path / "mosaic.tif", chunk=3)
    assert chunks == 9, "7 x 7 cells in chunks of at most 3 x 3: 2, 3 and 2 cells along each side, nine chunks"
    region = evaluate_region(model, card, rgb.transpose(2, 0, 1) / np.float32(255), PCAM_MPP)
    np.testing.assert_array_equal(evaluated, region.evaluated)
    np.testing.assert_allclose(tumour[evaluated], region.positive[evaluated], rtol=0, atol=1e-6)
    # Each patch's centre cell is judged in exactly that patch: the model's prediction on the patch.
    centres = mosaic.labelled & evaluated
    assert mosaic.labelled.sum() == 9 and centres.sum() >= 7, "a patch of fat or glass may have no stained centre"
    for i, j in np.argwhere(centres):
        patch = rgb[32 * i:32 * i + 96, 32 * j:32 * j + 96].transpose(2, 0, 1) / np.float32(255)
        alone = evaluate_region(model, card, patch, PCAM_MPP, cells=np.ones((1, 1), dtype=bool)).positive[0, 0]
        assert tumour[i, j] == pytest.approx(alone, abs=1e-4), (i, j)


def test_a_quarter_turned_slide_gives_the_quarter_turned_heatmap(model_and_mosaic, tmp_path):
    model, card, mosaic = model_and_mosaic
    rgb = np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8)
    write_pyramid(tmp_path / "mosaic.tif", rgb, PCAM_MPP)
    write_pyramid(tmp_path / "turned.tif", np.ascontiguousarray(np.rot90(rgb)), PCAM_MPP)
    tumour, evaluated, _ = evaluate_slide(model, card, tmp_path / "mosaic.tif", chunk=4)
    turned, turned_evaluated, _ = evaluate_slide(model, card, tmp_path / "turned.tif", chunk=4)
    np.testing.assert_array_equal(turned_evaluated, np.rot90(evaluated))
    np.testing.assert_allclose(turned[turned_evaluated], np.rot90(tumour)[turned_evaluated], rtol=0, atol=1e-5)


def test_a_model_without_attention_runs_each_chunk_as_one_tile_equal_to_its_crops(model_and_mosaic, tmp_path):
    """The engine's default for a model without attention is the shared trunk over the chunk (region mode's
    "tiles", its own function there): the crops' probabilities to round-off; a model with attention keeps crops."""
    _, card, mosaic = model_and_mosaic
    plain, plain_card = load_checkpoint(REPO / "checkpoints" / "p4m_densenet_pcam.safetensors")
    rgb = np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8)
    write_pyramid(tmp_path / "mosaic.tif", rgb, PCAM_MPP)
    with open_slide(tmp_path / "mosaic.tif") as slide:
        grid = slide_grid(slide, PCAM_MPP, plain_card, model_microns_per_pixel(plain_card), chunk=4)
        for ci, cj in np.ndindex(*grid.chunks):
            tiles = evaluate_chunk(plain.eval(), plain_card, slide, grid, ci, cj)
            crops = evaluate_chunk(plain.eval(), plain_card, slide, grid, ci, cj, method="crops")
            np.testing.assert_array_equal(tiles.evaluated, crops.evaluated)
            np.testing.assert_allclose(tiles.probabilities[tiles.evaluated], crops.probabilities[crops.evaluated],
                                       rtol=0, atol=1e-5)
    assert default_method(plain) == "tiles" and default_method(load_checkpoint(CHECKPOINT)[0]) == "crops"
