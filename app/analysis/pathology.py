"""Pathology mode: what a model card says about H&E models, their scale and their calibration.

PCam's label refers to the central 32 x 32 pixels of a 96 x 96 patch at about
1 um/px (0.972: the 40x slides downsampled four times); the ``he_demo`` proxy
set copies that geometry at 1.0 um/px, with a proxy label (nucleus-rich
centre), which the app must state plainly. A card's
``metrics.test_reliability`` holds the reliability diagram of the test set:
predictions binned by confidence (their largest class probability), bin i
holding (edges[i], edges[i + 1]], with the mean confidence, the accuracy and
the count per bin (None for empty bins).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.stain import nuclei_mask

__all__ = ["PATHOLOGY_DATASETS", "dataset_name", "is_pathology", "is_proxy", "proxy_statement", "centre_region",
           "model_microns_per_pixel", "scale_bar_microns", "Calibration", "calibration_at", "rgb_255", "nuclei_masks"]

# Dataset name (lower case) -> micrometres per pixel of its patches.
PATHOLOGY_DATASETS = {"he_demo": 1.0, "pcam": 0.972, "pcam_subset": 0.972, "pcam_public": 0.972,
                      "patchcamelyon": 0.972}
CENTRE = 32


def dataset_name(card: dict) -> str:
    """``card["dataset"]["name"]``, or the dataset string of older cards (e.g. ``"PatchCamelyon"``)."""
    dataset = card.get("dataset")
    return str(dataset.get("name", "")) if isinstance(dataset, dict) else str(dataset or "")


def _notes(card: dict) -> str:
    dataset = card.get("dataset")
    return str(dataset.get("notes") or "") if isinstance(dataset, dict) else ""


def is_pathology(card: dict) -> bool:
    """An H&E patch model (PCam, its real subset, or the he_demo proxy)."""
    return dataset_name(card).lower() in PATHOLOGY_DATASETS


def is_proxy(card: dict) -> bool:
    """Trained on a proxy label: the he_demo set, or a card whose dataset notes say proxy."""
    return dataset_name(card).lower() == "he_demo" or "proxy" in _notes(card).lower()


def proxy_statement(card: dict) -> str:
    """One plain paragraph for a proxy model; empty for others."""
    if not is_proxy(card):
        return ""
    notes = _notes(card) or "the label is a stand-in defined for demonstration"
    notes = notes.removeprefix("Demonstration proxy:").strip().rstrip(".")
    return (f"Demonstration proxy: not a tumour classifier. Its label: {notes}. Its probabilities say nothing "
            "about cancer; it exists to show equivariant attention on real H&E tissue.")


def centre_region(size: int, centre: int = CENTRE) -> tuple[int, int, int]:
    """``(top, left, side)`` of the centred ``centre`` x ``centre`` square that PCam's label refers to."""
    side = min(centre, size)
    start = (size - side) // 2
    return start, start, side


def model_microns_per_pixel(card: dict) -> float | None:
    """The scale the model was trained at: ``card["input"]["microns_per_pixel"]`` or its dataset's."""
    value = (card.get("input") or {}).get("microns_per_pixel")
    if value is not None:
        return float(value)
    return PATHOLOGY_DATASETS.get(dataset_name(card).lower())


def scale_bar_microns(width_px: int, microns_per_pixel: float) -> float:
    """The longest of 10, 20, 50, 100, 200, 500 um not longer than 40 % of the image (at least 10)."""
    limit = 0.4 * width_px * microns_per_pixel
    fitting = [length for length in (10, 20, 50, 100, 200, 500) if length <= limit]
    return float(fitting[-1] if fitting else 10)


@dataclass(frozen=True)
class Calibration:
    """Where one prediction falls on the test set's reliability diagram.

    Attributes:
        low, high: the confidence bin (low, high].
        accuracy: fraction of the test predictions in that bin that were right (None: empty bin).
        count: how many test predictions fell in it.
        ece: the card's expected calibration error, where given.
    """

    low: float
    high: float
    accuracy: float | None
    count: int
    ece: float | None

    @property
    def text(self) -> str:
        if self.accuracy is None or not self.count:
            return (f"No test prediction had a confidence in ({self.low:.2f}, {self.high:.2f}]: "
                    "its calibration there is unknown.")
        return (f"On the test set, predictions with confidence in ({self.low:.2f}, {self.high:.2f}] were right "
                f"{100 * self.accuracy:.0f} % of the time ({self.count} patches).")


def calibration_at(card: dict, confidence: float) -> Calibration | None:
    """The reliability bin of a prediction's confidence (its largest probability); None without card data."""
    metrics = card.get("metrics") or {}
    curve = metrics.get("test_reliability")
    if not isinstance(curve, dict) or not curve.get("bin_edges"):
        return None
    edges = curve["bin_edges"]
    index = next((i for i in range(len(edges) - 1) if confidence <= edges[i + 1]), len(edges) - 2)
    index = max(index, 0)
    accuracy = curve["accuracy"][index]
    ece = metrics.get("test_ece")
    return Calibration(float(edges[index]), float(edges[index + 1]), None if accuracy is None else float(accuracy),
                       int(curve["count"][index] or 0), None if ece is None else float(ece))


def rgb_255(images: np.ndarray) -> np.ndarray:
    """``(..., 3, S, S)`` in [0, 1] -> ``(..., S, S, 3)`` on 0..255, as :mod:`models.stain` takes images: 255 x, not
    rounded (a resized image's values lie between integers). The page's nuclei outline and the nuclei measurement
    (:mod:`app.analysis.nuclei`) both convert here, so that they classify every pixel alike."""
    return 255.0 * np.moveaxis(images, -3, -1)


def nuclei_masks(images: np.ndarray) -> np.ndarray:
    """The nuclei of each RGB image, :func:`models.stain.nuclei_mask`: ``(T, 3, S, S)`` in [0, 1] -> bool
    ``(T, S, S)``. Its windows are centred squares, so the mask of g.x is the mask of x moved by g."""
    return np.stack([nuclei_mask(image) for image in rgb_255(images)])
