"""The Slide page in AppTest: the demo slides listed by name, the slide-info panel, a slide without a scale shown but
not analysed until one is given, and an empty listing or a missing viewer said in a sentence."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from PIL import Image
from starlette.requests import Request

import app.slides.tiles as tiles
import app.ui.slide_page as slide_page
from app.slides.library import DEMO_FOLDER, list_slides
from tests.conftest import REPO, require_shared

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
MAIN = str(REPO / "app" / "main.py")


def analysable(at):
    """The page run again until its Analyse button is there: the slide's plan is made in the background while the
    viewer shows its tiles (in a browser the page looks again by itself)."""
    deadline = time.monotonic() + 60
    while not at.button and time.monotonic() < deadline:
        time.sleep(0.1)
        at.run()
    return at


@pytest.fixture
def on_the_slide_page(tmp_path, monkeypatch):
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    monkeypatch.setenv("APP_SLIDE_STORE", str(tmp_path / "store"))
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    at.sidebar.radio(key="view").set_value("Slide").run()
    return analysable(at)


def test_the_demo_slides_are_listed_with_their_levels_scale_and_label(on_the_slide_page):
    at = on_the_slide_page
    assert not at.exception and at.sidebar.selectbox(key="slide").options == [
        "CMU-1-Small-Region.svs (demo)", "tcga-cr-7395-01a-01-ts1.svs (demo)", "CMU-1 region (demo)",
        "PCam test mosaic (truth known) (demo)"]
    info = " ".join(c.value for c in at.sidebar.caption)
    assert "aperio, 1 level(s): 2,220 x 2,967 px. Scale: 0.499 um/px, recorded in the slide." in info
    assert [button.label for button in at.button] == ["Analyse the slide"]
    # The Stain section: the slide's H and E beside PCam's (estimated with the plan), and the control, as scanned first.
    assert any("H and E: this slide" in m.value and m.value.count("background:rgb(") == 4 for m in at.sidebar.markdown)
    stain = at.sidebar.radio(key="slide_stain")
    assert stain.options == ["as scanned", "normalised to PCam: Macenko", "normalised to PCam: Reinhard"]
    assert stain.value == "none"
    at = analysable(stain.set_value("macenko").run())
    assert not at.exception and [button.label for button in at.button] == ["Analyse the slide"], "planned, normalised"


def test_a_slide_without_a_scale_waits_for_one(on_the_slide_page):
    at = on_the_slide_page
    box = at.sidebar.selectbox(key="slide")
    at = box.set_value(box.options[1]).run()
    assert not at.exception and "not analysed until its scale (µm per pixel) is given" in at.info[0].value
    assert not at.button, "nothing to analyse without a scale"
    field = next(n for n in at.sidebar.number_input if n.label == "Scale of level 0 (µm per pixel)")
    at = analysable(field.set_value(0.5).run())
    assert not at.info and [button.label for button in at.button] == ["Analyse the slide"]


def test_no_slides_and_no_viewer_are_said(tmp_path, monkeypatch):
    monkeypatch.setenv("APP_SLIDES", str(tmp_path))
    monkeypatch.setattr(slide_page, "list_slides", lambda: [])
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    at = at.sidebar.radio(key="view").set_value("Slide").run()
    assert "No slides here" in at.info[0].value


def test_an_uploaded_checkpoint_says_why_it_cannot_analyse_slides(tmp_path, monkeypatch):
    """Workers load the model from the server's disk; an upload is only in the session's memory."""
    monkeypatch.setenv("APP_SLIDE_STORE", str(tmp_path / "store"))
    checkpoint = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    at.sidebar.radio(key="model_source").set_value("Upload a checkpoint").run()
    at.sidebar.file_uploader(key="checkpoint_upload").set_value(
        (checkpoint.name, checkpoint.read_bytes(), "application/octet-stream")).run()
    at = at.sidebar.radio(key="view").set_value("Slide").run()
    assert not at.exception and "is an upload, held by this session only" in at.info[0].value


def test_the_precision_asked_for_is_planned_and_the_page_says_which_runs_and_why(on_the_slide_page):
    from models.precision import choose_precision

    at = on_the_slide_page
    precision = at.sidebar.radio(key="slide_precision")
    assert precision.options == ["auto", "float32 (exact)", "bfloat16"] and precision.value == "auto"
    auto = choose_precision("auto")  # this machine's CPU decides: the page's cluster is local
    assert f"Runs in {auto.name}: {auto.reason}." in [c.value for c in at.sidebar.caption]
    at = analysable(precision.set_value("bfloat16").run())
    said = [c.value for c in at.sidebar.caption if c.value.startswith("Runs in ")]
    assert not at.exception and said == [f"Runs in bfloat16: {choose_precision('bfloat16').reason}."], said


def test_an_image_is_a_slide_whose_scale_is_asked_for_and_the_mosaic_is_scored_against_its_truth(
        tmp_path, monkeypatch):
    """Region mode on the Slide page: an uploaded PNG waits for its scale; the PCam test mosaic (here of four test
    patches, analysed beforehand by the engine into the page's store) has its scale and its score against PCam's
    labels of the patch centres, turned too, with the proof that its heatmap turns with it."""
    from app.cells.mosaic import score_cells
    from app.slides.demos import mosaic_entry
    from app.slides.run import assemble, chunk_task, plan_slide

    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    mosaic = mosaic_entry(tmp_path / "demos", count=4)
    monkeypatch.setattr("app.slides.library.demo_images", lambda: [mosaic])
    monkeypatch.setattr(slide_page, "STORE", tmp_path / "store")
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    checkpoint = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
    plan = plan_slide(mosaic.path, checkpoint, tmp_path / "store", 0.972)
    results = {index: chunk_task(str(mosaic.path), 0.972, str(checkpoint), plan.grid.chunk, *index)
               for index in plan.chunks}
    for result in results.values():
        plan.store.put(result)
    labels = np.load(mosaic.truth)
    assert labels.shape == (plan.grid.cells.rows, plan.grid.cells.cols) == (4, 4), "a cell at each patch's centre"
    expected = score_cells(assemble(plan, results)["probabilities"][..., -1], labels)

    at = AppTest.from_file(MAIN, default_timeout=120).run()
    at.sidebar.radio(key="view").set_value("Slide").run()
    box = at.sidebar.selectbox(key="slide")
    assert box.options[-1] == "PCam test mosaic (truth known) (demo)"
    at = box.set_value(box.options[-1]).run()
    info = " ".join(c.value for c in at.sidebar.caption)
    assert "an image of one level: 192 x 192 px. Scale: 0.972 µm/px, recorded with this demo image." in info
    deadline = time.monotonic() + 30  # the plan is made in the background; the page then shows the analysed cells
    while not at.success and time.monotonic() < deadline:
        time.sleep(0.1)
        at.run()
    assert not at.exception and at.success[0].value == (
        f"Against the true labels of the patch centres: {expected.summary()}.")
    evaluated = np.isfinite(assemble(plan, results)["probabilities"][..., -1])
    assert expected.scored == int(((labels >= 0) & evaluated).sum()) >= 3, "the patch centres with tissue are scored"

    # Turned by a quarter turn, the mosaic is a slide of its own (analysed here beforehand too): its score is the
    # same, the truth turned with it, and the page proves its heatmap is the original's turned.
    turned = plan_slide(mosaic.path, checkpoint, tmp_path / "store", 0.972, element=1)
    for index in turned.chunks:
        turned.store.put(chunk_task(str(mosaic.path), 0.972, str(checkpoint), turned.grid.chunk, *index, 1))
    at = at.sidebar.radio(key="slide_rotate").set_value(90).run()
    deadline = time.monotonic() + 30
    while not any(c.value.startswith("Proof of equivariance: P(tumour)") for c in at.caption) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
        at.run()
    proof = next(c.value for c in at.caption if c.value.startswith("Proof of equivariance"))
    difference = float(proof.split("max |difference| = ")[1].split(" ")[0])
    assert difference < 1e-5 and f"over {int(evaluated.sum())} cells analysed in both" in proof, proof
    assert not at.exception and at.success[0].value.endswith(f"{expected.summary()}.")

    png = tmp_path / "region.png"
    Image.fromarray(np.full((200, 260, 3), 200, dtype=np.uint8)).save(png)
    at.sidebar.file_uploader(key="slide_upload").set_value((png.name, png.read_bytes(), "image/png")).run()
    assert not at.exception and at.sidebar.selectbox(key="slide").options[0] == "region.png (uploaded)"
    assert any("region.png is an image, which records no scale" in i.value for i in at.info)
    assert not at.button, "nothing to analyse without a scale"


def test_a_slide_is_planned_once_the_viewer_has_its_first_tile(tmp_path, monkeypatch):
    """The plan waits for the slide's first tile served (its CPU would share two cores with the first tiles), and is
    made at once after it."""
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    monkeypatch.setattr(slide_page, "STORE", tmp_path / "store")
    monkeypatch.setattr(slide_page, "PLAN_WAIT_S", 600.0)
    monkeypatch.setattr(tiles, "_served", {})  # no tile of any slide served yet in this process
    cmu = next(e for e in list_slides() if e.name == "CMU-1-Small-Region.svs")
    checkpoint = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
    planning = slide_page._make_plan(cmu.slide_id, str(cmu.path), str(checkpoint), None)
    with pytest.raises(TimeoutError):
        planning.result(timeout=2)  # the plan takes 0.5 s once started: it has not started
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "path_params": dict(slide_id=cmu.slide_id, level=8, col=0, row=0)}
    assert asyncio.run(tiles.tile(Request(scope))).status_code == 200
    plan = planning.result(timeout=60)
    assert plan.chunks and plan.tissue.any()


def test_a_plan_queued_behind_others_waits_as_long_as_it_was_told_when_asked_for(tmp_path, monkeypatch):
    """A plan asked for while the planner's threads are busy waits for tiles as long as PLAN_WAIT_S said then, not
    as long as it says when a thread takes the plan up (a later test's 600 s held both threads for ten minutes, and
    every slide page after it waited for a plan)."""
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    monkeypatch.setattr(slide_page, "STORE", tmp_path / "store")
    monkeypatch.setattr(tiles, "_served", {})  # no tile of any slide served in this process: none will be
    monkeypatch.setattr(slide_page, "PLAN_WAIT_S", 0.2)
    release = threading.Event()
    busy = [slide_page._PLANNER.submit(release.wait, 60) for _ in range(slide_page._PLANNER._max_workers)]
    try:
        cmu = next(e for e in list_slides() if e.name == "CMU-1-Small-Region.svs")
        checkpoint = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
        planning = slide_page._make_plan(cmu.slide_id, str(cmu.path), str(checkpoint), None)  # queued
        monkeypatch.setattr(slide_page, "PLAN_WAIT_S", 600.0)
    finally:
        release.set()
    assert all(done.result(timeout=60) for done in busy)
    plan = planning.result(timeout=60)  # 0.2 s for the tiles that never come, then the plan
    assert plan.chunks and plan.tissue.any()


def test_a_scheduler_that_says_nothing_is_a_sentence_on_the_page(tmp_path, monkeypatch):
    import app.slides.connection as connection
    from tests.test_slides_connection import Listener

    silent = Listener()  # accepts, and says nothing
    monkeypatch.setenv("AAGC_DASK_SCHEDULER", silent.address)
    monkeypatch.setattr(connection, "CONNECT_DEADLINE_S", 1.0)
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    monkeypatch.setenv("APP_SLIDE_STORE", str(tmp_path / "store"))
    try:
        at = AppTest.from_file(MAIN, default_timeout=120).run()
        at = analysable(at.sidebar.radio(key="view").set_value("Slide").run())
        at = at.button[0].click().run()
        assert not at.exception
        assert [e.value for e in at.error] == [
            f"The analysis cannot start: no Dask scheduler answers at {silent.address}: it accepted the connection "
            "but said nothing within 1 s (not a Dask scheduler, or a network that drops its answers)."]
    finally:
        connection.close_server_clients()
        silent.close()
