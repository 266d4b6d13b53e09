"""A slide the server offers, as the listing (:mod:`app.slides.library`) and the demo images (:mod:`app.slides.demos`)
name it: by an id that is a digest of where the file is and what it is, never by a path the browser sends."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SlideEntry", "entry_of"]


@dataclass(frozen=True)
class SlideEntry:
    """A slide the server offers: its id, the name shown, where it is, whether it is a demo slide; for a demo
    image, its scale (which an image does not record), the file of its cells' true labels where known, and what to say
    of it (its source, its limits)."""

    slide_id: str
    name: str
    path: Path
    demo: bool
    microns_per_pixel: float | None = None
    truth: Path | None = None
    note: str = ""


def entry_of(path: Path, demo: bool, **known) -> SlideEntry:
    """The entry of the file ``path``: its id a digest of its folder, name, size and modification time."""
    stat = path.stat()
    what = f"{path.parent.resolve()}|{path.name}|{stat.st_size}|{stat.st_mtime_ns}"
    return SlideEntry(hashlib.sha256(what.encode()).hexdigest()[:16], path.name, path, demo, **known)
