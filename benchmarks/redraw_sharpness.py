"""How much sharper ``augment="redraw"`` keeps rot-MNIST's training digits than ``augment="rotate"``, in one run.

On the real training and validation digits (12,000, rot-MNIST rebuilt from MNIST): their upright MNIST digits,
the stored digits (turned once), those turned once more by a fresh angle (what ``rotate`` trains on) and the
upright digits drawn again at a fresh angle (what ``redraw`` trains on), each measured by its gradient energy
(mean squared difference of neighbouring pixels, in 0..255 units) and its ink. Also checks that the upright
digits turned by their stored angles give back the stored digits.

Run from the repository root (rot-MNIST under data/rot_mnist)::

    python -m benchmarks.redraw_sharpness
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from training.data import ConcatSplit, load_dataset
from training.data.augment import random_rotation, redraw_rotation
from training.data.rot_mnist import rotate_images


def gradient_energy(images: torch.Tensor) -> float:
    rows = (images[..., 1:, :] - images[..., :-1, :]).pow(2).mean()
    columns = (images[..., :, 1:] - images[..., :, :-1]).pow(2).mean()
    return float(rows + columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="data/rot_mnist")
    args = parser.parse_args()
    splits = load_dataset("rot_mnist", args.data_dir)
    digits = ConcatSplit(splits.train, splits.valid)
    everything = np.arange(len(digits))
    upright = torch.from_numpy(digits.get_upright(everything)).double()
    stored = torch.from_numpy(digits.get_batch(everything)[0]).double()
    cache = np.load(Path(args.data_dir) / "rot_mnist_built_seed0.npz")
    angles = torch.from_numpy(np.concatenate([cache["train_angles"], cache["valid_angles"]]))

    rebuilt = rotate_images(upright * 255, angles).round().clamp(0, 255)  # 0..255, as the dataset was built
    difference = (rebuilt - (stored * 255).round()).abs().flatten(1)
    mismatched = int((difference > 0).any(1).sum())
    print(f"upright digits turned by their stored angles: {len(digits) - mismatched:,} of {len(digits):,} "
          f"give back the stored digit exactly, the others within {int(difference.max())} grey level(s) "
          f"in {int((difference > 0).sum())} pixel(s) (floating-point round-off)\n")
    variants = {
        "upright (MNIST)": upright,
        "stored (turned once)": stored,
        "rotate (turned twice)": random_rotation(stored, torch.Generator().manual_seed(0)),
        "redraw (upright, turned once)": redraw_rotation(upright, torch.Generator().manual_seed(0)),
    }
    reference = gradient_energy(stored * 255)
    print(f"{'digits':<32} {'gradient energy':>15} {'/ stored':>9} {'ink / stored':>13}")
    for name, images in variants.items():
        energy = gradient_energy(images * 255)
        print(f"{name:<32} {energy:15.1f} {energy / reference:9.3f} {float(images.sum() / stored.sum()):13.4f}")


if __name__ == "__main__":
    main()
