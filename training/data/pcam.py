"""PatchCamelyon (PCam): 96x96 H&E patches labelled by tumour tissue in their central 32x32 pixels.

Two layouts, told apart by what ``root`` holds:

* the official HDF5 files ``camelyonpatch_level_2_split_{train,valid,test}_{x,y}.h5``
  (262,144 / 32,768 / 32,768 patches; x ``(N, 96, 96, 3)`` uint8, y ``(N, 1, 1, 1)``),
  read lazily: the training set is 7 GB, more than a loader should hold in memory;
* an image folder ``{train,valid,test}/{no_tumor,tumor}/*.png`` (or jpg, tif, bmp, webp),
  each image 96x96, read on demand.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .base import DataError, DatasetSpec, Splits

__all__ = ["load_pcam", "pcam_spec", "read_patch", "H5Split", "ImageFolderSplit", "CLASS_NAMES", "LABEL_NOTE"]

CLASS_NAMES = ("no_tumor", "tumor")
# Per-channel normalisation of [0, 1] pixels, as the paper's code (its transforms.Normalize constants).
MEAN = (0.701, 0.538, 0.692)
STD = (0.235, 0.277, 0.213)
SPLITS = ("train", "valid", "test")
SIZE = 96
LABEL_NOTE = "label: tumour tissue in the central 32x32 pixels"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp"}
_H5_PREFIX = "camelyonpatch_level_2_split_"


def _h5_name(split: str, part: str) -> str:
    return f"{_H5_PREFIX}{split}_{part}.h5"


def _empty_batch() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 3, SIZE, SIZE), dtype=np.float32), np.zeros(0, dtype=np.int64)


class H5Split:
    """One split of the official HDF5 files: labels in memory, images read per batch.

    The image file is opened on first use in each process (an HDF5 handle inherited through
    ``fork`` by a data-loader worker must not be shared), and never pickled.

    Args:
        x_path: the ``..._x.h5`` file, dataset ``x`` of shape ``(N, 96, 96, 3)`` uint8.
        labels: the ``N`` labels, 0 or 1.
    """

    def __init__(self, x_path: Path, labels: np.ndarray):
        self.x_path = Path(x_path)
        self.labels = np.asarray(labels, dtype=np.int64)
        self._file = None
        self._pid = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None, "_pid": None}

    def _images(self):
        if self._file is None or self._pid != os.getpid():
            import h5py

            self._file = h5py.File(self.x_path, "r")
            self._pid = os.getpid()
        return self._file["x"]

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0:
            return _empty_batch()
        labels = self.labels[indices]  # also raises IndexError for indices out of range
        indices = indices % len(self)
        # HDF5 reads a selection only in increasing order without repeats; restore the order after
        unique, inverse = np.unique(indices, return_inverse=True)
        try:
            images = self._images()[unique][inverse]  # (B, 96, 96, 3)
        except OSError as e:
            raise DataError(f"cannot read patches from PCam file {self.x_path}: {e}") from e
        return images.transpose(0, 3, 1, 2).astype(np.float32) / 255.0, labels


class ImageFolderSplit:
    """One split of the image-folder layout: paths and labels in memory, images read per batch."""

    def __init__(self, paths: list[Path], labels: np.ndarray):
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.paths)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0:
            return _empty_batch()
        images = np.stack([read_patch(self.paths[i]) for i in indices])  # (B, 96, 96, 3)
        return images.transpose(0, 3, 1, 2).astype(np.float32) / 255.0, self.labels[indices]


def read_patch(path: Path, kind: str = "PCam image") -> np.ndarray:
    """One 96x96 RGB patch as uint8 ``(96, 96, 3)``; a missing, unreadable or misshapen file is a DataError.

    ``kind`` names the file in the message (e.g. ``"PCam subset image"``).
    """
    from PIL import Image

    if not path.is_file():
        raise DataError(f"{kind} {path} not found")
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise DataError(f"cannot read {kind} {path}: {e}") from e
    if rgb.size != (SIZE, SIZE):
        raise DataError(f"{kind} {path} is {rgb.size[0]}x{rgb.size[1]}, expected {SIZE}x{SIZE}")
    return np.asarray(rgb)


def _check_h5(split: str, root: Path) -> H5Split:
    """Open both files of a split once, check shapes and dtypes, keep the labels."""
    import h5py

    x_path, y_path = root / _h5_name(split, "x"), root / _h5_name(split, "y")
    for path in (x_path, y_path):
        if not path.is_file():
            packed = path.with_name(path.name + ".gz")
            if packed.is_file():
                raise DataError(f"PCam file {path} is still gzipped ({packed.name}): run `gunzip {packed}` first")
            raise DataError(f"PCam file {path} not found")
    try:
        with h5py.File(x_path, "r") as f:
            x = f.get("x")
            if not isinstance(x, h5py.Dataset):
                raise DataError(f"PCam file {x_path} has no dataset 'x'")
            if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (SIZE, SIZE, 3):
                raise DataError(f"PCam file {x_path}: 'x' must be uint8 (N, 96, 96, 3), got {x.dtype} {x.shape}")
            count = x.shape[0]
        with h5py.File(y_path, "r") as f:
            y = f.get("y")
            if not isinstance(y, h5py.Dataset):
                raise DataError(f"PCam file {y_path} has no dataset 'y'")
            if y.dtype.kind not in "iub" or y.ndim < 1 or any(d != 1 for d in y.shape[1:]):
                raise DataError(f"PCam file {y_path}: 'y' must be integers (N, 1, 1, 1), got {y.dtype} {y.shape}")
            labels = y[()].reshape(-1).astype(np.int64)  # (N, 1, 1, 1) -> (N,)
    except OSError as e:
        raise DataError(f"cannot read PCam file {x_path} or {y_path} (not HDF5, truncated?): {e}") from e
    if len(labels) != count:
        raise DataError(f"PCam files disagree: {x_path} holds {count} patches, {y_path} {len(labels)} labels")
    if labels.size and not np.isin(labels, (0, 1)).all():
        raise DataError(f"PCam file {y_path}: labels must be 0 or 1, found {sorted(set(labels.tolist()) - {0, 1})}")
    return H5Split(x_path, labels)


def _folder_split(folder: Path) -> ImageFolderSplit:
    if not folder.is_dir():
        raise DataError(f"PCam folder {folder} not found (expected {', '.join(SPLITS)} beside it)")
    others = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name not in CLASS_NAMES)
    if others:
        raise DataError(f"PCam folder {folder} holds {', '.join(others)}; class folders must be named "
                        f"{' and '.join(CLASS_NAMES)}")
    paths, labels = [], []
    for label, name in enumerate(CLASS_NAMES):
        if (folder / name).is_dir():
            found = sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            paths += found
            labels += [label] * len(found)
    if not paths:
        raise DataError(f"PCam folder {folder} holds no images in {'/ or '.join(CLASS_NAMES)}/ "
                        f"({', '.join(sorted(IMAGE_SUFFIXES))})")
    return ImageFolderSplit(paths, np.array(labels))


def load_pcam(root: Path) -> Splits:
    """Read PCam from the official HDF5 files or from an image folder, whichever ``root`` holds.

    Args:
        root: folder of the six ``camelyonpatch_level_2_split_*.h5`` files, or of
            ``train``/``valid``/``test`` each with ``no_tumor``/``tumor`` image folders.

    Returns:
        Splits of float32 ``(N, 3, 96, 96)`` RGB patches in [0, 1]; label 1 is tumour.

    Raises:
        DataError: missing, gzipped, corrupt or misshapen files, named in the message (an image
            of the folder layout is only opened when a batch needs it).
    """
    root = Path(root)
    if any(root.glob(_H5_PREFIX + "*")):
        splits = {split: _check_h5(split, root) for split in SPLITS}
        source = "PatchCamelyon HDF5 files camelyonpatch_level_2_split_{train,valid,test}_{x,y}.h5"
    elif (root / "train").is_dir():
        splits = {split: _folder_split(root / split) for split in SPLITS}
        source = f"PCam-style image folders {{train,valid,test}}/{{{','.join(CLASS_NAMES)}}} in {root.name}"
    else:
        raise DataError(f"no PCam data in {root}: expected the files {_h5_name('train', 'x')} (and the other five "
                        f"splits/parts), or folders train/, valid/, test/ each with {' and '.join(CLASS_NAMES)}/")
    spec = pcam_spec("pcam", f"{source} ({', '.join(f'{len(s):,} {n}' for n, s in splits.items())})")
    return Splits(spec=spec, **splits)


def pcam_spec(name: str, source: str, notes: str = LABEL_NOTE, mean: tuple[float, ...] = MEAN,
              std: tuple[float, ...] = STD, **more) -> DatasetSpec:
    """The spec of a dataset of PCam patches (this one, or pcam_public): two classes (:data:`CLASS_NAMES`), 96 x 96
    RGB patches labelled by PCam's rule (:data:`LABEL_NOTE`); ``more``: the other fields of :class:`DatasetSpec`."""
    return DatasetSpec(name=name, num_classes=2, channels=3, size=SIZE, mean=mean, std=std, class_names=CLASS_NAMES,
                       source=source, notes=notes, **more)
