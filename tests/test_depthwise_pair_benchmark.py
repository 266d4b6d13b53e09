"""benchmarks.depthwise_pair times a baseline commit's kernels beside this tree's, in one process."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from benchmarks import depthwise_pair
from models.cpu import attention_kernels

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler here to build the attention kernels"),
    pytest.mark.skipif(subprocess.run(["git", "-C", str(depthwise_pair.REPO), "rev-parse", "HEAD"],
                                      capture_output=True).returncode != 0, reason="not a git checkout"),
]


def test_the_baseline_is_the_commits_own_source(tmp_path):
    path = depthwise_pair.baseline_source("HEAD", tmp_path)
    committed = subprocess.run(["git", "show", "HEAD:models/cpu/attention_kernels.cpp"], cwd=depthwise_pair.REPO,
                               check=True, capture_output=True).stdout
    assert path.name == "attention_kernels.cpp" and path.read_bytes() == committed


def test_both_builds_are_timed_for_every_shape_and_pass(monkeypatch, capsys):
    if attention_kernels._library() is None:
        pytest.skip("the attention kernels are not used on this machine")
    monkeypatch.setattr(depthwise_pair, "SHAPES", [(4, 40, 24, 24), (8, 24, 10, 10)])
    depthwise_pair.main(["--baseline", "HEAD", "--rounds", "1"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert len(rows) == 4  # two shapes x (forward, forward + backward)
    for row in rows:
        before, after, ratio = map(float, row[-3:])
        # The times are printed to 0.01 ms and the ratio is of the unrounded ones: at 0.07 ms, rounding alone
        # moves before / after by 15 %, so the ratio must lie within what the printed times allow.
        half = 0.005
        assert before > 0 and after > 0
        assert (before - half) / (after + half) - 0.01 <= ratio <= (before + half) / max(after - half, 1e-9) + 0.01
    # The tree's own build is back in place afterwards.
    assert attention_kernels.SOURCE.parent.name == "cpu"
