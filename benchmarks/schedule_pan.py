"""A pan's wait, measured: from a view moved to another part of a slide to the first chunk of the new view finished,
for three ways of feeding Dask the chunks, with a stub chunk of known duration (a sleep) on a local cluster of one
worker of two threads, as the app's own (:func:`app.slides.run.local_client`'s shape, in process).

    python -m benchmarks.schedule_pan                      # 0.5 s chunks, a 16 x 16-chunk slide
    python -m benchmarks.schedule_pan --seconds 1 --json out/pan.json

- ``queue (margin m)``: :class:`app.slides.schedule.ChunkScheduler`, the threads and ``m`` more tasks on the
  cluster, the rest waiting in the client, re-ordered on the pan;
- ``priorities, cancel and resubmit``: every chunk submitted at once (priority 0, in the spread order); on the pan
  the new view's unfinished chunks cancelled (``client.cancel``, a wait on the scheduler) and submitted again under
  new keys at priority 10 (a submitted task's priority cannot be changed: dask/dask#3874);
- ``all at once``: every chunk submitted at once row by row, nothing changed on the pan (the app before, whose
  order, least tissue first, knows nothing of the view either).

Each also gives the whole run's time for a slide of ``--whole`` chunks a side against the ideal (chunks x seconds /
threads): what the queue's round trip per chunk costs. Last, fairness: a small slide's time to its last chunk alone,
and started second beside the large one, through the queue and all at once. The pan, and the second slide, come
once the first ``--before`` chunks have finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from app.cells.evaluation import make_grid
from app.slides.engine import SlideGrid
from app.slides.order import chunk_edges, spread_order
from app.slides.schedule import ChunkScheduler
from benchmarks.browser_latency import cpu_model
from benchmarks.train_step import instruction_sets

THREADS = 2


def stub_chunk(seconds: float, index: tuple[int, int]) -> tuple[object, float]:
    """A chunk's stand-in: ``seconds`` of sleep (a worker thread held, as a chunk holds it), ``(index, seconds)``."""
    time.sleep(seconds)
    return index, seconds


@dataclass
class Finishes:
    """When each chunk finished (the stub store's ``put``), by index."""

    at: dict[tuple[int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, index) -> None:
        with self.lock:
            self.at.setdefault(tuple(index), time.perf_counter())

    def get(self, ci: int, cj: int):
        return None

    def first_of(self, chunks: set, after: float) -> float | None:
        with self.lock:
            times = [t for index, t in self.at.items() if index in chunks and t >= after]
        return min(times) - after if times else None


def stub_plan(side: int, name: str, finishes: Finishes):
    """A slide of ``side`` x ``side`` chunks of 8 x 8 cells, all with tissue, at the model's scale (level 0 = the
    model's pixels), its store the stub's clock."""
    cells = make_grid(side * 8 * 32 + 64, side * 8 * 32 + 64)
    grid = SlideGrid((cells.rows * 32 + 64,) * 2, (cells.rows * 32 + 64,) * 2, cells, 8, 1.0, 1.0)
    store = SimpleNamespace(folder=Path(name), get=finishes.get, put=finishes.put)
    chunks = tuple((ci, cj) for ci in range(grid.chunks[0]) for cj in range(grid.chunks[1]))
    return SimpleNamespace(grid=grid, chunks=chunks, store=store, slide=Path(f"{name}.svs"))


def views(plan) -> tuple[tuple, set, tuple, set]:
    """A view of about 2 x 2 chunks near the top left and one near the bottom right, and the chunks each meets."""
    rows, cols = chunk_edges(plan.grid)
    n = len(rows)

    def view(first: int) -> tuple[tuple, set]:
        top, bottom = rows[first, 0] + 10, rows[first + 1, 1] - 10
        left, right = cols[first, 0] + 10, cols[first + 1, 1] - 10
        return (left, top, right - left, bottom - top), {(i, j) for i in (first, first + 1) for j in (first,
                                                                                                   first + 1)}

    return (*view(0), *view(n - 3))


def wait_count(finishes: Finishes, count: int, timeout: float = 600) -> None:
    deadline = time.perf_counter() + timeout
    while len(finishes.at) < count and time.perf_counter() < deadline:
        time.sleep(0.005)


def queued(client, side: int, seconds: float, before: int, margin: int, run: str) -> float:
    finishes = Finishes()
    plan = stub_plan(side, run, finishes)
    first, _, second, second_chunks = views(plan)

    def submit(client, plan, ci, cj):
        return client.submit(stub_chunk, seconds, (ci, cj), key=f"{run}-{ci}-{cj}")

    scheduler = ChunkScheduler(client, slots=THREADS + margin, submit=submit)
    scheduler.analyse(plan, view=first)
    wait_count(finishes, before)
    panned = time.perf_counter()
    scheduler.view(run, second)
    while (waited := finishes.first_of(second_chunks, panned)) is None:
        time.sleep(0.005)
    scheduler.close()
    return waited


def all_at_once(client, side: int, seconds: float, before: int, reprioritise: bool, run: str) -> float:
    finishes = Finishes()
    plan = stub_plan(side, run, finishes)
    _, _, _, second_chunks = views(plan)
    futures = {}
    # Reprioritised: in the spread order; else the chunks row by row, an order that knows nothing of the view (as
    # the plan's own, least tissue first, knows nothing of it).
    for index in spread_order(plan.chunks) if reprioritise else sorted(plan.chunks):
        futures[index] = client.submit(stub_chunk, seconds, index, key=f"{run}-{index[0]}-{index[1]}")
        futures[index].add_done_callback(lambda f: finishes.put(f.result()[0]) if f.status == "finished" else None)
    wait_count(finishes, before)
    panned = time.perf_counter()
    if reprioritise:
        again = [index for index in second_chunks if index not in finishes.at]
        client.cancel([futures[index] for index in again])
        for index in again:
            futures[index] = client.submit(stub_chunk, seconds, index, key=f"{run}-{index[0]}-{index[1]}-again",
                                           priority=10)
            futures[index].add_done_callback(lambda f: finishes.put(f.result()[0]) if f.status == "finished"
                                             else None)
    while (waited := finishes.first_of(second_chunks, panned)) is None:
        time.sleep(0.005)
    client.cancel(list(futures.values()))
    return waited


def whole_run(client, side: int, seconds: float, margin: int | None, run: str) -> float:
    """Seconds for the chunks of a slide of about ``side`` x ``side``: through the queue of ``margin``, or (None) all
    submitted at once."""
    finishes = Finishes()
    plan = stub_plan(side, run, finishes)
    start = time.perf_counter()
    if margin is None:
        futures = [client.submit(stub_chunk, seconds, index, key=f"{run}-{index[0]}-{index[1]}")
                   for index in plan.chunks]
        from dask.distributed import wait
        wait(futures)
        return time.perf_counter() - start

    def submit(client, plan, ci, cj):
        return client.submit(stub_chunk, seconds, (ci, cj), key=f"{run}-{ci}-{cj}")

    scheduler = ChunkScheduler(client, slots=THREADS + margin, submit=submit)
    scheduler.analyse(plan)
    wait_count(finishes, len(plan.chunks))
    return time.perf_counter() - start


def second_slide(client, side: int, small_side: int, seconds: float, before: int, queue: bool | None,
                 run: str) -> float:
    """Seconds from a small slide's start to its last chunk: alone (``queue`` None, through the queue), or started
    once ``before`` chunks of a large slide have finished, both through the queue (True) or both all at once."""
    large_finishes, small_finishes = Finishes(), Finishes()
    large, small = stub_plan(side, f"{run}-large", large_finishes), stub_plan(small_side, f"{run}-small",
                                                                              small_finishes)

    def submit(client, plan, ci, cj):
        return client.submit(stub_chunk, seconds, (ci, cj), key=f"{plan.store.folder.name}-{ci}-{cj}")

    scheduler = ChunkScheduler(client, slots=THREADS + 1, submit=submit)
    futures = []

    def start(plan, finishes) -> None:
        if queue is False:
            for ci, cj in spread_order(plan.chunks):
                futures.append(submit(client, plan, ci, cj))
                futures[-1].add_done_callback(lambda f, finishes=finishes: finishes.put(f.result()[0])
                                              if f.status == "finished" else None)
        else:
            scheduler.analyse(plan, viewer=plan.store.folder.name)

    if queue is not None:
        start(large, large_finishes)
        wait_count(large_finishes, before)
    began = time.perf_counter()
    start(small, small_finishes)
    wait_count(small_finishes, len(small.chunks))
    took = time.perf_counter() - began
    scheduler.close()
    if futures:
        client.cancel(futures)
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="a stub chunk's duration")
    parser.add_argument("--side", type=int, default=16, help="the slide's chunks per side")
    parser.add_argument("--before", type=int, default=6, help="chunks finished before the pan")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--whole", type=int, default=6, help="chunks per side of the whole-run comparison's slide")
    parser.add_argument("--small", type=int, default=2, help="chunks per side of the slide started second")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from dask.distributed import Client

    results: dict[str, object] = dict(cpu=cpu_model(), instructions=instruction_sets(), seconds=args.seconds,
                                      threads=THREADS, chunks=args.side ** 2)
    with Client(processes=False, n_workers=1, threads_per_worker=THREADS, dashboard_address=None) as client:
        strategies = {f"queue (margin {m})": lambda r, m=m: queued(client, args.side, args.seconds, args.before, m, r)
                      for m in (0, 1, 2)}
        strategies["priorities, cancel and resubmit"] = lambda r: all_at_once(client, args.side, args.seconds,
                                                                             args.before, True, r)
        strategies["all at once"] = lambda r: all_at_once(client, args.side, args.seconds, args.before, False, r)
        pans = {}
        for name, measure in strategies.items():
            waits = [measure(f"pan-{len(pans)}-{k}") for k in range(args.repeats if "all at once" not in name else 1)]
            pans[name] = statistics.median(waits)
            print(f"{name:32s} pan to the first chunk of the new view finished: {pans[name]:6.2f} s "
                  f"(median of {len(waits)}; a chunk is {args.seconds} s)", flush=True)
        count = len(stub_plan(args.whole, "count", Finishes()).chunks)
        ideal = count * args.seconds / THREADS
        whole = {}
        for name, margin in (("queue (margin 0)", 0), ("queue (margin 1)", 1), ("queue (margin 2)", 2),
                             ("all at once", None)):
            whole[name] = whole_run(client, args.whole, args.seconds, margin, f"whole-{len(whole)}")
            print(f"{name:32s} {count} chunks: {whole[name]:6.2f} s (ideal {ideal:.2f} s)", flush=True)
        small = len(stub_plan(args.small, "count", Finishes()).chunks)
        fair = {}
        for name, queue in (("alone", None), ("second, the queue", True), ("second, all at once", False)):
            fair[name] = second_slide(client, args.side, args.small, args.seconds, args.before, queue,
                                      f"fair-{len(fair)}")
            print(f"a slide of {small} chunks {name:24s} {fair[name]:6.2f} s to its last chunk", flush=True)
    results.update(pan_seconds=pans, whole_seconds=whole, whole_ideal_seconds=ideal, second_slide_seconds=fair)
    print(f"CPU: {results['cpu']} ({results['instructions']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
