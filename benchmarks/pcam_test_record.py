"""Record what each shipped PCam checkpoint predicts on every test patch of ``pcam_public``.

    python -m benchmarks.pcam_test_record [STEM ...] [--threads 2]

Measures ``checkpoints/{stem}.safetensors`` (no stem named: every ``*_pcam`` checkpoint) on all 1,944 test
patches of ``../shared/data/pcam_public`` (the card's data_dir) and writes ``results/pcam_test_predictions/
{stem}.json``, the record ``tests/test_shipped_checkpoints.py`` holds the checkpoint and its card to: the
checkpoint's sha256, the data's identity (test files and labels, decoded images), each patch's tumour probability
(the softmax's float32, as the shortest decimal that reads back to the same float32) and the card's metrics
recomputed from those probabilities. Measuring them takes minutes on two cores; the test reads them and recomputes
a seeded random sample of patches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from models import load_checkpoint
from training.data import SubsetSplit, load_dataset
from training.distributed import Context
from training.evaluation import Normaliser, predict
from training.metrics import classification_metrics
from training.provenance import _cpu_name, git_commit, sha256_file

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "results" / "pcam_test_predictions"
RECORD_COMMAND = "python -m benchmarks.pcam_test_record"
BATCH_SIZE = 256  # evaluate_checkpoint's, which measured the cards
CARD_METRICS = ("error", "nll", "auc", "ece", "count")


def shipped() -> list[Path]:
    return sorted((REPO / "checkpoints").glob("*_pcam.safetensors"))


def record_path(stem: str) -> Path:
    return RECORDS / f"{stem}.json"


def data_identity(split) -> dict:
    """What names the test patches: their count, the sha256 of ``file,label`` lines (split order) and of the
    images as ``get_batch`` hands them to the model (float32 in [0, 1])."""
    listing = "".join(f"{name},{label}\n" for name, label in zip(split.names, split.labels, strict=True))
    images = hashlib.sha256()
    for start in range(0, len(split), 256):
        batch, _ = split.get_batch(np.arange(start, min(start + 256, len(split))))
        images.update(np.ascontiguousarray(batch, dtype=np.float32).tobytes())
    return {"patches": len(split), "files_labels_sha256": hashlib.sha256(listing.encode()).hexdigest(),
            "images_float32_sha256": images.hexdigest()}


def tumour_probability(model, card, split, indices=None) -> np.ndarray:
    """float32 softmax probability of class 1 (tumour) of the patches ``indices`` (all by default), in that order."""
    if indices is not None:
        split = SubsetSplit(split, indices)
    ctx = Context(0, 1, torch.device("cpu"))
    probs, _ = predict(model, split, Normaliser.for_card(card, ctx.device), ctx, batch_size=BATCH_SIZE)
    return probs[:, 1].astype(np.float32)  # predict widened the softmax's float32 to float64: exact back


def encode(tumour: np.ndarray) -> str:
    """Space-separated shortest decimals that read back to the same float32s."""
    text = " ".join(np.format_float_positional(p, unique=True, trim="-") for p in tumour.astype(np.float32))
    if not np.array_equal(decode(text), tumour):
        raise AssertionError("the decimals do not read back to the same float32s")
    return text


def decode(text: str) -> np.ndarray:
    return np.array([np.float32(word) for word in text.split()], dtype=np.float32)


def card_metrics(tumour: np.ndarray, labels: np.ndarray) -> dict:
    """The card's test metrics from the tumour probabilities, by the evaluation's own ``classification_metrics``."""
    p = tumour.astype(np.float64)
    measured = classification_metrics(np.stack([1 - p, p], axis=1), labels, calibration=True)
    return {name: measured[name] for name in CARD_METRICS}


def record(path: Path, test, identity: dict, threads: int) -> dict:
    model, card = load_checkpoint(path)
    started = time.perf_counter()
    tumour = tumour_probability(model, card, test)
    seconds = time.perf_counter() - started
    result = {
        "what": f"{path.stem}'s tumour probability on each of the {len(test)} test patches of pcam_public "
                "(tests/test_shipped_checkpoints.py holds the checkpoint and its card to it)",
        "how_made": f"{RECORD_COMMAND} (this checkpoint alone: {RECORD_COMMAND} {path.stem})",
        "made": time.strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "machine": f"{_cpu_name()}, {threads} thread(s), torch {torch.__version__}, numpy {np.__version__}, "
                   f"python {platform.python_version()}, AAGC_NATIVE={os.environ.get('AAGC_NATIVE', '1')}; "
                   f"{seconds:.0f} s",
        "checkpoint": str(path.relative_to(REPO)),
        "sha256": sha256_file(path),
        "data": {"name": "pcam_public", "split": "test", "dir": card["training"]["config"]["data_dir"], **identity},
        "batch_size": BATCH_SIZE,
        "metrics": card_metrics(tumour, test.labels),
        "metrics_how": "training.metrics.classification_metrics of (1 - p, p), p the tumour probabilities below",
        "tumour_probability": encode(tumour),
        "tumour_probability_format": "softmax probability of class 1 (tumour), float32, of each test patch in "
                                     "test-split order, as the shortest decimal that reads back to that float32",
    }
    RECORDS.mkdir(parents=True, exist_ok=True)
    out = record_path(path.stem)
    out.write_text(json.dumps(result, indent=1) + "\n")
    m = result["metrics"]
    print(f"{path.stem}: error {m['error']:.4f}, AUC {m['auc']:.4f}, NLL {m['nll']:.4f}, ECE {m['ece']:.4f} "
          f"in {seconds:.0f} s -> {out.relative_to(REPO)}", flush=True)
    return result


def main() -> None:
    stems = [path.stem for path in shipped()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stems", nargs="*", metavar="STEM", help=f"of {', '.join(stems)} (none named: all)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    if set(args.stems) - set(stems):
        parser.error(f"no shipped PCam checkpoint {', '.join(sorted(set(args.stems) - set(stems)))}")
    torch.set_num_threads(args.threads)
    loaded = {}  # data_dir -> (test split, its identity): the cards name one folder, read once
    for stem in args.stems or stems:
        path = REPO / "checkpoints" / f"{stem}.safetensors"
        data_dir = load_checkpoint(path)[1]["training"]["config"]["data_dir"]
        if data_dir not in loaded:
            test = load_dataset("pcam_public", REPO / data_dir).test
            loaded[data_dir] = test, data_identity(test)
        record(path, *loaded[data_dir], args.threads)


if __name__ == "__main__":
    main()
