"""``python -m app.slides DIR_OR_SLIDES... --out DIR``: whole slides through the H&E model, cell by cell, on Dask;
any number of them as one cohort (:mod:`app.slides.cohort`).

For each slide: ``DIR/<stem>.npz`` with the per-cell arrays of ``python -m app.region --npz`` (``probability``,
``probabilities``, ``evaluated``, ``tissue``, ``cell_top_left_px`` and ``cell_size_px`` in the slide's level-0
pixels, ``microns_per_pixel``, ``model_microns_per_pixel``, ``method``, ``class_names``, ``checkpoint``,
``stain``, the normalisation, and ``precision``), the
tumour heatmap over the slide's thumbnail as ``DIR/<stem>.png``, and the tumour regions at 0.5 as
``DIR/<stem>.geojson`` that QuPath imports (each 4-connected region of cells one annotation classified "Tumor",
one valid polygon with its holes in level-0 pixels, :mod:`app.slides.regions`; its mean tumour probability, its
cells and its area in µm² as measurements; the precision as its metadata). For the cohort, ``DIR/summary.csv``: a
row per slide (:data:`app.slides.cohort.SUMMARY_COLUMNS`), its numbers or its error, and the stain normalisation and
precision it ran with.

``--stain macenko`` or ``--stain reinhard`` normalises each slide's pixels to the model's reference stain (PCam's,
from its card) before the model sees them, with the slide's own estimate as source (:mod:`app.slides.stain`); its
chunks go to a store of their own, never mixed with an analysis of the pixels as scanned (``--stain none``, the
default). A slide with too little tissue to estimate its stain is recorded with its sentence, as other slides that
cannot be used are.

``--precision auto`` (the default) runs the network in bfloat16 where the workers' CPUs compute it natively and it
was measured faster (AMX-BF16), else in float32, the exact path; ``--precision float32`` or ``bfloat16`` as asked
(bfloat16 emulated on a CPU without it: slow, and said). Decided once for the cohort, by this machine for a local
cluster and by asking every worker of ``--scheduler``'s (:mod:`app.slides.precision`; workers that differ get
float32), and said in one line on stderr with its reason; each precision's chunks go to a store of their own.
Finished chunks are kept in ``DIR/.chunks/`` as they finish: the same command again resumes.

One progress bar over the cohort on stderr (cells, slides, chunks, time left), and Dask's dashboard address where
the scheduler serves one; one summary line per slide on stdout. A slide that cannot be used is recorded with its
sentence (``error: <message>`` on stderr, and in the summary) while the others finish, and the exit status is
then 2; a checkpoint that cannot be used, or a scheduler that does not answer, ends the run with ``error:
<message>`` and exit status 2. No traceback.

Dask: a ``LocalCluster`` on this machine by default (``--workers``, ``--threads``; TLS with credentials only this
command holds), or the scheduler at ``--scheduler ADDRESS`` (or ``$AAGC_DASK_SCHEDULER``): ``tls://HOST:PORT`` with
Dask's TLS settings, or ``tcp://HOST:PORT`` on a trusted network only (:mod:`app.slides.connection`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from models import CheckpointError, load_checkpoint
from models.precision import PRECISIONS

from .cohort import (
    CohortProgress,
    SchedulerLost,
    SlideRun,
    find_slides,
    run_cohort,
    summary_row,
    write_summary,
)
from .connection import connect
from .precision import resolve_precision
from .provenance import code_sha256
from .reader import SlideError
from .regions import tumour_regions
from .run import SCHEDULER_ENV, SlidePlan, assemble, close_client, local_client, plan_slide
from .stain import METHODS

__all__ = ["main", "DEFAULT_CHECKPOINT"]

DEFAULT_CHECKPOINT = "checkpoints/fa_p4m_densenet_pcam.safetensors"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.slides", description=__doc__.splitlines()[0])
    parser.add_argument("slides", nargs="+", type=Path,
                        help="slide files (.svs, .ndpi, .mrxs, .tif, ...), images, or folders of them")
    parser.add_argument("--out", type=Path, required=True, help="folder for the .npz, .png and .geojson of each")
    parser.add_argument("--checkpoint", type=Path, default=Path(DEFAULT_CHECKPOINT),
                        help=f"the H&E model (default: {DEFAULT_CHECKPOINT})")
    parser.add_argument("--mpp", type=float, default=None,
                        help="micrometres per pixel of level 0, for slides that record none (overrides theirs)")
    parser.add_argument("--scheduler", default=os.environ.get(SCHEDULER_ENV),
                        help=f"a Dask scheduler's address (default ${SCHEDULER_ENV}; else a local cluster)")
    parser.add_argument("--workers", type=int, default=1, help="local cluster: worker processes (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="local cluster: threads per worker (default 2)")
    parser.add_argument("--chunk", type=int, default=None, help="cells per chunk side (default 16)")
    parser.add_argument("--stain", choices=METHODS, default="none",
                        help="normalise each slide's stain to the model's reference (PCam's) before the model sees "
                             "it, from the slide's own estimate: macenko (stain vectors), reinhard (colour means and "
                             "spreads), or none, the pixels as scanned (default)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="the network's precision: auto (default) bfloat16 where the workers' CPUs have AMX-BF16, "
                             "else float32; float32, the exact path; bfloat16 as asked (emulated, slow, without it)")
    return parser


def heatmap_png(plan: SlidePlan, probability: np.ndarray, evaluated: np.ndarray) -> Image.Image:
    """The tumour probability per cell over the slide's thumbnail (viridis, 60 % opaque on evaluated cells)."""
    from matplotlib import colormaps

    thumbnail = plan.thumbnail.astype(np.float64)
    rows, cols = thumbnail.shape[:2]
    grid = plan.grid
    # Each thumbnail pixel's cell, by its centre at the model's scale.
    model_rows = (np.arange(rows) + 0.5) * grid.model_size[0] / rows
    model_cols = (np.arange(cols) + 0.5) * grid.model_size[1] / cols
    top, left = grid.cells.cell_origin(0, 0)
    i = np.floor((model_rows - top) / grid.cells.cell).astype(int)
    j = np.floor((model_cols - left) / grid.cells.cell).astype(int)
    inside_i, inside_j = (i >= 0) & (i < grid.cells.rows), (j >= 0) & (j < grid.cells.cols)
    ii, jj = np.clip(i, 0, grid.cells.rows - 1), np.clip(j, 0, grid.cells.cols - 1)
    shown = inside_i[:, None] & inside_j[None, :] & evaluated[ii][:, jj]
    colours = colormaps["viridis"](np.nan_to_num(probability[ii][:, jj]))[..., :3] * 255
    blended = np.where(shown[..., None], 0.4 * thumbnail + 0.6 * colours, thumbnail)
    return Image.fromarray(np.round(blended).astype(np.uint8))


def write_outputs(plan: SlidePlan, arrays: dict, out: Path) -> dict:
    """The .npz, .png and .geojson of one slide; the summary's numbers."""
    stem = plan.slide.stem
    probabilities, evaluated = arrays["probabilities"], arrays["evaluated"]
    probability = probabilities[..., -1]
    corners, size = plan.grid.cell_top_left_px(), plan.grid.cell_size_px()
    np.savez_compressed(out / f"{stem}.npz", probability=probability, probabilities=probabilities,
                        evaluated=evaluated, tissue=arrays["tissue"], cell_top_left_px=corners,
                        cell_size_px=np.array(size), microns_per_pixel=plan.scale.microns_per_pixel,
                        model_microns_per_pixel=plan.grid.model_microns_per_pixel, method="crops",
                        class_names=np.array(plan.card.get("class_names") or []), checkpoint=str(plan.checkpoint),
                        stain=plan.stain_method, precision=plan.precision.name)
    heatmap_png(plan, probability, evaluated).save(out / f"{stem}.png")
    regions = tumour_regions(probability, evaluated, corners, size, plan.scale.microns_per_pixel,
                             metadata={"precision": plan.precision.name})
    (out / f"{stem}.geojson").write_text(json.dumps(regions) + "\n")
    return dict(cells=int(evaluated.sum()), tumour=int((np.nan_to_num(probability) >= 0.5).sum()),
                regions=len(regions["features"]))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    client, rows, failed, bar = None, {}, 0, False
    # Dask's client logs a lost scheduler as tracebacks while it tries to reconnect; the run says it in a sentence.
    dask_log = logging.getLogger("distributed")
    level = dask_log.level
    dask_log.setLevel(logging.CRITICAL)

    def end_bar() -> None:
        """The progress bar's line ended before another line is written: erased on a terminal, else ended."""
        nonlocal bar
        if bar:
            sys.stderr.write("\r\033[K" if sys.stderr.isatty() else "\n")
        bar = False

    try:
        runs = [SlideRun(path) for path in find_slides(args.slides)]
        code = code_sha256()

        def finished(run: SlideRun) -> None:
            nonlocal failed
            arrays = None
            if run.error is None:
                arrays = assemble(run.plan, run.results)
                summary = write_outputs(run.plan, arrays, args.out)
                end_bar()
                stained = "" if args.stain == "none" else f", stain normalised to PCam's by {args.stain}"
                print(f"{run.slide.name}: {summary['cells']} cells evaluated, {summary['tumour']} at tumour "
                      f"p >= 0.5 in {summary['regions']} regions, {run.plan.scale.sentence}{stained}; "
                      f"{run.computed} of {len(run.plan.chunks)} chunks computed, {run.seconds:.1f} s", flush=True)
            else:
                failed += 1
                end_bar()
                print(f"error: {run.error}", file=sys.stderr)
            weights = str(run.plan.card.get("weights_sha256") or "") if run.plan else ""
            rows[run.slide] = summary_row(run, arrays, weights, code, args.stain, precision.name)
            write_summary(args.out / "summary.csv", [rows[r.slide] for r in runs if r.slide in rows])

        def connect():
            nonlocal client
            if client is None:
                client = _client(args)
                if dashboard := _dashboard(client):
                    end_bar()
                    print(f"Dask dashboard: {dashboard}", file=sys.stderr)
            return client

        def progress(counts: CohortProgress) -> None:
            nonlocal bar
            print(f"\r{counts.line()}", end="", file=sys.stderr, flush=True)
            bar = True

        def planner(path: Path) -> SlidePlan:
            return plan_slide(path, args.checkpoint, args.out / ".chunks", args.mpp, args.chunk, stain=args.stain,
                              precision=precision)

        precision = _precision(args, connect)
        print(f"precision: {precision.name} ({precision.reason})", file=sys.stderr)
        counts = run_cohort(runs, connect, planner, address=args.scheduler, progress=progress, finished=finished)
        end_bar()
        if len(runs) > 1:
            computed = sum(run.computed for run in runs)
            print(f"cohort: {counts.slides_done} of {len(runs)} slides done, {counts.chunks_done} chunks "
                  f"({counts.chunks_done - computed} read back, {computed} computed), summary in "
                  f"{args.out.name}/summary.csv")
    except (SlideError, CheckpointError, SchedulerLost, FileNotFoundError, OSError, ValueError) as err:
        end_bar()
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if client is not None:
            close_client(client)
        dask_log.setLevel(level)
    return 2 if failed else 0


def _precision(args, connect):
    """The cohort's precision, decided once: ``auto`` by asking every worker of the scheduler named (connected now,
    before any slide is planned: a store's name depends on it), or by this machine for a local cluster, whose workers
    share its CPU and environment; the checkpoint's model says whether it has a bfloat16 path."""
    model, _ = load_checkpoint(args.checkpoint)
    client = connect() if args.scheduler and args.precision == "auto" else None
    return resolve_precision(args.precision, model, client)


def _dashboard(client) -> str | None:
    """Dask's dashboard address, where the scheduler serves one."""
    try:
        return client.dashboard_link if "dashboard" in client.scheduler_info().get("services", {}) else None
    except (KeyError, AttributeError):
        return None


def _client(args):
    """A Dask client: on the named scheduler (within :data:`app.slides.connection.CONNECT_DEADLINE_S`, or a
    sentence naming it), or on a local cluster this command starts (TLS with credentials of its own)."""
    if args.scheduler:
        return connect(args.scheduler)
    # A local cluster's workers log into this command's stderr: a chunk that fails there is said once, in a
    # sentence, not also as the worker's traceback.
    return local_client(args.workers, args.threads, silence_logs=logging.CRITICAL)
