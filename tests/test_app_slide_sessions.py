"""The Slide page's analyses through the server's one chunk scheduler (:mod:`app.slides.schedule`), driven in AppTest
by two sessions of the real page, on a real Dask cluster (one worker of two threads, in process), with the engine
stubbed (:class:`tests.chunk_stub.ChunkStub`: known values, :func:`benchmarks.synthetic_store.synthetic_chunk`,
each chunk held until the test lets it through).

Two AppTest instances in one process are two sessions of one server: their session states are their own, the page's
modules (and so the scheduler, the Dask client) are the server's. The slides are two PCam test mosaics: a large one
of 225 patches (43 x 43 cells, 11 x 11 chunks) and a small one of 9 (7 x 7 cells, 3 x 3 chunks).

- Fair: session B's small slide, analysed while session A's large one runs, is done when A has 14 of its 121 chunks.
- View first: the view in A's viewer state (the component's ``view``) is analysed first, a pan re-orders, and the
  page says ``In view: k of n``; the patch page chosen, the slide goes on in the background, and back on the Slide
  page the same slide is shown and looked at again, with its view.
- A slide left (another chosen) is left at once, while the new one's plan is still being made; it keeps its finished
  chunks and goes on in the background, below the slide another session looks at.

Orders and counts only, never seconds.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest
from chunk_stub import WAIT_S, ChunkStub, in_process_client, inner_chunks, view_of
from dask_processes import wait_for

import app.slides.run as run
import app.slides.schedule as schedule
import app.ui.slide_page as slide_page
from app.slides.demos import mosaic_entry
from app.slides.library import DEMO_FOLDER
from app.slides.store import ChunkStore
from benchmarks.synthetic_store import synthetic_chunk
from tests.conftest import REPO, require_shared

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
pytest.importorskip("dask.distributed")
MAIN = str(REPO / "app" / "main.py")
CHUNK = {225: 4, 9: 3}  # cells a side of a chunk, by the mosaic's patches
LARGE, SMALL = 121, 9  # their chunks with tissue
SESSION = "test-session"  # the session's name in its state, for the test to tell whose viewer was handed what


@pytest.fixture(scope="module")
def client():
    with in_process_client() as client:
        yield client


@pytest.fixture(scope="module")
def mosaics(tmp_path_factory):
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    folder = tmp_path_factory.mktemp("demos")
    made = {count: mosaic_entry(folder / str(count), count=count) for count in CHUNK}
    if None in made.values():
        pytest.skip("no PCam test patches to make the mosaics of")
    return {count: replace(entry, name=f"mosaic of {count}", truth=None) for count, entry in made.items()}


class Server:
    """The page's server for one test: its slides the two mosaics, its store in ``tmp_path``, its Dask client the
    in-process cluster's (already connected), its scheduler new, its engine ``stub``; ``plans`` the plans the page
    made, by slide file."""

    def __init__(self, monkeypatch, tmp_path: Path, client, mosaics):
        self.client, self.mosaics, self.plans = client, mosaics, {}
        self.held_plans = {count: threading.Event() for count in mosaics}  # cleared: the mosaic's plans wait
        for gate in self.held_plans.values():
            gate.set()
        self.stub = ChunkStub(result=lambda path, ci, cj: synthetic_chunk(self.plans[Path(path).name], ci, cj))
        connected: Future = Future()
        connected.set_result(client)
        # The small one first: a new session's page shows it before the test chooses (its plan is cheap).
        monkeypatch.setattr(slide_page, "list_slides", lambda: [mosaics[9], mosaics[225]])
        monkeypatch.setattr(slide_page, "STORE", tmp_path / "store")
        monkeypatch.setattr(slide_page, "PLAN_WAIT_S", 0.0)  # no browser asks for tiles here
        monkeypatch.setattr(slide_page, "plan_slide", self._plan)
        monkeypatch.setattr(slide_page, "dask_client", lambda: client)
        monkeypatch.setattr(slide_page, "_connecting", lambda: connected)
        monkeypatch.setattr(schedule, "_SHARED", {})  # a scheduler of this test's own
        monkeypatch.setattr(run, "chunk_task", self.stub)
        self.shown: list[tuple[str, dict]] = []  # (session, what its viewer was handed, as it is sent)
        viewer = slide_page._VIEWER

        def recording(**kwargs):
            self.shown.append((slide_page.st.session_state[SESSION], json.loads(json.dumps(kwargs["data"]))))
            return viewer(**kwargs)

        monkeypatch.setattr(slide_page, "_VIEWER", recording)

    def _plan(self, path, checkpoint, store, mpp, element=0, stain="none", precision="auto"):
        count = next(count for count, entry in self.mosaics.items() if entry.path == Path(path))
        assert self.held_plans[count].wait(WAIT_S), "the test never let the plan be made"
        plan = run.plan_slide(path, checkpoint, store, mpp, chunk=CHUNK[count], element=element, stain=stain,
                              precision=precision)
        self.plans[Path(path).name] = plan
        return plan

    def session(self, name: str, count: int) -> AppTest:
        """A new session, called ``name``, on the Slide page with mosaic ``count`` chosen and planned."""
        at = AppTest.from_file(MAIN, default_timeout=120)
        at.session_state[SESSION] = name
        at.run()
        at.sidebar.radio(key="view").set_value("Slide").run()
        return self.choose(at, count)

    def choose(self, at: AppTest, count: int) -> AppTest:
        """Session ``at`` chooses mosaic ``count``: the page once its plan is made and shown."""
        return self.planned(at.sidebar.selectbox(key="slide").set_value(self.mosaics[count].slide_id).run(), count)

    def planned(self, at: AppTest, count: int) -> AppTest:
        deadline = time.monotonic() + WAIT_S  # the plan is made in the background
        while self.plan(count) is None or not self.said(at, count):
            assert time.monotonic() < deadline, "the slide's plan was never shown"
            time.sleep(0.1)
            at.run()
        assert not at.exception, at.exception
        assert len(self.plan(count).chunks) == {225: LARGE, 9: SMALL}[count]
        return at

    def plan(self, count: int):
        return self.plans.get(self.mosaics[count].path.name)

    def key(self, count: int) -> str:
        return self.plan(count).store.folder.name

    def said(self, at: AppTest, count: int) -> str | None:
        """What session ``at``'s viewer of mosaic ``count`` was last told in its status line (None: not shown since
        planned)."""
        route, session = f"slides/{self.mosaics[count].slide_id}.dzi", at.session_state[SESSION]
        return next((data["caption"] for name, data in reversed(self.shown) if name == session
                     and data["dzi"] == route and data["caption"] != "Finding the tissue ..."), None)

    def analyse(self, at: AppTest, count: int) -> AppTest:
        at = at.button(key=f"analyse-{self.mosaics[count].slide_id}").click().run()
        assert not at.exception, at.exception
        return at

    def look(self, at: AppTest, count: int, view: tuple) -> AppTest:
        """The viewer's view message: the component's state ``view`` as the browser sets it, then the page's run."""
        left, top, width, height = (float(v) for v in view)
        at.session_state[f"slide-viewer-{self.mosaics[count].slide_id}"] = dict(
            view=dict(x=left, y=top, width=width, height=height))
        return at.run()

    def progress(self, count: int):
        return schedule.current_scheduler().progress(self.key(count))


@pytest.fixture
def server(monkeypatch, tmp_path, client, mosaics):
    server = Server(monkeypatch, tmp_path, client, mosaics)
    yield server
    scheduler = schedule.current_scheduler()
    if scheduler is not None:
        scheduler.close()
    server.stub.open()  # nothing left held after a failed test
    for gate in server.held_plans.values():
        gate.set()


def held(server, count: int, running: int = 3) -> None:
    """Wait until the workers' two threads hold chunks of mosaic ``count`` and ``running`` of its tasks are on the
    cluster (its threads and the scheduler's margin of one)."""
    wait_for(lambda: sum(1 for name, _ in server.stub.started if name == server.mosaics[count].path.name)
             - len(server.stub.ended) >= 2 and server.progress(count).running == running, WAIT_S,
             "two chunks held at the stub, three tasks on the cluster")


def test_a_view_in_the_viewers_state_is_analysed_first_and_a_pan_reorders(server):
    at = server.session("a", 225)
    plan, key = server.plan(225), server.key(225)
    inner = inner_chunks(plan)
    first, second = inner[0], inner[-1]
    assert abs(first[0] - second[0]) + abs(first[1] - second[1]) > 6, "two corners of the slide, apart"
    view, in_view = view_of(plan, *first)
    at = server.look(at, 225, view)  # before Analyse: kept, for the Analyse to give the scheduler
    assert at.session_state[slide_page.VIEW] == (key, *(float(v) for v in view))
    server.analyse(at, 225)
    held(server, 225)
    scheduler = schedule.current_scheduler()
    submitted = set(plan.chunks) - set(scheduler.waiting_order(key))
    share = {index: run.tissue_share(plan.grid, plan.tissue, *index) for index in in_view}
    started = server.stub.of(plan.slide.name)
    assert share[started[0]] == min(share.values()), "the view's quickest chunk (the least tissue) first"
    assert first in started[:2], "the chunk nearest the view's centre beside it (or first, on a tie)"
    assert len(submitted) == 3 and submitted <= in_view, "then the view's"
    assert server.progress(225).in_view == len(in_view) == 9

    # A pan: the viewer's next view message, to the other corner. What waits is re-ordered at the page's run.
    view, in_view = view_of(plan, *second)
    at = server.look(at, 225, view)
    assert not at.exception
    waiting = scheduler.waiting_order(key)
    assert waiting[0] == second and set(waiting[:9]) == in_view, "the new view's chunks next, its centre first"
    server.stub.allow(3 + 9)  # the three on the cluster at the pan, then nine more
    wait_for(lambda: server.progress(225).done == 12, WAIT_S, "twelve chunks finished")
    _, finished = scheduler.finished_since(key)
    assert set(finished) == submitted | in_view, "the three on the cluster at the pan, then exactly the new view's"
    started = server.stub.of(plan.slide.name)
    assert set(started[:3]) == submitted and started[3] == second and set(started[3:12]) == in_view, \
        "started in that order: the three on the cluster, then the new view's, its centre first"
    assert ChunkStore(slide_page.STORE, key).finished() == set(finished), "each in the store, on disk"
    at.run()
    assert server.said(at, 225).startswith("Analysing. In view: 9 of 9 chunks. Slide: 12 of 121 chunks, about ")

    # Another page chosen: nobody looks at the slide, which goes on in the background; back, looked at again, with
    # the view the viewer last reported.
    at = at.sidebar.radio(key="view").set_value("Patch").run()
    assert not at.exception and server.progress(225).state == "background"
    assert scheduler._analyses[key].viewers == {} and server.progress(225).in_view == 0
    at = at.sidebar.radio(key="view").set_value("Slide").run()
    assert at.sidebar.selectbox(key="slide").value == server.mosaics[225].slide_id, "the slide chosen, again"
    assert not at.exception and server.progress(225).state == "running"
    assert (server.progress(225).in_view_done, server.progress(225).in_view) == (9, 9)


def test_a_small_slide_of_a_second_session_is_not_kept_waiting_behind_a_large_one(server):
    a = server.session("a", 225)
    server.analyse(a, 225)
    held(server, 225)
    scheduler = schedule.current_scheduler()
    b = server.session("b", 9)
    server.analyse(b, 9)
    # Two sessions, one server: their own session states, the page's one scheduler and one Dask client.
    mine = {name: at.session_state[slide_page.VIEWER_ID] for name, at in (("a", a), ("b", b))}
    assert mine["a"] != mine["b"]
    assert schedule.current_scheduler() is scheduler and scheduler._client is server.client
    assert set(scheduler._analyses[server.key(225)].viewers) == {mine["a"]}
    assert set(scheduler._analyses[server.key(9)].viewers) == {mine["b"]}
    assert server.progress(9).state == server.progress(225).state == "running"

    # The three tasks of A's slide on the cluster go first; then the slots are shared in turn: B's nine chunks are
    # through within their nine turns and A's nine (two to spare), where behind A's slide they would wait for 121.
    let_through = 3 + 2 * SMALL + 2
    server.stub.allow(let_through)
    wait_for(lambda: server.progress(225).done + server.progress(9).done == let_through, WAIT_S,
             f"{let_through} chunks finished")
    small, large = server.progress(9), server.progress(225)
    assert (small.state, small.done, small.total, small.failed) == ("done", SMALL, SMALL, 0)
    assert (large.state, large.done, large.total) == ("running", let_through - SMALL, LARGE)
    assert large.done / large.total < 0.12, "B complete with A at 14 of its 121 chunks"
    ended = [name for name, _ in server.stub.ended]
    last_small = max(k for k, name in enumerate(ended) if name == server.mosaics[9].path.name)
    assert ended[:last_small].count(server.mosaics[225].path.name) <= 3 + SMALL + 2
    b.run()
    assert server.said(b, 9).endswith(f"; {SMALL} of {SMALL} chunks analysed (grey stripes: not yet). Hover a cell for "
                                   "its P(tumour), click it to open it in the patch page.")
    a.run()
    assert server.said(a, 225).startswith(f"Analysing. Slide: {let_through - SMALL} of {LARGE} chunks, about ")

    server.stub.open()
    wait_for(lambda: server.progress(225).state == "done", WAIT_S, "A's slide finished")
    assert sorted(server.stub.of(server.mosaics[225].path.name)) == sorted(server.plan(225).chunks), "each once"


def test_a_slide_left_keeps_its_chunks_and_goes_on_in_the_background_below_one_looked_at(server):
    server.held_plans[9].clear()  # A's plan of the small slide (the page's first, not yet chosen) waits
    a = server.session("a", 225)
    key = server.key(225)
    server.analyse(a, 225)
    held(server, 225)
    server.stub.allow(5)
    wait_for(lambda: server.progress(225).done == 5 and server.progress(225).running == 3, WAIT_S,
             "five chunks finished, three more on the cluster")
    a = a.sidebar.selectbox(key="slide").set_value(server.mosaics[9].slide_id).run()  # A leaves its slide
    assert server.said(a, 9) is None, "the small slide still being planned"
    scheduler = schedule.current_scheduler()
    assert server.progress(225).state == "background" and scheduler._analyses[key].viewers == {}, \
        "left at once, not once the new slide's plan is made"
    server.held_plans[9].set()
    a = server.planned(a, 9)
    assert server.progress(225).state == "background"
    _, finished = scheduler.finished_since(key)
    assert len(finished) == 5 and ChunkStore(slide_page.STORE, key).finished() == set(finished), \
        "its finished chunks in the store, on disk"

    b = server.session("b", 9)
    server.analyse(b, 9)
    assert server.progress(9).state == "running"
    server.stub.open()
    wait_for(lambda: server.progress(9).state == server.progress(225).state == "done", WAIT_S, "both finished")
    names = [name for name, _ in server.stub.started]
    large, small = server.mosaics[225].path.name, server.mosaics[9].path.name
    # Five finished, two held, one waiting on the worker; then B's nine, none of A's while one of B's waits.
    assert names[:8] == [large] * 8 and names[8:8 + SMALL] == [small] * SMALL
    assert names.count(large) == LARGE, "A's slide finished in the background, each chunk once"
    assert ChunkStore(slide_page.STORE, key).finished() == set(server.plan(225).chunks)
    b.run()
    assert server.said(b, 9).endswith(f"; {SMALL} of {SMALL} chunks analysed (grey stripes: not yet). Hover a cell for "
                                   "its P(tumour), click it to open it in the patch page.")
