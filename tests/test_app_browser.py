"""The app in a real browser: headless Chromium (Debian's), driven by Playwright, against ``streamlit run``.

The server runs as a subprocess on a free port with ``APP_CHECKPOINTS`` on a
temporary folder holding one small dev checkpoint. The test switches the image
source to upload, uploads a PNG, waits until the orientation panels are drawn,
and saves a screenshot (``tmp_path``, and ``out/browser-screenshot.png`` with
``SAVE_SCREENSHOT=1``), which must be a non-blank PNG of the window's width.
With ``UPDATE_DOCS_SCREENSHOT=1`` the pathology test also rewrites docs/pathology_tumour.png and the README's
picture, ``docs/app.png``.

Playwright's own browser download does not work on these machines, so it drives
``/usr/bin/chromium`` (``apt-get install chromium``). Without it, or without
the ``playwright`` package, the test skips; with ``REQUIRE_REFERENCE=1`` (CI) it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_app_ui import write_dev_checkpoints

from benchmarks.concurrent_sessions import CHROMIUM, CHROMIUM_ARGS, free_port, streamlit_server
from tests.conftest import REPO

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # skipped (or failed under CI) with a message below
    sync_playwright = None

VIEWPORT = dict(width=1400, height=1000)
FIRST_SCREEN = dict(width=1440, height=900)  # what the first page must fit
VARIANTS_SCREEN = dict(width=1440, height=2150)  # five variant rows and their table in one picture
TIMEOUT_S = 180  # the trainings of the machines this runs on can slow the first analysis down a lot
ARCH = "p4cnn"


def require(condition: bool, message: str) -> None:
    """Skip without ``condition``; under ``REQUIRE_REFERENCE=1`` (CI) fail instead."""
    if condition:
        return
    if os.environ.get("REQUIRE_REFERENCE") == "1":
        pytest.fail(message + "; REQUIRE_REFERENCE=1 makes this an error (.ci/run installs chromium)")
    pytest.skip(message)


def scroll_to(locator, attempts: int = 5) -> None:
    """Scroll a Streamlit element into view, again where a rerun replaced it meanwhile ("not attached to the DOM":
    a tab's maps are drawn after its text, and the text can be drawn anew)."""
    for attempt in range(attempts):
        try:
            locator.scroll_into_view_if_needed(timeout=30_000)
            return
        except Exception as error:  # playwright's Error; the module is optional (app_page says so)
            if "not attached" not in str(error) or attempt == attempts - 1:
                raise


@contextlib.contextmanager
def app_page(folder: Path, tmp_path: Path, viewport: dict = VIEWPORT):
    """A Chromium page on ``streamlit run app/server.py`` serving the checkpoints in ``folder``; both stop after."""
    require(CHROMIUM.exists(), f"{CHROMIUM} not found (apt-get install chromium)")
    require(sync_playwright is not None, "the playwright package is missing (pip install -r requirements-dev.txt)")
    deadline = time.monotonic() + TIMEOUT_S
    with contextlib.ExitStack() as stack:
        try:
            _, url = stack.enter_context(streamlit_server(folder, tmp_path / "streamlit.log", free_port(), deadline))
        except (RuntimeError, TimeoutError) as err:
            pytest.fail(str(err))
        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        stack.callback(browser.close)
        page = browser.new_page(viewport=viewport)
        page.set_default_timeout(TIMEOUT_S * 1000)
        page.goto(url)
        yield page


def wait_for_panels(page) -> None:
    """Wait until the analysis is drawn: the turn viewer's panels, then the first tab's arrow field (an SVG picture;
    only the open tab is computed and sent), decoded by the browser."""
    page.get_by_text("What the model sees").wait_for()
    page.locator(".turn-viewer[data-ready='1']").wait_for()
    arrows = page.locator('[data-testid="stMain"] img[src^="data:image/svg+xml"]')
    arrows.first.wait_for(state="visible", timeout=60_000)
    page.wait_for_function("(image) => image.complete && image.naturalWidth > 0", arg=arrows.first.element_handle())
    assert page.locator('[data-testid="stException"]').count() == 0


def assert_viewer_toolbar(page) -> None:
    """.streamlit/config.toml's toolbarMode = "viewer": no Deploy button, no developer menu entries."""
    assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
    assert page.get_by_text("Deploy", exact=True).count() == 0


def check_and_keep(screenshot: Path, name: str, viewport: dict = VIEWPORT) -> None:
    """A non-blank PNG of the window's width; with SAVE_SCREENSHOT=1 also kept as ``out/NAME``."""
    with Image.open(screenshot) as shot:
        assert shot.format == "PNG"
        assert shot.width == viewport["width"] and shot.height >= viewport["height"], shot.size
        pixels = np.asarray(shot.convert("L"), dtype=np.float32)
    assert pixels.std() > 10, f"the screenshot looks blank (pixel std {pixels.std():.1f})"
    if os.environ.get("SAVE_SCREENSHOT") == "1":
        (REPO / "out").mkdir(exist_ok=True)
        shutil.copyfile(screenshot, REPO / "out" / name)


def write_docs_picture(screenshot: Path, name: str, colors: int) -> None:
    """``docs/NAME``: the screenshot 1080 px wide (its aspect kept: 1440 x 900 becomes 1080 x 675) in a palette of
    ``colors``, small enough to commit."""
    with Image.open(screenshot) as shot:
        small = shot.convert("RGB")
    small = small.resize((1080, round(small.height * 1080 / small.width)), Image.LANCZOS)
    small.quantize(colors=colors, dither=Image.NONE).save(REPO / "docs" / name, optimize=True)


def test_upload_shows_the_orientation_panels_in_chromium(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    write_dev_checkpoints(folder, [ARCH])
    upload = tmp_path / "upload.png"
    rng = np.random.default_rng(0)
    rows, cols = np.mgrid[:120, :120]
    disc = ((rows - 60) ** 2 + (cols - 52) ** 2 < 30**2) * 200.0 + rng.normal(0, 20, (120, 120))
    Image.fromarray(np.clip(disc, 0, 255).astype(np.uint8)).save(upload)
    screenshot = tmp_path / "browser-screenshot.png"
    with app_page(folder, tmp_path) as page:
        page.get_by_text("Upload an image", exact=True).click()
        page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(upload))
        wait_for_panels(page)  # the maps' viewer and the arrow field
        assert_viewer_toolbar(page)
        assert "Scaled the whole image of the 120 x 120 upload to 28 x 28" in page.inner_text("body")
        page.screenshot(path=str(screenshot), full_page=True)
    check_and_keep(screenshot, "browser-screenshot.png")


def test_opens_in_pathology_mode_on_a_real_tumour_patch(tmp_path):
    shipped = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
    require(shipped.exists(), f"{shipped} not found")
    screenshot = tmp_path / "pathology-screenshot.png"
    with app_page(REPO / "checkpoints", tmp_path, FIRST_SCREEN) as page:
        # No clicks: the app opens on the PCam model and the first gallery patch, a real tumour patch.
        wait_for_panels(page)  # the maps' viewer and the arrow field
        assert_viewer_toolbar(page)
        body = page.inner_text("body")
        assert "fa_p4m_densenet_pcam" in body and "True label: tumor" in body
        # Above the fold of a 1440 x 900 window: the image, the prediction and the per-orientation maps.
        maps = page.locator(".turn-viewer").bounding_box()
        assert maps["y"] + maps["height"] <= FIRST_SCREEN["height"], maps
        assert page.get_by_text("What the model sees").bounding_box()["y"] < FIRST_SCREEN["height"]
        page.screenshot(path=str(screenshot))
        page.get_by_role("tab", name="Attention on nuclei").click()
        page.get_by_text("rank correlation of attention with haematoxylin", exact=False).wait_for()
        # Streamlit scrolls inside its main block: bring the nuclei figure into the window for a second picture.
        scroll_to(page.get_by_text("rank correlation of attention with haematoxylin", exact=False))
        page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "pathology-nuclei-screenshot.png"))
    check_and_keep(screenshot, "pathology-screenshot.png", FIRST_SCREEN)
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        # The README's first picture: the first screen, in a small palette PNG.
        write_docs_picture(screenshot, "app.png", colors=192)
        # docs/pathology.md's picture: the same patch's attention-on-nuclei tab.
        write_docs_picture(tmp_path / "pathology-nuclei-screenshot.png", "pathology_tumour.png", colors=192)
    check_and_keep(tmp_path / "pathology-nuclei-screenshot.png", "pathology-nuclei-screenshot.png", FIRST_SCREEN)


def test_variants_view_shows_every_shipped_attention_variant_in_rows(tmp_path):
    """The shipped rot-MNIST variants on a rotated gallery digit, one row each. With ``UPDATE_DOCS_SCREENSHOT=1``
    the page becomes ``docs/variants.png``."""
    names = sorted(path.stem for path in (REPO / "checkpoints").glob("*_p4cnn_rot_mnist.safetensors")
                   if not path.stem.startswith(("p4cnn", "big")))
    require(len(names) >= 2, "fewer than two attentive rot-MNIST checkpoints shipped")
    screenshot = tmp_path / "variants-screenshot.png"
    with app_page(REPO / "checkpoints", tmp_path, VARIANTS_SCREEN) as page:
        wait_for_panels(page)
        sidebar = page.locator('[data-testid="stSidebar"]')
        sidebar.get_by_text("rot-MNIST", exact=True).click()
        page.get_by_text("What the model sees").wait_for()
        sidebar.get_by_text("Variants", exact=True).click()
        page.get_by_text("All variants", exact=True).wait_for()
        charts = page.locator('[data-testid="stPlotlyChart"]')
        deadline = time.monotonic() + 60
        # Until exactly one chart per row: under load the Image view's charts linger while this run draws.
        while charts.count() != len(names) and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert charts.count() == len(names), f"{charts.count()} rows drawn for {names}"
        charts.last.locator(".main-svg").first.wait_for(state="visible")
        page.wait_for_timeout(1000)
        body = page.inner_text("body")
        assert all(name in body for name in names) and "Table 1:" in body
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(screenshot), full_page=True)
    check_and_keep(screenshot, "variants-screenshot.png", VARIANTS_SCREEN)
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        write_docs_picture(screenshot, "variants.png", colors=224)
