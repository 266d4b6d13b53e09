"""The Slide page in Chromium: the CMU demo slide drawn from its tiles; then a pyramidal TIFF of PCam test patches,
uploaded, opens in the deep-zoom viewer (tiles over HTTP), pans, is analysed on Dask, shows its heatmap as tiled
layers (overlay tiles over HTTP, no picture of the whole slide), and the cell hovered, without the view moving, is
the cell a click opens in the patch page."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image
from test_app_browser import app_page
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.library import list_slides
from app.slides.overlay_tiles import TILE
from models import load_checkpoint
from tests.conftest import REPO, require_shared


def test_a_slide_opens_is_analysed_and_a_click_opens_a_cell(tmp_path, monkeypatch):
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    mosaic = pcam_test_mosaic(card, PCAM, count=9)
    write_pyramid(tmp_path / "mosaic.tif", np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8), PCAM_MPP)
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no-slides"))
    monkeypatch.setenv("APP_SLIDE_UPLOADS", str(tmp_path / "uploads"))
    monkeypatch.setenv("APP_SLIDE_STORE", str(tmp_path / "store"))
    with app_page(REPO / "checkpoints", tmp_path) as page:
        asked = []
        page.on("request", lambda request: asked.append(request.url))
        page.get_by_text("What the model sees").wait_for()
        sidebar = page.locator('[data-testid="stSidebar"]')
        sidebar.get_by_text("Slide", exact=True).click()
        # The CMU demo slide, listed first, is drawn from its tiles.
        cmu = next(entry for entry in list_slides() if entry.name == "CMU-1-Small-Region.svs")
        page.locator(f".slide-viewer[data-dzi='slides/{cmu.slide_id}.dzi'][data-drawn]").wait_for()
        # Its descriptor came with the page and the viewer's buttons are its own: the first tiles waited for neither.
        assert not [url for url in asked if url.endswith(".dzi") or "/openseadragon/images/" in url]
        # Uploaded, the slide is kept in the uploads folder and chosen.
        uploader = sidebar.locator('[data-testid="stFileUploader"] input[type="file"]')
        uploader.set_input_files(str(tmp_path / "mosaic.tif"))
        # Its tiles are shown while its tissue is found; then the viewer again, with the outline and the grid.
        viewer = page.locator(".slide-viewer[data-open='1']").filter(has_text="49 cells of 32 px")
        viewer.wait_for()
        page.wait_for_function("() => Number(document.querySelector('.slide-viewer')?.dataset.tiles"
                               " ?? [...document.querySelectorAll('*')].map((e) => e.shadowRoot).filter(Boolean)"
                               ".map((r) => r.querySelector('.slide-viewer')).find(Boolean)?.dataset.tiles) > 0")
        assert viewer.get_attribute("data-scale-bar").endswith("µm"), "a scale bar from the slide's 0.972 um/px"
        # A pan moves the view by the drag (benchmarks.browser_latency: with no websocket byte).
        centre = "(v) => { const c = v.viewer.viewport.getCenter(true); return [c.x, c.y]; }"
        before = viewer.evaluate(centre)
        box = viewer.locator(".view").bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(x - 100, y, steps=4)
        page.mouse.up()
        page.wait_for_function("(v) => !v.viewer.isAnimating()", arg=viewer.element_handle())
        after = viewer.evaluate(centre)
        zoom = viewer.evaluate("(v) => v.viewer.viewport.viewportToImageZoom(v.viewer.viewport.getZoom(true))")
        assert after[0] - before[0] == pytest.approx(100 / zoom / 288, rel=0.05) and after[1] == before[1]
        # The viewer's buttons (the slide fills the view: zoomed in as far as it goes, 1.1 screen pixels a pixel).
        zooms = []
        for control in ("Zoom out", "Zoom in", "The whole slide", "Full screen"):  # drawn, whatever the fonts
            assert viewer.locator(f"[data-control='{control}'] svg path").count() == 1
        for control in ("Zoom out", "Zoom in", "The whole slide"):
            viewer.locator(f"[data-control='{control}']").click()
            page.wait_for_function("(v) => !v.viewer.isAnimating()", arg=viewer.element_handle())
            zooms.append(viewer.evaluate("(v) => v.viewer.viewport.getZoom() / v.viewer.viewport.getHomeZoom()"))
        assert zooms[0] < 1 and zooms[1] > zooms[0] and zooms[2] == pytest.approx(1)
        page.get_by_role("button", name="Analyse the slide").click()
        page.locator("[data-opacity]").wait_for()  # the heatmap's opacity slider: the analysis is shown
        page.locator(".slide-viewer[data-overlay='drawn'][data-outline='drawn']").wait_for()
        # Once the last chunk is in, the page runs once more and the status line says so (on a loaded machine that run
        # can come after the overlay is drawn: the line said "Analysing. ... done." for a while).
        viewer.locator(".status", has_text="chunks analysed").wait_for()
        # The overlays are tiles of their own routes (P(tumour) and the readings one layer of values tiles, coloured
        # by the viewer); no picture of the whole slide is sent.
        values_tiles = [url for url in asked if "/slides/overlays/" in url and "/values/" in url]
        assert values_tiles and any("/outline/" in url for url in asked)
        assert not viewer.locator("img[src^='data:']").count()
        # The viewer's colours of a values tile are the server's own tile of each overlay, pixel for pixel.
        for kind in ("tumour", "spatial", "removed", "kept"):
            assert _coloured_in_the_page(page, values_tiles[-1], kind) == _tile(page, values_tiles[-1], kind), kind
        # On screen, at opacity 1, the centre of cell (3, 3) (pixel (144, 144), a cell of 32 pixels: no blend with a
        # neighbour) is the server's colour of that cell.
        viewer.locator("[data-opacity]").evaluate("(s) => { s.value = '1'; s.dispatchEvent(new Event('input')); }")
        frames = int(viewer.get_attribute("data-drawn"))
        page.wait_for_function(f"(v) => Number(v.dataset.drawn) > {frames} + 1", arg=viewer.element_handle())
        shown, (url, x, y) = viewer.evaluate(
            "(v) => { const w = v.viewer.world; const at = w.getItemAt(0).imageToViewerElementCoordinates("
            "new OpenSeadragon.Point(144, 144)); const canvas = v.viewer.drawer.canvas; const ratio = canvas.width"
            " / v.viewer.container.clientWidth; const shown = Array.from(canvas.getContext('2d').getImageData("
            "Math.floor(at.x * ratio), Math.floor(at.y * ratio), 1, 1).data); const source = w.getItemAt(1).source;"
            " const px = Math.floor(144 * source.dimensions.x / w.getItemAt(0).source.dimensions.x);"
            " const side = source.getTileWidth(source.maxLevel); return [shown, [source.getTileUrl(source.maxLevel,"
            " Math.floor(px / side), Math.floor(px / side)), px % side, px % side]]; }")
        tile = page.request.get(url.replace("/values/", "/tumour/"))
        assert shown[3] == 255, "an evaluated cell: opaque"
        assert shown == list(Image.open(io.BytesIO(tile.body())).convert("RGBA").getpixel((x, y))), (shown, url)
        # The opacity changes the overlay's layer as it is (nothing fetched); another overlay is the same tiles
        # coloured again in the page: nothing fetched, neither the overlay's tiles nor the slide's.
        seen = len(asked)
        viewer.locator("[data-opacity]").evaluate("(s) => { s.value = '0.8'; s.dispatchEvent(new Event('input')); }")
        assert viewer.evaluate("(v) => v.viewer.world.getItemAt(1).getOpacity()") == pytest.approx(0.8)
        page.get_by_text("α_s: where it removes", exact=False).click()
        page.locator(".slide-viewer[data-overlay-kind='spatial'][data-overlay='drawn']").wait_for()
        switched = asked[seen:]
        assert not [url for url in switched if url.endswith((".jpeg", ".png")) or ".png?" in url], switched
        assert viewer.evaluate("(v) => v.viewer.world.getItemAt(1).getOpacity()") == pytest.approx(0.8)
        # Cell (3, 3) is the centre of the mosaic's middle patch: its centre is pixel (144, 144) of level 0. Hovered,
        # it is named over the view, and the view does not move (the bar's height is fixed): the click there opens it.
        point = viewer.evaluate("(v) => { const p = v.viewer.viewport.imageToViewerElementCoordinates("
                                "new OpenSeadragon.Point(144, 144)); const box = v.querySelector('.view')"
                                ".getBoundingClientRect(); return [box.left + p.x, box.top + p.y]; }")
        before = viewer.locator(".view").bounding_box()
        page.mouse.move(*point)
        page.wait_for_function("(v) => (v.dataset.hover || '').includes('P(tumour) =')", arg=viewer.element_handle())
        hovered = viewer.get_attribute("data-hover")
        assert hovered.startswith("cell (3, 3): P(tumour) = "), hovered
        assert viewer.locator(".view").bounding_box() == before, "hovering moves nothing"
        page.mouse.click(*point)
        page.get_by_text("What the model sees").wait_for()
        assert "mosaic.tif, cell (3, 3)" in page.inner_text("body")


def _tile(page, values_url: str, kind: str) -> bytes:
    """The server's tile of ``kind`` at the place of the values tile ``values_url``, decoded: RGBA bytes."""
    response = page.request.get(values_url.replace("/values/", f"/{kind}/"))
    assert response.ok, response.status
    return np.array(Image.open(io.BytesIO(response.body())).convert("RGBA")).tobytes()


def _coloured_in_the_page(page, values_url: str, kind: str) -> bytes:
    """The values tile ``values_url``, decoded here (exact, not through a canvas) and coloured for ``kind`` in the
    page by the viewer's own code (app/ui/slide_viewer.js's loadPalette and colourValues): RGBA bytes."""
    response = page.request.get(values_url)
    values = np.array(Image.open(io.BytesIO(response.body())).convert("RGBA"))
    col, row = map(int, re.search(r"/(\d+)_(\d+)\.png", values_url).groups())
    coloured = page.evaluate(
        """async ([pixels, width, kind, x0, y0]) => {
            const viewer = await import(new URL("slides/viewer.js", document.baseURI).href);
            const colours = await viewer.loadPalette();
            return Array.from(viewer.colourValues(Uint8ClampedArray.from(pixels), width, kind, colours, x0, y0));
        }""", [values.ravel().tolist(), values.shape[1], kind, col * TILE, row * TILE])
    return bytes(coloured)
