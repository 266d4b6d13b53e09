"""The cohort's parts that need no cluster (:mod:`app.slides.cohort`, :mod:`app.slides.provenance`): the progress
bar, folders of slides, a failed slide's row, the code hash's rule."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from app.slides.cli import main
from app.slides.cohort import SUMMARY_COLUMNS, CohortProgress, SlideRun, find_slides, summary_row
from app.slides.provenance import code_sha256
from app.slides.reader import SlideError


def test_the_progress_bar_counts_cells_slides_chunks_and_time_left():
    counts = CohortProgress(slides=3, chunks=12, cells=1000, started=100.0)
    assert counts.line(now=101.0) == ("[------------------------] 0/1,000 cells, 0/3 slides, 0/12 chunks, "
                                      "time left unknown")
    counts.cells_done = counts.cells_read_back = 200  # read back: no part of the rate
    counts.chunks_done = 3
    assert counts.line(now=110.0).endswith("200/1,000 cells, 0/3 slides, 3/12 chunks, time left unknown")
    counts.cells_done, counts.chunks_done, counts.slides_done = 600, 7, 1
    assert counts.line(now=110.0) == ("[##############----------] 600/1,000 cells, 1/3 slides, 7/12 chunks, "
                                      "10 s left"), "400 cells in 10 s, 400 to go"
    counts.cells_done, counts.chunks_done, counts.slides_done = 1000, 12, 3
    assert counts.line(now=112.5).endswith("] 1,000/1,000 cells, 3/3 slides, 12/12 chunks, done in 12.5 s")


def test_a_folder_gives_its_slides_and_images_by_name_and_an_empty_one_a_sentence(tmp_path):
    for name in ("b.svs", "a.tif", "c.png", "notes.txt", "d.NDPI"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "e.svs").write_bytes(b"x")
    assert [p.name for p in find_slides([tmp_path, tmp_path / "inner" / "e.svs"])] == [
        "a.tif", "b.svs", "c.png", "d.NDPI", "e.svs"], "a folder's own files, not its subfolders'"
    (tmp_path / "inner" / "e.svs").unlink()
    with pytest.raises(SlideError, match=r"^inner/ holds no slide or image \(\.bif, "):
        find_slides([tmp_path / "inner"])


def test_a_folder_without_slides_ends_the_command_with_a_sentence(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: empty/ holds no slide or image") and "Traceback" not in err


def test_a_slide_that_could_not_be_planned_has_its_sentence_and_no_numbers():
    row = summary_row(SlideRun(Path("x/cut.svs"), error="cut.svs is empty (0 bytes)"), None, "w", "c")
    assert list(row) == list(SUMMARY_COLUMNS)
    assert (row["slide"], row["status"], row["error"], row["code_sha256"]) == ("cut.svs", "error",
                                                                               "cut.svs is empty (0 bytes)", "c")
    assert row["stain"] == "none", "the normalisation asked for is named, the slide as scanned by default"
    assert row["precision"] == "float32", "the precision decided is named, float32 by default"
    named = ("slide", "status", "error", "stain", "precision", "code_sha256")
    assert all(row[key] == "" for key in SUMMARY_COLUMNS if key not in named)


def test_the_code_hash_is_the_sha256sum_listing_of_the_numbers_code(tmp_path):
    files = {"models/net.py": b"a", "models/cpu/k.cpp": b"b", "app/slides/run.py": b"c", "app/region/r.py": b"d",
             "app/analysis/x.py": b"e", "app/ui/page.py": b"not hashed", "models/__pycache__/net.py": b"nor this",
             "models/notes.md": b"nor this", "training/loop.py": b"nor this"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    hashed = sorted(name for name in files if not files[name].startswith(b"no"))
    listing = "".join(f"{hashlib.sha256(files[name]).hexdigest()}  {name}\n" for name in hashed)
    assert code_sha256(tmp_path) == hashlib.sha256(listing.encode()).hexdigest()
    if shutil.which("sha256sum"):
        shell = subprocess.run(["sha256sum", *hashed], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert shell.stdout == listing, "the listing is sha256sum's"


def test_a_file_named_twice_is_one_slide_and_two_files_of_one_name_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for path in (tmp_path / "a" / "s.svs", tmp_path / "b" / "s.tif"):
        path.write_bytes(b"x")
    assert find_slides([tmp_path / "a", tmp_path / "a" / "s.svs", tmp_path / "a" / ".." / "a" / "s.svs"]) == [
        tmp_path / "a" / "s.svs"]
    with pytest.raises(SlideError, match=r"^two slides named s: .* would overwrite each other"):
        find_slides([tmp_path / "a", tmp_path / "b"])


def test_a_slide_whose_chunks_fail_on_a_worker_is_recorded_and_the_others_finish(tmp_path):
    """The slide is cut short after its plan (as a file replaced while a cohort runs): its chunks fail on the
    worker with the reader's sentence, its other chunks are dropped, and the next slide finishes."""
    import numpy as np
    from dask.distributed import Client
    from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

    from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
    from app.slides.cohort import run_cohort
    from app.slides.run import plan_slide
    from models import load_checkpoint
    from tests.conftest import require_shared

    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    rgb = np.round(pcam_test_mosaic(card, PCAM, count=4).image.transpose(1, 2, 0) * 255).astype(np.uint8)
    write_pyramid(tmp_path / "cut.tif", np.ascontiguousarray(np.rot90(rgb)), PCAM_MPP)
    write_pyramid(tmp_path / "whole.tif", rgb, PCAM_MPP)

    def planner(path: Path):
        plan = plan_slide(path, CHECKPOINT, tmp_path / "store", chunk=2)
        if path.name == "cut.tif":
            path.write_bytes(path.read_bytes()[:5000])
        return plan

    told, runs = [], [SlideRun(tmp_path / "cut.tif"), SlideRun(tmp_path / "whole.tif")]
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        counts = run_cohort(runs, lambda: client, planner, finished=told.append)
    cut, whole = runs
    assert cut.error.startswith("cut.tif is neither a slide OpenSlide reads nor an image this app reads: the image "
                                "file is truncated or corrupt") and not cut.done
    assert whole.error is None and whole.done and whole.computed == counts.chunks > 0
    assert cut.plan is None and whole.plan is None, "let go once written"
    assert told == [cut, whole] and (counts.slides, counts.slides_done) == (1, 1)
    assert counts.chunks == counts.chunks_done == len(list((tmp_path / "store").glob("*/chunk-*.npz"))), \
        "the cut slide's chunks left the counts"


def test_a_scheduler_lost_while_chunks_are_submitted_is_named_as_lost(tmp_path):
    """A scheduler can go while the cohort still submits (a fast first chunk, then the scheduler killed): the closed
    connection is the same sentence as a task cancelled by a lost scheduler, not the connection's own words."""
    import numpy as np
    from dask.distributed import Client
    from distributed.comm.core import CommClosedError
    from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

    from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
    from app.slides.cohort import SchedulerLost, run_cohort
    from app.slides.run import plan_slide
    from tests.conftest import require_shared

    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    write_pyramid(tmp_path / "a.tif", np.round(pcam_test_mosaic({}, PCAM, count=4).image.transpose(1, 2, 0) * 255)
                  .astype(np.uint8), PCAM_MPP)

    def gone(*args, **kwargs):
        raise CommClosedError("in <TCP (closed) local=tcp://127.0.0.1:1 remote=tcp://127.0.0.1:2>: "
                              "ConnectionResetError: [Errno 104] Connection reset by peer")

    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        client.submit = gone
        with pytest.raises(SchedulerLost, match=r"^the Dask scheduler at tcp://127.0.0.1:2 stopped answering during "
                                                r"the run; the chunks finished so far are stored"):
            run_cohort([SlideRun(tmp_path / "a.tif")], lambda: client,
                       lambda path: plan_slide(path, CHECKPOINT, tmp_path / "s"), address="tcp://127.0.0.1:2")
