"""Dataset readers, by name: ``load_dataset("rot_mnist", "data/rot_mnist")``.

Each reader takes the folder the user names and returns :class:`Splits`; see
``base.py`` for what a split hands out. Readers are imported on first use, so
``h5py`` (PCam) is only needed by whoever reads PCam.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from .base import ArraySplit, ConcatSplit, DataError, DatasetSpec, Split, Splits, SubsetSplit

__all__ = ["load_dataset", "list_datasets", "can_fetch", "DataError", "DatasetSpec", "Split", "ArraySplit",
           "ConcatSplit", "SubsetSplit", "Splits"]

# name -> (module, function); every function is ``fn(root, **options) -> Splits``.
_READERS = {
    "rot_mnist": ("rot_mnist", "load_rot_mnist"),
    "cifar10": ("cifar10", "load_cifar10"),
    "pcam": ("pcam", "load_pcam"),
    "pcam_public": ("pcam_public", "load_pcam_public"),
}


def list_datasets() -> list[str]:
    return sorted(_READERS)


def _reader(name: str):
    if name not in _READERS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(list_datasets())}")
    module, function = _READERS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def can_fetch(name: str) -> bool:
    """Whether dataset ``name``'s reader can download what is missing (``fetch=True``)."""
    return "fetch" in inspect.signature(_reader(name)).parameters


def load_dataset(name: str, root: str | Path, **options) -> Splits:
    """Read dataset ``name`` from folder ``root``.

    Raises:
        ValueError: unknown dataset name.
        DataError: missing or corrupt files, named in the message.
    """
    return _reader(name)(Path(root), **options)
