"""The test split of ``../shared/data/pcam_public`` as the app uses it: real PCam test patches with their labels.

The gallery draws its H&E patches from it and region mode lays its demo mosaic out of it: patches that no
shipped H&E model trained on (the pcam_public models trained on its train split; the pcam_subset ones on a
disjoint set). Read in place from ``$PCAM_PUBLIC_DIR`` (default ``../shared/data/pcam_public`` from the
working directory), never copied; the app never imports ``training``, so this reads ``labels.csv`` itself.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PublicPatch", "public_folder", "test_patches", "PCAM_CREDIT"]

PCAM_CREDIT = ("PatchCamelyon (Veeling, Linmans, Winkens, Cohen, Welling, MICCAI 2018; Camelyon16 lymph-node "
               "slides), CC0 1.0")


@dataclass(frozen=True)
class PublicPatch:
    """One test patch: its file (relative to the folder), label (1 tumour), and where it was found."""

    file: str
    label: int
    near_uniform: bool
    encoding: str
    source: str  # repository @ commit : path

    @property
    def credit(self) -> str:
        return f"{PCAM_CREDIT}; this copy via the public repository {self.source.split(' @ ')[0]}"


def public_folder() -> Path:
    """Where pcam_public is read from (``$PCAM_PUBLIC_DIR``, else ``../shared/data/pcam_public``)."""
    return Path(os.environ.get("PCAM_PUBLIC_DIR", "../shared/data/pcam_public"))


def test_patches(folder: Path | None = None) -> list[PublicPatch]:
    """The test split's patches in ``labels.csv`` order; an empty list where the folder is not reachable.

    Raises:
        ValueError: a ``labels.csv`` that lacks the columns this reads.
    """
    labels = (folder or public_folder()) / "labels.csv"
    if not labels.is_file():
        return []
    with open(labels, newline="") as f:
        rows = list(csv.DictReader(f))
    needed = {"file", "label", "split", "near_uniform", "encoding", "source_repo", "source_commit", "source_path"}
    if rows and not needed <= set(rows[0]):
        raise ValueError(f"{labels} lacks the column(s) {', '.join(sorted(needed - set(rows[0])))}")
    return [PublicPatch(r["file"], int(r["label"]), r["near_uniform"] == "1", r["encoding"],
                        f"{r['source_repo']} @ {r['source_commit'][:8]} : {r['source_path']}")
            for r in rows if r["split"] == "test"]
