"""``python -m benchmarks.slides`` on a small real pyramidal TIFF (PCam test patches): every figure is there, finite
and consistent (no timing asserted)."""

from __future__ import annotations

import json
import math

import numpy as np
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

from app.region.demo import PCAM_MPP, pcam_test_mosaic
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
