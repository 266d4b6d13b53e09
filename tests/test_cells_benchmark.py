"""``python -m benchmarks.cells``: the set-ups' environments and the table's arithmetic (no timing asserted; the full
run measures real processes for minutes)."""

from __future__ import annotations

import numpy as np

from benchmarks.cells import SETUPS, environments, summarise


def test_before_has_dasks_worker_environment_and_after_keeps_freed_memory_in_one_arena(monkeypatch):
    monkeypatch.delenv("AAGC_KEEP_FREED_MEMORY", raising=False)
    environ = environments()
    assert environ["before"] == environ["after_dask_allocator"]
    assert environ["before"]["OMP_NUM_THREADS"] == environ["after"]["OMP_NUM_THREADS"] == "1"
    assert environ["after"]["MALLOC_ARENA_MAX"] == "1" and environ["after"]["MALLOC_MMAP_MAX_"] == "0"
    assert "MALLOC_ARENA_MAX" not in environ["before"]


def test_the_summary_takes_medians_ratios_to_before_and_the_largest_difference(tmp_path):
    runs, probabilities = {}, {}
    for k, setup in enumerate(SETUPS):
        runs[setup] = [dict(cells=10, cells_per_s=s * (k + 1), cpu_ms_per_cell=60 / (k + 1), system_share=0.1,
                            faults_per_cell=5.0, peak_rss_mib=900.0) for s in (1.0, 2.0, 3.0)]
        path = tmp_path / f"{setup}.npy"
        np.save(path, np.full((10, 2), 0.5) + (1e-7 if setup == "after" else 0))
        probabilities[setup] = [path]
    table = summarise(runs, probabilities)
    assert table["before"]["cells_per_s"] == 2.0 and table["before"]["speed_x_before"] == 1.0
    assert table["after"]["speed_x_before"] == 3.0 and table["after"]["cpu_x_before"] == 3.0
    assert table["after_dask_allocator"]["max_abs_dp"] == 0.0
    assert abs(table["after"]["max_abs_dp"] - 1e-7) < 1e-12
