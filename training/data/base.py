"""What every dataset reader returns: a spec and three splits that hand out batches.

Images leave a reader as float32 ``(B, C, H, W)`` in [0, 1], upright (a format
that stores images transposed, like rot-MNIST's ``.amat``, is undone here), and
labels as int64 ``(B,)``. Normalisation by ``spec.mean``/``spec.std`` happens
later, on the batch, so that the model card can record exactly what was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["DataError", "DatasetSpec", "Split", "ArraySplit", "ConcatSplit", "SubsetSplit", "Splits"]


class DataError(ValueError):
    """A dataset file that is missing, corrupt or inconsistent; the message names the file."""


@dataclass(frozen=True)
class DatasetSpec:
    """Attributes:
    name: registry name (``rot_mnist``, ``cifar10``, ``pcam``, ``pcam_public``).
    num_classes, channels, size: label count, image channels and side in pixels.
    mean, std: per-channel normalisation of [0, 1] pixels.
    class_names: one name per label.
    source: where the data came from, in words (goes into model cards).
    notes: caveats every place showing this data must repeat (e.g. a proxy label).
    test_files: the file names of the test split, in order, where a reader splits a folder itself (so that a
        card says exactly which patches it was measured on); empty otherwise.
    """

    name: str
    num_classes: int
    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]
    source: str = ""
    notes: str = ""
    test_files: tuple[str, ...] = ()


class Split(Protocol):
    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images float32 ``(B, C, H, W)`` in [0, 1] and labels int64 ``(B,)`` for these indices, in this order."""
        ...


def _as_float(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images.astype(np.float32)


class ArraySplit:
    """A split held in memory: images ``(N, C, H, W)`` uint8 (0..255) or float (0..1), labels ``(N,)``.

    ``upright``, where a reader has it, holds each image as it was before the reader rotated it (rot-MNIST
    rebuilt from MNIST), indexable like ``images``: ``augment="redraw"`` draws fresh rotations of it.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, upright=None):
        if images.ndim != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {images.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        if upright is not None and len(upright) != len(labels):
            raise ValueError(f"{len(upright)} upright images but {len(labels)} labels")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.upright = upright

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _as_float(self.images[indices]), self.labels[indices]

    def get_upright(self, indices: np.ndarray) -> np.ndarray:
        """The images before their rotation, float32 ``(B, C, H, W)`` in [0, 1], for these indices."""
        if self.upright is None:
            raise DataError("this split holds no upright images (only rot-MNIST rebuilt from the MNIST IDX files "
                            "does): augment='redraw' cannot draw fresh rotations of it")
        return _as_float(self.upright[indices])


class ConcatSplit:
    """Two splits as one (e.g. training and validation digits for a final model): index ``i`` reads the first
    split below its length and the second above it."""

    def __init__(self, first: Split, second: Split):
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._gather(lambda split, chosen: split.get_batch(chosen), indices)

    def get_upright(self, indices: np.ndarray) -> np.ndarray:
        return self._gather(lambda split, chosen: (split.get_upright(chosen),), indices)[0]

    def _gather(self, fetch, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        """``fetch(split, indices)``'s arrays from both splits, in the order of ``indices``."""
        indices = np.asarray(indices)
        in_first = indices < len(self.first)
        parts = [fetch(split, chosen) for split, chosen in
                 ((self.first, indices[in_first]), (self.second, indices[~in_first] - len(self.first)))
                 if len(chosen)] or [fetch(self.first, indices)]  # no indices: the first split's empty arrays
        # Back into the order asked for: the first split's examples came first.
        order = np.argsort(np.concatenate([np.flatnonzero(in_first), np.flatnonzero(~in_first)]), kind="stable")
        return tuple(np.concatenate([part[k] for part in parts])[order] for k in range(len(parts[0])))


class SubsetSplit:
    """The examples ``indices`` of a split, in that order (a sample to recompute, the first n of a split)."""

    def __init__(self, split: Split, indices):
        self.split, self.indices = split, np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.split.get_batch(self.indices[np.asarray(indices)])


@dataclass(frozen=True)
class Splits:
    """A dataset: its spec and its train / valid / test splits."""

    spec: DatasetSpec
    train: Split
    valid: Split
    test: Split

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "valid": len(self.valid), "test": len(self.test)}
