"""``python -m benchmarks.slides --cohort`` (:mod:`benchmarks.cohort_cost`) on a small real pyramidal TIFF of PCam
patches: every figure is there and the derived ones follow from the measured ones (no timing asserted); the work
per cell is the network's own count."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from benchmarks.cohort_cost import cohort_estimate
from benchmarks.slides import main
from models import load_checkpoint
from tests.conftest import require_shared


def test_the_cohort_benchmark_measures_cells_the_hardware_the_scheduler_and_estimates_a_cohort(tmp_path, capsys):
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    model, card = load_checkpoint(CHECKPOINT)
    slide = tmp_path / "mosaic.tif"
    write_pyramid(slide, np.round(pcam_test_mosaic(card, PCAM, count=9).image.transpose(1, 2, 0) * 255)
                  .astype(np.uint8), PCAM_MPP)
    out = tmp_path / "cohort.json"
    assert main(["--cohort", "--slide", str(slide), "--chunk", "3", "--tasks", "50", "--worker-counts", "1",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["cells"] == 42 and set(report["task_s"]) == {"1"}  # of 7 x 7, in palindromic 3 x 3 chunks
    # The work per cell is the network's: a 96-pixel context's forward pass, counted alone, gives the same.
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(torch.rand(1, 3, 96, 96))
    assert report["macs_per_cell"] == pytest.approx(counter.get_total_flops() / 2, rel=0.02)
    best = max(report["cells_per_s_1x2"], report["cells_per_s_2x1"])
    assert report["engine_macs_per_s"] == pytest.approx(best * report["macs_per_cell"])
    assert report["share_of_limit"] == pytest.approx(report["engine_macs_per_s"] / report["matmul_macs_per_s_all"])
    assert 0 < report["result_bytes"] and 0 < report["task_bytes"] < 1000, "a task names its chunk, never pixels"
    estimate = report["estimate"]
    assert estimate == pytest.approx(cohort_estimate(best / 2, report["macs_per_cell"],
                                                     max(report["task_s"].values()), report["result_bytes"]))
    assert estimate["slides"] == 399 and estimate["cells"] == pytest.approx(399 * 120 / (32 * 0.972e-3) ** 2)
    assert all(math.isfinite(v) and v > 0 for v in estimate.values())
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].startswith("CPU: ") and "instruction set: PyTorch" in lines[0]
    assert all(line.endswith("]") and "instruction set: PyTorch" in line for line in lines[1:6]), \
        "the CPU and instruction set beside every measured figure"
    assert "ESTIMATED" in printed and "not measured" in printed


def test_the_gpu_check_runs_the_workers_device_path_and_says_when_there_is_no_gpu(tmp_path, monkeypatch, capsys):
    """Where there is no GPU it says so; pointed at the CPU, the device path gives the CPU's probabilities exactly
    (what a GPU is measured against)."""
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    slide = tmp_path / "mosaic.tif"
    write_pyramid(slide, np.round(pcam_test_mosaic(card, PCAM, count=4).image.transpose(1, 2, 0) * 255)
                  .astype(np.uint8), PCAM_MPP)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--cohort", "--gpu", "--slide", str(slide), "--chunk", "2"]) == 0
    assert capsys.readouterr().out.startswith("no GPU here (PyTorch sees no CUDA device): nothing measured [")
    out = tmp_path / "gpu.json"
    assert main(["--cohort", "--gpu", "--device", "cpu", "--slide", str(slide), "--chunk", "2", "--json",
                 str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["device_cells"] > 0 and report["largest_difference"] == 0.0
    assert "differ from the CPU's by at most 0.0e+00" in capsys.readouterr().out
