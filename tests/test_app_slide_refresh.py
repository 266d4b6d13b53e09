"""What a refresh of the Slide page hands its viewer (AppTest): a few hundred bytes whatever the slide's size (the
overlays are tiles the viewer fetches, hover a lookup by cell), growing only by the chunks finished since the last
refresh; and the view the browser reports, clamped to the slide."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

import app.ui.slide_page as slide_page
from app.slides.demos import mosaic_entry
from app.slides.library import DEMO_FOLDER
from app.slides.run import plan_slide
from app.ui.slide_page import viewer_rect
from benchmarks.synthetic_store import synthetic_chunk
from tests.conftest import REPO, require_shared

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
MAIN = str(REPO / "app" / "main.py")
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


def recorded(monkeypatch) -> list[dict]:
    """Every ``data`` the page hands the viewer, as it is sent (JSON)."""
    calls = []
    viewer = slide_page._VIEWER

    def recording(**kwargs):
        calls.append(json.loads(json.dumps(kwargs["data"])))
        return viewer(**kwargs)

    monkeypatch.setattr(slide_page, "_VIEWER", recording)
    return calls


def test_a_refresh_sends_the_same_few_hundred_bytes_whatever_the_slides_size(tmp_path, monkeypatch):
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    small = replace(mosaic_entry(tmp_path / "demos", count=4), name="mosaic of 4")
    large = replace(mosaic_entry(tmp_path / "demos", count=225), name="mosaic of 225")
    monkeypatch.setattr("app.slides.library.demo_images", lambda: [small, large])
    monkeypatch.setattr(slide_page, "STORE", tmp_path / "store")
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "no_slides_here"))
    plans = {entry.slide_id: plan_slide(entry.path, CHECKPOINT, tmp_path / "store", 0.972)
             for entry in (small, large)}
    cells = {name: plan.grid.cells.rows * plan.grid.cells.cols for name, plan in plans.items()}
    assert cells[small.slide_id] == 16 and cells[large.slide_id] == 43 * 43
    large_plan = plans[large.slide_id]
    for plan in plans.values():  # a stub engine: known values (benchmarks/synthetic_store.py), all but three chunks
        for index in plan.chunks[: len(plan.chunks) - (3 if plan is large_plan else 0)]:
            plan.store.put(synthetic_chunk(plan, *index))
    calls = recorded(monkeypatch)
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    at.sidebar.radio(key="view").set_value("Slide").run()
    sizes = {}
    for entry in (small, large):
        box = at.sidebar.selectbox(key="slide")
        at = box.set_value(entry.slide_id).run()
        deadline = time.monotonic() + 60  # the plan is made in the background
        while not (calls[-1]["dzi"] == f"slides/{entry.slide_id}.dzi" and calls[-1]["layers"].get("overlay")) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
            at.run()
        assert not at.exception
        data = calls[-1]
        grid = plans[entry.slide_id].grid
        assert data["cells"] == dict(top=data["cells"]["top"], left=data["cells"]["left"], rows=grid.cells.rows,
                                     cols=grid.cells.cols, height=data["cells"]["height"],
                                     width=data["cells"]["width"]), "the grid's lattice, not a value per cell"
        sizes[entry.slide_id] = len(json.dumps(data))
    # 16 cells or 1,849, the same bytes but for the digits of the numbers in it.
    assert max(sizes.values()) < 2500 and abs(sizes[small.slide_id] - sizes[large.slide_id]) < 80, sizes

    # Three chunks finish: the next refresh names them (their rectangles), and only them; the one after, none.
    overlay = calls[-1]["layers"]["overlay"]
    finishing = large_plan.chunks[-3:]
    for index in finishing:
        large_plan.store.put(synthetic_chunk(large_plan, *index))
    at.run()
    refreshed = calls[-1]["layers"]["overlay"]
    assert refreshed["since"] == overlay["version"] and refreshed["version"] == overlay["version"] + 1
    from app.slides.overlay_tiles import chunk_rect

    assert refreshed["rects"] == [chunk_rect(large_plan.grid, *index) for index in sorted(finishing)]
    assert len(json.dumps(calls[-1])) - sizes[large.slide_id] < 3 * 60, "a few dozen bytes a chunk finished"
    at.run()
    assert calls[-1]["layers"]["overlay"] == refreshed and not at.exception, "nothing new: the same message again"


def test_the_view_the_browser_reports_is_clamped_to_the_slide():
    size = (1000, 2000)  # rows, cols
    assert viewer_rect(size, {"x": 10, "y": 20, "width": 300, "height": 400}) == (10, 20, 300, 400)
    assert viewer_rect(size, {"x": -50, "y": 900, "width": 1e300, "height": 500}) == (0, 900, 2000, 100)
    assert viewer_rect(size, {"x": 5000, "y": -1e9, "width": -3, "height": 10}) == (2000, 0, 0, 0)
    assert viewer_rect(size, {"x": float("inf"), "y": 0, "width": 1, "height": 1}) == (2000, 0, 0, 1), \
        "an infinite edge is the slide's edge: a view of no area, with no chunk in it"
    for absurd in (None, "view", {"x": 1}, {"x": "nan", "y": 0, "width": 1, "height": 1},
                   {"x": float("nan"), "y": 0, "width": 1, "height": 1}, {"x": [1], "y": 0, "width": 1, "height": 1},
                   {"x": 10**400, "y": 0, "width": 1, "height": 1}, {"x": True, "y": 0, "width": 1, "height": 1}):
        assert viewer_rect(size, absurd) is None, absurd


def test_plans_are_kept_per_session_and_slide(monkeypatch):
    """One session's tries of many scales push out only its own older plans of that slide, never another
    session's nor its own plans of other slides (issue 66)."""
    made = []
    monkeypatch.setattr(slide_page, "_make_plan", lambda *args: made.append(args) or args)
    sessions = [{}, {}]
    for state in sessions:
        monkeypatch.setattr(slide_page.st, "session_state", state)
        slide_page._planning("B", "b.svs", "model", 0.5)
    monkeypatch.setattr(slide_page.st, "session_state", sessions[0])
    for k in range(10):
        slide_page._planning("A", "a.svs", "model", 0.1 + k / 100)
    kept = sessions[0][slide_page.PLANS]
    assert list(kept) == ["B", "A"] and len(kept["A"]) == slide_page.PLANS_PER_SLIDE
    # A plan's key: path, model, scale, element, stain, precision asked for.
    assert list(sessions[1][slide_page.PLANS]["B"]) == [("b.svs", "model", 0.5, 0, "none", "auto")]
    count = len(made)
    slide_page._planning("B", "b.svs", "model", 0.5)
    assert len(made) == count, "the kept plan, not made again"
    for slide in ("C", "D"):
        slide_page._planning(slide, f"{slide}.svs", "model", 0.5)
    assert list(kept) == ["B", "C", "D"], f"the latest {slide_page.SLIDES_PLANNED} slides used"


def test_the_refresh_follows_the_rate_chunks_finish_at():
    from app.ui.refresh import LONGEST_S, SHORTEST_S, keeps_interval, refresh_interval

    # Not yet measured (or nonsense): the shortest, so that the first cells come within it.
    for rate in (None, 0.0, -1.0, float("nan"), float("inf")):
        assert refresh_interval(rate) == SHORTEST_S
    # About one chunk's time, as a power of two of the shortest, within [shortest, longest].
    assert refresh_interval(10.0) == SHORTEST_S  # a chunk every 0.1 s
    assert refresh_interval(1 / 0.9) == SHORTEST_S
    assert refresh_interval(1 / 1.0) == 1.0
    assert refresh_interval(1 / 1.9) == 1.0  # the gigapixel slide's chunk every 1.9 s: 4 refreshes in 4 s -> 2
    assert refresh_interval(1 / 2.0) == 2.0
    assert refresh_interval(1 / 60.0) == LONGEST_S
    for rate in (5.0, 1.3, 1 / 1.5, 0.4, 0.1, 0.01):
        interval = refresh_interval(rate)
        assert keeps_interval(interval, rate), (rate, interval)  # the interval it chose suits it
        assert interval <= max(SHORTEST_S, 1 / rate), "never longer than a chunk's time, but at the shortest"
    # A rate that wobbles about a boundary keeps its interval: a new one costs a run of the whole page.
    assert keeps_interval(1.0, 1 / 1.9) and keeps_interval(1.0, 1 / 2.1) and keeps_interval(2.0, 1 / 1.9)
    # Chunks four times slower than the interval (three refreshes in four find nothing), or faster than it by more
    # than the slack (each waits to be drawn): a new interval.
    assert not keeps_interval(0.5, 1 / 4.0) and refresh_interval(1 / 4.0) == 4.0
    assert not keeps_interval(2.0, 1 / 1.2) and refresh_interval(1 / 1.2) == 1.0
    # The ends are open: the shortest suits any faster rate, the longest any slower one; unmeasured, the shortest.
    assert keeps_interval(SHORTEST_S, 100.0) and keeps_interval(LONGEST_S, 1e-4)
    assert keeps_interval(SHORTEST_S, None) and not keeps_interval(2.0, None)


def test_while_the_views_chunks_are_all_in_the_page_refreshes_seldom_and_a_pan_to_work_makes_it_often_again():
    """Every chunk in view in: a refresh changes only the status line's counts, so at least every VIEW_DONE_S
    (a chunk still runs every 0.7 s elsewhere); a view with chunks waiting goes back to the chunks' rate."""
    from app.ui.refresh import LONGEST_S, SHORTEST_S, VIEW_DONE_S, keeps_interval, refresh_interval

    for rate in (None, 10.0, 1.4, 1 / 1.5):
        assert refresh_interval(rate, view_done=True) == VIEW_DONE_S
        assert keeps_interval(VIEW_DONE_S, rate, view_done=True), rate
    assert refresh_interval(1 / 60.0, view_done=True) == LONGEST_S  # a slow cluster's own interval is longer
    assert keeps_interval(LONGEST_S, 1 / 60.0, view_done=True)
    # The view done: the chunks' interval (0.5 s at 1.4 chunks/s) no longer suits; a pan to chunks not yet in: 2 s
    # no longer suits either, and the rate's comes back.
    assert keeps_interval(SHORTEST_S, 1.4) and not keeps_interval(SHORTEST_S, 1.4, view_done=True)
    assert not keeps_interval(VIEW_DONE_S, 1.4) and refresh_interval(1.4) == SHORTEST_S
    # A view done on a cluster slower than VIEW_DONE_S a chunk goes longer, as without a view.
    assert not keeps_interval(VIEW_DONE_S, 1 / 12.0, view_done=True)


def test_the_view_is_done_only_when_every_running_analysis_has_its_views_chunks_in():
    from app.slides.schedule import Progress
    from app.ui.slide_page import _view_done

    def progress(in_view_done, in_view, state="running"):
        return Progress("k", state, 5, 10, in_view_done, in_view, 1, 0, 1.0, 5.0, 1.0, (), None, 5)

    assert _view_done([progress(6, 6)]) and _view_done([progress(6, 6), progress(3, 3, "background")])
    assert not _view_done([progress(5, 6)]) and not _view_done([progress(6, 6), progress(0, 2)])
    assert not _view_done([progress(0, 0)]), "no view reported yet (or one over glass): the first cells must not wait"
    assert not _view_done([progress(6, 6, "done")]) and not _view_done([])
