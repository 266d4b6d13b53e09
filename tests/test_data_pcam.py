"""PCam reader: tiny official-format HDF5 files and an image folder; lazy reads keep the batch order."""

from __future__ import annotations

import gzip
import os
import pickle

import h5py
import numpy as np
import pytest
from PIL import Image

from training.data import DataError, load_dataset
from training.data.pcam import load_pcam

COUNTS = {"train": 7, "valid": 3, "test": 4}


def h5_path(root, split, part):
    return root / f"camelyonpatch_level_2_split_{split}_{part}.h5"


def write_h5(root, counts=COUNTS):
    """Patch i of a split is filled with i in the red channel; its label is i % 2."""
    written = {}
    for split, n in counts.items():
        x = np.zeros((n, 96, 96, 3), dtype=np.uint8)
        x[..., 0] = np.arange(n)[:, None, None]
        x[:, 0, 5, 2] = 200  # blue, row 0, column 5: checks the channel move keeps images upright
        y = (np.arange(n) % 2).reshape(n, 1, 1, 1).astype(np.uint8)
        with h5py.File(h5_path(root, split, "x"), "w") as f:
            f.create_dataset("x", data=x, chunks=(1, 96, 96, 3), compression="gzip")
        with h5py.File(h5_path(root, split, "y"), "w") as f:
            f.create_dataset("y", data=y)
        written[split] = (x, y)
    return written


def write_folder(root, counts=COUNTS, size=96):
    for split, n in counts.items():
        for i in range(n):
            label = ("no_tumor", "tumor")[i % 2]
            (root / split / label).mkdir(parents=True, exist_ok=True)
            pixels = np.zeros((size, size, 3), dtype=np.uint8)
            pixels[..., 0] = i
            pixels[0, 5, 2] = 200
            Image.fromarray(pixels).save(root / split / label / f"patch_{i:03d}.png")


def check_spec(spec):
    assert (spec.name, spec.num_classes, spec.channels, spec.size) == ("pcam", 2, 3, 96)
    assert spec.class_names == ("no_tumor", "tumor")
    assert spec.mean == (0.701, 0.538, 0.692) and spec.std == (0.235, 0.277, 0.213)
    assert spec.notes == "label: tumour tissue in the central 32x32 pixels"


def test_h5_lazy_batches_in_requested_order(tmp_path):
    write_h5(tmp_path)
    splits = load_pcam(tmp_path)
    check_spec(splits.spec)
    assert splits.sizes() == COUNTS and "HDF5" in splits.spec.source
    x, y = splits.train.get_batch(np.array([5, 1, 5, 0, 6]))
    assert x.shape == (5, 3, 96, 96) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_allclose(x[:, 0, 50, 50], np.array([5, 1, 5, 0, 6]) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, [1, 1, 1, 0, 0])
    assert x[0, 2, 0, 5] == pytest.approx(200 / 255) and x[0, 2, 5, 0] == 0
    assert 0 <= x.min() and x.max() <= 1
    empty_x, empty_y = splits.test.get_batch(np.array([], dtype=np.int64))
    assert empty_x.shape == (0, 3, 96, 96) and empty_y.shape == (0,)
    with pytest.raises(IndexError):
        splits.valid.get_batch(np.array([3]))
    assert load_dataset("pcam", tmp_path).sizes() == COUNTS


def test_h5_split_reopens_after_fork_and_pickles_without_its_handle(tmp_path):
    write_h5(tmp_path)
    split = load_pcam(tmp_path).valid
    split.get_batch(np.array([0]))
    handle = split._file
    assert handle is not None and split._pid == os.getpid()
    split._pid = -1  # as a forked worker sees it: opened by another process
    split.get_batch(np.array([1]))
    assert split._file is not handle and split._pid == os.getpid()
    copy = pickle.loads(pickle.dumps(split))
    assert copy._file is None
    np.testing.assert_array_equal(copy.get_batch(np.array([2, 0]))[1], [0, 0])


@pytest.mark.parametrize(
    "split, part, data, message",
    [
        ("train", "x", np.zeros((7, 96, 96), np.uint8), r"'x' must be uint8 \(N, 96, 96, 3\)"),
        ("train", "x", np.zeros((7, 32, 32, 3), np.uint8), r"'x' must be uint8 \(N, 96, 96, 3\)"),
        ("valid", "x", np.zeros((3, 96, 96, 3), np.float32), "uint8"),
        ("valid", "y", np.zeros((3, 2), np.uint8), r"'y' must be integers \(N, 1, 1, 1\)"),
        ("test", "y", np.zeros((5, 1, 1, 1), np.uint8), "disagree"),
        ("test", "y", np.full((4, 1, 1, 1), 3, np.uint8), "labels must be 0 or 1"),
    ],
)
def test_h5_inconsistent_files_name_the_file(tmp_path, split, part, data, message):
    write_h5(tmp_path)
    path = h5_path(tmp_path, split, part)
    with h5py.File(path, "w") as f:
        f.create_dataset(part, data=data)
    with pytest.raises(DataError, match=message) as error:
        load_pcam(tmp_path)
    assert str(path) in str(error.value)


def test_h5_missing_gzipped_corrupt_and_wrong_dataset(tmp_path):
    write_h5(tmp_path)
    path = h5_path(tmp_path, "valid", "y")
    raw = path.read_bytes()
    path.unlink()
    with pytest.raises(DataError, match="not found") as error:
        load_pcam(tmp_path)
    assert str(path) in str(error.value)

    path.with_name(path.name + ".gz").write_bytes(gzip.compress(raw))
    with pytest.raises(DataError, match="gunzip"):
        load_pcam(tmp_path)
    path.with_name(path.name + ".gz").unlink()

    path.write_bytes(raw[:100])
    with pytest.raises(DataError, match="not HDF5") as error:
        load_pcam(tmp_path)
    assert str(path) in str(error.value)

    with h5py.File(path, "w") as f:
        f.create_dataset("labels", data=np.zeros((3, 1, 1, 1), np.uint8))
    with pytest.raises(DataError, match="no dataset 'y'"):
        load_pcam(tmp_path)


def test_image_folder_layout(tmp_path):
    write_folder(tmp_path)
    splits = load_pcam(tmp_path)
    check_spec(splits.spec)
    assert splits.sizes() == COUNTS and "image folders" in splits.spec.source
    # sorted: no_tumor first (patches 0, 2, 4, 6), then tumor (1, 3, 5)
    x, y = splits.train.get_batch(np.array([4, 0, 4]))
    assert x.shape == (3, 3, 96, 96) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_allclose(x[:, 0, 50, 50], np.array([1, 0, 1]) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, [1, 0, 1])
    assert x[0, 2, 0, 5] == pytest.approx(200 / 255) and x[0, 2, 5, 0] == 0

    grey = tmp_path / "test" / "tumor" / "grey.jpg"
    Image.fromarray(np.full((96, 96), 128, np.uint8)).save(grey)  # converted to RGB on reading
    test = load_pcam(tmp_path).test
    assert test.get_batch(np.array([len(test) - 1]))[0].shape == (1, 3, 96, 96)


def test_image_folder_bad_images_name_the_file(tmp_path):
    write_folder(tmp_path)
    broken = tmp_path / "valid" / "tumor" / "broken.png"
    broken.write_bytes(b"this is not a png")
    split = load_pcam(tmp_path).valid
    index = split.paths.index(broken)
    with pytest.raises(DataError, match="cannot read PCam image") as error:
        split.get_batch(np.array([index]))
    assert str(broken) in str(error.value)

    small = tmp_path / "valid" / "tumor" / "small.png"
    broken.unlink()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(small)
    split = load_pcam(tmp_path).valid
    with pytest.raises(DataError, match="32x32, expected 96x96") as error:
        split.get_batch(np.array([split.paths.index(small)]))
    assert str(small) in str(error.value)


def test_image_folder_structure_errors(tmp_path):
    with pytest.raises(DataError, match="no PCam data"):
        load_pcam(tmp_path)
    write_folder(tmp_path)
    (tmp_path / "valid" / "Tumour").mkdir()
    with pytest.raises(DataError, match="Tumour"):
        load_pcam(tmp_path)
    (tmp_path / "valid" / "Tumour").rmdir()
    for path in (tmp_path / "test" / "tumor").iterdir():
        path.unlink()
    for path in (tmp_path / "test" / "no_tumor").iterdir():
        path.unlink()
    with pytest.raises(DataError, match="holds no images") as error:
        load_pcam(tmp_path)
    assert str(tmp_path / "test") in str(error.value)
