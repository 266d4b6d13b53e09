"""A slide's cells as a Dask worker evaluates them, before and after, side by side in one run (issue 59).

    python -m benchmarks.cells [--baseline aef4c86] [--chunks 6] [--rounds 3] [--json out.json]

The CMU demo slide, the shipped default model (``fa_p4m_densenet_pcam``), the exact method ("crops": every cell
in its own 96 x 96 context). Each measurement is a fresh process doing what a worker of ``python -m
benchmarks.slides`` does (one Dask worker of two threads): :func:`app.slides.run.chunk_task` on the ``--chunks``
chunks with the most tissue, two threads taking them in turn, PyTorch on one thread each (Dask's nanny sets
``OMP_NUM_THREADS=1``), after one chunk to warm up (the model loaded, the kernels built). Three set-ups, in turn
over ``--rounds`` rounds, so that a machine whose load drifts affects all alike:

* ``before``: the ``models`` package of ``--baseline`` (``git archive``), in the environment Dask gave a worker
  before (its nanny's ``pre-spawn-environ``: ``MALLOC_TRIM_THRESHOLD_=65536``, which also fixes glibc's mmap
  threshold at 128 KiB);
* ``after, Dask's allocator``: this tree's ``models``, the same environment: what the code changes alone give;
* ``after``: this tree's ``models`` in the environment :func:`app.slides.run.local_client` now starts its workers
  with (:func:`app.slides.run.worker_environ`: freed memory kept, one malloc arena).

Per set-up, the median over rounds of: cells per second (wall clock: what a user waits for, but other processes'
load shows in it), CPU seconds per cell (user + system of the process, both threads: what the work costs, far
less sensitive to that load), the system time's share, minor page faults per cell, peak RSS, and the ratios of
"before" over each. The probabilities of every cell are compared with "before" (largest absolute difference). The
header names the CPU and the instruction set; run it again under the AVX2 switches of ``make test-avx2``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    # Appended, not prepended: a worker's PYTHONPATH names the models package it measures, which must win.
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from benchmarks.densenet_step import extract  # noqa: E402
from benchmarks.train_step import describe_failure, instruction_sets  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASELINE = "aef4c86"  # main before this work (2026-11-29)
SLIDE = REPO.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
THREADS = 2  # a worker of benchmarks.slides' default cluster
SETUPS = ("before", "after_dask_allocator", "after")
SHOWN = {"before": "before", "after_dask_allocator": "after, Dask's allocator", "after": "after"}


def fullest_chunks(count: int) -> tuple[object, list[tuple[int, int]]]:
    """The slide's plan and its ``count`` chunks with the most tissue (the plan orders them least first)."""
    from app.slides.run import plan_slide

    with tempfile.TemporaryDirectory() as store:
        plan = plan_slide(SLIDE, CHECKPOINT, Path(store))
    return plan, list(plan.chunks[-count:])


def measure(count: int, out: Path) -> dict:
    """In a worker process: the chunks through two threads as a Dask worker runs them; probabilities into ``out``."""
    import resource
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    import models
    from app.slides.run import chunk_task

    plan, chunks = fullest_chunks(count)

    def task(index):
        return chunk_task(str(SLIDE), plan.scale.microns_per_pixel, str(CHECKPOINT), plan.grid.chunk, *index)

    task(chunks[-1])  # warm-up: the model loaded, the kernels built, the first allocations
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(task, chunks))
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    cells = sum(int(r.evaluated.sum()) for r in results)
    np.save(out, np.concatenate([r.probabilities[r.evaluated] for r in results]))
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return dict(cells=cells, wall_s=wall, cells_per_s=cells / wall, cpu_ms_per_cell=1e3 * (user + system) / cells,
                system_share=system / (user + system), faults_per_cell=(after.ru_minflt - before.ru_minflt) / cells,
                peak_rss_mib=after.ru_maxrss / 1024, models_from=str(Path(models.__file__).parent.parent))


def environments() -> dict[str, dict[str, str]]:
    """Each set-up's additions to the environment: Dask's pre-spawn environment before and after this work."""
    import dask
    import distributed  # noqa: F401  (its import loads the nanny's settings into dask.config)

    from app.slides.run import worker_environ

    dask_default = {k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    return {"before": dask_default, "after_dask_allocator": dask_default,
            "after": {k: str(v) for k, v in worker_environ().items()}}


def run_worker(code: Path, environ: dict[str, str], args: argparse.Namespace, out: Path) -> dict:
    """:func:`measure` in a fresh process whose ``models`` is the package in folder ``code``."""
    # The worker's glibc settings are the set-up's alone, not this shell's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(environ, PYTHONPATH=str(code))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(out), "--chunks",
                           str(args.chunks)], check=False, capture_output=True, text=True, env=env, cwd=code)
    if proc.returncode != 0:
        return {"error": describe_failure(proc)}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if Path(result["models_from"]).resolve() != code.resolve():
        return {"error": f"the worker imported models from {result['models_from']}, not {code}"}
    return result


def summarise(runs: dict[str, list[dict]], probabilities: dict[str, list]) -> dict[str, dict]:
    """Medians over rounds per set-up, the ratios of "before" over it, and the largest difference from "before"."""
    import numpy as np

    keys = ("cells_per_s", "cpu_ms_per_cell", "system_share", "faults_per_cell", "peak_rss_mib")
    table = {}
    for setup, results in runs.items():
        good = [r for r in results if "error" not in r]
        if not good:
            table[setup] = {"error": results[0]["error"]}
            continue
        row = {key: statistics.median(r[key] for r in good) for key in keys} | {"cells": good[0]["cells"]}
        reference = np.load(probabilities["before"][0]) if probabilities["before"] else None
        row["max_abs_dp"] = max(float(np.abs(np.load(p) - reference).max()) for p in probabilities[setup]) \
            if reference is not None else None
        table[setup] = row
    base = table.get("before", {})
    for row in table.values():
        if "error" not in row and "error" not in base:
            row["speed_x_before"] = row["cells_per_s"] / base["cells_per_s"]
            row["cpu_x_before"] = base["cpu_ms_per_cell"] / row["cpu_ms_per_cell"]
    return table


def print_table(table: dict[str, dict], header: str) -> None:
    print(header)
    print("| set-up | cells/s (wall) | x before | CPU ms per cell | x before | system share | page faults per cell "
          "| peak RSS | max abs dp vs before |")
    print("|---|---|---|---|---|---|---|---|---|")
    for setup, row in table.items():
        if "error" in row:
            print(f"| {SHOWN[setup]} | error: {row['error']} |")
            continue
        speed, cpu = (f"{row[key]:.2f}" if key in row else "-" for key in ("speed_x_before", "cpu_x_before"))
        dp = "-" if row["max_abs_dp"] is None else f"{row['max_abs_dp']:.2g}"
        print(f"| {SHOWN[setup]} | {row['cells_per_s']:.1f} | {speed} | {row['cpu_ms_per_cell']:.1f} | {cpu} "
              f"| {100 * row['system_share']:.0f} % | {row['faults_per_cell']:,.0f} | {row['peak_rss_mib']:,.0f} MiB "
              f"| {dp} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit whose models package is 'before'")
    parser.add_argument("--chunks", type=int, default=6, help="the slide's chunks with the most tissue (default 6)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three set-ups in turn (default 3)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.chunks, args.worker)))
        return 0
    if not SLIDE.is_file():
        parser.error(f"{SLIDE} not found (the CMU demo slide lives in ../shared/data/slides)")
    from benchmarks.browser_latency import cpu_model

    header = (f"CPU: {cpu_model()}, {os.cpu_count()} CPUs | {instruction_sets()} | one worker of {THREADS} threads, "
              f"{args.chunks} chunks of the CMU slide, median of {args.rounds} rounds | baseline {args.baseline} | "
              f"load avg {os.getloadavg()[0]:.1f} before")
    environ = environments()
    runs: dict[str, list[dict]] = {setup: [] for setup in SETUPS}
    probabilities: dict[str, list[Path]] = {setup: [] for setup in SETUPS}
    with tempfile.TemporaryDirectory(prefix="cells-bench-") as folder:
        baseline = Path(folder) / "baseline"
        baseline.mkdir()
        extract(args.baseline, baseline)
        for round_ in range(args.rounds):
            for setup in SETUPS:
                out = Path(folder) / f"{setup}-{round_}.npy"
                result = run_worker(baseline if setup == "before" else REPO, environ[setup], args, out)
                runs[setup].append(result)
                if "error" not in result:
                    probabilities[setup].append(out)
                done = result.get("error") or f"{result['cells_per_s']:.1f} cells/s, {result['cpu_ms_per_cell']:.1f} ms"
                print(f"  round {round_ + 1}, {SHOWN[setup]}: {done}", file=sys.stderr, flush=True)
        table = summarise(runs, probabilities)
    print_table(table, header + f", {os.getloadavg()[0]:.1f} after")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(header=header, environments=environ, runs=runs, table=table), indent=2))
    return 0 if all("error" not in row for row in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
