"""Records of what a PCam checkpoint predicts on every test patch of ``pcam_public``, bound to it by sha256.

A record is a JSON file: the checkpoint's sha256 (and, for a sweep's run, the sha256 of its card in the results
folder), the data's identity (test files and labels, decoded images), each patch's tumour probability (the
softmax's float32, as the shortest decimal that reads back to the same float32) and the card's metrics recomputed
from those probabilities. ``benchmarks.pcam_test_record`` records the shipped checkpoints with it
(``results/pcam_test_predictions/``), ``python -m experiments table3 --record`` the Table 3 runs
(``results/pcam_table3/test_predictions/``); their tests recompute a seeded sample of patches.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from models import load_checkpoint
from training.atomic import write_atomic
from training.data import SubsetSplit
from training.data.pcam_public import read_labels
from training.distributed import Context
from training.evaluation import Normaliser, predict
from training.metrics import classification_metrics, confidence_intervals
from training.provenance import _cpu_name, code_record, on_cpu, sha256_file

__all__ = ["BATCH_SIZE", "CARD_METRICS", "data_identity", "listing_sha256", "tumour_probability", "encode", "decode",
           "card_metrics", "tumour_intervals", "card_tolerances", "prediction_record", "read_test_labels",
           "read_record", "write_record"]

BATCH_SIZE = 256  # evaluate_checkpoint's, which measured the cards
CARD_METRICS = ("error", "nll", "auc", "ece", "count")
FORMAT = ("softmax probability of class 1 (tumour), float32, of each test patch in test-split order, as the "
          "shortest decimal that reads back to that float32")


def listing_sha256(names, labels) -> str:
    """sha256 of ``file,label`` lines, one per patch in split order: what names the test patches and their truth."""
    return hashlib.sha256("".join(f"{n},{int(y)}\n" for n, y in zip(names, labels, strict=True)).encode()).hexdigest()


def data_identity(split) -> dict:
    """What names the test patches: their count, the sha256 of ``file,label`` lines (split order) and of the
    images as ``get_batch`` hands them to the model (float32 in [0, 1])."""
    images = hashlib.sha256()
    for start in range(0, len(split), 256):
        batch, _ = split.get_batch(np.arange(start, min(start + 256, len(split))))
        images.update(np.ascontiguousarray(batch, dtype=np.float32).tobytes())
    return {"patches": len(split), "files_labels_sha256": listing_sha256(split.names, split.labels),
            "images_float32_sha256": images.hexdigest()}


def read_test_labels(data_dir: str | Path) -> tuple[tuple[str, ...], np.ndarray]:
    """The test split's file names and labels (int64) from ``labels.csv`` alone, in split order: no image decoded.

    Raises:
        DataError: no readable ``labels.csv`` in ``data_dir``.
    """
    records = [r for r in read_labels(Path(data_dir)) if r.split == "test"]
    return tuple(r.file for r in records), np.array([r.label for r in records], dtype=np.int64)


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


def _two_class(tumour: np.ndarray) -> np.ndarray:
    """``(N, 2)`` float64 probabilities (no tumour, tumour) from the tumour probabilities."""
    p = tumour.astype(np.float64)
    return np.stack([1 - p, p], axis=1)


def card_metrics(tumour: np.ndarray, labels: np.ndarray) -> dict:
    """The card's test metrics from the tumour probabilities, by the evaluation's own ``classification_metrics``."""
    measured = classification_metrics(_two_class(tumour), labels, calibration=True)
    return {name: measured[name] for name in CARD_METRICS}


def tumour_intervals(tumour: np.ndarray, labels: np.ndarray) -> dict:
    """The card's 95 % test intervals (:func:`training.metrics.confidence_intervals`) from the tumour probabilities."""
    return confidence_intervals(_two_class(tumour), labels)


def card_tolerances(card: dict) -> dict[str, float]:
    """How far the test metrics of a record computed on a CPU may be from the card's own.

    Round-off (1e-6) where the card was measured on a CPU too. A card measured on a GPU (its ``hardware``, the
    last piece's machine, which ran the final evaluation) comes from kernels that round otherwise: probabilities
    within about 1e-5 (measured: NLL 3e-6 to 1.7e-5, AUC 2e-6 to 1e-5 apart for the four Table 3 runs that
    finished on an H200, error equal); so NLL and AUC agree to 1e-4, the error to one patch in case one sits on
    0.5, and ECE to two patches' worth (a patch crossing one of its bin edges moves it by up to 1/count).
    """
    if on_cpu(card["training"]["hardware"]):
        return dict.fromkeys(("error", "nll", "auc", "ece"), 1e-6)
    count = card["metrics"]["test_count"]
    return {"error": 1 / count + 1e-12, "nll": 1e-4, "auc": 1e-4, "ece": 2 / count}


def prediction_record(path: Path, test, identity: dict, *, what: str, how_made: str, threads: int,
                      shown_as: str, card_file: Path | None = None, card_shown_as: str | None = None) -> dict:
    """Measure checkpoint ``path`` on every patch of ``test`` and return its record (not written).

    Args:
        identity: :func:`data_identity` of ``test``.
        what, how_made: the record's own description and the command that makes it.
        shown_as: the checkpoint's path as the record names it (relative: no path of this machine).
        card_file, card_shown_as: a copy of the checkpoint's card kept elsewhere (a sweep's results folder),
            bound by its sha256 too.
    """
    model, card = load_checkpoint(path)
    started = time.perf_counter()
    tumour = tumour_probability(model, card, test)
    seconds = time.perf_counter() - started
    result = {
        "what": what,
        "how_made": how_made,
        "made": time.strftime("%Y-%m-%d"),
        **code_record(),  # commit, code_sha256 and whether they agree (training.provenance)
        "machine": f"{_cpu_name()}, {threads} thread(s), torch {torch.__version__}, numpy {np.__version__}, "
                   f"python {platform.python_version()}, AAGC_NATIVE={os.environ.get('AAGC_NATIVE', '1')}; "
                   f"{seconds:.0f} s",
        "checkpoint": shown_as,
        "sha256": sha256_file(path),
    }
    if card_file is not None:
        result["card"], result["card_sha256"] = card_shown_as, sha256_file(card_file)
    result.update({
        "data": {"name": "pcam_public", "split": "test", "dir": card["training"]["config"]["data_dir"], **identity},
        "batch_size": BATCH_SIZE,
        "metrics": card_metrics(tumour, test.labels),
        "metrics_how": "training.metrics.classification_metrics of (1 - p, p), p the tumour probabilities below",
        "tumour_probability": encode(tumour),
        "tumour_probability_format": FORMAT,
    })
    return result


def write_record(path: Path, record: dict) -> None:
    """Write a record (or rewrite it), in the layout every record has."""
    write_atomic(Path(path), (json.dumps(record, indent=1) + "\n").encode())


def read_record(path: str | Path) -> tuple[dict, np.ndarray]:
    """A record and its decoded tumour probabilities (float32, test-split order)."""
    record = json.loads(Path(path).read_text())
    return record, decode(record["tumour_probability"])
