"""Demo regions with known truth: a mosaic of held-out PCam test patches, scored cell by cell.

The shipped PCam-subset model's card lists its test split (``dataset.test_files``): real PatchCamelyon patches
it never trained on, each with a verified label (``../shared/data/pcam_subset``, see its README). Laid side by
side, 96 x 96 each, they make a region whose grid puts one cell at the centre of every patch, seen in exactly
that patch as its context: the cell PCam's label refers to. Those cells' truth is known, so the heatmap is
scored (ROC AUC); the cells on the seams between patches have no label and are shown but not scored.

The subset is read in place (``$PCAM_SUBSET_DIR``, by default ``../shared/data/pcam_subset`` from the working
directory) and never copied. Where it is not reachable (e.g. in the Docker image) the mosaic is made of the
twelve gallery patches, which come from the same test split.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.images import ImageError, read_image
from ..gallery import list_gallery

__all__ = ["Mosaic", "CellScore", "pcam_test_mosaic", "score_cells", "roc_auc", "subset_folder", "PCAM_MPP"]

PCAM_MPP = 0.972
PATCH = 96
SEED = 2020
PCAM_CREDIT = ("PatchCamelyon (Veeling et al., MICCAI 2018; Camelyon16 lymph-node slides), CC0 1.0, "
               "via the public repository rayhanros2030/VLM_Captions_Explainability; labels by Kaggle id")


@dataclass(frozen=True)
class Mosaic:
    """Patches side by side and the truth of the cells at their centres.

    Attributes:
        image: ``(3, 96 R, 96 C)`` float32 in [0, 1]; empty slots are white.
        labels: ``(3 R - 2, 3 C - 2)`` int8 per grid cell: 1 tumour, 0 normal, -1 no label (seams, empty slots).
        files: ``(R, C)`` the patch file in each slot ("" when empty).
        source: where the patches come from, with credit.
    """

    image: np.ndarray
    labels: np.ndarray
    files: np.ndarray
    source: str
    microns_per_pixel: float = PCAM_MPP

    @property
    def labelled(self) -> np.ndarray:
        """``(rows, cols)`` bool: the cells with a true label."""
        return self.labels >= 0


@dataclass(frozen=True)
class CellScore:
    """The heatmap against the truth: ROC AUC of the tumour probability over the labelled, evaluated cells."""

    auc: float
    scored: int
    tumour: int
    normal: int
    accuracy: float

    def summary(self) -> str:
        return (f"AUC {self.auc:.3f} over {self.scored} labelled cells ({self.tumour} tumour, {self.normal} normal), "
                f"accuracy {self.accuracy:.1%} at p = 0.5")


def subset_folder() -> Path:
    return Path(os.environ.get("PCAM_SUBSET_DIR", "../shared/data/pcam_subset"))


def _subset_patches(card: dict, folder: Path) -> list[tuple[str, np.ndarray, int]] | None:
    """The card's test patches read from the subset folder, or None where it or they are missing."""
    names = (card.get("dataset") or {}).get("test_files")
    labels_csv = folder / "labelled" / "labels.csv"
    if not names or not labels_csv.is_file():
        return None
    with open(labels_csv, newline="") as f:
        labels = {row["filename"]: int(row["label"]) for row in csv.DictReader(f)}
    try:
        images = folder / "labelled" / "images"
        return [(name, read_image((images / name).read_bytes()), labels[name]) for name in names]
    except (OSError, KeyError, ImageError):
        return None


def _gallery_patches(card: dict) -> list[tuple[str, np.ndarray, int]]:
    classes = list(card.get("class_names") or ["no_tumor", "tumor"])
    return [(item.name, read_image(item.path.read_bytes()), classes.index(item.label))
            for item in list_gallery(kind="he") if item.label in classes]


def pcam_test_mosaic(card: dict, folder: Path | None = None, seed: int = SEED) -> Mosaic:
    """The model's held-out test patches in a near-square mosaic, in a fixed random order.

    Args:
        card: the PCam model's card (``dataset.test_files``, ``class_names``).
        folder: the PCam subset (default :func:`subset_folder`); the gallery's patches where it is unreachable.
    """
    folder = subset_folder() if folder is None else folder
    patches = _subset_patches(card, folder)
    if patches is not None:
        source = f"the {len(patches)} test patches of the shipped model's split, read from {folder}. {PCAM_CREDIT}"
    else:
        patches = _gallery_patches(card)
        source = (f"the {len(patches)} gallery patches (the PCam subset is not reachable here), all from the shipped "
                  f"model's test split. {PCAM_CREDIT}")
    if not patches:
        raise FileNotFoundError("no labelled PCam patches found, neither the subset nor the gallery")
    order = np.random.default_rng(seed).permutation(len(patches))
    cols = math.ceil(math.sqrt(len(patches)))
    rows = math.ceil(len(patches) / cols)
    image = np.ones((3, rows * PATCH, cols * PATCH), dtype=np.float32)
    labels = np.full((3 * rows - 2, 3 * cols - 2), -1, dtype=np.int8)
    files = np.full((rows, cols), "", dtype=object)
    for slot, k in enumerate(order):
        name, pixels, label = patches[k]
        r, c = divmod(slot, cols)
        image[:, r * PATCH:(r + 1) * PATCH, c * PATCH:(c + 1) * PATCH] = pixels[:3]
        labels[3 * r, 3 * c] = label  # cell (3r, 3c)'s context is exactly this patch
        files[r, c] = name
    return Mosaic(image, labels, files, source)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a positive outscores a negative, ties counting half."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    positive, negative = scores[labels], scores[~labels]
    if not len(positive) or not len(negative):
        return math.nan
    greater = (positive[:, None] > negative[None, :]).sum()
    ties = (positive[:, None] == negative[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(positive) * len(negative)))


def score_cells(positive: np.ndarray, labels: np.ndarray) -> CellScore:
    """Score a ``(rows, cols)`` tumour probability (NaN: not evaluated) against cell labels (-1: none)."""
    scored = (labels >= 0) & np.isfinite(positive)
    p, y = positive[scored], labels[scored] == 1
    return CellScore(roc_auc(p, y), int(scored.sum()), int(y.sum()), int((~y).sum()),
                     float(((p > 0.5) == y).mean()) if len(p) else math.nan)
