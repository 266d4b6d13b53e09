"""benchmarks.app_latency runs the page's stages for a new image and reports them, with the CPU's instruction set."""

from __future__ import annotations

import json

import pytest

from benchmarks import app_latency


def test_every_stage_is_timed_and_the_total_is_their_sum(tmp_path, capsys):
    out = tmp_path / "latency.json"
    assert app_latency.main(["--models", "p4cnn", "--repeats", "1", "--threads", "1", "--json", str(out)]) == 0
    header = capsys.readouterr().out
    assert "instruction set: PyTorch" in header and "plotly's JSON engine: orjson" in header
    (result,) = json.loads(out.read_text())
    assert result["arch"] == "p4cnn" and result["repeats"] == 1
    median = result["median_s"]
    assert set(app_latency.STAGES) | {"total", "forward", "forward_default_malloc"} == set(median)
    assert all(median[stage] >= 0 for stage in app_latency.STAGES)
    assert median["total"] == pytest.approx(sum(median[stage] for stage in app_latency.STAGES))
    assert median["forward"] > 0
