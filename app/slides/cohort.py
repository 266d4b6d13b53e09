"""A cohort of slides as one Dask computation: every chunk with tissue of every slide one task, a slide's tasks
submitted as soon as it is planned (the workers start on the first slide while the next are planned), all at once
(nobody looks at a cohort: as fast as the page's bounded queue, ``python -m benchmarks.schedule_pan``) and coarse to
fine over the slide (:func:`app.slides.order.spread_order`), each finished chunk into its slide's store as it
arrives, each slide finished (its outputs, its row of the summary) as its last chunk arrives, and then let go: the
command holds only the slides still running, and the cluster only the results not yet taken.

What a failure costs:
- a slide that cannot be planned (damaged, no scale, no tissue), or whose chunk raises on a worker, is recorded
  with its sentence (:class:`SlideRun` ``error``) and the others go on;
- a worker that dies takes only its running chunks with it: Dask's scheduler gives them to another worker (or to
  its nanny's new process), and a chunk's result is stored once, by this process, when it arrives;
- this process killed: the chunks already stored are read back by the next run and not computed again;
- the scheduler gone: :class:`SchedulerLost`, which names its address; what was stored stays.

Chunks are the tasks (:data:`app.slides.engine.CHUNK_CELLS`, 8 x 8 cells): a chunk of a slide with tissue is
seconds of a CPU's work, and the scheduler's cost per task is about a millisecond (``python -m benchmarks.slides
--cohort`` measures both), so scheduling is about 0.1 % of the work (docs/slides.md, "Chunks as tasks"; GPU workers
take ``--chunk 32``).
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from models import CheckpointError

from .engine import ChunkResult
from .order import spread_order
from .reader import SlideError
from .run import SlidePlan, chunk_key, submit_chunk

__all__ = ["SlideRun", "CohortProgress", "SchedulerLost", "find_slides", "plan_run", "run_cohort",
           "summary_row", "write_summary", "SUMMARY_COLUMNS"]

SUMMARY_COLUMNS = ("slide", "status", "error", "stain", "precision", "microns_per_pixel", "scale_source", "tissue_mm2",
                   "cells_evaluated", "mean_tumour_probability", "max_tumour_probability", "tumour_mm2_at_0.5",
                   "chunks", "chunks_computed", "worker_seconds", "seconds", "weights_sha256", "code_sha256")


class SchedulerLost(ConnectionError):
    """The Dask scheduler stopped answering during a run; the message names its address."""


@dataclass
class SlideRun:
    """One slide of a cohort as it runs: its plan, its finished chunks, and its error sentence if it failed.

    The plan is there while the slide runs: None before it is planned or when it could not be, and let go (with
    its thumbnail, the most of it) once the slide is done or has failed and its outputs and summary row are
    written, so that a cohort of hundreds of slides holds only those still running."""

    slide: Path
    plan: SlidePlan | None = None
    error: str | None = None
    results: dict[tuple[int, int], ChunkResult] = field(default_factory=dict)
    computed: int = 0  # chunks computed by this run (the rest were read back from the store)
    worker_seconds: float = 0.0  # the workers' time on this slide's chunks in this run
    seconds: float | None = None  # from the cohort's start to this slide's last chunk

    done: bool = False  # its last chunk is in, its outputs written; its chunks are then let go


@dataclass
class CohortProgress:
    """The cohort's counts as chunks arrive, and its progress bar (:meth:`line`)."""

    slides: int
    chunks: int
    cells: int
    started: float = field(default_factory=time.perf_counter)
    slides_done: int = 0
    chunks_done: int = 0
    cells_done: int = 0
    cells_read_back: int = 0  # not computed by this run: no part of the rate

    def line(self, now: float | None = None, width: int = 24) -> str:
        """``[#####-----] 1,200/2,500 cells, 1/3 slides, 6/12 chunks, 40 s left``."""
        elapsed = (now or time.perf_counter()) - self.started
        share = self.cells_done / self.cells if self.cells else 1.0
        bar = "#" * round(width * share) + "-" * (width - round(width * share))
        computed = self.cells_done - self.cells_read_back
        if self.cells_done >= self.cells:
            left = f"done in {elapsed:.1f} s"
        elif computed > 0:
            left = f"{(self.cells - self.cells_done) * elapsed / computed:.0f} s left"
        else:
            left = "time left unknown"
        return (f"[{bar}] {self.cells_done:,}/{self.cells:,} cells, {self.slides_done}/{self.slides} slides, "
                f"{self.chunks_done}/{self.chunks} chunks, {left}")


def find_slides(paths: list[Path]) -> list[Path]:
    """The slides named: files as given, a folder's slides and images (sorted by name, not its subfolders); a file
    named twice, once.

    Raises:
        SlideError: a folder without any slide or image in it; two files of one name (their outputs,
            ``DIR/<stem>.*``, would overwrite each other).
    """
    from .library import SUFFIXES

    found: dict[Path, Path] = {}
    for path in map(Path, paths):
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
            if not inside:
                raise SlideError(f"{path.name}/ holds no slide or image ({', '.join(sorted(SUFFIXES))})")
        else:
            inside = [path]
        for slide in inside:
            found.setdefault(slide.resolve(), slide)
    stems: dict[str, Path] = {}
    for slide in found.values():
        if slide.stem in stems:
            raise SlideError(f"two slides named {slide.stem}: {stems[slide.stem]} and {slide}; their outputs "
                             f"({slide.stem}.npz, .png, .geojson) would overwrite each other: give one of them "
                             "another name or run them apart")
        stems[slide.stem] = slide
    return list(found.values())


def plan_run(run: SlideRun, planner: Callable[[Path], SlidePlan]) -> None:
    """``run`` planned by ``planner`` (:func:`app.slides.run.plan_slide` with the run's settings), or its error
    sentence when its slide cannot be used.

    Raises:
        CheckpointError: the checkpoint cannot be used (no slide can be run).
    """
    try:
        run.plan = planner(run.slide)
    except CheckpointError:
        raise
    except (SlideError, OSError, ValueError) as err:
        run.error = str(err)


def _cells(plan: SlidePlan, index: tuple[int, int]) -> int:
    i0, i1, j0, j1 = plan.grid.cell_block(*index)
    return (i1 - i0) * (j1 - j0)


def run_cohort(runs: list[SlideRun], connect: Callable[[], object], planner: Callable[[Path], SlidePlan], *,
               address: str | None = None, progress: Callable[[CohortProgress], None] | None = None,
               finished: Callable[[SlideRun], None] | None = None) -> CohortProgress:
    """Every slide of ``runs`` planned (:func:`plan_run`) and its chunks with tissue submitted, slide after slide, so
    that the workers start on the first slide while the next ones are planned: the chunks in the slides' stores
    read back, the rest computed on the client ``connect()`` returns (a ``dask.distributed.Client``, asked for at
    the first chunk to compute: a cohort whose chunks are all stored needs no cluster) and stored as each arrives.

    ``finished`` is called with each slide when its last chunk is in, before its chunks are let go (a cohort of
    hundreds of slides holds only those still running), or when it fails (its ``error`` set); ``progress`` as
    chunks arrive. Returns the final counts.

    Raises:
        CheckpointError: from :func:`plan_run`.
        SchedulerLost: the scheduler (at ``address``) stopped answering; the chunks stored so far stay.
    """
    from dask.distributed import as_completed
    from distributed.comm.core import CommClosedError

    counts = CohortProgress(len(runs), 0, 0)
    client, arriving = None, None
    # The futures not yet taken, by key: the only references this process keeps, so that a result taken is let go
    # on the workers too. A key is the store's and the chunk's, so that two runs of one store on one cluster share
    # the task; two slides of one store in the cohort (a file and its copy) share it here (``owners``).
    pending: dict[str, object] = {}
    owners: dict[str, list[SlideRun]] = {}
    try:
        for run in runs:
            plan_run(run, planner)
            if run.error is not None:
                counts.slides -= 1
                if finished:
                    finished(run)
                continue
            plan = run.plan
            counts.chunks += len(plan.chunks)
            counts.cells += sum(_cells(plan, index) for index in plan.chunks)
            for index in plan.chunks:
                stored = plan.store.get(*index)
                if stored is not None:
                    run.results[index] = stored
                    counts.chunks_done += 1
                    counts.cells_done += _cells(plan, index)
                    counts.cells_read_back += _cells(plan, index)
            # Coarse to fine over the slide (app.slides.order.spread_order): a run cut short leaves a map of the
            # whole slide in its store, which the Slide page shows and sharpens from.
            for ci, cj in (index for index in spread_order(plan.chunks) if index not in run.results):
                key = chunk_key(plan, ci, cj)
                if key not in owners:
                    if client is None:
                        client, arriving = connect(), as_completed()
                    pending[key] = submit_chunk(client, plan, ci, cj)
                    arriving.add(pending[key])
                    owners[key] = []
                owners[key].append(run)
            if len(run.results) == len(plan.chunks):
                _finish(run, counts, finished)
            for future in arriving.next_batch(block=False) if arriving is not None and arriving.has_ready() else ():
                _take(future, pending, owners, counts, client, address, finished)
            if progress:
                progress(counts)
        for future in arriving if arriving is not None else ():
            if _take(future, pending, owners, counts, client, address, finished) and progress:
                progress(counts)
    except (CommClosedError, ConnectionError) as err:  # the scheduler went away while chunks were submitted
        if isinstance(err, SchedulerLost):
            raise
        raise SchedulerLost(_lost(address)) from err
    return counts


def _lost(address: str | None) -> str:
    """What to say when the scheduler stops answering, whether a task was cancelled or a connection closed."""
    return (f"the Dask scheduler at {address or 'the local cluster'} stopped answering during the run; the chunks "
            "finished so far are stored, and the same command resumes")


def _take(future, pending: dict, owners: dict[str, list[SlideRun]], counts: CohortProgress, client,
          address: str | None, finished: Callable[[SlideRun], None] | None) -> bool:
    """A finished task's chunk into each waiting slide's store; a failed one fails its slides (their other chunks
    cancelled); a cancelled one, not by this process, means the scheduler is gone. Whether any slide took it."""
    pending.pop(future.key, None)
    waiting = [run for run in owners[future.key] if run.error is None]  # a failed slide's chunks are dropped
    if waiting and future.status == "cancelled":
        raise SchedulerLost(_lost(address))
    if waiting and future.status == "error":
        for run in waiting:
            _fail(run, _sentence(run, future.exception()), counts, finished)
        client.cancel([other for key, other in pending.items() if all(run.error is not None for run in owners[key])])
        return True
    result, seconds = future.result() if waiting else (None, 0.0)
    for run in waiting:
        run.plan.store.put(result)
        run.results[result.index] = result
        run.computed += 1
        run.worker_seconds += seconds
        counts.chunks_done += 1
        counts.cells_done += _cells(run.plan, result.index)
        if len(run.results) == len(run.plan.chunks):
            _finish(run, counts, finished)
    return bool(waiting)


def _fail(run: SlideRun, error: str, counts: CohortProgress, finished: Callable[[SlideRun], None] | None) -> None:
    """``run`` failed with ``error``: its chunks still to come leave the cohort's counts."""
    run.error = error
    lost = [index for index in run.plan.chunks if index not in run.results]
    counts.chunks -= len(lost)
    counts.cells -= sum(_cells(run.plan, index) for index in lost)
    counts.slides -= 1
    if finished:
        finished(run)
    run.results.clear()
    run.plan = None


def _finish(run: SlideRun, counts: CohortProgress, finished: Callable[[SlideRun], None] | None) -> None:
    """``run``'s last chunk is in: told, then its chunks let go (they are on disk)."""
    run.seconds = time.perf_counter() - counts.started
    run.done = True
    counts.slides_done += 1
    if finished:
        finished(run)
    run.results.clear()
    run.plan.store.forget()
    run.plan = None


def _sentence(run: SlideRun, error: BaseException) -> str:
    """A worker's exception as a sentence: a slide's own (:class:`SlideError`, which names the file) as it is, any
    other with the slide's name and the exception's kind (a worker lost three times over one chunk is Dask's
    ``KilledWorker``)."""
    if isinstance(error, SlideError):
        return str(error)
    return f"{run.slide.name}: a chunk failed on a worker ({type(error).__name__}: {error})"


def summary_row(run: SlideRun, arrays: dict | None, weights: str, code: str, stain: str = "none",
                precision: str = "float32") -> dict:
    """The summary's row of one slide (:data:`SUMMARY_COLUMNS`); ``arrays`` from :func:`app.slides.run.assemble`
    for a finished slide, None for a failed one; ``stain`` the normalisation the run asked for and ``precision`` the
    precision decided for it (:mod:`app.slides.precision`; a plan's own where the slide has one), both named in a
    failed slide's row too: its numbers would have been of those pixels, in that precision. Areas in mm^2: the
    tissue area is the slide's tissue mask (:mod:`app.slides.tissue`, on its thumbnail), the tumour area the
    evaluated cells at p >= 0.5, each 32 pixels square at the model's scale."""
    row = dict.fromkeys(SUMMARY_COLUMNS, "")
    row.update(slide=run.slide.name, status="error" if run.error else "done", error=run.error or "",
               stain=stain, precision=precision, code_sha256=code)
    plan = run.plan
    if plan is None:
        return row
    row.update(precision=plan.precision.name)
    cell_mm2 = (plan.grid.cells.cell * plan.grid.model_microns_per_pixel / 1000) ** 2
    row.update(microns_per_pixel=f"{plan.scale.microns_per_pixel:.6g}", scale_source=plan.scale.source,
               chunks=len(plan.chunks), chunks_computed=run.computed, worker_seconds=f"{run.worker_seconds:.2f}",
               weights_sha256=weights)
    if arrays is None or run.error:
        return row
    evaluated = arrays["evaluated"]
    tumour = arrays["probabilities"][..., -1][evaluated]
    (rows, cols), (thumb_rows, thumb_cols) = plan.grid.size, plan.thumbnail.shape[:2]
    pixel_mm2 = (plan.scale.microns_per_pixel / 1000) ** 2 * (rows / thumb_rows) * (cols / thumb_cols)
    row.update(tissue_mm2=f"{int(plan.tissue.sum()) * pixel_mm2:.4f}", cells_evaluated=int(evaluated.sum()),
               mean_tumour_probability=f"{float(tumour.mean()):.6f}" if tumour.size else "",
               max_tumour_probability=f"{float(tumour.max()):.6f}" if tumour.size else "",
               **{"tumour_mm2_at_0.5": f"{int((tumour >= 0.5).sum()) * cell_mm2:.4f}"},
               seconds=f"{run.seconds:.2f}" if run.seconds is not None else "")
    return row


def write_summary(path: Path, rows: list[dict]) -> None:
    """``rows`` as a CSV with :data:`SUMMARY_COLUMNS`, written whole under a temporary name and renamed into place
    (a run killed while writing leaves the previous summary)."""
    temporary = path.with_suffix(".csv.part")
    with temporary.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    temporary.replace(path)
