"""The slides the server offers: those in its slides folder and the two real demo slides, each by a short id.

The folder is ``$APP_SLIDES``, else ``slides/`` in the project (in Docker a mounted volume: ``docker run -v
/path/to/slides:/slides -e APP_SLIDES=/slides ...``); the demo slides are ``../shared/data/slides`` beside the
project where it is there. The browser sees names and ids, never a path: an id is a digest of the slide's folder,
name, size and modification time, and the server looks it up in this listing, so a request cannot name a file
outside it (``../`` or another folder finds nothing).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SlideEntry", "list_slides", "find_slide", "slides_folder", "DEMO_FOLDER", "SUFFIXES"]

REPO = Path(__file__).resolve().parents[2]
DEMO_FOLDER = REPO.parent / "shared" / "data" / "slides"
# What the listing offers: OpenSlide's formats and pyramidal TIFF (an ordinary image is region mode's).
SUFFIXES = frozenset({".svs", ".tif", ".tiff", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".bif", ".svslide"})


@dataclass(frozen=True)
class SlideEntry:
    """A slide the server offers: its id, the name shown, where it is, whether it is a demo slide."""

    slide_id: str
    name: str
    path: Path
    demo: bool


def slides_folder() -> Path:
    return Path(os.environ.get("APP_SLIDES") or REPO / "slides")


def _entries(folder: Path, demo: bool) -> list[SlideEntry]:
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in SUFFIXES and path.is_file():
            stat = path.stat()
            what = f"{folder.resolve()}|{path.name}|{stat.st_size}|{stat.st_mtime_ns}"
            found.append(SlideEntry(hashlib.sha256(what.encode()).hexdigest()[:16], path.name, path, demo))
    return found


def list_slides(folder: Path | None = None, demo_folder: Path | None = DEMO_FOLDER) -> list[SlideEntry]:
    """The server's slides (``folder``, default :func:`slides_folder`), then the demo slides."""
    return _entries(folder or slides_folder(), False) + (_entries(demo_folder, True) if demo_folder else [])


def find_slide(slide_id: str, entries: list[SlideEntry] | None = None) -> SlideEntry | None:
    """The listed slide with ``slide_id``, or None."""
    return next((entry for entry in (entries if entries is not None else list_slides())
                 if entry.slide_id == slide_id), None)
