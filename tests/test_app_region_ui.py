"""The region page in AppTest: the scored mosaic, a cell opened in the patch explorer, every bad upload refused
with a message while the app keeps serving; and the figure's cell geometry and click handling."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_app_region import mosaic_of
from test_app_ui import checkpoint_box

import models
from app.analysis.images import read_image
from app.gallery import list_gallery
from app.region.evaluation import evaluate_region
from app.region.plots import _cell_values, clicked_cell, region_figure

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
    picker = at.selectbox(key="region_cell_pick")
    cell = picker.options[0]
    assert cell.startswith("cell (") and "truth" in cell, "mosaic cells name their true label"
    probability = float(cell.split("P = ")[1].split(",")[0])
    at = at.button(key="region_open_cell").click().run()
    assert not at.exception and at.session_state["view"] == "Patch"
    assert at.sidebar.radio(key="image_source").value == "Cell from the region"
    prediction = at.metric[0]
    assert f"p = {probability:.3f}" in prediction.delta, "the patch view must predict what the region view showed"


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


def test_each_displayed_pixel_shows_the_cell_under_it(small_result):
    values = _cell_values(small_result, 1, small_result.image.shape[1:])
    grid = small_result.grid
    for i in range(grid.rows):
        for j in range(grid.cols):
            top, left = grid.cell_origin(i, j)
            block = values[top:top + grid.cell, left:left + grid.cell]
            assert np.array_equal(block, np.full_like(block, small_result.positive[i, j]), equal_nan=True)
    assert np.isnan(values[:grid.cell_origin(0, 0)[0]]).all(), "outside the cells nothing is coloured"


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


def test_the_figures_draw_the_region_with_a_colour_bar_and_the_truth(small_result):
    labels = np.full((small_result.grid.rows, small_result.grid.cols), -1, np.int8)
    labels[0, 0], labels[3, 3] = 1, 0
    figure = region_figure(small_result, "probability", labels, selected=(1, 1))
    names = [trace.type for trace in figure.data]
    assert names[:2] == ["image", "heatmap"] and figure.data[1].colorbar.title.text == "P(tumor)"
    assert {trace.name for trace in figure.data if trace.type == "scatter"} >= {"true tumour", "true normal",
                                                                              "opened cell"}
    attention = region_figure(small_result, "attention")
    assert attention.data[1].colorbar.title.text == "attention (c1)"
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
    assert at.sidebar.radio(key="region_method-p4m_densenet_pcam").value == "tiles"
    assert "(fast)" in next(c.value for c in at.caption if "cells evaluated" in c.value)
    assert "no attention layer" in at.info[0].value and len(at.get("plotly_chart")) == 1
    assert "AUC" in at.success[0].value
