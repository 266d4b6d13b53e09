"""Whole slides: what a user waits for, measured on this machine, with its CPU and instruction set named.

    python -m benchmarks.slides                      # the CMU demo slide
    python -m benchmarks.slides --slide my.svs --mpp 0.25 --tiles 100 --json out/slides.json
    python -m benchmarks.slides --gigapixel          # a built 100,000-pixel slide: benchmarks/slides_gigapixel.py
    python -m benchmarks.slides --cohort             # cells/s against the hardware, the scheduler, a cohort on paper

Measured in one run, with the shipped default model (``--checkpoint``), the exact method, on a local Dask cluster
of ``--workers`` processes of ``--threads`` threads (started before the clock, as a server keeps one):

- ``plan``: the slide opened, its scale, grid, 1,024-pixel thumbnail and tissue mask (what the Slide page computes
  before it draws the viewer);
- ``first chunk``: from the chunks' submission to the first one finished (what the page draws first);
- ``whole slide``: to the last one, and the cells per second;
- ``tile (in process)``: OpenSlide's deep-zoom tile as the server makes it (read, JPEG), median over ``--tiles``
  tiles drawn at random from the levels a viewer shows;
- ``tile (HTTP)``: the same tiles fetched from ``app/server.py`` on a free port, median, as the browser waits for
  them (the server warmed by one request first).

Each analysis starts from an empty store, so nothing is read back. Measure on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from app.slides.library import DEMO_FOLDER, list_slides
from app.slides.run import close_client, local_client, plan_slide, start_slide
from app.slides.tiles import deep_zoom, tile_bytes
from benchmarks.browser_latency import cpu_model
from benchmarks.concurrent_sessions import free_port, streamlit_server
from benchmarks.train_step import instruction_sets

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SLIDE = DEMO_FOLDER / "CMU-1-Small-Region.svs"
DEFAULT_CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


def analysis_times(slide: Path, checkpoint: Path, mpp: float | None, workers: int, threads: int,
                   chunk: int | None) -> dict:
    """Plan, first chunk and whole slide, seconds, from an empty store on a cluster started beforehand."""
    with tempfile.TemporaryDirectory(prefix="slides-bench-") as store, contextlib.ExitStack() as stack:
        client = local_client(workers, threads)
        stack.callback(close_client, client)
        start = time.perf_counter()
        plan = plan_slide(slide, checkpoint, Path(store), mpp, chunk)
        planned = time.perf_counter()
        futures = start_slide(plan, client)
        finished = []
        from dask.distributed import wait

        for future in futures:
            future.add_done_callback(lambda _: finished.append(time.perf_counter()))
        wait(futures)
        done = time.perf_counter()
        cells = sum(int(f.result()[0].evaluated.sum()) for f in futures)
    return dict(plan_s=planned - start, first_chunk_s=min(finished) - planned, whole_s=done - planned,
                chunks=len(futures), cells=cells, cells_per_s=cells / (done - planned))


def tile_addresses(slide: Path, count: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """``count`` (level, col, row) drawn at random over the deep-zoom levels a viewer shows (the top five)."""
    generator = deep_zoom(str(slide), slide.stat().st_mtime_ns)
    rng = np.random.default_rng(seed)
    levels = list(range(max(0, generator.level_count - 5), generator.level_count))
    picks = []
    for _ in range(count):
        level = int(rng.choice(levels))
        cols, rows = generator.level_tiles[level]
        picks.append((level, int(rng.integers(cols)), int(rng.integers(rows))))
    return picks


def tile_times(slide: Path, addresses: list[tuple[int, int, int]]) -> dict:
    """Median milliseconds of a tile made in this process and fetched over HTTP from the app's server."""
    entry = next((e for e in list_slides() if e.path.resolve() == slide.resolve()), None)
    if entry is None:
        raise SystemExit(f"{slide} is not in the server's listing: put it in $APP_SLIDES or slides/")
    made = []
    for level, col, row in addresses:
        start = time.perf_counter()
        tile_bytes(entry.slide_id, level, col, row)
        made.append(1000 * (time.perf_counter() - start))
    deep_zoom.cache_clear()  # the server has its own; this process's warm cache would not be the browser's case
    fetched = []
    with tempfile.TemporaryDirectory() as logs, streamlit_server(REPO / "checkpoints", Path(logs) / "log",
                                                                 free_port(), time.monotonic() + 120) as (_, url):
        urllib.request.urlopen(f"{url}slides/{entry.slide_id}.dzi").read()
        for level, col, row in addresses:
            start = time.perf_counter()
            urllib.request.urlopen(f"{url}slides/{entry.slide_id}_files/{level}/{col}_{row}.jpeg").read()
            fetched.append(1000 * (time.perf_counter() - start))
    return dict(tile_in_process_ms=statistics.median(made), tile_http_ms=statistics.median(fetched),
                tiles=len(addresses))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slide", type=Path, default=DEFAULT_SLIDE, help="the slide (default: the CMU demo)")
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the model")
    parser.add_argument("--mpp", type=float, default=None, help="level 0's um/px where the slide records none")
    parser.add_argument("--workers", type=int, default=1, help="Dask worker processes (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads per worker (default 2)")
    parser.add_argument("--chunk", type=int, default=None, help="cells per chunk side (default 16)")
    parser.add_argument("--tiles", type=int, default=None,
                        help="tiles timed (default 50; 400 with --gigapixel; 0: none)")
    parser.add_argument("--gigapixel", type=int, nargs="?", const=100_000, metavar="SIDE",
                        help="instead: the built gigapixel slide (SIDE px, default 100,000) opened to its tissue "
                             "outline, and the server's memory while it is viewed (benchmarks.slides_gigapixel)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--cohort", action="store_true",
                        help="instead: what a slide costs and a cohort on paper (benchmarks/cohort_cost.py)")
    parser.add_argument("--tasks", type=int, default=2000, help="--cohort: no-op tasks timed per cluster")
    parser.add_argument("--worker-counts", type=int, nargs="+", default=[1, 2, 4],
                        help="--cohort: the local clusters' worker processes whose scheduler cost is measured")
    parser.add_argument("--gpu", action="store_true",
                        help="with --cohort: the slide on a worker's GPU against the CPU (cells/s, the difference)")
    parser.add_argument("--device", default=None, help="--gpu: this device instead of a worker's (cpu checks the path)")
    args = parser.parse_args(argv)
    if args.tiles is None:
        args.tiles = 400 if args.gigapixel else 50
    if args.gigapixel:
        return gigapixel_main(args)
    if not args.slide.is_file():
        parser.error(f"{args.slide} not found")
    if args.cohort:
        from benchmarks.cohort_cost import main as cohort_main

        return cohort_main(args, analysis_times)
    report = dict(cpu=cpu_model(), instruction_set=instruction_sets(), slide=args.slide.name,
                  workers=args.workers, threads=args.threads)
    report.update(analysis_times(args.slide, args.checkpoint, args.mpp, args.workers, args.threads, args.chunk))
    if args.tiles:
        report.update(tile_times(args.slide, tile_addresses(args.slide, args.tiles)))
    print(f"CPU: {report['cpu']} | {report['instruction_set']}")
    print(f"{report['slide']}, {args.workers} worker(s) x {args.threads} thread(s): plan {report['plan_s']:.2f} s, "
          f"first chunk {report['first_chunk_s']:.2f} s, whole slide {report['whole_s']:.1f} s ({report['chunks']} "
          f"chunks, {report['cells']:,} cells, {report['cells_per_s']:.1f} cells/s)")
    if args.tiles:
        print(f"tiles ({report['tiles']}, median): made in process {report['tile_in_process_ms']:.1f} ms, fetched "
              f"over HTTP {report['tile_http_ms']:.1f} ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def gigapixel_main(args: argparse.Namespace) -> int:
    from benchmarks.slides_gigapixel import gigapixel_report, print_report

    report = dict(cpu=cpu_model(), instruction_set=instruction_sets(),
                  **gigapixel_report(args.gigapixel, args.checkpoint, args.tiles))
    print(f"CPU: {report['cpu']} | {report['instruction_set']}")
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
