"""Staging data for a lent GPU: pieces cut to the transfer's packed size."""

from __future__ import annotations

import io
import tarfile

import pytest

from tools.device_chunks import packed_size, plan_pieces


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 4900])
def test_packed_size_is_what_tar_writes_for_the_file(tmp_path, size):
    path = tmp_path / "patch.jpg"
    path.write_bytes(b"x" * size)
    with tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.add(path, arcname="patch.jpg")
        assert packed_size(path) == tar.offset  # where the member ends (before tar's closing blocks)


def test_pieces_keep_the_order_and_stay_within_the_budget():
    files = [(f"f{i}", size) for i, size in enumerate([400, 300, 300, 500, 100, 1000])]
    pieces = plan_pieces(files, budget=1000)
    assert pieces == [["f0", "f1", "f2"], ["f3", "f4"], ["f5"]]
    sizes = dict(files)
    assert all(sum(sizes[name] for name in piece) <= 1000 for piece in pieces)


def test_a_file_larger_than_a_piece_is_a_clear_error():
    with pytest.raises(ValueError, match=r"big\.bin alone \(2048 bytes packed\) is larger than a piece"):
        plan_pieces([("big.bin", 2048)], budget=1024)
