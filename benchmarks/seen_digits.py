"""How much easier rot-MNIST digits are for a shipped model when it trained on the same MNIST digit at another angle.

Our rot-MNIST is rebuilt from all 70,000 MNIST digits (the original ``.amat`` files are not reachable here), and
so was Larochelle et al.'s: another rot-MNIST test set drawn from MNIST shares digits with our training split,
turned by other angles, as ours shares digits with the training set of the paper's releases. This measures
what that is worth: each shipped model's error on its own training digits drawn again at fresh angles (one
interpolation, as the dataset's digits; ``augment="redraw"``), beside its error on the test digits it never saw.

Run from the repository root (rot-MNIST rebuilt from MNIST under data/rot_mnist)::

    python -m benchmarks.seen_digits                    # or --models a_p4cnn
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from benchmarks.rot_mnist_vs_paper import test_error
from models import load_checkpoint
from training.data import ArraySplit, ConcatSplit, load_dataset
from training.data.augment import redraw_rotation

REPO = Path(__file__).resolve().parents[1]
MODELS = ("z2cnn", "p4cnn", "fa_p4cnn", "a_p4cnn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="data/rot_mnist")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="shipped models to measure (default: all four)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    splits = load_dataset("rot_mnist", args.data_dir)
    print(f"{'model':<10} {'trained on':>11} {'error % on them, fresh angles':>30} {'test error % (50k, unseen)':>27}")
    for arch in args.models:
        model, card = load_checkpoint(REPO / "checkpoints" / f"{arch}_rot_mnist.safetensors")
        model.eval()
        both = card["training"]["config"]["train_on_valid"]
        seen = ConcatSplit(splits.train, splits.valid) if both else splits.train
        everything = np.arange(len(seen))
        fresh = redraw_rotation(torch.from_numpy(seen.get_upright(everything)), torch.Generator().manual_seed(0))
        error = test_error(model, card, ArraySplit(fresh.numpy(), seen.get_batch(everything)[1]))
        print(f"{arch:<10} {len(seen):>11,} {100 * error:30.2f} {100 * card['metrics']['test_error']:27.2f}",
              flush=True)


if __name__ == "__main__":
    main()
