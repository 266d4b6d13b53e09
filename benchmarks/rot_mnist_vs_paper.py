"""Our shipped rot-MNIST checkpoints beside the paper's released ones, on the same real rotated MNIST test digits.

    python -m benchmarks.rot_mnist_vs_paper [--count 2000] [--data-dir data/rot_mnist]
    python -m benchmarks.rot_mnist_vs_paper --count 50000 --ours p4cnn=../runs/rot_mnist-p4cnn-seed0/best.safetensors

Both are measured in this one run on the first ``count`` digits of our test split
(MNIST digits rotated by uniform random angles, as Larochelle et al. built
rot-MNIST); each model is fed as it was trained: ours upright, the paper's
transposed (the ``.amat`` layout), both as their cards record. The paper's
checkpoints are read from ``../shared/reference/checkpoints`` (or $REFERENCE_DIR).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from models import import_reference_checkpoint, load_checkpoint
from training.data import load_dataset
from training.distributed import Context
from training.evaluation import Normaliser, predict
from training.metrics import error_rate

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("REFERENCE_DIR", REPO.parent / "shared" / "reference"))
PAPER_RUNS = {"z2cnn": "z2cnn", "p4cnn": "p4cnn", "fa_p4cnn": "f_att_p4cnn", "a_p4cnn": "att_p4cnn"}


def released_checkpoint(arch: str) -> str:
    """The paper's released checkpoint of ``arch``, relative to the reference folder."""
    return f"checkpoints/model_{PAPER_RUNS[arch]}_optim_adam_lr_0.001_wd_0.0001_seed_0/model.pth"


def first_n(split, count):
    """A split restricted to its first ``count`` examples."""

    class Head:
        def __len__(self):
            return min(count, len(split))

        def get_batch(self, indices):
            return split.get_batch(indices)

    return Head()


def test_error(model, card, split) -> float:
    ctx = Context(0, 1, torch.device("cpu"))
    probs, labels = predict(model, split, Normaliser.for_card(card, ctx.device), ctx, batch_size=250)
    return error_rate(probs, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--data-dir", default="data/rot_mnist")
    parser.add_argument("--ours", action="append", default=[], metavar="ARCH=PATH",
                        help="measure this checkpoint as ours for ARCH instead of the shipped one (repeatable)")
    args = parser.parse_args()
    candidates = dict(item.split("=", 1) for item in args.ours)
    torch.set_num_threads(2)
    split = first_n(load_dataset("rot_mnist", args.data_dir).test, args.count)
    print(f"test error (%) on the first {len(split)} digits of our rot-MNIST test split\n")
    print(f"{'model':<10} {'ours':>7} {'paper':>7}")
    for arch in PAPER_RUNS:
        ours = Path(candidates.get(arch, REPO / "checkpoints" / f"{arch}_rot_mnist.safetensors"))
        row = [f"{arch:<10}"]
        if ours.is_file():
            model, card = load_checkpoint(ours)
            row.append(f"{100 * test_error(model, card, split):7.2f}")
        else:
            row.append(f"{'-':>7}")
        run = REFERENCE / released_checkpoint(arch)
        if run.is_file():
            paper = import_reference_checkpoint(run, arch)
            row.append(f"{100 * test_error(paper, paper.card, split):7.2f}")
        else:
            row.append(f"{'-':>7}")
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
