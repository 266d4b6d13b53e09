"""Uploaded slides: found by id in O(1), the quotas of a session and of the server, expiry least recently used first,
and two identical uploads at once (app/slides/uploads.py through app/slides/library.save_upload)."""

from __future__ import annotations

import io
import os
import threading
import time

import numpy as np
import pytest
from PIL import Image

import app.slides.uploads as uploads
from app.slides.library import find_slide, save_upload
from app.slides.reader import SlideError


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("APP_SLIDE_UPLOADS", str(tmp_path / "uploads"))
    monkeypatch.setenv("APP_SLIDE_PYRAMIDS", str(tmp_path / "pyramids"))
    monkeypatch.setattr(uploads, "_sessions", {})
    monkeypatch.setattr(uploads, "_last_used", {})
    return tmp_path / "uploads"


def png(seed: int, side: int = 40) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_a_session_over_its_quota_is_refused_with_a_sentence(folder, monkeypatch):
    monkeypatch.setenv("APP_SESSION_UPLOADS_MAX_COUNT", "2")
    first, second = save_upload("a.png", png(1), 2**20, "s1"), save_upload("b.png", png(2), 2**20, "s1")
    assert save_upload("a.png", png(1), 2**20, "s1").slide_id == first.slide_id, "the same bytes again: no new one"
    with pytest.raises(SlideError, match=r"c.png: this session has kept 2 uploads \(0.0 MB\); a session may keep 2 "):
        save_upload("c.png", png(3), 2**20, "s1")
    assert save_upload("c.png", png(3), 2**20, "s2").path.is_file(), "another session has its own quota"
    monkeypatch.setenv("APP_SESSION_UPLOADS_MAX_BYTES", str(len(png(4)) - 1))
    with pytest.raises(SlideError, match="d.png: this session has kept 1 uploads"):
        save_upload("d.png", png(4), 2**20, "s2")
    assert find_slide(second.slide_id).path == second.path


def test_the_server_lets_the_least_recently_used_upload_go_to_make_room(folder, monkeypatch):
    monkeypatch.setenv("APP_UPLOADS_MAX_COUNT", "2")
    old, used = save_upload("old.png", png(1), 2**20), save_upload("used.png", png(2), 2**20)
    (folder.parent / "pyramids").mkdir()
    pyramid = folder.parent / "pyramids" / f"{old.path.stem}.tif"
    pyramid.write_bytes(b"its pyramid")
    time.sleep(0.01)
    assert find_slide(old.slide_id) is not None  # used now: `used` is the least recently used
    new = save_upload("new.png", png(3), 2**20)
    assert not used.path.exists() and find_slide(used.slide_id) is None
    assert old.path.exists() and new.path.exists() and pyramid.exists()
    monkeypatch.setenv("APP_UPLOADS_MAX_BYTES", str(len(png(5, 80)) - 1))
    with pytest.raises(SlideError, match="big.png: this server keeps 0.0 MB of uploads in all, less than 0.0 MB"):
        save_upload("big.png", png(5, 80), 2**20)
    monkeypatch.setenv("APP_UPLOADS_MAX_BYTES", str(10 * 2**20))
    monkeypatch.setenv("APP_UPLOADS_MAX_AGE_HOURS", "0")
    time.sleep(0.01)
    save_upload("newest.png", png(6), 2**20)
    assert not old.path.exists() and not pyramid.exists() and not new.path.exists(), "expired, pyramid and all"


def test_an_upload_is_found_by_id_from_an_index_that_sees_other_processes_files(folder):
    entry = save_upload("a.png", png(1), 2**20)
    assert find_slide(entry.slide_id).path == entry.path
    other = folder / f"{'f' * 32}.png"
    other.write_bytes(png(2))  # written by another process: the folder's mtime changes
    os.utime(folder, ns=(time.time_ns() + 10**9,) * 2)
    found = [e for e in uploads._refreshed()["by_path"].values() if e.path == other]
    assert found and find_slide(found[0].slide_id).path == other
    assert find_slide("0" * 16) is None and find_slide("../" + entry.slide_id) is None


def test_two_identical_uploads_at_once_are_both_served(folder):
    data, ids, errors = png(7, 300), [], []

    def upload():
        try:
            ids.append(save_upload("same.png", data, 2**20).slide_id)
        except Exception as err:  # noqa: BLE001 - what the test looks for
            errors.append(repr(err))

    threads = [threading.Thread(target=upload) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(ids) == 6 and len(set(ids)) == 1, (errors, ids)
    assert [p.name for p in folder.iterdir()] == [find_slide(ids[0]).path.name], "one file kept, nothing hidden left"
