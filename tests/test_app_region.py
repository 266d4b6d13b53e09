"""Region mode: the grid and its tiles map onto themselves, the heatmap moves exactly with the region, crops are
the model's own function, tiles are exact without attention, the mosaic is scored, and bad input is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import REPO, require_shared

import models
from app.analysis.frames import InputFrame
from app.analysis.images import read_image
from app.analysis.pcam_public import public_folder
from app.analysis.pcam_public import test_patches as pcam_test_patches
from app.analysis.transforms import apply_element
from app.cells.evaluation import (
    TILES_AT_CHANCE,
    RegionError,
    cell_tissue,
    check_region,
    default_method,
    evaluate_region,
    exact_methods,
    inexact_method,
    make_grid,
    tile_spans,
    to_model_scale,
)
from app.cells.mosaic import MOSAIC_PATCHES, pcam_test_mosaic, roc_auc, score_cells
from app.gallery import list_gallery

SHIPPED = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
ELEMENTS = (1, 2, 4, 7)  # quarter turn, half turn, mirror, mirror after three quarter turns
TOLERANCE = 1e-5  # float32 round-off of probabilities and attention


@pytest.fixture(scope="module")
def shipped():
    model, card = models.load_checkpoint(SHIPPED)
    return model.eval(), card


@pytest.fixture(scope="module")
def patches() -> list[np.ndarray]:
    return [read_image(item.path.read_bytes()) for item in list_gallery(kind="he")]


def mosaic_of(patches: list[np.ndarray], rows: int, cols: int) -> np.ndarray:
    """``(3, 96 rows, 96 cols)``: the patches in reading order (non-square on purpose)."""
    return np.concatenate([np.concatenate(patches[r * cols:(r + 1) * cols], axis=2) for r in range(rows)], axis=1)


def moved(values: np.ndarray, g: int) -> np.ndarray:
    """A ``(rows, cols)`` map moved by g like an image."""
    return apply_element(values[None], g)[0]


@pytest.mark.parametrize("n", range(1, 42))
@pytest.mark.parametrize("tile", [1, 2, 5, 15])
def test_tiles_cover_the_cells_once_and_read_the_same_from_either_end(n, tile):
    spans = tile_spans(n, tile)
    lengths = [length for _, length in spans]
    assert [start for start, _ in spans] == list(np.cumsum([0] + lengths[:-1])), "tiles must follow each other"
    assert sum(lengths) == n and max(lengths) <= tile, "tiles must cover every cell once, each at most `tile` long"
    assert lengths == lengths[::-1], "tile lengths must be a palindrome, so reversing the cells reverses the tiles"


@pytest.mark.parametrize("shape", [(96, 96), (128, 200), (288, 384), (1000, 702)])
def test_the_grid_is_centred_and_every_context_fits(shape):
    grid = make_grid(*shape)
    bottom, right = grid.context_origin(grid.rows - 1, grid.cols - 1)
    assert grid.top >= 0 and grid.left >= 0
    assert bottom + grid.context <= shape[0] and right + grid.context <= shape[1]
    assert shape[0] - (bottom + grid.context) == grid.top and shape[1] - (right + grid.context) == grid.left, \
        "even sides: the grid's margins must be equal on both sides"
    assert (shape[0] - bottom - grid.context) < grid.cell + grid.top + 1, "the grid must be the largest that fits"
    i, j = grid.rows - 1, grid.cols // 2
    top, left = grid.cell_origin(i, j)
    assert grid.cell_at(top, left) == (i, j) and grid.cell_at(top + 31.9, left + 31.9) == (i, j)
    assert grid.cell_at(top - 0.5 - grid.rows * grid.cell, left) is None


def test_resampling_gives_even_sides_and_commutes_with_the_group(patches):
    region = mosaic_of(patches, 2, 3)  # 192 x 288
    scaled = to_model_scale(region, 0.61, 0.972)
    assert scaled.shape == (3, 2 * round(192 * 0.61 / 0.972 / 2), 2 * round(288 * 0.61 / 0.972 / 2))
    for g in ELEMENTS:
        turned = to_model_scale(apply_element(region, g), 0.61, 0.972)
        # Resampled in float64: turned and not turned differ by at most one float32 rounding step.
        assert np.abs(turned - apply_element(scaled, g)).max() <= 2**-23
    assert to_model_scale(region, 0.972, 0.972) is not region and np.array_equal(
        to_model_scale(region, 0.972, 0.972), region), "at the model's scale with even sides nothing is resampled"


def test_crops_are_the_model_applied_to_each_patch(shipped, patches):
    """The mosaic's patch-centre cells, in crops, give exactly the network's probability on each patch alone."""
    model, card = shipped
    region = mosaic_of(patches, 3, 4)
    result = evaluate_region(model, card, region, 0.972, method="crops", cells=np.ones((7, 10), dtype=bool))
    frame = InputFrame.from_card(card, model.group)
    with torch.inference_mode():
        alone = torch.softmax(model(frame.to_network(torch.from_numpy(np.stack(patches)))).double(), dim=1).numpy()
    centres = result.probabilities[::3, ::3].reshape(-1, 2)
    assert np.abs(centres - alone).max() < TOLERANCE
    assert result.evaluated.all() and result.grid.rows == 7 and result.grid.cols == 10


@pytest.mark.parametrize("method", ["tiles", "crops"])
def test_the_heatmap_of_a_moved_region_is_the_moved_heatmap(shipped, patches, method):
    model, card = shipped
    region = mosaic_of(patches, 2, 3)
    # 0.8 um/px: resampled to 158 x 238 (a grid of 3 x 5 cells) in tiles of at most 2 cells.
    kwargs = dict(method=method, tile_cells=2)
    base = evaluate_region(model, card, region, 0.8, **kwargs)
    assert base.evaluated.sum() >= 6, "the test region must have tissue in several cells"
    for g in ELEMENTS:
        result = evaluate_region(model, card, apply_element(region, g), 0.8, **kwargs)
        assert np.array_equal(result.evaluated, moved(base.evaluated, g)), f"g={g}: the tissue mask must move"
        error = np.nanmax(np.abs(result.positive - moved(base.positive, g)))
        assert error < TOLERANCE, f"g={g}, {method}: heatmap moved by {error:.2e}"
        attention_error = np.nanmax(np.abs(result.attention - moved(base.attention, g)))
        assert attention_error < TOLERANCE, f"g={g}, {method}: stitched attention moved by {attention_error:.2e}"
        assert np.array_equal(np.isnan(result.attention), moved(np.isnan(base.attention), g))


def test_the_p4_models_heatmap_turns_with_the_region(patches):
    """fa_p4_densenet_pcam, the p4 H&E model: its crops' heatmap and attention move exactly with quarter turns, its
    group's elements (a mirror is not one of them, and the region page offers none for it)."""
    model, card = models.load_checkpoint(REPO / "checkpoints" / "fa_p4_densenet_pcam.safetensors")
    assert card["group"] == "p4"
    region = mosaic_of(patches, 2, 3)
    base = evaluate_region(model.eval(), card, region, 0.8, method="crops")
    for g in range(1, 4):
        result = evaluate_region(model, card, apply_element(region, g), 0.8, method="crops")
        assert np.nanmax(np.abs(result.positive - moved(base.positive, g))) < TOLERANCE, g
        assert np.nanmax(np.abs(result.attention - moved(base.attention, g))) < TOLERANCE, g


def test_without_attention_tiles_are_the_same_function_as_crops(patches):
    """Valid convolutions and pooling at even offsets: the shared trunk computes every context exactly (the shipped
    p4m DenseNet without attention, so region mode uses the fast way for it)."""
    model, card = models.load_checkpoint(REPO / "checkpoints" / "p4m_densenet_pcam.safetensors")
    assert default_method(model) == "tiles" and exact_methods(model) == ("tiles", "crops")
    assert inexact_method(model, "tiles", "p4m_densenet_pcam") == ""
    region = mosaic_of(patches, 2, 3)
    tiles = evaluate_region(model, card, region, 0.8, method="tiles", tile_cells=3)
    crops = evaluate_region(model, card, region, 0.8, method="crops")
    assert tiles.attention is None and tiles.attention_layer == ""
    assert np.array_equal(tiles.evaluated, crops.evaluated)
    assert np.nanmax(np.abs(tiles.probabilities - crops.probabilities)) < TOLERANCE
    assert np.nanstd(tiles.positive) > 0.05, "a trained model's probabilities must vary over the region"


def test_with_attention_the_default_and_only_method_offered_is_crops(shipped):
    """Tiles are at chance for the shipped model: the page and the CLI leave them out, saying why."""
    model = shipped[0]
    assert default_method(model) == "crops" and exact_methods(model) == ("crops",)
    assert inexact_method(model, "crops", "fa_p4m_densenet_pcam") == ""
    reason = inexact_method(model, "tiles", "fa_p4m_densenet_pcam")
    assert reason.startswith("The shared trunk over tiles is not fa_p4m_densenet_pcam's function")
    assert reason.endswith(TILES_AT_CHANCE)


def test_stitched_attention_covers_the_evaluated_contexts_and_nothing_else(shipped, patches):
    model, card = shipped
    region = mosaic_of(patches, 2, 2)
    region[:, :96, :96] = 1.0  # one patch of glass
    result = evaluate_region(model, card, region, 0.972, method="crops")
    assert result.attention_layer == "c1" and result.attention.shape == region.shape[1:]
    grid = result.grid
    covered = np.zeros(region.shape[1:], dtype=bool)
    for i, j in np.argwhere(result.evaluated):
        top, left = grid.context_origin(i, j)
        covered[top:top + grid.context, left:left + grid.context] = True
    assert np.array_equal(np.isfinite(result.attention), covered), "defined exactly on the evaluated contexts"
    assert not result.evaluated[0, 0] and np.isnan(result.positive[0, 0])
    assert np.isnan(result.attention[:32, :32]).all(), "the glass corner is in no evaluated context"
    # An evaluated cell's centre is its own context's: its crop alone gives the same map there.
    i, j = np.argwhere(result.evaluated)[0]
    alone = evaluate_region(model, card, result.context(i, j), 0.972, method="crops")
    top, left = grid.cell_origin(i, j)
    np.testing.assert_allclose(result.attention[top:top + 32, left:left + 32], alone.attention[32:64, 32:64],
                               atol=TOLERANCE)


def test_the_reading_changes_the_attention_and_kept_plus_removed_is_one(shipped, patches):
    model, card = shipped
    region = mosaic_of(patches, 2, 2)
    once = evaluate_region(model, card, region, 0.972, method="tiles")
    assert once.reading == "spatial" and once.readings == ("kept", "removed", "spatial")
    assert set(once.attentions) == {"removed", "spatial"}, "alpha+ = 1 - alpha- is derived, not held"
    results = {reading: once.in_reading(reading) for reading in ("kept", "removed", "spatial")}
    # One evaluation holds every reading: each is what an evaluation in that reading alone gives.
    alone = evaluate_region(model, card, region, 0.972, method="tiles", reading="kept")
    assert alone.reading == "kept"
    np.testing.assert_array_equal(alone.attention, results["kept"].attention)
    kept, removed, spatial = (results[r].attention for r in ("kept", "removed", "spatial"))
    assert {r.reading for r in results.values()} == {"kept", "removed", "spatial"}
    np.testing.assert_allclose(kept + removed, 1.0, atol=1e-6)
    assert np.nanmax(np.abs(spatial - removed)) > 1e-3 and np.nanmax(np.abs(spatial - kept)) > 1e-3
    assert ((spatial >= removed - 1e-6) | np.isnan(spatial)).all(), "alpha- = alpha_c alpha_s is at most alpha_s"
    for result in results.values():  # the probabilities do not depend on the reading
        np.testing.assert_array_equal(result.probabilities, results["kept"].probabilities)
    with pytest.raises(RegionError, match="reading"):
        evaluate_region(model, card, region, 0.972, method="tiles", reading="alpha")


def test_tissue_is_the_share_of_stained_pixels(patches):
    region = np.ones((3, 96, 160), dtype=np.float32)
    region[:, 32:48, 32:64] = 0.5  # half of cell (0, 0) stained
    tissue = cell_tissue(region, make_grid(96, 160))
    assert tissue.shape == (1, 3) and tissue[0, 0] == 0.5 and tissue[0, 1] == 0 and tissue[0, 2] == 0


@pytest.mark.parametrize(("image", "mpp", "message"), [
    (np.ones((1, 200, 200), np.float32), 1.0, "RGB"),
    (np.ones((3, 4097, 100), np.float32), 1.0, "at most 4096"),
    (np.ones((3, 200, 200), np.float32), None, "micrometres per pixel"),
    (np.ones((3, 200, 200), np.float32), 0.0, "plausible"),
    (np.ones((3, 200, 200), np.float32), float("nan"), "plausible"),
    (np.ones((3, 200, 200), np.float32), 150.0, "plausible"),
    (np.ones((3, 200, 200), np.float32), 0.3, "smaller than one 96 x 96"),
    (np.ones((3, 4000, 4000), np.float32), 2.0, "would be"),
    (np.ones((3, 300, 300), np.float32), 0.972, "No tissue"),
])
def test_bad_regions_are_refused_with_a_clear_message(shipped, image, mpp, message):
    model, card = shipped
    with pytest.raises(RegionError, match=message):
        evaluate_region(model, card, image, mpp)


def test_a_model_that_is_not_for_h_and_e_is_refused(shipped):
    model, _ = models.load_checkpoint(REPO / "checkpoints" / "p4cnn_rot_mnist.safetensors")
    card = {"input": {"size": 28, "channels": 1}, "dataset": {"name": "rot_mnist"}}
    with pytest.raises(RegionError, match="H&E"):
        check_region(np.ones((3, 200, 200), np.float32), 1.0, card, model)


def test_the_mosaic_puts_each_patch_centre_on_a_labelled_cell(shipped, tmp_path):
    _, card = shipped
    mosaic = pcam_test_mosaic(card, folder=tmp_path)  # no pcam_public there: the gallery's twelve patches
    gallery = {item.name: item for item in list_gallery(kind="he")}
    assert mosaic.image.shape == (3, 288, 384) and mosaic.labels.shape == (7, 10)
    assert (mosaic.labels >= 0).sum() == 12 and set(np.unique(mosaic.labels)) == {-1, 0, 1}
    for r in range(3):
        for c in range(4):
            item = gallery[mosaic.files[r, c]]
            assert np.array_equal(mosaic.image[:, 96 * r:96 * (r + 1), 96 * c:96 * (c + 1)],
                                  read_image(item.path.read_bytes()))
            assert mosaic.labels[3 * r, 3 * c] == card["class_names"].index(item.label)


def test_roc_auc_counts_pairs_and_ties():
    scores, labels = np.array([0.9, 0.4, 0.4, 0.1, 0.7]), np.array([1, 1, 0, 0, 0])
    pairs = [(p, n) for p in scores[labels == 1] for n in scores[labels == 0]]
    assert roc_auc(scores, labels) == sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert math.isnan(roc_auc(np.array([0.5]), np.array([1])))
    score = score_cells(np.array([[0.9, np.nan], [0.2, 0.6]]), np.array([[1, 1], [0, -1]]))
    assert (score.scored, score.tumour, score.normal, score.auc, score.accuracy) == (2, 1, 1, 1.0, 1.0)


def test_the_mosaic_of_the_real_test_split_holds_400_labelled_test_patches(shipped):
    """The default mosaic: 400 distinct patches of pcam_public's test split, each at its slot with its label."""
    _, card = shipped
    folder = public_folder()
    require_shared(folder / "labels.csv", f"pcam_public is not at {folder}")
    truth = {p.file: p.label for p in pcam_test_patches(folder)}
    mosaic = pcam_test_mosaic(card)
    assert mosaic.image.shape == (3, 20 * 96, 20 * 96) and mosaic.labelled.sum() == MOSAIC_PATCHES == 400
    files = [f for f in mosaic.files.ravel() if f]
    assert len(set(files)) == 400 and all(f.startswith("test/") and f in truth for f in files)
    for r, c in ((0, 0), (7, 13), (19, 19)):
        assert mosaic.labels[3 * r, 3 * c] == truth[mosaic.files[r, c]]
        assert np.array_equal(mosaic.image[:, 96 * r:96 * (r + 1), 96 * c:96 * (c + 1)],
                              read_image((folder / mosaic.files[r, c]).read_bytes()))
    labels = mosaic.labels[mosaic.labelled]
    assert 150 < (labels == 1).sum() < 250, "a random draw of a split that is about half tumour"
    assert pcam_test_mosaic(card).files.tolist() == mosaic.files.tolist(), "the same mosaic every time"
