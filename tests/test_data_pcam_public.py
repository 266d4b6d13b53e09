"""The pcam_public reader: real patches of ``../shared/data/pcam_public`` copied into a small folder of the same
layout, the decoded cache, and every error message.

The real folder is read in place (never copied into the repository); without it these tests skip, and fail
under REQUIRE_REFERENCE=1.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, require_shared
from PIL import Image

from training.data import DataError, load_dataset
from training.data.pcam_public import load_pcam_public, read_labels

PUBLIC = REPO.parent / "shared" / "data" / "pcam_public"
HEADER = "file,label,split,encoding,kaggle_id,copies_found,near_uniform,source_repo,source_commit,source_path"


def public_folder() -> Path:
    require_shared(PUBLIC / "labels.csv", f"{PUBLIC} not found (real PCam patches live in ../shared/data/pcam_public)")
    return PUBLIC


@pytest.fixture(scope="module")
def real_rows() -> list[dict]:
    """Three real patches of each split, both labels in each, the first rows of labels.csv that qualify."""
    with open(public_folder() / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    chosen = []
    for split in ("train", "valid", "test"):
        for label in ("0", "1", "1"):
            chosen.append(next(r for r in rows if r["split"] == split and r["label"] == label and r not in chosen))
    return chosen


@pytest.fixture
def small(tmp_path, real_rows) -> Path:
    """A folder in pcam_public's layout holding nine of its real patches."""
    root = tmp_path / "pcam_public"
    for row in real_rows:
        (root / row["split"]).mkdir(parents=True, exist_ok=True)
        shutil.copy2(PUBLIC / row["file"], root / row["file"])
    write_labels(root, real_rows)
    return root


def write_labels(root: Path, rows: list[dict]) -> None:
    with open(root / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HEADER.split(","))
        writer.writeheader()
        writer.writerows(rows)


def test_real_labels_file_has_the_documented_splits():
    records = read_labels(public_folder())
    counts = {(r.split, r.label): 0 for r in records}
    for r in records:
        counts[r.split, r.label] += 1
    assert counts == {("train", 0): 16402, ("train", 1): 13420, ("valid", 0): 1500, ("valid", 1): 1407,
                      ("test", 0): 991, ("test", 1): 953}


def test_real_patches_read_with_their_labels_shapes_and_order(small, real_rows, tmp_path):
    splits = load_dataset("pcam_public", small, cache=tmp_path / "cache")
    assert splits.sizes() == {"train": 3, "valid": 3, "test": 3}
    assert splits.spec.name == "pcam_public" and splits.spec.class_names == ("no_tumor", "tumor")
    for split in ("train", "valid", "test"):
        part = getattr(splits, split)
        rows = [r for r in real_rows if r["split"] == split]
        images, labels = part.get_batch(np.arange(3))
        assert images.shape == (3, 3, 96, 96) and images.dtype == np.float32
        assert 0 <= images.min() and images.max() <= 1
        assert labels.tolist() == [int(r["label"]) for r in rows]
        assert part.names == tuple(r["file"] for r in rows)
        for k, row in enumerate(rows):  # pixel for pixel what Pillow decodes from the file, channels first
            expected = np.asarray(Image.open(PUBLIC / row["file"]).convert("RGB")).transpose(2, 0, 1)
            assert np.array_equal(part.images[k], expected)
    assert splits.spec.test_files == splits.test.names
    train = splits.train.images.astype(np.float64) / 255  # (3, 3, 96, 96)
    assert splits.spec.mean == pytest.approx(train.mean(axis=(0, 2, 3)), abs=6e-5)
    assert splits.spec.std == pytest.approx(train.std(axis=(0, 2, 3)), abs=6e-5)
    assert "PCam" in splits.spec.source and "JPEG" in splits.spec.notes


def test_the_cache_is_reused_and_renewed_when_a_file_changes(small, tmp_path):
    cache = tmp_path / "cache"
    first = load_pcam_public(small, cache=cache)
    files = list(cache.glob("pcam_public-*.npy"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    again = load_pcam_public(small, cache=cache)
    assert files[0].stat().st_mtime_ns == stamp, "an unchanged folder reads the cache, it does not write it"
    assert np.array_equal(again.test.images, first.test.images)
    # Replace one test patch by another image: a new fingerprint, decoded again, the new pixels read.
    changed = small / first.test.names[0]
    Image.fromarray(np.full((96, 96, 3), 7, np.uint8)).save(changed, format="JPEG")
    renewed = load_pcam_public(small, cache=cache)
    assert len(list(cache.glob("pcam_public-*.npy"))) == 2
    assert abs(int(renewed.test.images[0].mean()) - 7) <= 1
    assert np.array_equal(load_pcam_public(small, cache=None).test.images, renewed.test.images)


def test_a_damaged_cache_is_decoded_again(small, tmp_path):
    cache = tmp_path / "cache"
    expected = load_pcam_public(small, cache=cache).valid.images
    (path,) = cache.glob("pcam_public-*.npy")
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    assert np.array_equal(load_pcam_public(small, cache=cache).valid.images, expected)
    assert path.stat().st_size > 1000, "the truncated cache was replaced"


def edit_row(small: Path, real_rows: list[dict], index: int, **changes) -> None:
    rows = [dict(r) for r in real_rows]
    rows[index].update(changes)
    write_labels(small, rows)


@pytest.mark.parametrize("change, message", [
    ({"label": "2"}, r"labels\.csv line 3: label must be 0 or 1, got '2'"),
    ({"split": "dev"}, r"labels\.csv line 3: split must be one of train, valid, test, got 'dev'"),
])
def test_bad_rows_name_the_line(small, real_rows, change, message):
    edit_row(small, real_rows, 1, **change)
    with pytest.raises(DataError, match=message):
        load_pcam_public(small, cache=None)


def test_a_file_listed_twice_is_an_error(small, real_rows):
    edit_row(small, real_rows, 1, file=real_rows[0]["file"])
    with pytest.raises(DataError, match=rf"line 3: {real_rows[0]['file']} is listed twice"):
        load_pcam_public(small, cache=None)


def test_missing_folder_labels_file_and_columns(tmp_path, small):
    with pytest.raises(DataError, match=r"PCam public folder .*nowhere not found"):
        load_pcam_public(tmp_path / "nowhere")
    (small / "labels.csv").write_text("file,label\ntest/a.jpg,1\n")
    with pytest.raises(DataError, match=r"lacks the column\(s\) split, encoding, near_uniform, source_repo"):
        load_pcam_public(small, cache=None)
    (small / "labels.csv").unlink()
    with pytest.raises(DataError, match=r"has no labels\.csv"):
        load_pcam_public(small, cache=None)


@pytest.mark.parametrize("cache", [None, "cache"])
def test_missing_corrupt_and_misshapen_images_are_named(small, real_rows, tmp_path, cache):
    cache = None if cache is None else tmp_path / cache
    target = small / real_rows[4]["file"]
    target.unlink()
    with pytest.raises(DataError, match=rf"PCam public image .*{target.name} not found"):
        load_pcam_public(small, cache=cache)
    target.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    with pytest.raises(DataError, match=rf"cannot read PCam public image .*{target.name}"):
        load_pcam_public(small, cache=cache)
    Image.fromarray(np.zeros((64, 96, 3), np.uint8)).save(target, format="JPEG")
    with pytest.raises(DataError, match=rf"PCam public image .*{target.name} is 96x64, expected 96x96"):
        load_pcam_public(small, cache=cache)


def test_a_few_training_steps_on_real_patches_write_a_card_naming_the_test_patches(small, tmp_path, monkeypatch):
    import json

    import torch
    from safetensors.torch import load_file

    from training.cli import main as cli_main

    monkeypatch.setenv("AAGC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert cli_main(["train", "pcam_public", "--data-dir", str(small), "--out", str(out), "--model", "densenet",
                     "--epochs", "1", "--batch-size", "3", "--epoch-size", "6", "--augment", "group_stain_jpeg",
                     "--eval-batch-size", "3", "--equivariance-images", "2", "--threads", "1",
                     "--precision", "bf16"]) == 0
    card = json.loads((out / "best.json").read_text())
    assert card["dataset"]["name"] == "pcam_public" and card["dataset"]["splits"] == {"train": 3, "valid": 3,
                                                                                     "test": 3}
    assert card["dataset"]["test_files"] == [name for name in card["dataset"]["test_files"] if name.startswith("test/")]
    assert len(card["dataset"]["test_files"]) == 3 and card["metrics"]["test_count"] == 3
    assert card["training"]["config"]["augment"] == "group_stain_jpeg"
    assert card["training"]["config"]["precision"] == "bf16"
    assert all(t.dtype == torch.float32 for t in load_file(out / "best.safetensors").values() if t.is_floating_point())
    assert list((tmp_path / "cache").glob("pcam_public/pcam_public-*.npy")), "the decoded patches were cached"
