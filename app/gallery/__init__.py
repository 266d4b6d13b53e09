"""The built-in gallery: rotated MNIST test digits, real PCam patches and an H&E region.

See ``CREDITS.md`` and ``make_gallery.py``.
``gallery.json`` lists the files with a caption, their source and credit, and
for H&E images their micrometres per pixel and, where known, their true label.
Regions (kind ``"region"``) are large images for a whole-region map, not model-sized
patches: :func:`list_patches` leaves them out, :func:`list_regions` lists only them.

May import: the standard library here; ``make_gallery`` (the script that made the files) also
:mod:`app.analysis`. Never Streamlit, pictures, region mode or the UI: they list the gallery, not it them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GalleryItem", "list_gallery", "list_patches", "list_regions", "GALLERY_DIR"]

GALLERY_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class GalleryItem:
    """One gallery image.

    Attributes:
        path: the image file (PNG digits; JPEG PCam patches, as found, and region).
        kind: ``"digit"``, ``"he"`` (a 96 x 96 PCam patch) or ``"region"`` (a large H&E image).
        caption: short description for the picker.
        source, credit: where it comes from.
        microns_per_pixel: H&E patches and regions only, else None.
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


def list_patches(folder: Path = GALLERY_DIR) -> list[GalleryItem]:
    """The digits and patches, in ``gallery.json`` order: every item except the regions."""
    return [item for item in list_gallery(folder) if item.kind != "region"]


def list_regions(folder: Path = GALLERY_DIR) -> list[GalleryItem]:
    """The large H&E regions, for a whole-region map."""
    return list_gallery(folder, kind="region")
