"""The built-in gallery: rotated MNIST test digits and real PCam patches (see ``CREDITS.md``, ``make_gallery.py``).

``gallery.json`` lists the files with a caption, their source and credit, and
for H&E patches their micrometres per pixel and, where known, their true label.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GalleryItem", "list_gallery", "GALLERY_DIR"]

GALLERY_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class GalleryItem:
    """One gallery image.

    Attributes:
        path: the PNG file.
        kind: ``"digit"`` or ``"he"``.
        caption: short description for the picker.
        source, credit: where it comes from.
        microns_per_pixel: H&E patches only, else None.
        label: the true class name where the image has one (PCam: ``"tumor"`` or ``"no_tumor"``), else None.
    """

    path: Path
    kind: str
    caption: str
    source: str
    credit: str
    microns_per_pixel: float | None = None
    label: str | None = None

    @property
    def name(self) -> str:
        return self.path.name


def list_gallery(folder: Path = GALLERY_DIR, kind: str | None = None) -> list[GalleryItem]:
    """The gallery's items in ``gallery.json`` order, optionally only one kind."""
    manifest = folder / "gallery.json"
    if not manifest.is_file():
        return []
    items = [GalleryItem(folder / e["file"], e["kind"], e["caption"], e["source"], e["credit"],
                         e.get("microns_per_pixel"), e.get("label")) for e in json.loads(manifest.read_text())]
    return [item for item in items if kind is None or item.kind == kind]
