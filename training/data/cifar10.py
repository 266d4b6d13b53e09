"""CIFAR-10 from the official python batches (``cifar-10-batches-py``), read without trusting pickle.

The batches are pickles, and unpickling runs whatever callables a file names. The reader
therefore allows only the three globals numpy needs to rebuild an array; any other name
(``os.system``, ``builtins.eval``, ...) is refused before anything is called.

Split as the paper: train = ``data_batch_1..4`` (40,000), valid = ``data_batch_5`` (10,000),
test = ``test_batch`` (10,000).
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np

from .base import ArraySplit, DataError, DatasetSpec, Splits

__all__ = ["load_cifar10", "load_batch", "CLASS_NAMES"]

FOLDER = "cifar-10-batches-py"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLIT_FILES = {
    "train": ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4"),
    "valid": ("data_batch_5",),
    "test": ("test_batch",),
}
# (module, name) -> where it lives now; numpy 2 moved numpy.core to numpy._core
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): ("numpy._core.multiarray", "numpy.core.multiarray"),
    ("numpy._core.multiarray", "_reconstruct"): ("numpy._core.multiarray", "numpy.core.multiarray"),
    ("numpy", "ndarray"): ("numpy",),
    ("numpy", "dtype"): ("numpy",),
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Resolves only the globals that rebuild numpy arrays; anything else raises DataError."""

    def __init__(self, file, path: Path):
        super().__init__(file, encoding="bytes")
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise DataError(f"{self.path} asks to load {module}.{name}, which a CIFAR-10 batch never needs; refused")
        for home in _ALLOWED[module, name]:
            try:
                return getattr(importlib.import_module(home), name)
            except (ImportError, AttributeError):
                continue
        raise DataError(f"{self.path} needs {module}.{name}, which this numpy lacks")


def _unpickle(path: Path) -> object:
    try:
        with open(path, "rb") as f:
            return _NumpyOnlyUnpickler(f, path).load()
    except DataError:
        raise
    except FileNotFoundError as e:
        raise DataError(f"CIFAR-10 file {path} not found") from e
    except Exception as e:  # a corrupt pickle raises almost anything (UnpicklingError, EOFError, ValueError, ...)
        raise DataError(f"cannot read CIFAR-10 file {path} (truncated or corrupt?): {type(e).__name__}: {e}") from e


def load_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``(N, 3, 32, 32)`` and labels int64 ``(N,)`` of one batch file, checked.

    A row of ``b"data"`` is the red, green and blue 32x32 planes, each row by row, so it
    reshapes straight to ``(3, 32, 32)`` upright.
    """
    batch = _unpickle(path)
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{path} is not a CIFAR-10 batch (a dict with b'data' and b'labels')")
    data, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: b'data' must be a uint8 array (N, 3072), got "
                        f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DataError(f"{path}: b'labels' must be a list of integers") from e
    if labels.shape != (len(data),):
        raise DataError(f"{path}: {len(data)} images but labels of shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{path}: labels must lie in 0..9, found {labels.min()}..{labels.max()}")
    return data.reshape(-1, 3, 32, 32), labels  # (N, 3072) -> (N, C, H, W)


def _class_names(folder: Path) -> tuple[str, ...]:
    """Names from ``batches.meta`` when it is there and sane, else the standard ten."""
    path = folder / "batches.meta"
    if not path.is_file():
        return CLASS_NAMES
    meta = _unpickle(path)
    names = meta.get(b"label_names") if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != 10:
        raise DataError(f"{path}: b'label_names' must be a list of 10 names")
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def load_cifar10(root: Path) -> Splits:
    """Read CIFAR-10 from the python batches.

    Args:
        root: the ``cifar-10-batches-py`` folder, or a folder containing it.

    Returns:
        Splits of float32 ``(N, 3, 32, 32)`` images in [0, 1]; 40,000 / 10,000 / 10,000 for the
        real files (a batch of any length is accepted).

    Raises:
        DataError: a missing, corrupt or unsafe file, named in the message.
    """
    root = Path(root)
    folder = root if (root / "data_batch_1").exists() or not (root / FOLDER).is_dir() else root / FOLDER
    if not (folder / "data_batch_1").is_file():
        hint = " (unpack cifar-10-python.tar.gz first)" if any(root.glob("cifar-10-python.tar*")) else ""
        raise DataError(f"CIFAR-10 file {folder / 'data_batch_1'} not found: expected {root} to be {FOLDER} "
                        f"or to contain it{hint}")
    splits = {}
    for split, names in SPLIT_FILES.items():
        batches = [load_batch(folder / name) for name in names]
        images = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        splits[split] = ArraySplit(images, labels)
    spec = DatasetSpec(
        name="cifar10",
        num_classes=10,
        channels=3,
        size=32,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        class_names=_class_names(folder),
        source=(f"CIFAR-10 python batches in {FOLDER}: data_batch_1-4 train ({len(splits['train']):,}), "
                f"data_batch_5 valid ({len(splits['valid']):,}), test_batch test ({len(splits['test']):,})"),
    )
    return Splits(spec=spec, **splits)
