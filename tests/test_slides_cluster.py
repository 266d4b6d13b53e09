"""A cohort of slides (:mod:`app.slides.cohort`) on a real Dask cluster: ``dask scheduler`` and ``dask worker``
processes on 127.0.0.1 (:mod:`tests.dask_processes`), against the default ``LocalCluster`` run of the same
slides. Three small real pyramidal TIFFs of PCam test patches (the mosaic, turned and mirrored) and a damaged one.

- The cluster's stores equal the local run's, bit for bit; the damaged slide is in the summary with its sentence.
- A worker process killed (SIGKILL) mid-run: the run finishes, every chunk stored once, equal to the local run.
- The command killed mid-run and started again: the chunks it stored are read back, not computed (counted), and a
  damaged one is found by its checksum and computed again.
- The scheduler killed mid-run: a sentence naming its address, exit status 2; a later run on a new cluster resumes.

Every cluster's processes are killed as process groups when its test ends, pass or fail, and checked gone.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from dask_processes import DaskProcesses, wait_for
from test_slides_engine import CHECKPOINT, PCAM, write_pyramid

from app.cells.mosaic import PCAM_MPP, pcam_test_mosaic
from app.slides.cli import main
from models import load_checkpoint
from tests.conftest import REPO, require_shared

pytest.importorskip("dask.distributed")
RUN_TIMEOUT = 180  # seconds for one run of the three small slides, a cluster's start included
DAMAGED_SENTENCE = "damaged.svs is a TIFF-based slide that OpenSlide cannot read"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    """A folder of three slides (the mosaic of 9 PCam test patches, it turned, it mirrored) and a cut one."""
    require_shared(PCAM / "labels.csv", f"{PCAM} not found (pcam_public lives in ../shared/data)")
    _, card = load_checkpoint(CHECKPOINT)
    rgb = np.round(pcam_test_mosaic(card, PCAM, count=9).image.transpose(1, 2, 0) * 255).astype(np.uint8)
    folder = tmp_path_factory.mktemp("cohort")
    for name, pixels in (("a", rgb), ("b", np.rot90(rgb)), ("c", rgb[:, ::-1])):
        write_pyramid(folder / f"{name}.tif", np.ascontiguousarray(pixels), PCAM_MPP)
    (folder / "damaged.svs").write_bytes((folder / "a.tif").read_bytes()[:5000])
    return folder


def argv(cohort: Path, out: Path, *more: str) -> list[str]:
    return [str(cohort), "--out", str(out), "--checkpoint", str(CHECKPOINT), "--chunk", "3", *more]


def store_files(out: Path) -> dict[str, bytes]:
    """Every file of every slide's store under ``out``, by its path there."""
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted((out / ".chunks").rglob("*"))
            if path.is_file()}


def stored_chunks(out: Path) -> list[Path]:
    """The chunks stored whole: those with their checksum beside them."""
    return sorted(path for path in (out / ".chunks").glob("*/chunk-*.npz") if path.with_suffix(".sha256").is_file())


def counts(stdout: str) -> tuple[int, int]:
    """``(read back, computed)`` chunks from the cohort's line on stdout."""
    read, computed = re.search(r"\((\d+) read back, (\d+) computed\)", stdout).groups()
    return int(read), int(computed)


@pytest.fixture(scope="module")
def local_run(cohort, tmp_path_factory):
    """The default run: a ``LocalCluster`` the command starts itself. Returns its folder, exit status, stdout."""
    out = tmp_path_factory.mktemp("local")
    stdout = tmp_path_factory.mktemp("log") / "stdout"
    result = subprocess.run([sys.executable, "-m", "app.slides", *argv(cohort, out)], cwd=REPO, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT)
    stdout.write_text(result.stdout)
    return out, result.returncode, result.stdout, result.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and two workers of one thread each, on 127.0.0.1, for the tests of this module that leave it
    standing."""
    processes = DaskProcesses(tmp_path_factory.mktemp("dask"))
    try:
        processes.start_scheduler()
        processes.start_workers(2)
        yield processes
    finally:
        processes.close()


def in_thread(target, *args) -> tuple[threading.Thread, list]:
    """``target(*args)`` started in a thread; its return value lands in the list."""
    returned: list = []
    thread = threading.Thread(target=lambda: returned.append(target(*args)), daemon=True)
    thread.start()
    return thread, returned


def test_the_local_run_records_every_slide_and_the_damaged_one_with_its_sentence(local_run):
    out, code, stdout, stderr = local_run
    assert code == 2, "one slide of four could not be read"
    assert f"error: {DAMAGED_SENTENCE}" in stderr and "Traceback" not in stderr
    rows = {row["slide"]: row for row in csv.DictReader((out / "summary.csv").open())}
    assert list(rows) == ["a.tif", "b.tif", "c.tif", "damaged.svs"]
    assert rows["damaged.svs"]["status"] == "error" and rows["damaged.svs"]["error"].startswith(DAMAGED_SENTENCE)
    _, card = load_checkpoint(CHECKPOINT)
    for name in ("a", "b", "c"):
        row, cells = rows[f"{name}.tif"], np.load(out / f"{name}.npz")
        tumour = cells["probability"][cells["evaluated"]]
        assert row["status"] == "done" and row["error"] == "" and row["weights_sha256"] == card["weights_sha256"]
        assert int(row["cells_evaluated"]) == cells["evaluated"].sum() == 42  # of 7 x 7, in 3 x 3 palindromic chunks
        assert float(row["max_tumour_probability"]) == pytest.approx(tumour.max(), abs=1e-6)
        assert float(row["mean_tumour_probability"]) == pytest.approx(tumour.mean(), abs=1e-6)
        cell_mm2 = (32 * PCAM_MPP / 1000) ** 2
        assert float(row["tumour_mm2_at_0.5"]) == pytest.approx((tumour >= 0.5).sum() * cell_mm2, abs=1e-4)
        assert 0 < float(row["tissue_mm2"]) <= (288 * PCAM_MPP / 1000) ** 2
        assert re.fullmatch(r"[0-9a-f]{64}", row["code_sha256"]) and row["chunks_computed"] == row["chunks"]
    # The three are one slide turned and mirrored: the same cells judged, the same numbers to round-off.
    assert len({rows[f"{n}.tif"]["max_tumour_probability"][:6] for n in "abc"}) == 1
    assert counts(stdout) == (0, len(stored_chunks(out)))


def test_the_cluster_gives_the_local_runs_stores_bit_for_bit(cohort, local_run, cluster, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(argv(cohort, out, "--scheduler", cluster.address)) == 2
    stdout, stderr = capsys.readouterr()
    assert f"error: {DAMAGED_SENTENCE}" in stderr and "3 of 4 slides done" in stdout
    reference = store_files(local_run[0])
    assert len(reference) == 2 * len(stored_chunks(local_run[0])) > 6
    assert store_files(out) == reference
    for name in ("a", "b", "c"):
        np.testing.assert_array_equal(np.load(out / f"{name}.npz")["probabilities"],
                                      np.load(local_run[0] / f"{name}.npz")["probabilities"])


def test_a_worker_killed_mid_run_loses_nothing_and_counts_nothing_twice(cohort, local_run, cluster, tmp_path,
                                                                        capsys):
    from dask.distributed import Client

    out = tmp_path / "out"
    total = len(stored_chunks(local_run[0]))
    thread, returned = in_thread(main, argv(cohort, out, "--scheduler", cluster.address))
    with Client(cluster.address, timeout="20s") as probe:
        wait_for(lambda: stored_chunks(out) if (out / ".chunks").is_dir() else None, RUN_TIMEOUT, "a first chunk")
        busy = wait_for(lambda: [w for w, keys in probe.processing().items() if keys], 30, "a busy worker")
        pid = probe.run(os.getpid, workers=[busy[0]])[busy[0]]
        assert len(stored_chunks(out)) < total, "killed mid-run"
        os.kill(pid, signal.SIGKILL)
    thread.join(RUN_TIMEOUT)
    assert not thread.is_alive() and returned == [2]
    stdout = capsys.readouterr().out
    assert counts(stdout) == (0, total), "each chunk computed once into the store, whichever worker finished it"
    assert store_files(out) == store_files(local_run[0])


def test_the_command_killed_and_started_again_redoes_only_what_is_missing_or_damaged(cohort, local_run, cluster,
                                                                                     tmp_path, capsys):
    out = tmp_path / "out"
    total = len(stored_chunks(local_run[0]))
    command = subprocess.Popen([sys.executable, "-m", "app.slides", *argv(cohort, out, "--scheduler",
                                                                          cluster.address)],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: stored_chunks(out) if (out / ".chunks").is_dir() else None, RUN_TIMEOUT, "a first chunk")
    finally:
        os.killpg(command.pid, signal.SIGKILL)
        command.wait(30)
    kept = stored_chunks(out)
    assert 0 < len(kept) < total, "killed mid-run"
    damaged, kept = kept[0], kept[1:]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    before = {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in kept}

    assert main(argv(cohort, out, "--scheduler", cluster.address)) == 2
    assert counts(capsys.readouterr().out) == (len(kept), total - len(kept))
    assert {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in kept} == before, "not written again"
    assert store_files(out) == store_files(local_run[0])


def test_a_lost_scheduler_is_named_and_a_later_run_resumes(cohort, local_run, tmp_path, capsys):
    out = tmp_path / "out"
    total = len(stored_chunks(local_run[0]))
    first, second = DaskProcesses(tmp_path / "first"), DaskProcesses(tmp_path / "second")
    try:
        address = first.start_scheduler()
        first.start_workers(1)
        thread, returned = in_thread(main, argv(cohort, out, "--scheduler", address))
        wait_for(lambda: stored_chunks(out) if (out / ".chunks").is_dir() else None, RUN_TIMEOUT, "a first chunk")
        first.kill_scheduler()
        thread.join(RUN_TIMEOUT)
        assert not thread.is_alive() and returned == [2]
        stderr = capsys.readouterr().err
        assert f"error: the Dask scheduler at {address} stopped answering during the run" in stderr
        assert "Traceback" not in stderr
        kept = len(stored_chunks(out))
        assert 0 < kept < total

        second.start_scheduler()
        second.start_workers(1)
        assert main(argv(cohort, out, "--scheduler", second.address)) == 2
        assert counts(capsys.readouterr().out) == (kept, total - kept)
        assert store_files(out) == store_files(local_run[0])
    finally:
        first.close()
        second.close()


def test_the_slide_page_says_where_its_analyses_run(cluster, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    import app.ui.slide_page as slide_page
    from app.slides.library import DEMO_FOLDER

    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    monkeypatch.setenv("APP_SLIDE_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("AAGC_DASK_SCHEDULER", cluster.address)
    try:
        at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=120).run()
        at = at.sidebar.radio(key="view").set_value("Slide").run()
        # ... and in which precision (the one the plan decided; auto: float32 or, with AMX, bfloat16)
        said = f"Runs on 2 workers, none with a GPU, on the Dask scheduler at {cluster.address}, in "
        deadline = time.monotonic() + 60  # the plan and the client are made in the background
        while said not in " ".join(caption.value for caption in at.caption) and time.monotonic() < deadline:
            time.sleep(0.2)
            at.run()
        assert not at.exception
        captions = " ".join(caption.value for caption in at.caption)
        assert said + "float32." in captions or said + "bfloat16." in captions
    finally:
        slide_page.close_dask_client()
        slide_page._cluster_sentence.clear()
