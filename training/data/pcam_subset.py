"""The real labelled PCam subset (``../shared/data/pcam_subset``): a fixed stratified split, hard negatives in train.

The folder holds three parts, each a folder with ``images/`` and (where labels exist) ``labels.csv``
(``filename,label[,kaggle_id]``):

* ``labelled/``: real PCam patches with verified tumour labels (317: 160 normal, 157 tumour). They are split
  once, stratified by label, with a fixed seed: 25 % test, 15 % valid, the rest train (:func:`split_labelled`);
* ``hard_negatives/``: label-0 patches that another CNN called tumour, mostly JPEG re-encodes. They are not a
  random sample of normal tissue, so they only ever go to training;
* ``unlabelled/``: PCam patches without a label; never read here (not used by training).

Two details keep the training split from teaching shortcuts:

* the hard negatives are JPEG (one quality throughout) and the labelled patches lossless, so "JPEG
  artefacts" alone would predict "normal". Every labelled training patch therefore also enters training as a
  JPEG re-encode with the hard negatives' own quantisation tables and chroma subsampling, and the PNG and
  JPEG copies share the patch's sampling weight;
* the classes are unbalanced once 2,263 hard negatives join ~95 normal and ~95 tumour patches, so the train
  split carries ``sample_weights``: tumour patches draw half of all samples, labelled normal patches a quarter
  and hard negatives a quarter (the loop samples with these weights when ``sampling="weighted"``).

``pcam_subset_labelled_only`` (:func:`load_pcam_subset_labelled_only`, the ``pcam_subset`` preset's choice on
validation) is the same split without the hard negatives: tumour and normal patches draw half each.

All images are held in memory as uint8 (about 70 MB with the hard negatives).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .augment import jpeg_round_trip
from .base import ArraySplit, DataError, DatasetSpec, Splits
from .pcam import CLASS_NAMES, MEAN, SIZE, STD, read_patch

__all__ = ["load_pcam_subset", "read_labelled_folder", "split_labelled", "split_names", "PatchFolder",
           "WeightedArraySplit", "SPLIT_SEED", "TEST_FRACTION", "VALID_FRACTION", "CLASS_NAMES"]

SPLIT_SEED = 20260
TEST_FRACTION = 0.25
VALID_FRACTION = 0.15
# Shares of all training samples drawn from each stratum when sampling with weights.
SHARES = {"tumour": 0.5, "normal": 0.25, "hard_negative": 0.25}


@dataclass(frozen=True)
class PatchFolder:
    """One labelled folder read into memory.

    Attributes:
        images: uint8 ``(N, 96, 96, 3)``.
        labels: int64 ``(N,)``, 0 or 1.
        names: file names, in the order of ``labels.csv``.
        jpeg_reference: path of one JPEG of the folder (for its quantisation tables), or None.
    """

    images: np.ndarray
    labels: np.ndarray
    names: tuple[str, ...]
    jpeg_reference: Path | None


def _labels_rows(folder: Path) -> list[dict]:
    """The rows of ``folder/labels.csv``; a missing folder or file, or a header without the columns, is a DataError."""
    labels_file = folder / "labels.csv"
    if not folder.is_dir():
        raise DataError(f"PCam subset folder {folder} not found")
    if not labels_file.is_file():
        raise DataError(f"PCam subset folder {folder} has no labels.csv (filename,label per image)")
    try:
        with open(labels_file, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read {labels_file}: {e}") from e
    if not rows or "filename" not in rows[0] or "label" not in rows[0]:
        raise DataError(f"{labels_file} must have a header with 'filename' and 'label' and at least one row")
    return rows


def _first_jpeg(folder: Path, rows: list[dict]) -> Path | None:
    return next((folder / "images" / row["filename"] for row in rows
                 if Path(row["filename"]).suffix.lower() in (".jpg", ".jpeg")), None)


def read_labelled_folder(folder: Path) -> PatchFolder:
    """Read ``folder/labels.csv`` and every image it names from ``folder/images``.

    Raises:
        DataError: a missing folder or labels file, a header without ``filename`` and ``label``, a label other
            than 0 or 1, a listed image that is missing, unreadable or not 96x96; the message names the file.
    """
    folder = Path(folder)
    rows = _labels_rows(folder)
    images, labels = [], []
    for line, row in enumerate(rows, start=2):
        if row["label"] not in ("0", "1"):
            raise DataError(f"{folder / 'labels.csv'} line {line}: label must be 0 or 1, got {row['label']!r}")
        images.append(read_patch(folder / "images" / row["filename"], "PCam subset image"))
        labels.append(int(row["label"]))
    names = tuple(row["filename"] for row in rows)
    return PatchFolder(np.stack(images), np.array(labels, dtype=np.int64), names, _first_jpeg(folder, rows))


def split_labelled(labels: np.ndarray, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
    """Fixed stratified split of the labelled patches: indices of train, valid and test, each sorted.

    Within each class the indices are permuted with ``numpy.random.default_rng(seed)``; the first
    ``round(TEST_FRACTION * n)`` go to test, the next ``round(VALID_FRACTION * n)`` to valid, the rest to train.
    """
    rng = np.random.default_rng(seed)
    parts = {"train": [], "valid": [], "test": []}
    for label in (0, 1):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_test, n_valid = round(TEST_FRACTION * len(members)), round(VALID_FRACTION * len(members))
        parts["test"].append(members[:n_test])
        parts["valid"].append(members[n_test:n_test + n_valid])
        parts["train"].append(members[n_test + n_valid:])
    return {name: np.sort(np.concatenate(chunks)) for name, chunks in parts.items()}


def _jpeg_like(images: np.ndarray, reference: Path) -> np.ndarray:
    """Re-encode ``(N, 96, 96, 3)`` uint8 patches as JPEG with the reference file's tables and subsampling."""
    from PIL import Image, JpegImagePlugin

    try:
        with Image.open(reference) as ref:
            qtables, subsampling = ref.quantization, JpegImagePlugin.get_sampling(ref)
    except (OSError, ValueError, SyntaxError) as e:
        raise DataError(f"cannot read the JPEG {reference} whose quality the training copies take: {e}") from e
    return np.stack([jpeg_round_trip(image, qtables=qtables, subsampling=subsampling) for image in images])


class WeightedArraySplit(ArraySplit):
    """An in-memory split whose examples carry sampling weights (summing to 1)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, sample_weights: np.ndarray):
        super().__init__(images, labels)
        self.sample_weights = np.asarray(sample_weights, dtype=np.float64)


def _channels_first(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # (N, 96, 96, 3) -> (N, 3, 96, 96)


def load_pcam_subset_labelled_only(root: Path) -> Splits:
    """:func:`load_pcam_subset` without the hard negatives: the labelled training patches and their JPEG copies."""
    return load_pcam_subset(root, hard_negatives=False)


def load_pcam_subset(root: Path, seed: int = SPLIT_SEED, hard_negatives: bool = True) -> Splits:
    """Read the subset and return its fixed split (hard negatives and JPEG copies in train only).

    Args:
        root: the folder holding ``labelled/`` and ``hard_negatives/``.
        seed: seed of the stratified split of ``labelled/`` (keep the default: shipped cards were measured on it).

    Returns:
        Splits of float32 ``(N, 3, 96, 96)`` RGB patches in [0, 1]; label 1 is tumour in the central 32x32.
        ``train`` is a :class:`WeightedArraySplit`; ``valid``/``test`` hold labelled PNGs only. The spec's
        ``source`` names the folder and counts; ``split_names(root)`` lists which file went where.

    Raises:
        DataError: a missing or damaged folder, labels file or image, named in the message.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"PCam subset folder {root} not found (expected labelled/ and hard_negatives/ in it)")
    labelled = read_labelled_folder(root / "labelled")
    hard_folder = root / "hard_negatives"
    if hard_negatives:
        hard = read_labelled_folder(hard_folder)
        if (hard.labels != 0).any():
            raise DataError(f"{hard_folder / 'labels.csv'}: hard negatives must all have label 0")
        extra_images, extra_labels, reference = hard.images, hard.labels, hard.jpeg_reference
    else:
        # Only the re-encoding quality is needed: one JPEG, not the 2,263 patches.
        extra_images, extra_labels = np.zeros((0, SIZE, SIZE, 3), np.uint8), np.zeros(0, np.int64)
        reference = _first_jpeg(hard_folder, _labels_rows(hard_folder))
    if reference is None:
        raise DataError(f"{hard_folder} holds no JPEG to take the re-encoding quality from")
    parts = split_labelled(labelled.labels, seed)
    train = parts["train"]
    own = labelled.images[train]
    own_labels = labelled.labels[train]
    images = np.concatenate([own, _jpeg_like(own, reference), extra_images])
    labels = np.concatenate([own_labels, own_labels, extra_labels])
    own_strata = np.where(own_labels == 1, "tumour", "normal")
    stratum = np.concatenate([own_strata, own_strata, ["hard_negative"] * len(extra_labels)])
    shares = SHARES if hard_negatives else {"tumour": 0.5, "normal": 0.5}
    weights = np.zeros(len(labels))
    for name, share in shares.items():
        members = stratum == name
        weights[members] = share / members.sum()
    counts = {name: len(index) for name, index in parts.items()}
    spec = DatasetSpec(
        name="pcam_subset",
        num_classes=2,
        channels=3,
        size=SIZE,
        mean=MEAN,
        std=STD,
        class_names=CLASS_NAMES,
        source=(f"PatchCamelyon (PCam; Veeling et al. 2018, CC0), a subset of its training split: "
                f"{len(labelled.labels)} labelled patches (PCam train_x[0:500] as PNG, repository "
                f"rayhanros2030/VLM_Captions_Explainability; labels by Kaggle id) split "
                f"{counts['train']}/{counts['valid']}/{counts['test']} (train/valid/test,"
                f" stratified, seed {seed}); "
                + (f"plus {len(extra_labels)} hard negatives in train only (repository MartiHan/8p361_MedicalImaging)"
                   if hard_negatives else "the hard negatives of MartiHan/8p361_MedicalImaging not used")
                + "; each labelled training patch also as a JPEG re-encode"),
        notes=("Test set small and drawn from PCam's training split: not comparable with the paper's Table 3 "
               "(PCam test set)"),
        test_files=tuple(labelled.names[i] for i in parts["test"]),
    )
    return Splits(
        spec=spec,
        train=WeightedArraySplit(_channels_first(images), labels, weights),
        valid=ArraySplit(_channels_first(labelled.images[parts["valid"]]), labelled.labels[parts["valid"]]),
        test=ArraySplit(_channels_first(labelled.images[parts["test"]]), labelled.labels[parts["test"]]),
    )


def split_names(root: Path, seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """File names of the labelled patches in each split (reads ``labelled/labels.csv`` only)."""
    rows = _labels_rows(Path(root) / "labelled")
    labels = np.array([int(row["label"]) for row in rows])
    return {name: [rows[i]["filename"] for i in index] for name, index in split_labelled(labels, seed).items()}
