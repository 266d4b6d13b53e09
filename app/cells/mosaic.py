"""Demo regions with known truth: a mosaic of held-out PCam test patches, scored cell by cell.

400 patches of PCam's test split (``../shared/data/pcam_public``, read in place through
:mod:`app.analysis.pcam_public`, never copied), real patches with PCam's own test labels that no shipped H&E model
trained on, laid side by side, 96 x 96 each, make a region whose grid puts one cell at the centre of every patch,
seen in exactly that patch as its context: the cell PCam's label refers to. Those cells' truth is known, so the
heatmap is scored (ROC AUC and accuracy); the cells on the seams between patches have no label and are shown
but not scored. Where pcam_public is not reachable (e.g. in the Docker image) the mosaic is made of the twelve
gallery patches, which come from the same test split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.images import ImageError, read_image
from ..analysis.pcam_public import PCAM_CREDIT, public_folder, test_patches
from ..gallery import list_gallery

__all__ = ["Mosaic", "CellScore", "pcam_test_mosaic", "score_cells", "roc_auc", "PCAM_MPP", "MOSAIC_PATCHES"]

PCAM_MPP = 0.972
PATCH = 96
SEED = 2020
MOSAIC_PATCHES = 400  # a 20 x 20 mosaic, 1920 x 1920 px: enough cells for AUC and accuracy to mean something


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


def _public_patches(folder: Path, count: int, seed: int) -> list[tuple[str, np.ndarray, int]] | None:
    """``count`` test patches of pcam_public drawn with ``seed``, or None where the folder or a patch is missing."""
    patches = test_patches(folder)
    if len(patches) < count:
        return None
    chosen = [patches[i] for i in sorted(np.random.default_rng(seed).choice(len(patches), count, replace=False))]
    try:
        return [(p.file, read_image((folder / p.file).read_bytes()), p.label) for p in chosen]
    except (OSError, ImageError):
        return None


def _gallery_patches(card: dict) -> list[tuple[str, np.ndarray, int]]:
    classes = list(card.get("class_names") or ["no_tumor", "tumor"])
    return [(item.name, read_image(item.path.read_bytes()), classes.index(item.label))
            for item in list_gallery(kind="he") if item.label in classes]


def pcam_test_mosaic(card: dict, folder: Path | None = None, seed: int = SEED, count: int = MOSAIC_PATCHES) -> Mosaic:
    """``count`` patches of PCam's test split in a near-square mosaic, drawn and placed in a fixed random order.

    Args:
        card: the PCam model's card (``class_names``, for the gallery's labels).
        folder: pcam_public (default :func:`~app.analysis.pcam_public.public_folder`); the gallery's twelve
            patches where it is unreachable.
    """
    folder = public_folder() if folder is None else folder
    patches = _public_patches(folder, count, seed)
    if patches is not None:
        source = (f"{len(patches)} patches of PCam's test split drawn at random (seed {seed}) from the "
                  f"{len(test_patches(folder)):,} in {folder}; no shipped H&E model trained on them. {PCAM_CREDIT}, "
                  f"via the public repositories that pcam_public's labels.csv names")
    else:
        patches = _gallery_patches(card)
        source = (f"the {len(patches)} gallery patches (pcam_public is not reachable here), all from PCam's test "
                  f"split. {PCAM_CREDIT}")
    if not patches:
        raise FileNotFoundError("no labelled PCam patches found, neither pcam_public nor the gallery")
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
