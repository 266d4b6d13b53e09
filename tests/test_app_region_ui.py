"""The region page in AppTest: the scored mosaic, a cell opened in the patch explorer, every bad upload refused
with a message while the app keeps serving; and the figure's cell geometry and click handling."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_app_region import mosaic_of
from test_app_ui import checkpoint_box

import models
from app.analysis.images import read_image
from app.analysis.readings import BRIGHT, LABELS
from app.gallery import list_gallery
from app.region.evaluation import RegionError, RegionResult, evaluate_region, make_grid
from app.region.overlays import (
    READING_LABELS,
    attention_range,
    display_tissue,
    probability_contour,
    probability_field,
    truth_outline,
)
from app.region.plots import _block_means, _downsampled, clicked_cell, region_figure
from app.ui import region_page

streamlit_testing = pytest.importorskip("streamlit.testing.v1")
AppTest = streamlit_testing.AppTest

REPO = Path(__file__).resolve().parents[1]
MAIN = str(REPO / "app" / "main.py")
SHIPPED = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def region_app(monkeypatch, tmp_path) -> AppTest:
    """The app on the shipped checkpoints, region view; the mosaic from the gallery's twelve patches (fast)."""
    monkeypatch.setenv("APP_CHECKPOINTS", str(REPO / "checkpoints"))
    monkeypatch.setenv("PCAM_PUBLIC_DIR", str(tmp_path / "no_pcam_public"))
    at = AppTest.from_file(MAIN, default_timeout=300).run()
    assert "pcam" in checkpoint_box(at).value.lower()
    at = at.sidebar.radio(key="view").set_value("Region").run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_the_mosaic_is_scored_and_a_cell_opens_in_the_patch_explorer(region_app):
    at = region_app
    assert not at.error, [e.value for e in at.error]
    assert re.search(r"AUC [01]\.\d{3} over 12 labelled cells \(6 tumour, 6 normal\)", at.success[0].value)
    assert len(at.get("plotly_chart")) == 2
    assert at.sidebar.radio(key="region_reading").value == "spatial" and "α_s" in caption_with(at, "Colours span")
    assert "percentile of its values on tissue" in caption_with(at, "Colours span")
    assert "(exact)" in caption_with(at, "cells evaluated")
    at = at.toggle(key="region_truth").set_value(False).run()
    names = {trace.get("name") for trace in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}
    assert "labelled tumour" not in names and "p = 0.5" in names
    picker = at.selectbox(key="region_cell_pick")
    cell = picker.options[0]
    assert cell.startswith("cell (") and "truth" in cell, "mosaic cells name their true label"
    probability = float(cell.split("P = ")[1].split(",")[0])
    at = at.button(key="region_open_cell").click().run()
    assert not at.exception and at.session_state["view"] == "Patch"
    assert at.sidebar.radio(key="image_source").value == "Cell from the region"
    prediction = at.metric[0]
    assert f"p = {probability:.3f}" in prediction.delta, "the patch view must predict what the region view showed"


def caption_with(at: AppTest, text: str) -> str:
    return next(c.value for c in at.caption if text in c.value)


def test_the_model_with_attention_is_not_offered_the_shared_trunk_it_is_at_chance_with(region_app):
    """Not one click away: no method to choose, and the sidebar says why before anything is run, with the numbers."""
    at = region_app
    assert [r.key for r in at.sidebar.radio if r.key.startswith("region_method")] == []
    assert next(c.value for c in at.sidebar.caption if c.value.startswith("Method")) == (
        "Method: exact, each cell in its own 96 x 96 context (no fast method for this model). The shared trunk over "
        "tiles is not fa_p4m_densenet_pcam's function: its attention would pool over a whole tile, not each cell's "
        "96 x 96 context. On the PCam test mosaic the shipped fa_p4m_densenet_pcam scores AUC 0.458 with tiles "
        "(chance) against 0.956 with crops (docs/region.md).")


def attention_panel(at: AppTest) -> tuple[str, str]:
    """The right-hand panel's picture (its PNG, as sent) and its colour bar's title."""
    image, colourbar = json.loads(at.get("plotly_chart")[1].proto.spec)["data"][:2]
    return image["source"], colourbar["colorbar"]["title"]["text"]


def test_another_reading_redraws_the_attention_without_evaluating_the_region_again(region_app, monkeypatch):
    evaluations = []
    monkeypatch.setattr(region_page, "evaluate_region", lambda *args, **kwargs: evaluations.append(
        kwargs["method"]) or evaluate_region(*args, **kwargs))
    region_page.region_results.clear()  # other tests' regions are cached in this process: start from none
    at = region_app.sidebar.radio(key="region_rotate").set_value(90).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert evaluations == ["crops", "crops"], "the turned region and, for the proof, the original: once each"
    spatial = attention_panel(at)
    assert spatial[1] == "spatial (c1)" and "α_s" in caption_with(at, "Colours span")
    at = at.sidebar.radio(key="region_reading").set_value("kept").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert evaluations == ["crops", "crops"], "one evaluation holds every reading: another reading needs none"
    kept = attention_panel(at)
    assert kept[1] == "kept (c1)" and "α⁺" in caption_with(at, "Colours span")
    assert kept[0] != spatial[0], "the panel must draw the new reading's map, not the last one's"
    at = at.sidebar.radio(key="region_reading").set_value("spatial").run()
    assert evaluations == ["crops", "crops"] and attention_panel(at) == spatial, "back to the first reading's map"


@pytest.mark.parametrize(("upload", "mpp", "message"), [
    (("cut.png", b"\x89PNG\r\n\x1a\n" + b"garbage" * 20, "image/png"), 0.5, "Cannot use cut.png"),
    (("grey.png", png(np.full((200, 200), 128, np.uint8)), "image/png"), 0.5, "RGB"),
    (("glass.png", png(np.full((300, 300, 3), 250, np.uint8)), "image/png"), 0.972, "No tissue"),
    (("tissue.png", png(np.full((300, 300, 3), 120, np.uint8)), "image/png"), 100.0, "plausible"),
    (("long.png", png(np.full((10, 4100, 3), 120, np.uint8)), "image/png"), 0.5, "4096"),
])
def test_bad_region_uploads_are_refused_and_the_app_keeps_serving(region_app, upload, mpp, message):
    at = region_app.sidebar.radio(key="region_source").set_value("Upload a region").run()
    at = at.sidebar.number_input(key="region_mpp").set_value(mpp).run()
    at = at.sidebar.file_uploader(key="region_upload").set_value(upload).run()
    assert not at.exception, [e.message for e in at.exception]
    assert message in " ".join(e.value for e in at.error), [e.value for e in at.error]
    at = at.sidebar.radio(key="region_source").set_value("PCam test mosaic (truth known)").run()
    assert not at.exception and not at.error and "AUC" in at.success[0].value, "the app must go on serving"


def test_an_upload_without_its_scale_asks_for_it(region_app):
    at = region_app.sidebar.radio(key="region_source").set_value("Upload a region").run()
    tissue = png((np.random.default_rng(0).random((200, 200, 3)) * 200).astype(np.uint8))
    at = at.sidebar.file_uploader(key="region_upload").set_value(("tissue.png", tissue, "image/png")).run()
    assert not at.exception and not at.error
    assert "micrometres per pixel" in at.warning[0].value


@pytest.fixture(scope="module")
def small_result():
    model, card = models.load_checkpoint(SHIPPED)
    region = mosaic_of([read_image(item.path.read_bytes()) for item in list_gallery(kind="he")], 2, 2)
    return evaluate_region(model.eval(), card, region, 0.972, method="tiles")


def synthetic(p: np.ndarray, image: np.ndarray) -> RegionResult:
    """A RegionResult without a network: ``p`` per cell (NaN: not evaluated) over ``image`` ``(3, H, W)``."""
    grid = make_grid(*image.shape[1:])
    assert p.shape == (grid.rows, grid.cols)
    attention = np.random.default_rng(1).random(image.shape[1:]).astype(np.float32)
    return RegionResult(image=image, grid=grid, tissue=np.isfinite(p).astype(float), evaluated=np.isfinite(p),
                        probabilities=np.stack([1 - p, p], -1), attentions={"spatial": attention}, attention_layer="c1",
                        class_names=("no_tumor", "tumor"), method="crops", microns_per_pixel=0.972,
                        model_microns_per_pixel=0.972, seconds=0.0)


def tissue_and_glass(rows: int = 256, cols: int = 320) -> np.ndarray:
    """``(3, rows, cols)``: H&E-like pink on the left half, white glass on the right."""
    image = np.ones((3, rows, cols), np.float32)
    image[:, :, :cols // 2] = np.array([0.85, 0.45, 0.7], np.float32)[:, None, None]
    return image


def background(figure) -> np.ndarray:
    """The blended picture a region figure sends to the browser, ``(h, w, 3)`` uint8."""
    uri = figure.data[0].source
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB"))


def test_the_probability_surface_is_drawn_on_tissue_only():
    image = tissue_and_glass()
    grid = make_grid(*image.shape[1:])
    result = synthetic(np.full((grid.rows, grid.cols), 0.9), image)
    rgb, factor = _downsampled(result, 900)
    tissue = display_tissue(rgb, factor)
    assert tissue[:, :100].all() and not tissue[:, 200:].any()
    drawn = background(region_figure(result, "probability"))
    assert np.array_equal(drawn[~tissue], rgb[~tissue]), "off tissue the overlay's alpha must be 0"
    changed = np.abs(drawn.astype(int) - rgb).sum(axis=-1) > 20
    inside = np.isfinite(probability_field(result, rgb.shape[:2], factor))
    assert changed[tissue & inside].all(), "on tissue inside the grid the surface shows"


def test_the_surface_is_each_cells_probability_at_its_centre_and_contiguous_between():
    p = np.random.default_rng(0).random((4, 6))
    p[1, 2] = np.nan  # left out: its neighbours fill it
    result = synthetic(p, np.ones((3, 192, 256), np.float32))
    field = probability_field(result, (192, 256), 1.0)
    grid = result.grid
    # Pixels 32 wide: displayed pixel (i + 1, j + 1) is centred on cell (i, j)'s centre (the grid starts at 32).
    at_centres = probability_field(result, (6, 8), 32.0)[1:5, 1:7]
    finite = np.isfinite(p)
    np.testing.assert_allclose(at_centres[finite], p[finite], atol=1e-12)
    top, left = grid.cell_origin(0, 0)
    inside = field[top:top + 4 * 32, left:left + 6 * 32]
    assert np.isfinite(inside).all(), "one surface: no hole where a single cell is missing"
    assert np.abs(np.diff(inside, axis=1)).max() < np.nanmax(np.abs(np.diff(p, axis=1))) / 32 * 2.01, "no jumps"
    assert np.isnan(field[:top]).all() and np.isnan(field[:, :left]).all(), "nothing outside the grid"


def test_the_half_contour_crosses_between_cells_on_either_side_of_one_half():
    p = np.random.default_rng(2).random((7, 8))
    p[3, 3] = np.nan
    result = synthetic(p, np.ones((3, 288, 320), np.float32))
    cells = np.where(np.isfinite(p), p, 0.5)
    cells[3, 3] = np.nanmean(p[2:5, 2:5])  # the filled value the surface uses there
    grid = result.grid
    top, left = grid.cell_origin(0, 0)
    lines = probability_contour(result)
    assert lines and sum(len(line) for line in lines) > 10
    for x, y in np.concatenate(lines):
        u, v = (x - left) / grid.cell - 0.5, (y - top) / grid.cell - 0.5  # in cell-centre units
        if abs(u - round(u)) < 1e-9:
            j, i = round(u), int(np.floor(v))
            a, b, t = cells[i, j], cells[i + 1, j], v - i
        else:
            assert abs(v - round(v)) < 1e-9, f"({x}, {y}) is not on a line between cell centres"
            i, j = round(v), int(np.floor(u))
            a, b, t = cells[i, j], cells[i, j + 1], u - j
        assert min(a, b) <= 0.5 <= max(a, b), f"({x}, {y}) between {a:.3f} and {b:.3f}"
        np.testing.assert_allclose(a + t * (b - a), 0.5, atol=1e-9)


def test_the_truth_outlines_the_tumour_patches_and_merges_neighbours():
    grid = make_grid(288, 288)  # a 3 x 3 mosaic: patch centres on cells (0, 0), (0, 3), ... (6, 6)
    labels = np.full((grid.rows, grid.cols), -1, np.int8)
    labels[::3, ::3] = 0
    labels[0, 0] = labels[0, 3] = 1  # two tumour patches side by side
    segments = truth_outline(grid, labels)
    xs, ys = segments[..., 0], segments[..., 1]
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (0, 192, 0, 96), "the two patches' 96 x 96 squares"
    assert np.isclose(np.linalg.norm(segments[:, 1] - segments[:, 0], axis=-1).sum(), 2 * (192 + 96)), \
        "one outline around both: no edge between them"


def test_the_attention_colours_span_its_percentiles_on_tissue():
    image = tissue_and_glass()
    grid = make_grid(*image.shape[1:])
    result = synthetic(np.full((grid.rows, grid.cols), 0.3), image)
    figure = region_figure(result, "attention")
    rgb, factor = _downsampled(result, 900)
    values, tissue = _block_means(result.attention, factor, rgb.shape[:2]), display_tissue(rgb, factor)
    expected = np.percentile(values[tissue & np.isfinite(values)], (2, 98))
    np.testing.assert_allclose(attention_range(values, tissue), expected)
    colourbar = figure.data[1]
    np.testing.assert_allclose((colourbar.zmin, colourbar.zmax), expected)
    assert colourbar.colorbar.title.text == "spatial (c1)", "the colour bar names the reading"
    assert expected[0] > 0.01 and expected[1] < 0.99, "the range is the percentiles, not the values' extremes"


def test_the_page_words_each_reading_as_the_patch_page():
    assert all(READING_LABELS[r] == LABELS[r] for r in READING_LABELS) and set(READING_LABELS) <= set(BRIGHT)


def test_a_click_on_the_heatmap_names_its_cell(small_result):
    top, left = small_result.grid.cell_origin(1, 2)
    point = {"x": left + 3.0, "y": top + 30.0}
    assert clicked_cell({"selection": {"points": [point]}}, small_result) == (1, 2)

    class Event:  # Streamlit's return value reads by attribute
        class selection:  # noqa: N801
            points = [point]

    assert clicked_cell(Event, small_result) == (1, 2)
    assert clicked_cell({"selection": {"points": [{"x": 1.0, "y": 1.0}]}}, small_result) is None
    assert clicked_cell(None, small_result) is None


def test_the_figures_draw_the_region_with_a_colour_bar_the_contour_and_the_truth(small_result):
    labels = np.full((small_result.grid.rows, small_result.grid.cols), -1, np.int8)
    labels[0, 0], labels[3, 3] = 1, 0
    figure = region_figure(small_result, "probability", labels, selected=(1, 1))
    names = [trace.type for trace in figure.data]
    assert names[:2] == ["image", "heatmap"] and figure.data[1].colorbar.title.text == "P(tumor)"
    traces = {trace.name: trace for trace in figure.data if trace.type == "scatter"}
    assert {"p = 0.5", "labelled tumour", "opened cell"} <= set(traces)
    assert traces["labelled tumour"].line.dash == "dash", "the truth must not hide the surface"
    assert "true normal" not in traces
    attention = region_figure(small_result, "attention")
    assert attention.data[1].colorbar.title.text == "spatial (c1)"
    assert figure.layout.yaxis.range == (small_result.image.shape[1], 0), "rows go down, as in the image"


def test_turning_the_region_turns_the_heatmap_and_proves_it(region_app):
    score = re.search(r"AUC [01]\.\d{3} over 12 labelled cells", region_app.success[0].value).group()
    at = region_app.sidebar.radio(key="region_rotate").set_value(90).run()
    at = at.sidebar.toggle(key="region_mirror").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    proof = next(c.value for c in at.caption if c.value.startswith("Proof of equivariance"))
    error = float(proof.split("max |difference| = ")[1].split(" ")[0])
    assert error < 1e-5 and "over 12 cells" in proof
    assert score in at.success[0].value, "the truth moves with the region, so the score stays"


def test_a_picked_cell_is_forgotten_when_the_region_changes(region_app):
    at = region_app.selectbox(key="region_cell_pick").set_value((3, 0)).run()
    assert at.selectbox(key="region_cell_pick").value == (3, 0)
    at = at.sidebar.radio(key="region_rotate").set_value(180).run()
    picker = at.selectbox(key="region_cell_pick")
    assert not at.exception and picker.index == 0 and picker.value != (3, 0), "the old region's cell must not stay"


def test_the_model_without_attention_uses_the_exact_shared_trunk(region_app):
    at = checkpoint_box(region_app).set_value("p4m_densenet_pcam").run()
    at = at.sidebar.radio(key="view").set_value("Region").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    method = at.sidebar.radio(key="region_method-p4m_densenet_pcam")
    assert method.value == "tiles" and method.options == ["Fast: shared trunk over tiles, exact for this model",
                                                           "Exact: every cell in its own 96 x 96 context"]
    assert "(fast)" in next(c.value for c in at.caption if "cells evaluated" in c.value)
    assert "no attention layer" in at.info[0].value and len(at.get("plotly_chart")) == 1
    assert "AUC" in at.success[0].value


def test_a_reading_the_layer_lacks_is_refused_by_name():
    p = np.full((3, 3), 0.5)
    channel_only = dataclasses.replace(synthetic(p, tissue_and_glass(160, 160)),
                                       attentions={"removed": np.full((160, 160), 0.25, np.float32)}, reading="kept")
    assert channel_only.readings == ("kept", "removed")
    assert (channel_only.attention == 0.75).all() and (channel_only.in_reading("removed").attention == 0.25).all()
    with pytest.raises(RegionError, match="layer c1 has no 'spatial' reading.*readings: kept, removed"):
        channel_only.in_reading("spatial")


def test_the_p4_model_turns_the_region_and_offers_no_mirror(region_app):
    box = checkpoint_box(region_app)
    at = box.set_value(next(o for o in box.options if o.startswith("fa_p4_densenet_pcam"))).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "region_mirror" not in [w.key for w in at.sidebar.toggle], "a mirror is not an element of p4"
    assert "not fa_p4_densenet_pcam's function" in next(c.value for c in at.sidebar.caption
                                                            if c.value.startswith("Method"))
    at = at.sidebar.radio(key="region_rotate").set_value(270).run()
    proof = next(c.value for c in at.caption if c.value.startswith("Proof of equivariance"))
    assert float(proof.split("max |difference| = ")[1].split(" ")[0]) < 1e-5 and "over 12 cells" in proof
