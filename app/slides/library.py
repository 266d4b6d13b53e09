"""The slides the server offers: those in its slides folder and the two real demo slides, each by a short id; and
the slides users upload.

The folder is ``$APP_SLIDES``, else ``slides/`` in the project (in Docker a mounted volume: ``docker run -v
/path/to/slides:/slides -e APP_SLIDES=/slides ...``); the demo slides are ``../shared/data/slides`` beside the
project where it is there. The browser sees names and ids, never a path: an id is a digest of the slide's folder,
name, size and modification time, and the server looks it up in this listing, so a request cannot name a file
outside it (``../`` or another folder finds nothing).

An upload (:func:`save_upload`) is written to the uploads folder (``$APP_SLIDE_UPLOADS``, else the project's user
cache), under a name of its content's digest, where the tile routes and the Dask workers read it as they read any
slide; it is listed to the session that uploaded it only (the page keeps its id), and found by id like the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
import time
from pathlib import Path

from .demos import demo_images
from .entries import SlideEntry, entry_of
from .reader import SlideError, open_slide
from .uploads import admit, find_upload, kept, uploads_folder

__all__ = ["SlideEntry", "list_slides", "find_slide", "slides_folder", "uploads_folder", "save_upload", "DEMO_FOLDER",
           "SUFFIXES", "UPLOAD_SUFFIXES", "IMAGE_SUFFIXES", "entry_of"]

REPO = Path(__file__).resolve().parents[2]
DEMO_FOLDER = REPO.parent / "shared" / "data" / "slides"
# What the listing offers: OpenSlide's formats, pyramidal TIFF, and ordinary images (a slide of one level whose scale
# the user gives: region and slide mode are one page).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp"})
SUFFIXES = frozenset({".svs", ".tif", ".tiff", ".ndpi", ".vms", ".vmu", ".scn", ".mrxs", ".bif", ".svslide"}) \
    | IMAGE_SUFFIXES
# What can be uploaded: the formats that are one file (MIRAX and the Hamamatsu VMS/VMU index files name others).
UPLOAD_SUFFIXES = tuple(sorted(SUFFIXES - {".mrxs", ".vms", ".vmu"}))


def slides_folder() -> Path:
    return Path(os.environ.get("APP_SLIDES") or REPO / "slides")


def _entries(folder: Path, demo: bool) -> list[SlideEntry]:
    if not folder.is_dir():
        return []
    return [entry_of(path, demo) for path in sorted(folder.iterdir())
            if path.suffix.lower() in SUFFIXES and not path.name.startswith(".") and path.is_file()]


def list_slides(folder: Path | None = None, demo_folder: Path | None = DEMO_FOLDER) -> list[SlideEntry]:
    """The server's slides (``folder``, default :func:`slides_folder`), then the demo slides and demo images (the
    CMU-1 region and the PCam test mosaic, :mod:`app.slides.demos`)."""
    demos = (_entries(demo_folder, True) + demo_images()) if demo_folder else []
    return _entries(folder or slides_folder(), False) + demos


def find_slide(slide_id: str, entries: list[SlideEntry] | None = None) -> SlideEntry | None:
    """The slide with ``slide_id`` in ``entries``, or None; by default among the listed slides and the uploads, by
    an index (a dict, O(1): :mod:`app.slides.uploads` for the uploads, the listing kept for
    :data:`LISTING_TTL_S` seconds and while its folders are unchanged)."""
    if entries is not None:
        return next((entry for entry in entries if entry.slide_id == slide_id), None)
    upload = find_upload(slide_id)
    if upload is not None:
        return upload
    return _listed_index().get(slide_id)


LISTING_TTL_S = 5.0  # a listing is made again after this, or at once where a folder's own mtime changed
_listing: dict = {"key": None, "at": 0.0, "by_id": {}}
_listing_lock = threading.Lock()


def _listed_index() -> dict[str, SlideEntry]:
    """The listed slides by id, made again where older than :data:`LISTING_TTL_S` or where the slides folder or
    the demo folder changed (a file added, renamed or removed changes its folder's mtime)."""
    folders = (slides_folder(), DEMO_FOLDER)
    key = tuple((str(folder), _mtime(folder)) for folder in folders)
    with _listing_lock:
        if _listing["key"] == key and time.monotonic() - _listing["at"] < LISTING_TTL_S:
            return _listing["by_id"]
    by_id = {entry.slide_id: entry for entry in list_slides()}
    with _listing_lock:
        _listing.update(key=key, at=time.monotonic(), by_id=by_id)
    return by_id


def _mtime(folder: Path) -> int | None:
    try:
        return folder.stat().st_mtime_ns
    except OSError:
        return None


def save_upload(name: str, data: bytes | memoryview, limit_bytes: int, session: str | None = None) -> SlideEntry:
    """Keep an uploaded slide named ``name`` in the uploads folder and return its entry (shown as ``name``).

    The file is named by its bytes' digest (an upload of the same slide again is the same file and the same id, its
    analyses kept), written whole under a name of its own before it is visible (two identical uploads at once are
    both served, one file kept), and opened once to prove it is a slide. The quotas (:mod:`app.slides.uploads`:
    ``session``'s count and bytes, where given, and the server's) are checked first; the server's are kept by
    letting the least recently used uploads go.

    Raises:
        SlideError: a name of no single-file slide format, more than ``limit_bytes``, over a quota, or bytes that
            are not a slide (the sentence of :func:`app.slides.reader.open_slide`); nothing is kept.
    """
    suffix = Path(name).suffix.lower()
    if suffix not in UPLOAD_SUFFIXES:
        raise SlideError(f"{name}: not a slide or image format that is one file; upload one of"
                         f" {', '.join(UPLOAD_SUFFIXES)} "
                         "(MIRAX and VMS slides are folders: put them in the server's slides folder)")
    if len(data) > limit_bytes:
        raise SlideError(f"{name} is {len(data) / 2**20:,.0f} MB, over this server's upload limit of "
                         f"{limit_bytes / 2**20:,.0f} MB: put it in the server's slides folder instead")
    folder = uploads_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:32]}{suffix}"  # the user's name is the session's only
    admit(name, path, len(data), session)
    if not path.exists():
        partial = path.with_name(f".{os.getpid()}-{secrets.token_hex(6)}-{path.name}")  # hidden; its own name
        partial.write_bytes(data)
        try:
            open_slide(partial).close()
        except SlideError as err:
            raise SlideError(str(err).replace(partial.name, name)) from None
        else:
            with contextlib.suppress(FileExistsError):  # the same bytes kept meanwhile: that file is this one
                os.link(partial, path)  # never replaces: a file kept keeps its mtime, so its id
        finally:
            partial.unlink(missing_ok=True)
    entry = kept(path, session)
    return SlideEntry(entry.slide_id, name, path, False)
