"""The real-PCam-subset reader on a tiny fixture in the same layout: split, strata, JPEG copies and bad folders."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from training.data import DataError, load_dataset
from training.data.pcam_subset import SHARES, load_pcam_subset, split_labelled, split_names


def write_part(folder, labels, suffix=".png", kaggle=False, size=96):
    """Patch i: red channel i * 3, a blue mark at row 0, column 5; label as given."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = ["filename,label" + (",kaggle_id" if kaggle else "")]
    for i, label in enumerate(labels):
        pixels = np.full((size, size, 3), 128, dtype=np.uint8)
        pixels[..., 0] = 3 * i
        pixels[0, 5, 2] = 250
        name = f"p{i:03d}{suffix}"
        Image.fromarray(pixels).save(folder / "images" / name, **({"quality": 90} if suffix == ".jpg" else {}))
        rows.append(f"{name},{label}" + (f",{i:040x}" if kaggle else ""))
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")


def write_subset(root, n_labelled=40, n_hard=12):
    write_part(root / "labelled", [i % 2 for i in range(n_labelled)], kaggle=True)
    write_part(root / "hard_negatives", [0] * n_hard, suffix=".jpg")
    return root


@pytest.fixture
def subset(tmp_path):
    return write_subset(tmp_path / "pcam_subset")


def test_split_is_stratified_disjoint_fixed_and_complete():
    labels = np.array([0] * 160 + [1] * 157)
    parts = split_labelled(labels)
    again = split_labelled(labels)
    assert all(np.array_equal(parts[k], again[k]) for k in parts)
    every = np.concatenate(list(parts.values()))
    assert sorted(every.tolist()) == list(range(317))
    assert {k: np.bincount(labels[v]).tolist() for k, v in parts.items()} == {
        "test": [40, 39], "valid": [24, 24], "train": [96, 94]}
    assert not np.array_equal(split_labelled(labels, seed=1)["test"], parts["test"])


def test_hard_negatives_and_jpeg_copies_only_in_train(subset):
    splits = load_dataset("pcam_subset", subset)
    assert splits.sizes() == {"train": 2 * 24 + 12, "valid": 6, "test": 10}  # per class: 5 test, 3 valid, 12 train
    assert splits.spec.name == "pcam_subset" and splits.spec.class_names == ("no_tumor", "tumor")
    names = split_names(subset)
    assert list(splits.spec.test_files) == names["test"]
    # valid and test hold the labelled PNGs themselves: red channel 3 * index, upright (blue mark at row 0, col 5)
    index = {f"p{i:03d}.png": i for i in range(40)}
    images, labels = splits.test.get_batch(np.arange(len(splits.test)))
    assert images.shape == (10, 3, 96, 96) and images.dtype == np.float32
    expected = np.array([index[name] for name in names["test"]])
    assert np.allclose(images[:, 0, 50, 50] * 255, 3 * expected)
    assert np.all(images[:, 2, 0, 5] * 255 == 250) and np.array_equal(labels, expected % 2)
    train = splits.train
    n_own = len(names["train"])
    png, jpeg = train.images[:n_own].astype(int), train.images[n_own:2 * n_own].astype(int)
    assert 0 < np.abs(png - jpeg).mean() < 3, "the second copy is a lossy re-encode of the first"
    assert np.array_equal(train.labels[:n_own], train.labels[n_own:2 * n_own])
    assert (train.labels[2 * n_own:] == 0).all()


def test_sampling_weights_give_the_documented_shares(subset):
    train = load_pcam_subset(subset).train
    n_own = (len(train) - 12) // 2
    weights, labels = train.sample_weights, train.labels
    assert weights.sum() == pytest.approx(1.0)
    own = np.r_[:2 * n_own]
    assert weights[own][labels[own] == 1].sum() == pytest.approx(SHARES["tumour"])
    assert weights[own][labels[own] == 0].sum() == pytest.approx(SHARES["normal"])
    assert weights[2 * n_own:].sum() == pytest.approx(SHARES["hard_negative"])


def test_missing_folder_names_it(tmp_path):
    with pytest.raises(DataError, match=r"PCam subset folder .*nowhere not found"):
        load_pcam_subset(tmp_path / "nowhere")


def test_missing_labels_file(subset):
    (subset / "labelled" / "labels.csv").unlink()
    with pytest.raises(DataError, match=r"labelled has no labels\.csv"):
        load_pcam_subset(subset)


def test_label_not_0_or_1(subset):
    csv = subset / "hard_negatives" / "labels.csv"
    csv.write_text(csv.read_text().replace("p003.jpg,0", "p003.jpg,2"))
    with pytest.raises(DataError, match=r"hard_negatives/labels\.csv line 5: label must be 0 or 1, got '2'"):
        load_pcam_subset(subset)


def test_hard_negative_labelled_tumour_is_refused(subset):
    csv = subset / "hard_negatives" / "labels.csv"
    csv.write_text(csv.read_text().replace("p003.jpg,0", "p003.jpg,1"))
    with pytest.raises(DataError, match=r"hard negatives must all have label 0"):
        load_pcam_subset(subset)


def test_unreadable_image(subset):
    (subset / "labelled" / "images" / "p007.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"cannot read PCam subset image .*p007\.png"):
        load_pcam_subset(subset)


def test_listed_image_missing(subset):
    (subset / "labelled" / "images" / "p007.png").unlink()
    with pytest.raises(DataError, match=r"PCam subset image .*p007\.png not found"):
        load_pcam_subset(subset)


def test_wrong_size(subset):
    Image.new("RGB", (64, 96)).save(subset / "labelled" / "images" / "p007.png")
    with pytest.raises(DataError, match=r"p007\.png is 64x96, expected 96x96"):
        load_pcam_subset(subset)


def test_header_without_label_column(subset):
    (subset / "labelled" / "labels.csv").write_text("name,class\np000.png,0\n")
    with pytest.raises(DataError, match=r"header with 'filename' and 'label'"):
        load_pcam_subset(subset)


def test_labelled_only_variant_leaves_out_the_hard_negatives(subset):
    splits = load_dataset("pcam_subset_labelled_only", subset)
    full = load_pcam_subset(subset)
    assert splits.sizes() == {**full.sizes(), "train": 2 * 24}
    train = splits.train
    assert train.sample_weights.sum() == pytest.approx(1.0)
    assert train.sample_weights[train.labels == 1].sum() == pytest.approx(0.5)
    assert "hard negatives of MartiHan/8p361_MedicalImaging not used" in splits.spec.source
    assert np.array_equal(splits.test.labels, full.test.labels)


def test_labelled_only_reads_one_hard_negative_for_its_jpeg_quality(subset):
    (subset / "hard_negatives" / "images" / "p005.jpg").write_bytes(b"damaged, but never read")
    splits = load_dataset("pcam_subset_labelled_only", subset)
    assert splits.sizes()["train"] == 2 * 24
    (subset / "hard_negatives" / "images" / "p000.jpg").unlink()
    with pytest.raises(DataError, match=r"cannot read the JPEG .*p000\.jpg whose quality"):
        load_dataset("pcam_subset_labelled_only", subset)
