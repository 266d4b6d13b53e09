"""``python -m benchmarks.slides`` on a small real pyramidal TIFF (PCam test patches): every figure is there, finite
and consistent (no timing asserted)."""

from __future__ import annotations

import json
import math

import numpy as np
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from benchmarks.gigapixel_slide import SOURCE
from benchmarks.slides import main
from models import load_checkpoint
from tests.conftest import require_shared


def test_the_benchmark_measures_a_slide_and_its_tiles(tmp_path, monkeypatch, capsys):
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    slides = tmp_path / "slides"
    slides.mkdir()
    mosaic = pcam_test_mosaic(card, PCAM, count=9)
    write_pyramid(slides / "mosaic.tif", np.round(mosaic.image.transpose(1, 2, 0) * 255).astype(np.uint8), PCAM_MPP)
    monkeypatch.setenv("APP_SLIDES", str(slides))
    out = tmp_path / "slides.json"
    assert main(["--slide", str(slides / "mosaic.tif"), "--chunk", "3", "--tiles", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["slide"] == "mosaic.tif" and report["cells"] > 0 and report["tiles"] == 3
    assert 0 < report["first_chunk_s"] <= report["whole_s"] and report["chunks"] >= 4
    assert all(math.isfinite(report[key]) and report[key] > 0 for key in ("plan_s", "cells_per_s", "tile_in_process_ms",
                                                                          "tile_http_ms"))
    printed = capsys.readouterr().out
    assert printed.startswith("CPU: ") and "instruction set: PyTorch" in printed and "cells/s" in printed


def test_the_gigapixel_measurement_runs_on_a_small_built_slide(tmp_path, monkeypatch, capsys):
    require_shared(SOURCE, f"{SOURCE} not found (the real slides live in ../shared/data/slides)")
    # The built slide goes here, not into the user's cache; the server keeps the user's cache (its built kernels).
    monkeypatch.setattr("benchmarks.gigapixel_slide.cache_root", lambda: tmp_path / "cache")
    # Without the Chromium phase (tests/test_app_browser_slides.py opens the Slide page): the suite stays quick.
    monkeypatch.setattr("benchmarks.slides_gigapixel.CHROMIUM", tmp_path / "no-chromium")
    out = tmp_path / "gigapixel.json"
    assert main(["--gigapixel", "2048", "--tiles", "30", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["side"] == 2048 and report["built_s"] > 0 and report["microns_per_pixel"] == 0.25
    assert report["open_to_outline_s"] >= report["plan_s"] > 0 and report["chunks_with_tissue"] > 0
    assert report["thumbnail_level"] == 1, "a 2,048-pixel slide's 1,024-pixel thumbnail is its level 1"
    # 29 tiles show the whole slide (deep-zoom levels 0 to 10); the zoom paths go on to level 11, the slide's level 0.
    assert report["tiles"] == 60 and report["tile_levels"] == 12, "tiles of every deep-zoom level"
    assert report["server_peak_mib"] >= max(report["server_start_mib"], report["server_end_mib"]) > 0
    assert all(math.isfinite(report[key]) and report[key] > 0 for key in ("tile_median_ms", "tile_p95_ms",
                                                                          "tile_concurrent_median_ms"))
    printed = capsys.readouterr().out
    assert printed.startswith("CPU: ") and "open to tissue outline" in printed and "server while viewed" in printed
    assert (tmp_path / "cache" / "gigapixel").is_dir(), "built once into the project's cache"
    assert "page_outline_s" not in report
