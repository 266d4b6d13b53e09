"""The order in which a slide's chunks run (:mod:`app.slides.schedule`), on a real Dask cluster (one worker of two
threads, in process) with the engine stubbed (:func:`app.slides.run.chunk_task`: an empty chunk, held until the test
lets it through, :class:`tests.chunk_stub.ChunkStub`), on a small built slide of five islands of tissue on glass (the
gigapixel slide's builder, 4,096 pixels a side: 15 x 15 chunks of 2 x 2 cells, 128 of them with tissue).

- View first: the first chunks started are those in the view, the quickest (least tissue) and the nearest its centre
  first.
- A pan re-orders what is still waiting: the next chunks started are the new view's.
- A pan over glass moves nothing; absurd views are clamped; two sessions of one store share one analysis.
- Fair: a small slide started second starts its chunks in turn with the large one's and finishes long before it; a
  stopped analysis runs only on the slots a looked-at one leaves.
- A chunk that raises is a sentence, the others finish; a finished analysis lets go of its plan and futures; a lost
  scheduler is a sentence.
- The spread order: no block of a level gets a second chunk before every block of it has one.
- The time left: the rate of the last chunks in wall time; a viewer silent for a minute (a closed tab) is gone
  (futures finished by hand, a clock of the test's).

Orders and counts only, never seconds.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import weakref
from pathlib import Path

import numpy as np
import pytest
from chunk_stub import WAIT_S, ChunkStub, empty_chunk, in_process_client, inner_chunks, view_of
from dask_processes import wait_for

import app.slides.run as run
from app.slides.order import chunk_edges, clamp_view, spread_order
from app.slides.schedule import ChunkScheduler
from app.slides.store import ChunkStore
from tests.conftest import REPO, require_shared

pytest.importorskip("dask.distributed")
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    from benchmarks.gigapixel_slide import SOURCE, GigapixelSpec, build_slide

    require_shared(SOURCE, f"{SOURCE} not found (the real slides live in ../shared/data/slides)")
    path = tmp_path_factory.mktemp("slide") / "islands.tif"
    build_slide(path, GigapixelSpec(size=4096, mask_cell=16, smallest=100))
    plan = run.plan_slide(path, CHECKPOINT, path.parent / "store", chunk=2)
    assert plan.grid.chunks == (15, 15) and len(plan.chunks) == 128
    return plan


@pytest.fixture(scope="module")
def client():
    with in_process_client() as client:
        yield client


@pytest.fixture
def stub(plan, monkeypatch):
    stub = ChunkStub(plan.grid)
    monkeypatch.setattr(run, "chunk_task", stub)
    yield stub
    stub.open()  # nothing left waiting on a failed test's gate


def own(plan, tmp_path: Path, name: str, chunks=None):
    """``plan`` with a store of its own (its own Dask keys) and the slide's file named ``name``."""
    return dataclasses.replace(plan, slide=plan.slide.with_name(name), store=ChunkStore(tmp_path, name),
                               chunks=plan.chunks if chunks is None else tuple(chunks))


def done(scheduler: ChunkScheduler, key: str) -> bool:
    progress = scheduler.progress(key)
    return progress is not None and progress.state == "done"


def test_the_chunks_in_view_start_first_the_quickest_and_the_nearest_its_centre_first(plan, client, stub, tmp_path):
    mine = own(plan, tmp_path, "view.tif")
    centre = inner_chunks(plan)[0]
    view, in_view = view_of(plan, *centre)
    assert len(in_view) == 9
    scheduler = ChunkScheduler(client)
    assert scheduler.slots == 2 + 1, "the cluster's two threads and the margin"
    stub.open()
    progress = scheduler.analyse(mine, view=view)
    assert (progress.in_view, progress.total) == (9, 128)
    wait_for(lambda: done(scheduler, mine.store.folder.name), WAIT_S, "the analysis finished")
    started = stub.of("view.tif")
    share = {index: run.tissue_share(plan.grid, plan.tissue, *index) for index in in_view}
    assert share[started[0]] == min(share.values()), "the view's quickest chunk (the least tissue) first"
    assert centre in started[:2], "the chunk nearest the view's centre beside it (or first, on a tie)"
    assert set(started[:9]) == in_view, "then the rest of the view, before any other"
    assert sorted(started) == sorted(plan.chunks), "every chunk with tissue once"
    _, finished = scheduler.finished_since(mine.store.folder.name)
    assert set(finished[:8]) <= in_view, "finished in that order, but for one running beside the last of the view"
    final = scheduler.progress(mine.store.folder.name)
    assert (final.done, final.total, final.failed, final.running, final.version) == (128, 128, 0, 0, 128)
    assert mine.store.done() == set(plan.chunks), "each into the store"


def test_a_pan_reorders_what_is_waiting_and_a_pan_over_glass_moves_nothing(plan, client, stub, tmp_path):
    mine = own(plan, tmp_path, "pan.tif")
    key = mine.store.folder.name
    inner = inner_chunks(plan)
    first, second = inner[0], inner[-1]
    assert abs(first[0] - second[0]) + abs(first[1] - second[1]) > 6, "two islands apart"
    scheduler = ChunkScheduler(client)
    scheduler.analyse(mine, view=view_of(plan, *first)[0])
    wait_for(lambda: len(stub.of("pan.tif")) == 2 and scheduler.progress(key).running == 3, WAIT_S,
             "both threads held at the gate, three tasks on the cluster")
    submitted = set(mine.chunks) - set(scheduler.waiting_order(key))
    assert len(submitted) == 3 and submitted <= view_of(plan, *first)[1]

    before = scheduler.waiting_order(key)
    glass = next(index for index in itertools.product(range(1, 14), repeat=2)
                 if all((index[0] + di, index[1] + dj) not in mine.chunks for di in (-1, 0, 1) for dj in (-1, 0, 1)))
    assert scheduler.view(key, view_of(plan, *glass)[0]) is not None
    assert scheduler.waiting_order(key) == before, "no chunk in view: the order stays as it was"
    assert scheduler.progress(key).in_view == 0 and scheduler.progress(key).running == 3, "no extra work"

    view, in_view = view_of(plan, *second)
    scheduler.view(key, view)
    assert scheduler.waiting_order(key)[0] == second and set(scheduler.waiting_order(key)[:9]) == in_view
    stub.open()
    wait_for(lambda: done(scheduler, key), WAIT_S, "the analysis finished")
    started = stub.of("pan.tif")
    assert set(started[:3]) == submitted, "the three on the cluster at the pan run on"
    assert started[3] == second and set(started[3:12]) == in_view, "then the new view's, before any other"


def test_absurd_views_are_clamped_to_the_slide():
    size = (1000, 2000)  # rows, cols
    assert clamp_view((10, 20, 30, 40), size) == (10.0, 20.0, 30.0, 40.0)
    assert clamp_view((-1e300, -5, 1e301, float("inf")), size) == (0.0, 0.0, 2000.0, 1000.0)
    assert clamp_view((1e300, 1e300, 10, 10), size) == (2000.0, 1000.0, 0.0, 0.0), "off the slide: nothing in view"
    assert clamp_view((50, 60, -20, -30), size) == (30.0, 30.0, 20.0, 30.0), "a negative side counts backwards"
    assert clamp_view({"left": 1, "top": 2, "width": 3, "height": 4}, size) == (1.0, 2.0, 3.0, 4.0)
    for bad in ((float("nan"), 0, 1, 1), (0, 0, float("nan"), 1), (float("inf"), 0, float("-inf"), 1),
                ("1", 2, 3, 4), (True, 1, 1, 1), (1, 2, 3), None, "left", {"left": 1}):
        assert clamp_view(bad, size) is None, bad


def test_an_absurd_view_and_a_second_session_join_the_one_analysis(plan, client, stub, tmp_path):
    mine = own(plan, tmp_path, "shared.tif")
    key = mine.store.folder.name
    scheduler = ChunkScheduler(client)
    scheduler.analyse(mine, viewer="first", view=(float("nan"), 0, 10, 10))
    assert scheduler.progress(key).in_view == 0, "NaN: no view"
    assert scheduler.view(key, (-1e300, -1e300, 1e300 * 10, float("inf")), "first") == (
        0.0, 0.0, float(plan.grid.size[1]), float(plan.grid.size[0]))
    assert scheduler.progress(key).in_view == 128, "clamped to the whole slide"
    view, in_view = view_of(plan, *inner_chunks(plan)[-1])
    again = own(plan, tmp_path, "shared.tif")  # another session's plan of the same store
    scheduler.analyse(again, viewer="second")
    scheduler.view(key, view, "second")
    scheduler.stop(key, "first")
    assert scheduler.running() == [key] and scheduler.progress(key).in_view == 9
    waiting = scheduler.waiting_order(key)
    assert set(waiting[:len(in_view & set(waiting))]) == in_view & set(waiting), "the second session's view first"
    stub.open()
    wait_for(lambda: done(scheduler, key), WAIT_S, "the analysis finished")
    assert sorted(stub.of("shared.tif")) == sorted(plan.chunks), "one analysis: each chunk once"


def test_a_small_slide_started_second_takes_turns_and_finishes_long_before_the_large(plan, client, stub, tmp_path):
    large, small = own(plan, tmp_path, "large.tif"), own(plan, tmp_path, "small.tif", plan.chunks[:6])
    scheduler = ChunkScheduler(client)
    scheduler.analyse(large, viewer="one")
    wait_for(lambda: len(stub.of("large.tif")) == 2, WAIT_S, "the large slide's first chunks held at the gate")
    scheduler.analyse(small, viewer="two")
    stub.open()
    wait_for(lambda: done(scheduler, large.store.folder.name) and done(scheduler, small.store.folder.name), WAIT_S,
             "both finished")
    names = [name for name, _ in stub.started]
    last_small = max(k for k, name in enumerate(names) if name == "small.tif")
    # The three tasks of the large slide already on the cluster, then the slots shared: the small slide's six chunks
    # start within its six turns and the large one's six.
    assert last_small < 3 + 2 * 6
    assert names[:3] == ["large.tif"] * 3 and names.count("large.tif") == 128
    assert names[:last_small].count("large.tif") <= 3 + 6, "alone it would have waited for 128"
    assert scheduler.progress(small.store.folder.name).done == 6


def test_a_stopped_analysis_runs_below_the_one_looked_at(plan, client, stub, tmp_path):
    background, looked_at = own(plan, tmp_path, "closed.tif"), own(plan, tmp_path, "open.tif", plan.chunks[:20])
    scheduler = ChunkScheduler(client)
    scheduler.analyse(background, viewer="one")
    wait_for(lambda: len(stub.of("closed.tif")) == 2, WAIT_S, "the first slide's chunks held at the gate")
    scheduler.stop(background.store.folder.name)  # its slide closed: it carries on in the background
    assert scheduler.progress(background.store.folder.name).state == "background"
    scheduler.analyse(looked_at, viewer="one")
    stub.open()
    wait_for(lambda: done(scheduler, background.store.folder.name), WAIT_S, "the stopped one finished too")
    names = [name for name, _ in stub.started]
    assert names[:3] == ["closed.tif"] * 3 and names[3:23] == ["open.tif"] * 20, "none of its own while one waits"
    assert names.count("closed.tif") == 128, "finished in the background"


def test_a_failing_chunk_is_a_sentence_and_a_finished_analysis_lets_go(plan, client, stub, tmp_path):
    mine = own(plan, tmp_path, "failing.tif", plan.chunks[:10])
    key = mine.store.folder.name
    stub.failing = {plan.chunks[2], plan.chunks[7]}
    stub.open()
    scheduler = ChunkScheduler(client)
    scheduler.analyse(mine)
    wait_for(lambda: done(scheduler, key), WAIT_S, "the analysis finished")
    progress = scheduler.progress(key)
    assert (progress.done, progress.failed, progress.total) == (8, 2, 10), "the others finished"
    assert sorted(progress.errors) == sorted(f"failing.tif: chunk {index} failed on a worker (RuntimeError: the "
                                             "stub was told to fail)" for index in stub.failing)
    assert progress.sentence() == "Slide: 8 of 10 chunks, 2 failed."
    held = weakref.ref(mine)
    del mine
    gc.collect()
    assert held() is None and scheduler.running() == [], "its plan let go"
    wait_for(lambda: not [k for k in client.futures if key in str(k)], WAIT_S, "its futures let go")

    stub.failing = set()
    again = own(plan, tmp_path, "failing.tif", plan.chunks[:10])
    assert scheduler.analyse(again).done == 8, "the finished ones read back from the store"
    wait_for(lambda: done(scheduler, key), WAIT_S, "the second analysis finished")
    assert sorted(stub.of("failing.tif")[10:]) == sorted({plan.chunks[2], plan.chunks[7]}), "only those again"
    assert scheduler.progress(key).done == 10


def test_a_lost_scheduler_is_a_sentence(plan, client, stub, tmp_path):
    from distributed.comm.core import CommClosedError

    def gone(*args, **kwargs):
        raise CommClosedError("in <TCP (closed) local=tcp://127.0.0.1:1 remote=tcp://127.0.0.1:2>")

    mine = own(plan, tmp_path, "lost.tif")
    scheduler = ChunkScheduler(client, address="tcp://127.0.0.1:2", submit=gone)
    progress = scheduler.analyse(mine)
    assert progress.state == "lost" and progress.done == 0 and progress.running == 0
    assert progress.lost == ("the Dask scheduler at tcp://127.0.0.1:2 stopped answering; the chunks finished so far "
                             "are stored, and Analyse resumes from them once it answers again")
    assert progress.sentence().startswith("The Dask scheduler at tcp://127.0.0.1:2 stopped answering")


def test_the_spread_order_serves_every_block_of_a_level_before_any_twice():
    rng = np.random.default_rng(0)
    chunks = [(i, j) for i in range(13) for j in range(9) if rng.random() < 0.7]
    order = spread_order(reversed(chunks))
    assert sorted(order) == sorted(chunks) and len(set(order)) == len(chunks)
    assert order == spread_order(chunks), "a function of the set"
    r0, r1 = min(i for i, _ in chunks), max(i for i, _ in chunks)
    c0, c1 = min(j for _, j in chunks), max(j for _, j in chunks)
    assert 12 >= r1 - r0 > 8 and c1 - c0 <= 8, "a 16 x 16 square over them"
    centre = ((r0 + r1) / 2, (c0 + c1) / 2)
    assert order[0] == min(chunks, key=lambda c: ((c[0] - centre[0]) ** 2 + (c[1] - centre[1]) ** 2, c)), \
        "the nearest the centre first"
    for size in (8, 4, 2):  # the blocks' side at each level of the 16 x 16 square over the chunks
        blocks = {((i - r0) // size, (j - c0) // size) for i, j in chunks}
        counts = dict.fromkeys(blocks, 0)
        for k, (i, j) in enumerate(order):
            counts[(i - r0) // size, (j - c0) // size] += 1
            if min(counts.values()) == 0:
                assert max(counts.values()) == 1, f"blocks of {size}: a second before every block had one ({k})"
        served = [((i - r0) // size, (j - c0) // size) for i, j in order[:len(blocks)]]
        assert len(set(served)) == len(blocks), f"the first {len(blocks)} chunks: one in each block of {size}"
    assert spread_order(chunks, first=chunks[-1])[0] == chunks[-1]
    assert spread_order([]) == []


def test_the_chunks_edges_are_their_cells_in_level_0_pixels(plan):
    rows, cols = chunk_edges(plan.grid)
    corners, (cell_rows, cell_cols) = plan.grid.cell_top_left_px(), plan.grid.cell_size_px()
    for ci, cj in plan.chunks[:20]:
        i0, i1, j0, j1 = plan.grid.cell_block(ci, cj)
        assert rows[ci].tolist() == pytest.approx([corners[i0, 0, 0], corners[i1 - 1, 0, 0] + cell_rows])
        assert cols[cj].tolist() == pytest.approx([corners[0, j0, 1], corners[0, j1 - 1, 1] + cell_cols])


class Handed:
    """A future the test finishes by hand (no cluster): ``finish`` runs the done-callbacks in the test's thread."""

    def __init__(self, key: str, result):
        self.key, self.status, self._result, self._callbacks = key, "pending", result, []

    def add_done_callback(self, callback) -> None:
        self._callbacks.append(callback)

    def result(self):
        return self._result

    def finish(self) -> None:
        self.status = "finished"
        for callback in self._callbacks:
            callback(self)


def test_the_time_left_is_the_rate_of_the_last_chunks_in_wall_time(plan, tmp_path):
    mine = own(plan, tmp_path, "rate.tif", plan.chunks[:10])
    now = [100.0]
    handed: list[Handed] = []

    def submit(client, plan, ci, cj):
        handed.append(Handed(f"chunk-{ci}-{cj}", (empty_chunk(plan.grid, ci, cj), 3.0)))
        return handed[-1]

    scheduler = ChunkScheduler(None, slots=2, submit=submit, clock=lambda: now[0])
    key = mine.store.folder.name
    progress = scheduler.analyse(mine)
    assert (progress.running, progress.rate, progress.seconds_left) == (2, None, None)
    assert progress.sentence() == "Slide: 0 of 10 chunks, time left not yet measured."
    for at in (102.0, 104.0):  # a chunk every 2 s of wall time
        now[0] = at
        handed[len(handed) - 2].finish()
    progress = scheduler.progress(key)
    assert (progress.done, progress.running, progress.rate, progress.seconds_left) == (2, 2, 0.5, 16.0)
    assert progress.worker_seconds == 6.0, "the tasks' own seconds, summed"
    assert progress.sentence() == "Slide: 2 of 10 chunks, about 16 s left at 0.5 chunks/s."
    scheduler.stop(key)
    assert scheduler.progress(key).sentence().endswith("about 16 s left at 0.5 chunks/s (in the background).")
    assert scheduler.finished_since(key, 1) == (2, [handed[1].result()[0].index])
    assert scheduler.finished_since(key, 99) == (2, [h.result()[0].index for h in handed[:2]]), "stale: all"


def test_a_viewer_not_heard_from_is_taken_for_gone(plan, tmp_path):
    from app.slides.schedule import VIEWER_TIMEOUT_S

    mine = own(plan, tmp_path, "tab.tif", plan.chunks[:10])
    now = [0.0]

    def submit(client, plan, ci, cj):
        return Handed(f"chunk-{ci}-{cj}", None)

    scheduler = ChunkScheduler(None, slots=2, submit=submit, clock=lambda: now[0])
    key = mine.store.folder.name
    scheduler.analyse(mine, viewer="tab", view=view_of(plan, *plan.chunks[9])[0])
    assert scheduler.progress(key).state == "running" and scheduler.progress(key).in_view > 0
    now[0] = VIEWER_TIMEOUT_S * 0.8
    scheduler.progress(key, viewer="tab")  # the page's refresh: still there
    now[0] = VIEWER_TIMEOUT_S * 1.6
    assert scheduler.progress(key).state == "running"
    now[0] = VIEWER_TIMEOUT_S * 1.9
    progress = scheduler.progress(key)
    assert (progress.state, progress.in_view) == ("background", 0), "a closed tab: no view, in the background"
