"""CIFAR-10 reader: tiny batches pickled like the real ones; unsafe or corrupt pickles are refused."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from training.data import DataError, load_dataset
from training.data.cifar10 import CLASS_NAMES, SPLIT_FILES, load_batch, load_cifar10


def write_batches(folder, n=6, names=True):
    """Batches of n images, the red plane of image i filled with i (the labels are i % 10)."""
    folder.mkdir(parents=True, exist_ok=True)
    start, written = 0, {}
    for name in [f for files in SPLIT_FILES.values() for f in files]:
        data = np.zeros((n, 3072), dtype=np.uint8)
        data[:, :1024] = np.arange(start, start + n)[:, None]  # red plane
        data[:, 2048 + 5] = 255  # blue plane, row 0, column 5
        batch = {b"batch_label": name.encode(), b"labels": [int(i % 10) for i in range(start, start + n)],
                 b"data": data, b"filenames": [f"{i}.png".encode() for i in range(n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=4)
        written[name] = data
        start += n
    if names:
        meta = {b"label_names": [name.encode() for name in CLASS_NAMES[::-1]], b"num_vis": 3072}
        with open(folder / "batches.meta", "wb") as f:
            pickle.dump(meta, f, protocol=4)
    return written


@pytest.mark.parametrize("nested", [False, True])
def test_splits_shapes_channels_and_spec(tmp_path, nested):
    write_batches(tmp_path / "cifar-10-batches-py")
    splits = load_cifar10(tmp_path / ("" if nested else "cifar-10-batches-py"))
    assert splits.sizes() == {"train": 24, "valid": 6, "test": 6}
    x, y = splits.train.get_batch(np.array([7, 2]))
    assert x.shape == (2, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(y, [7, 2])
    np.testing.assert_allclose(x[:, 0], np.array([7, 2])[:, None, None] / 255.0 * np.ones((1, 32, 32)), rtol=1e-6)
    assert x[0, 2, 0, 5] == 1.0 and x[0, 2, 5, 0] == 0.0 and x[0, 1].max() == 0.0  # planes and rows in place
    xv, yv = splits.valid.get_batch(np.arange(6))
    np.testing.assert_array_equal(yv, np.arange(24, 30) % 10)
    spec = splits.spec
    assert (spec.name, spec.num_classes, spec.channels, spec.size) == ("cifar10", 10, 3, 32)
    assert spec.mean == (0.4914, 0.4822, 0.4465) and spec.std == (0.2470, 0.2435, 0.2616)
    assert spec.class_names == CLASS_NAMES[::-1]  # read from batches.meta
    assert load_dataset("cifar10", tmp_path).sizes() == splits.sizes()


def test_standard_names_without_meta(tmp_path):
    write_batches(tmp_path, names=False)
    assert load_cifar10(tmp_path).spec.class_names == CLASS_NAMES


def test_malicious_pickle_is_refused_without_running(tmp_path):
    write_batches(tmp_path)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    with open(tmp_path / "data_batch_3", "wb") as f:
        pickle.dump({b"data": Exploit(), b"labels": []}, f, protocol=4)
    with pytest.raises(DataError, match="os.system|posix.system") as error:
        load_cifar10(tmp_path)
    assert str(tmp_path / "data_batch_3") in str(error.value) and "refused" in str(error.value)
    assert not marker.exists()

    with open(tmp_path / "data_batch_3", "wb") as f:
        pickle.dump({b"data": print}, f, protocol=4)
    with pytest.raises(DataError, match="builtins.print"):
        load_batch(tmp_path / "data_batch_3")


def test_missing_truncated_and_malformed_files(tmp_path):
    with pytest.raises(DataError, match="data_batch_1"):
        load_cifar10(tmp_path)
    written = write_batches(tmp_path)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(DataError, match="test_batch.*not found"):
        load_cifar10(tmp_path)

    path = tmp_path / "data_batch_2"
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="truncated or corrupt") as error:
        load_batch(path)
    assert str(path) in str(error.value)

    for batch, message in [
        ([1, 2], "not a CIFAR-10 batch"),
        ({b"data": written["data_batch_2"][:, :100], b"labels": [0] * 6}, r"uint8 array \(N, 3072\)"),
        ({b"data": written["data_batch_2"].astype(np.float32), b"labels": [0] * 6}, "uint8"),
        ({b"data": written["data_batch_2"], b"labels": [0] * 5}, "6 images but labels"),
        ({b"data": written["data_batch_2"], b"labels": [0, 1, 2, 3, 4, 10]}, r"0\.\.9"),
    ]:
        with open(path, "wb") as f:
            pickle.dump(batch, f, protocol=4)
        with pytest.raises(DataError, match=message) as error:
            load_batch(path)
        assert str(path) in str(error.value)


def python2_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """What Python 2's cPickle (protocol 2) writes for ``{"data": data, "labels": labels}``, opcode by opcode.

    Python 3 cannot write this: its protocol 2 spells bytes through ``_codecs.encode``, which
    the real files never use (and the reader rightly refuses).
    """

    def string(b: bytes) -> bytes:  # SHORT_BINSTRING or BINSTRING: a Python 2 str
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + len(b).to_bytes(4, "little") + b

    def integer(n: int) -> bytes:  # BININT2
        return b"M" + n.to_bytes(2, "little")

    dtype = (b"cnumpy\ndtype\n" + string(b"u1") + b"K\x00K\x01\x87R"  # dtype("u1", 0, 1)
             + b"(K\x03" + string(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")  # .__setstate__
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + string(b"b") + b"\x87R"
             + b"(K\x01" + integer(data.shape[0]) + integer(data.shape[1]) + b"\x86" + dtype
             + b"\x89" + string(data.tobytes()) + b"tb")  # .__setstate__((1, shape, dtype, False, raw))
    label_list = b"](" + b"".join(b"K" + bytes([label]) for label in labels) + b"e"
    return b"\x80\x02}(" + string(b"data") + array + string(b"labels") + label_list + b"u."


def test_python2_pickle_loads_like_the_real_files(tmp_path):
    data = (np.arange(2 * 3072) % 251).astype(np.uint8).reshape(2, 3072)
    payload = python2_pickle(data, [3, 4])
    plain = pickle.loads(payload, encoding="bytes")  # the helper writes a valid pickle
    assert np.array_equal(plain[b"data"], data) and plain[b"labels"] == [3, 4]
    (tmp_path / "batch").write_bytes(payload)
    images, labels = load_batch(tmp_path / "batch")
    np.testing.assert_array_equal(images.reshape(2, 3072), data)
    np.testing.assert_array_equal(labels, [3, 4])
