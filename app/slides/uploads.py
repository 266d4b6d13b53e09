"""The uploads folder's index, its quotas and its expiry: what :func:`app.slides.library.save_upload` keeps.

- Found by id in O(1): a dict of the folder's entries, made again only where the folder's own mtime changed (a
  file added or removed there, by this process or another); 5,000 uploads cost one scan, not one per tile.
- Quotas, each an environment variable (default in :data:`DEFAULTS`): a session may keep
  ``APP_SESSION_UPLOADS_MAX_COUNT`` uploads of ``APP_SESSION_UPLOADS_MAX_BYTES`` in all (over it: refused with a
  sentence); the server keeps ``APP_UPLOADS_MAX_COUNT`` uploads of ``APP_UPLOADS_MAX_BYTES`` in all, letting the
  least recently used go to make room for a new one (an upload larger than the whole is refused).
- Expiry: an upload not used (uploaded again, or found by id for a tile) for ``APP_UPLOADS_MAX_AGE_HOURS`` is
  deleted at the next upload, with the pyramid built for it (:mod:`app.slides.pyramid`, named as the upload).

When an upload was last used is known to this process (a restart starts from the files' mtimes); which session kept
which upload too (a session's quota counts what it kept since the server started).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from models.cpu.user_cache import cache_root

from .entries import SlideEntry, entry_of
from .reader import SlideError

__all__ = ["uploads_folder", "find_upload", "admit", "kept", "limit", "DEFAULTS"]

DEFAULTS = {
    "APP_UPLOADS_MAX_COUNT": 1000,
    "APP_UPLOADS_MAX_BYTES": 20 * 2**30,  # 20 GiB
    "APP_SESSION_UPLOADS_MAX_COUNT": 20,
    "APP_SESSION_UPLOADS_MAX_BYTES": 2 * 2**30,  # 2 GiB: ten uploads of Streamlit's default 200 MB limit
    "APP_UPLOADS_MAX_AGE_HOURS": 7 * 24,
}
_lock = threading.Lock()
_index: dict = {"folder": None, "mtime": None, "by_id": {}, "by_path": {}}
_last_used: dict[Path, float] = {}  # path -> time.time() of its last use
_sessions: dict[str, dict[Path, int]] = {}  # session -> {path: bytes} it kept


def uploads_folder() -> Path:
    """``$APP_SLIDE_UPLOADS``, else ``slide-uploads`` in the project's user cache."""
    return Path(os.environ.get("APP_SLIDE_UPLOADS") or cache_root() / "slide-uploads")


def limit(name: str) -> float:
    """The limit ``name`` (a key of :data:`DEFAULTS`): its environment variable where it is a number, else the
    default."""
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return float(DEFAULTS[name])


def _refreshed() -> dict:
    """The index, made again where the folder or its mtime changed (under ``_lock``)."""
    folder = uploads_folder()
    try:
        mtime = folder.stat().st_mtime_ns
    except OSError:
        mtime = None
    if (_index["folder"], _index["mtime"]) != (folder, mtime):
        by_path = {}
        if mtime is not None:
            for path in folder.iterdir():
                if not path.name.startswith(".") and path.is_file():
                    by_path[path] = entry_of(path, False)
                    _last_used.setdefault(path, path.stat().st_mtime)
        _index.update(folder=folder, mtime=mtime, by_path=by_path,
                      by_id={entry.slide_id: entry for entry in by_path.values()})
    return _index


def find_upload(slide_id: str) -> SlideEntry | None:
    """The upload with ``slide_id``, or None (and its use noted: the least recently used go first)."""
    with _lock:
        entry = _refreshed()["by_id"].get(slide_id)
        if entry is not None:
            _last_used[entry.path] = time.time()
        return entry


def admit(name: str, path: Path, size: int, session: str | None) -> None:
    """Make room for an upload of ``size`` bytes to be kept at ``path`` for ``session`` (None: no session's quota),
    letting expired and then the least recently used uploads go.

    Raises:
        SlideError: over the session's quota, or larger than the server keeps in all.
    """
    with _lock:
        index = _refreshed()
        _expire(index, time.time() - limit("APP_UPLOADS_MAX_AGE_HOURS") * 3600)
        mine = _sessions.get(session, {}) if session is not None else {}
        if session is not None and path not in mine:
            count, total = len(mine) + 1, sum(mine.values()) + size
            if count > limit("APP_SESSION_UPLOADS_MAX_COUNT") or total > limit("APP_SESSION_UPLOADS_MAX_BYTES"):
                raise SlideError(
                    f"{name}: this session has kept {len(mine)} uploads ({sum(mine.values()) / 2**20:,.1f} MB); "
                    f"a session may keep {limit('APP_SESSION_UPLOADS_MAX_COUNT'):,.0f} of "
                    f"{limit('APP_SESSION_UPLOADS_MAX_BYTES') / 2**20:,.0f} MB in all: open a new session, or ask "
                    "the server's keeper to put the slide in its slides folder")
        if path in index["by_path"]:
            return
        most_count, most_bytes = limit("APP_UPLOADS_MAX_COUNT"), limit("APP_UPLOADS_MAX_BYTES")
        if size > most_bytes or most_count < 1:
            raise SlideError(f"{name}: this server keeps {most_bytes / 2**20:,.1f} MB of uploads in all, less than "
                             f"{size / 2**20:,.1f} MB: put it in the server's slides folder instead")
        by_use = sorted(index["by_path"], key=lambda p: _last_used.get(p, 0.0))
        count, total = len(by_use), sum(_size(p) for p in by_use)
        for oldest in by_use:
            if count + 1 <= most_count and total + size <= most_bytes:
                break
            total -= _size(oldest)
            count -= 1
            _delete(oldest)
        _index["mtime"] = None  # changed here: made again at the next look


def kept(path: Path, session: str | None) -> SlideEntry:
    """The entry of the upload now kept at ``path``, noted as used now and as ``session``'s."""
    with _lock:
        _index["mtime"] = None
        entry = _refreshed()["by_path"][path]
        _last_used[path] = time.time()
        if session is not None:
            _sessions.setdefault(session, {})[path] = path.stat().st_size
        return entry


def _expire(index: dict, before: float) -> None:
    for path in [p for p in index["by_path"] if _last_used.get(p, 0.0) < before]:
        _delete(path)
    _index["mtime"] = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _delete(path: Path) -> None:
    """The upload at ``path`` gone, with its pyramid (named as the upload: both by the bytes' digest)."""
    from .pyramid import pyramids_folder

    path.unlink(missing_ok=True)
    (pyramids_folder() / f"{path.stem}.tif").unlink(missing_ok=True)
    _last_used.pop(path, None)
    for mine in _sessions.values():
        mine.pop(path, None)
