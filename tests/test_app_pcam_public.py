"""The app's reader of pcam_public's test split (app/analysis/pcam_public.py)."""

from __future__ import annotations

import pytest
from conftest import require_shared

from app.analysis.pcam_public import public_folder
from app.analysis.pcam_public import test_patches as read_test_split  # renamed: pytest would collect test_*


def test_the_real_test_split():
    folder = public_folder()
    require_shared(folder / "labels.csv", f"pcam_public is not at {folder}")
    patches = read_test_split(folder)
    assert len(patches) == 1944 and sum(p.label for p in patches) == 953
    assert all(p.file.startswith("test/") and (folder / p.file).is_file() for p in patches[:20])
    assert patches[0].credit.startswith("PatchCamelyon") and "public repository" in patches[0].credit


def test_missing_folder_gives_nothing_and_a_bad_header_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PCAM_PUBLIC_DIR", str(tmp_path / "nowhere"))
    assert public_folder() == tmp_path / "nowhere" and read_test_split() == []
    (tmp_path / "labels.csv").write_text("file,label,split\ntest/a.jpg,1,test\n")
    with pytest.raises(ValueError, match=r"labels\.csv lacks the column\(s\) encoding, near_uniform"):
        read_test_split(tmp_path)
