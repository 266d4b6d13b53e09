"""Our shipped rot-MNIST checkpoints beside the paper's released ones, on the same real rotated MNIST test digits.

    python -m benchmarks.rot_mnist_vs_paper [--count 2000] [--data-dir data/rot_mnist]
    python -m benchmarks.rot_mnist_vs_paper --count 50000 --ours p4cnn=../runs/rot_mnist-p4cnn-seed0/best.safetensors
    OMP_NUM_THREADS=1 python -m benchmarks.rot_mnist_vs_paper --record [ARCH ...] --threads 1

Both are measured in this one run on the first ``count`` digits of our test split
(MNIST digits rotated by uniform random angles, as Larochelle et al. built
rot-MNIST); each model is fed as it was trained: ours upright, the paper's
transposed (the ``.amat`` layout), both as their cards record. The paper's
checkpoints are read from ``../shared/reference/checkpoints`` (or $REFERENCE_DIR).

``--record`` measures the shipped checkpoints and the releases on all 50,000 test digits and writes
``results/rot_mnist_vs_paper/{arch}.json``, the record ``tests/test_rot_mnist_vs_paper.py`` holds them to. The
digits are split into 25 parts of 2,000 by a seeded random permutation (:func:`parts`) and measured part by part,
in part order, as the test recomputes a part. The record keeps our per-digit predicted classes (test-split order)
and the sha256 of our checkpoint; of a release only measured figures: per part its error count and the sha256 of
its predicted classes (uint8, in part order), and the sha256 of its ``.pth``. Nothing more derived from the
reference checkpoints is kept in the project.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from models import import_reference_checkpoint, load_checkpoint
from training.data import SubsetSplit, load_dataset
from training.distributed import Context
from training.evaluation import Normaliser, predict
from training.metrics import error_rate
from training.provenance import _cpu_name, code_record, sha256_file

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("REFERENCE_DIR", REPO.parent / "shared" / "reference"))
PAPER_RUNS = {"z2cnn": "z2cnn", "p4cnn": "p4cnn", "fa_p4cnn": "f_att_p4cnn", "a_p4cnn": "att_p4cnn"}
RECORDS = REPO / "results" / "rot_mnist_vs_paper"
RECORD_COMMAND = "OMP_NUM_THREADS=1 python -m benchmarks.rot_mnist_vs_paper --record --threads 1"
DIGITS, PARTS, PART_SIZE = 50_000, 25, 2_000
PARTITION_SEED = 20240  # fixed: written in each record, which the test checks
PARTITION = "numpy.random.Generator(numpy.random.PCG64(seed)).permutation(50000).reshape(25, 2000): part k is row k"
BATCH_SIZE = 250  # divides a part: every batch, recorded or recomputed, holds 250 digits


def released_checkpoint(arch: str) -> str:
    """The paper's released checkpoint of ``arch``, relative to the reference folder."""
    return f"checkpoints/model_{PAPER_RUNS[arch]}_optim_adam_lr_0.001_wd_0.0001_seed_0/model.pth"


def shipped_checkpoint(arch: str) -> Path:
    return REPO / "checkpoints" / f"{arch}_rot_mnist.safetensors"


def record_path(arch: str) -> Path:
    return RECORDS / f"{arch}.json"


def first_n(split, count):
    """A split restricted to its first ``count`` examples."""
    return SubsetSplit(split, np.arange(min(count, len(split))))


def test_error(model, card, split) -> float:
    ctx = Context(0, 1, torch.device("cpu"))
    probs, labels = predict(model, split, Normaliser.for_card(card, ctx.device), ctx, batch_size=BATCH_SIZE)
    return error_rate(probs, labels)


def class_probabilities(model, card, split) -> tuple[np.ndarray, np.ndarray]:
    """Each digit's class probabilities ``(N, 10)`` and its label, in the split's order."""
    ctx = Context(0, 1, torch.device("cpu"))
    return predict(model, split, Normaliser.for_card(card, ctx.device), ctx, batch_size=BATCH_SIZE)


def predicted_classes(model, card, split) -> tuple[np.ndarray, np.ndarray]:
    """Each digit's predicted class (argmax of the probabilities, uint8) and its label, in the split's order."""
    probs, labels = class_probabilities(model, card, split)
    return probs.argmax(axis=1).astype(np.uint8), labels


def parts(seed: int = PARTITION_SEED) -> np.ndarray:
    """``(25, 2000)`` test-split indices: row k is part k, a random sample of the 50,000 digits."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(DIGITS).reshape(PARTS, PART_SIZE)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def classes_sha256(classes: np.ndarray) -> str:
    """sha256 of predicted classes as uint8 bytes, in the order given."""
    return sha256(np.ascontiguousarray(classes, dtype=np.uint8).tobytes())


def data_identity(split) -> dict:
    """What names the test digits: their count and the sha256 of their labels (uint8) and images (float32, as
    ``get_batch`` returns them), in test-split order."""
    images, labels = hashlib.sha256(), hashlib.sha256()
    for start in range(0, len(split), 5000):
        batch_images, batch_labels = split.get_batch(np.arange(start, min(start + 5000, len(split))))
        images.update(np.ascontiguousarray(batch_images, dtype=np.float32).tobytes())
        labels.update(np.asarray(batch_labels, dtype=np.uint8).tobytes())
    return {"digits": len(split), "labels_sha256": labels.hexdigest(), "images_float32_sha256": images.hexdigest()}


def measure_parts(model, card, split, name: str) -> list[np.ndarray]:
    """Predicted classes of every part, in part order, printing progress."""
    predictions, labels = [], []
    started = time.perf_counter()
    for k, indices in enumerate(parts()):
        classes, truth = predicted_classes(model, card, SubsetSplit(split, indices))
        predictions.append(classes)
        labels.append(truth)
        done = (k + 1) * PART_SIZE
        elapsed = time.perf_counter() - started
        print(f"  {name}: part {k + 1:2d}/{PARTS} {int((classes != truth).sum()):3d} errors; "
              f"{done} digits in {elapsed:.0f} s ({done / elapsed:.0f}/s)", flush=True)
    return predictions


def record(arch: str, split, identity: dict, data_dir: str, threads: int) -> dict:
    """Measure shipped ``arch`` and its release on all test digits, part by part; write and return the record."""
    if len(split) != DIGITS:
        raise SystemExit(f"--record needs the {DIGITS} test digits of rot-MNIST; {data_dir} has {len(split)}")
    ours_path, paper_path = shipped_checkpoint(arch), REFERENCE / released_checkpoint(arch)
    if not paper_path.is_file():
        raise SystemExit(f"the paper's {arch} is not at {paper_path}: it is needed to --record")
    split_parts = parts()
    labels = np.concatenate([split.get_batch(indices)[1] for indices in split_parts])
    model, card = load_checkpoint(ours_path)
    ours = measure_parts(model, card, split, f"{arch} ours")
    paper_model = import_reference_checkpoint(paper_path, arch)
    paper = measure_parts(paper_model, paper_model.card, split, f"{arch} paper")
    truth = labels.reshape(PARTS, PART_SIZE)
    ours_by_part = [int((p != t).sum()) for p, t in zip(ours, truth, strict=True)]
    paper_by_part = [int((p != t).sum()) for p, t in zip(paper, truth, strict=True)]
    in_test_order = np.empty(DIGITS, dtype=np.uint8)
    in_test_order[split_parts.ravel()] = np.concatenate(ours)
    result = {
        "what": f"shipped {arch} beside the paper's release on all {DIGITS} rot-MNIST test digits "
                "(tests/test_rot_mnist_vs_paper.py holds them to it)",
        "how_made": f"{RECORD_COMMAND} (this arch alone: --record {arch})",
        "made": time.strftime("%Y-%m-%d"),
        **code_record(),  # commit, code_sha256 and whether they agree (training.provenance)
        "machine": f"{_cpu_name()}, {threads} thread(s), torch {torch.__version__}, numpy {np.__version__}, "
                   f"python {platform.python_version()}, AAGC_NATIVE={os.environ.get('AAGC_NATIVE', '1')}",
        "data": {"name": "rot_mnist", "split": "test", "dir": data_dir, **identity},
        "partition": {"seed": PARTITION_SEED, "how": PARTITION, "parts": PARTS, "part_size": PART_SIZE,
                      "batch_size": BATCH_SIZE, "indices_int64_sha256": sha256(split_parts.astype(np.int64).tobytes())},
        "ours": {
            "checkpoint": str(ours_path.relative_to(REPO)),
            "sha256": sha256_file(ours_path),
            "errors": sum(ours_by_part),
            "errors_by_part": ours_by_part,
            "predicted": "".join(map(str, in_test_order)),
            "predicted_format": "the predicted class (argmax of the probabilities) of each test digit, "
                                "in test-split order, one decimal digit each",
        },
        "paper": {
            "checkpoint": f"{released_checkpoint(arch)} (in ../shared/reference)",
            "sha256": sha256_file(paper_path),
            "errors": sum(paper_by_part),
            "errors_by_part": paper_by_part,
            "predicted_sha256_by_part": [classes_sha256(p) for p in paper],
            "note": "only measured figures of the release are kept: per part its errors and the sha256 of its "
                    "predicted classes (uint8 bytes, in part order), not the predictions",
        },
    }
    RECORDS.mkdir(parents=True, exist_ok=True)
    path = record_path(arch)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{arch}: ours {result['ours']['errors']} errors ({100 * result['ours']['errors'] / DIGITS:.2f} %), "
          f"paper {result['paper']['errors']} ({100 * result['paper']['errors'] / DIGITS:.2f} %) -> "
          f"{path.relative_to(REPO)}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--data-dir", default="data/rot_mnist")
    parser.add_argument("--ours", action="append", default=[], metavar="ARCH=PATH",
                        help="measure this checkpoint as ours for ARCH instead of the shipped one (repeatable)")
    parser.add_argument("--record", nargs="*", choices=sorted(PAPER_RUNS), metavar="ARCH",
                        help=f"measure the shipped checkpoints and the releases on all {DIGITS} test digits and "
                             f"write {RECORDS.relative_to(REPO)}/ARCH.json (these archs; none named: all four)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    test = load_dataset("rot_mnist", args.data_dir).test
    if args.record is not None:
        if args.ours:
            parser.error("--record measures the shipped checkpoints: it takes no --ours")
        identity = data_identity(test)
        print(f"recording {len(test)} digits in {PARTS} parts of {PART_SIZE}, {args.threads} thread(s): "
              + " ".join(shlex.quote(arg) for arg in sys.argv[1:]), flush=True)
        for arch in args.record or PAPER_RUNS:
            record(arch, test, identity, args.data_dir, args.threads)
        return
    candidates = dict(item.split("=", 1) for item in args.ours)
    split = first_n(test, args.count)
    print(f"test error (%) on the first {len(split)} digits of our rot-MNIST test split\n")
    print(f"{'model':<10} {'ours':>7} {'paper':>7}")
    for arch in PAPER_RUNS:
        ours = Path(candidates.get(arch, shipped_checkpoint(arch)))
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
