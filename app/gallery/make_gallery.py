"""Regenerate the app's gallery: rotated MNIST test digits and real PCam test patches with their labels.

Run from the repository root (each part is remade only when its source is given; the other is kept)::

    python -m app.gallery.make_gallery [--mnist data/rot_mnist/t10k-images-idx3-ubyte]
        [--pcam-subset ../shared/data/pcam_subset] [--pcam-card checkpoints/fa_p4m_densenet_pcam_subset.json]

Digits: eight MNIST test images (Yann LeCun and Corinna Cortes, CC BY-SA 3.0),
drawn with a fixed seed, one per class 0-7, each rotated about its centre by
a uniform random angle (bilinear, :func:`app.transforms.rotate_by_angle`), as
rot-MNIST was built. Patches: six tumour and six normal PatchCamelyon patches
(96 x 96, 0.972 um/px, CC0), drawn with a fixed seed from the test split that the
shipped PCam-subset model's card lists (``dataset.test_files``), so that model never
trained on them; copied byte for byte, with their true label.
``gallery.json`` records where each file came from. Nothing here imports ``training``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from app.transforms import rotate_by_angle

HERE = Path(__file__).resolve().parent
SEED = 2020
PCAM_MPP = 0.972  # PCam: 40x Camelyon16 slides downsampled four times
PCAM_CLASSES = ("no_tumor", "tumor")
MNIST_CREDIT = "MNIST test set, Yann LeCun and Corinna Cortes, CC BY-SA 3.0"
PCAM_CREDIT = ("PatchCamelyon (Veeling, Linmans, Winkens, Cohen, Welling, MICCAI 2018; Camelyon16 slides), CC0 1.0; "
               "this patch via the public repository rayhanros2030/VLM_Captions_Explainability, label by its "
               "Kaggle id (Histopathologic Cancer Detection)")


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


def read_labels(subset: Path) -> dict[str, dict]:
    """``labelled/labels.csv`` of the PCam subset: file name -> its row (``label``, ``kaggle_id``)."""
    with open(subset / "labelled" / "labels.csv", newline="") as f:
        return {row["filename"]: row for row in csv.DictReader(f)}


def make_pcam_patches(subset: Path, card_json: Path, per_class: int = 6) -> list[dict]:
    """``per_class`` tumour and normal patches drawn with the fixed seed from the test split the card names.

    The files are copied byte for byte (PCam's pixels, lossless PNG); the entry records the true label.
    """
    card = json.loads(card_json.read_text())
    test_files = card["dataset"]["test_files"]
    rows = read_labels(subset)
    rng = np.random.default_rng(SEED)
    entries = []
    for label in (1, 0):
        members = sorted(name for name in test_files if int(rows[name]["label"]) == label)
        for name in sorted(rng.choice(members, size=per_class, replace=False)):
            target = f"pcam_{'tumour' if label else 'normal'}_{Path(name).stem.removeprefix('pcam_')}.png"
            shutil.copyfile(subset / "labelled" / "images" / name, HERE / target)
            entries.append(dict(
                file=target, kind="he", caption=f"PCam {'tumour' if label else 'normal'}, {name}",
                source=f"PatchCamelyon training patch {name} (Kaggle id {rows[name]['kaggle_id']}), in the test split "
                       f"of the shipped PCam-subset model ({card_json.name})",
                microns_per_pixel=PCAM_MPP, credit=PCAM_CREDIT, label=PCAM_CLASSES[label]))
    return entries


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, help="t10k-images-idx3-ubyte: remake the digits from it")
    parser.add_argument("--pcam-subset", type=Path, help="the PCam subset folder: remake the H&E patches from it")
    parser.add_argument("--pcam-card", type=Path, default=Path("checkpoints/fa_p4m_densenet_pcam_subset.json"))
    args = parser.parse_args(argv)
    manifest = HERE / "gallery.json"
    entries = json.loads(manifest.read_text()) if manifest.is_file() else []
    remade = []
    if args.mnist:
        remade.append(("digit", "mnist_*.png", lambda: make_digits(args.mnist, np.random.default_rng(SEED))))
    if args.pcam_subset:
        remade.append(("he", "pcam_*.png", lambda: make_pcam_patches(args.pcam_subset, args.pcam_card)))
    for kind, pattern, make in remade:
        for old in HERE.glob(pattern):
            old.unlink()
        entries = [e for e in entries if e["kind"] != kind] + make()
    manifest.write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
