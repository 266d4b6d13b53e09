"""The paper's released PCam model on the same 1,944 test patches as Table 3's runs, kept only as measured figures.

The release (``f_att_p4m_densenet`` by its folder's name, a plain P4M-DenseNet by its weights, imported as our
``p4m_densenet``, fed as its card says) is measured afresh wherever ``../shared/reference`` (or $REFERENCE_DIR) is
there. Nothing per patch of it is kept in the project: ``results/pcam_table3/release/p4m_densenet.json`` holds
its summary (metrics with 95 % intervals), the sha256 of its ``.pth``, and, for the test patches cut by a seeded
random permutation into 24 parts of 81, per part its error count, the sum of its tumour probabilities and the
sha256 of its predicted classes (uint8, in part order): a test recomputes a seeded part and must find the same.
The part is measured as one batch both times, so that a recomputed part is the recorded computation again.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from models import import_reference_checkpoint
from training.data import SubsetSplit
from training.metrics import confidence_intervals
from training.provenance import code_record, sha256_file

from .patch_records import tumour_probability

__all__ = ["REFERENCE", "RELEASE_ARCH", "RELEASE_CHECKPOINT", "PARTS", "PART_SIZE", "PARTITION_SEED", "parts",
           "release_path", "load_release", "measure_parts", "classes_sha256", "release_summary"]

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("REFERENCE_DIR", REPO.parent / "shared" / "reference"))
RELEASE_ARCH = "p4m_densenet"
RELEASE_CHECKPOINT = ("checkpoints/model_f_att_p4m_densenet_optim_adam_lr_0.001_wd_0.0001_seed_1_"
                      "dilatedkernelseverywhere_pat20onmaxacc/model.pth")
PATCHES, PARTS, PART_SIZE = 1944, 24, 81
PARTITION_SEED = 41  # fixed: written in the summary, which the test checks
PARTITION = "numpy.random.Generator(numpy.random.PCG64(seed)).permutation(1944).reshape(24, 81): part k is row k"


def release_path() -> Path:
    """Where the release's ``model.pth`` is on this machine (it may be absent)."""
    return REFERENCE / RELEASE_CHECKPOINT


def load_release():
    """The release imported as our ``p4m_densenet``, its card (with its input normalisation) as ``model.card``."""
    return import_reference_checkpoint(release_path(), RELEASE_ARCH)


def parts(seed: int = PARTITION_SEED) -> np.ndarray:
    """``(24, 81)`` test-split indices: row k is part k, a random sample of the 1,944 test patches."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(PATCHES).reshape(PARTS, PART_SIZE)


def classes_sha256(tumour: np.ndarray) -> str:
    """sha256 of the predicted classes (tumour probability above 1/2, as the argmax of two classes) as uint8."""
    return hashlib.sha256(np.ascontiguousarray(tumour > 0.5, dtype=np.uint8).tobytes()).hexdigest()


def measure_parts(model, test, which=None) -> dict[int, np.ndarray]:
    """The tumour probabilities (float32) of the parts ``which`` (all by default), each part one forward batch."""
    split_parts = parts()
    return {k: tumour_probability(model, model.card, SubsetSplit(test, split_parts[k]))
            for k in (range(PARTS) if which is None else which)}


def in_test_order(by_part: dict[int, np.ndarray]) -> np.ndarray:
    """Every part's probabilities put back in test-split order."""
    out = np.empty(PATCHES, dtype=np.float32)
    split_parts = parts()
    for k, tumour in by_part.items():
        out[split_parts[k]] = tumour
    return out


def release_summary(by_part: dict[int, np.ndarray], labels: np.ndarray, identity: dict, seconds: float) -> dict:
    """What the project keeps of the release: measured figures and digests, no per-patch value.

    Args:
        by_part: every part's tumour probabilities (:func:`measure_parts`).
        labels: the test labels in split order.
        identity: the test patches' :func:`experiments.patch_records.data_identity` (or at least its count and
            ``files_labels_sha256``).
    """
    tumour = in_test_order(by_part).astype(np.float64)
    split_parts = parts()
    probs = np.stack([1 - tumour, tumour], axis=1)
    return {
        "what": "the paper's released PCam model (a plain P4M-DenseNet) on the 1,944 test patches of pcam_public: "
                "only measured figures and digests, never its per-patch predictions",
        # The command in the form the kept summary has always named (python -m training hands it over).
        "how_made": "python -m training table3 results/pcam_table3 --release --write",
        "made": time.strftime("%Y-%m-%d"),
        **code_record(),  # commit, code_sha256 and whether they agree (training.provenance)
        "seconds": round(seconds),
        "checkpoint": f"{RELEASE_CHECKPOINT} (in ../shared/reference)",
        "sha256": sha256_file(release_path()),
        "imported_as": RELEASE_ARCH,
        "data": {"name": "pcam_public", "split": "test", **identity},
        "partition": {"seed": PARTITION_SEED, "how": PARTITION, "parts": PARTS, "part_size": PART_SIZE,
                      "indices_int64_sha256": hashlib.sha256(split_parts.astype(np.int64).tobytes()).hexdigest()},
        "errors": int(((tumour > 0.5) != labels).sum()),
        "errors_by_part": [int(((by_part[k] > 0.5) != labels[split_parts[k]]).sum()) for k in range(PARTS)],
        "tumour_sum_by_part": [float(by_part[k].astype(np.float64).sum()) for k in range(PARTS)],
        "predicted_sha256_by_part": [classes_sha256(by_part[k]) for k in range(PARTS)],
        "intervals": confidence_intervals(probs, labels),
        "note": "per part: errors, the float64 sum of the float32 tumour probabilities, and the sha256 of the "
                "predicted classes (uint8, tumour probability > 1/2, in part order)",
    }
