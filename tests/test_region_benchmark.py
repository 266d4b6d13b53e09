"""The region benchmark's functions in this process, on a small region (one thread, no timing asserted).

Without attention, ``"tiles"`` and ``"crops"`` are one function: the shipped p4m DenseNet without attention must
agree to round-off. For the shipped attentive model they differ; its numbers need only be there and finite. Cells are
counted over the whole grid, the evaluated ones among them.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from benchmarks import region as bench

SIDE = 320  # 8 x 8 cells at the model's scale
TILE_CELLS = 5  # three tiles a side (3, 2, 3 cells), so that stitching is exercised


@pytest.fixture(scope="module")
def measured():
    if not bench.DEFAULT_CHECKPOINT.is_file():
        pytest.skip(f"{bench.DEFAULT_CHECKPOINT} not found")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {(which, method): bench.measure(which, method, bench.DEFAULT_CHECKPOINT, SIDE, 1.0, TILE_CELLS)
                for which in bench.WHICH for method in bench.METHODS}
    finally:
        torch.set_num_threads(threads)


def test_region_is_seeded_he_of_the_side_asked():
    region = bench.build_region(SIDE)
    assert region.shape == (3, SIDE, SIDE) and region.dtype == np.float32
    assert 0 <= region.min() and region.max() <= 1
    np.testing.assert_array_equal(region, bench.build_region(SIDE))
    assert not np.array_equal(region, bench.build_region(SIDE, seed=1))


def test_cells_are_counted_over_the_grid(measured):
    for (which, method), (record, probabilities) in measured.items():
        rows, cols = record["grid"]
        assert record["cells"] == rows * cols, (which, method)
        assert probabilities.shape == (rows, cols, 2)
        assert record["evaluated"] == int(np.isfinite(probabilities[..., -1]).sum())
        assert 0 < record["evaluated"] <= record["cells"]
    grids = {tuple(record["grid"]) for record, _ in measured.values()}
    assert len(grids) == 1


def test_plain_densenet_tiles_equal_crops(measured):
    tiles, crops = measured[("plain", "tiles")][1], measured[("plain", "crops")][1]
    found = bench.agreement(tiles, crops)
    assert found["same_cells"] and found["cells"] > 0
    assert found["max_abs_dp"] < 1e-5
    assert found["same_class"] == 1.0
    # Not vacuous: with its BatchNorm calibrated, many of the probabilities are far from 0 and 1.
    positive = tiles[..., -1][np.isfinite(tiles[..., -1])]
    assert np.mean((positive > 0.01) & (positive < 0.99)) > 0.25


def test_attentive_model_numbers_are_present_and_finite(measured, capsys):
    runs = {key: record for key, (record, _) in measured.items()}
    arrays = {key: probabilities for key, (_, probabilities) in measured.items()}
    for method in bench.METHODS:
        record = runs[("checkpoint", method)]
        assert record["arch"] == "fa_p4m_densenet"
        for key in ("seconds", "ms_per_cell", "rss_base_mib", "rss_peak_mib", "rss_increment_mib"):
            assert math.isfinite(record[key]) and record[key] >= 0, (method, key)
        assert record["seconds"] > 0 and record["rss_peak_mib"] >= record["rss_base_mib"] > 0
    comparisons = {c["which"]: c for c in bench.compare(runs, arrays)}
    attentive = comparisons["checkpoint"]
    assert math.isfinite(attentive["time_ratio"]) and attentive["time_ratio"] > 0
    found = attentive["agreement"]
    assert found["same_cells"] and found["cells"] == runs[("checkpoint", "tiles")]["evaluated"]
    for key in ("max_abs_dp", "median_abs_dp", *(f"share_over_{t}" for t in bench.THRESHOLDS), "same_class"):
        assert 0 <= found[key] <= 1, key
    assert found["median_abs_dp"] <= found["max_abs_dp"]
    bench.print_tables(runs, list(comparisons.values()))
    printed = capsys.readouterr().out
    assert "fa_p4m_densenet_pcam" in printed and "p4m_densenet_pcam (no attention)" in printed


def test_command_line_runs_every_worker_and_writes_json(tmp_path, capsys):
    if not bench.DEFAULT_CHECKPOINT.is_file():
        pytest.skip(f"{bench.DEFAULT_CHECKPOINT} not found")
    out = tmp_path / "region.json"
    # A mosaic of 9 patches, not the command's 400: what this test asserts of it is that it is scored and written.
    assert bench.main(["--side", "160", "--threads", "1", "--mosaic-patches", "9", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [(r["which"], r["method"]) for r in written["runs"]] == [
        (which, method) for which in bench.WHICH for method in bench.METHODS]
    assert all("error" not in r and r["cells"] == r["grid"][0] * r["grid"][1] for r in written["runs"])
    plain = next(c for c in written["comparisons"] if c["which"] == "plain")
    assert plain["agreement"]["max_abs_dp"] < 1e-5
    assert "| p4m_densenet_pcam (no attention) | tiles (15 cells) |" in capsys.readouterr().out
    assert {method: written["mosaic"][method]["cells"] for method in bench.METHODS} == dict.fromkeys(bench.METHODS, 9)


def test_without_the_plain_checkpoint_an_untrained_network_stands_in():
    region = bench.build_region(160)
    model, card, label = bench.load_network("plain", bench.DEFAULT_CHECKPOINT, region, plain=None)
    assert label == "p4m_densenet (untrained)" and card["arch"] == "p4m_densenet" and not model.training
