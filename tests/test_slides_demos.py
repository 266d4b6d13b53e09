"""The demo images listed beside the demo slides (:mod:`app.slides.demos`): the PCam test mosaic written once, lossless,
with its cells' truth and scale; the gallery's CMU-1 region with the scale the gallery records; nothing listed, and
nothing raised, where the mosaic cannot be made."""

from __future__ import annotations

import numpy as np
from test_slides_engine import PCAM

from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.demos import demo_images, mosaic_entry
from app.slides.engine import slide_grid
from app.slides.reader import open_slide
from models import load_checkpoint
from tests.conftest import REPO, require_shared


def test_the_mosaic_is_written_once_lossless_with_its_truth_on_the_slides_grid(tmp_path):
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    entry = mosaic_entry(tmp_path, count=9)
    assert (entry.name, entry.microns_per_pixel, entry.demo) == ("PCam test mosaic (truth known)", PCAM_MPP, True)
    assert "9 patches of PCam's test split" in entry.note
    written = entry.path.stat().st_mtime_ns
    assert mosaic_entry(tmp_path, count=9) == entry and entry.path.stat().st_mtime_ns == written, "made once"
    mosaic = pcam_test_mosaic({}, PCAM, count=9)
    _, card = load_checkpoint(REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors")
    with open_slide(entry.path) as slide:
        pixels = slide.read_region(0, 0, 0, *slide.dimensions)
        grid = slide_grid(slide, PCAM_MPP, card, PCAM_MPP)
    np.testing.assert_array_equal(pixels, np.round(mosaic.image.transpose(1, 2, 0) * 255))
    labels = np.load(entry.truth)
    np.testing.assert_array_equal(labels, mosaic.labels)
    assert labels.shape == (grid.cells.rows, grid.cells.cols) == (7, 7) and (labels >= 0).sum() == 9
    assert not list(tmp_path.glob(".*")) and not list(tmp_path.glob("*.[0-9]*")), "no partial file left"


def test_the_cmu_region_has_the_gallerys_scale_and_an_unwritable_cache_lists_no_mosaic(monkeypatch):
    import app.cells.mosaic

    made = []
    monkeypatch.setattr(app.cells.mosaic, "pcam_test_mosaic", lambda *args, **kwargs: made.append(1) or
                        pcam_test_mosaic(*args, **kwargs))
    monkeypatch.setenv("APP_SLIDE_DEMOS", "/proc/no-such-folder/demos")
    entries = demo_images()
    assert demo_images() == entries and len(made) <= 1, "a mosaic that cannot be kept is not made again each listing"
    assert [(e.name, e.microns_per_pixel, e.path.name) for e in entries] == [
        ("CMU-1 region", 0.499, "region_cmu1.jpg")]
    assert "not lymph-node tissue" in entries[0].note and entries[0].truth is None
