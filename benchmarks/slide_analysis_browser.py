"""A slide analysed in the Slide page, in Chromium: the gigapixel slide's actions of issue 68, and the CMU slide whole
in the app against ``python -m app.slides`` on it (``python -m benchmarks.browser_latency --page slide --gigapixel``,
``... --whole-slide``).

``--gigapixel``: ``app/server.py`` with the slide of :mod:`benchmarks.gigapixel_slide` (100,000 x 100,000 px, built
once into the user cache) alone in ``$APP_SLIDES`` and an empty store, the Slide page opened in Chromium, then:

- the view put on one island (:data:`VIEW_PX` level-0 pixels across, OpenSeadragon's ``fitBounds``) and Analyse:
  seconds to the first cells drawn, and to the view's cells drawn (the status line's "In view: n of n chunks", the
  overlay's tiles in view loaded);
- a pan to another island (``fitBounds`` again): seconds to its cells drawn;
- over the analysis until then and :data:`ANALYSIS_S` seconds after Analyse at least: the websocket's bytes per
  minute (every frame's payload, both ways), and the CPU seconds of the server (its process and children but the
  Dask worker), of Chromium (this benchmark's browser's processes) and of the Dask worker (the server's
  ``multiprocessing`` children), from ``/proc`` through ``psutil``: the page's share is (server + Chromium) / all;
- then the whole slide in view, and each overlay chosen in turn (P(tumour), each reading of attention): seconds to the
  first frame drawn with its layer, and to its layer's tiles in view loaded (within :data:`SWITCH_TIMEOUT_S`: chunks
  finishing meanwhile add layers of their own), and the server's peak memory (its RSS and its children's summed,
  sampled every 0.1 s) while each is shown for :data:`HOLD_S` seconds; before Analyse, with the tissue outline only,
  and over the analysis (P(tumour) shown).

``--whole-slide``: the CMU demo slide whole: the app (the Slide page, Analyse, to the status line's "n of n chunks
analysed") and ``python -m app.slides`` on the same slide with a local cluster of the same shape, one after the other;
their seconds and ratio (issue 68's goal: the app at most 1.15 times the command).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.browser_latency import MARK_SCRIPT, OVERLAY_DRAWN
from benchmarks.concurrent_sessions import CHROMIUM_ARGS, environment, free_port, streamlit_server
from benchmarks.slides_gigapixel import ServerMemory

__all__ = ["gigapixel_actions", "whole_slide", "CpuTrees"]

REPO = Path(__file__).resolve().parents[1]
VIEW_PX = 2000  # level-0 pixels across the view put on an island: 500 um, about 20x in a 1,000-pixel viewer
ANALYSIS_S = 60.0  # the analysis measured at least this long before the overlays are switched
HOLD_S = 5.0  # each overlay shown this long, the memory sampled
SWITCH_TIMEOUT_S = 60.0
SAMPLE_S = 0.1
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
CMU_SLIDE = "CMU-1-Small-Region.svs"
OVERLAY_LABEL = "P(tumour) per cell"  # the Slide page's first overlay; then its readings of attention, in this order
READINGS = ("spatial", "removed", "kept")
POLL_MS = 100  # long waits look every 0.1 s, not every frame: a page polled 60 times a second costs Chromium's CPU

VIEWER = ("window.__settle.roots.flatMap((root) => [...root.querySelectorAll('.slide-viewer')])"
          ".find((viewer) => viewer.isConnected && viewer.viewer)")
LOADED = ("((v) => { const w = v.viewer.world; for (let i = 0; i < w.getItemCount(); i++) "
          "if (!w.getItemAt(i).getFullyLoaded()) return false; return v.dataset.overlay === 'drawn'; })")
# The view's chunks all analysed (the status line) and the overlay's tiles in view loaded.
VIEW_DRAWN = (f"(() => {{ const v = {VIEWER}; if (!v) return false; "
              "const m = /In view: ([\\d,]+) of ([\\d,]+) chunks/.exec(v.querySelector('.status')?.textContent || ''); "
              f"return !!m && m[1] === m[2] && {LOADED}(v); }})()")
SLIDE_DONE = (f"(() => {{ const v = {VIEWER}; if (!v) return false; "
              "const m = /([\\d,]+) of ([\\d,]+) chunks analysed/.exec(v.querySelector('.status')?.textContent || ''); "
              "return !!m && m[1] === m[2]; })()")


def overlay_drawn(kind: str) -> str:
    """The JS condition: the overlay ``kind`` (``tumour``, ``spatial``, ...) drawn, its tiles in view loaded."""
    return (f"(() => {{ const v = {VIEWER}; return !!v && v.dataset.overlayKind === {json.dumps(kind)} "
            f"&& {LOADED}(v); }})()")


def overlay_shown(kind: str) -> str:
    """The JS condition: a frame drawn with the overlay ``kind``'s layer (its tiles in view may still be loading)."""
    return (f"(() => {{ const v = {VIEWER}; return !!v && v.dataset.overlayKind === {json.dumps(kind)} "
            "&& v.dataset.overlay === 'drawn'; })()")


def fit(session, rect: tuple[float, float, float, float]) -> float:
    """Put the viewer on ``rect`` (level-0 x, y, width, height) at once; the page's clock then (ms)."""
    x, y, w, h = rect
    return session.page.evaluate(
        f"() => {{ const v = {VIEWER}; const item = v.viewer.world.getItemAt(0); "
        f"v.viewer.viewport.fitBounds(item.imageToViewportRectangle({x}, {y}, {w}, {h}), true); "
        "return performance.now(); }")


def wait_js(session, condition: str, timeout_s: float, polling="raf") -> float:
    """Wait for the JS ``condition`` (on every animation frame, or every ``polling`` ms); the page's clock when it
    held (ms)."""
    session.page.wait_for_function(f"() => ({condition}) && (window.__settle.held = performance.now())",
                                   polling=polling, timeout=timeout_s * 1000)
    return session.page.evaluate("window.__settle.held")


def _click(session, locator) -> float:
    """Click ``locator``; the page's clock at the pointer's press (ms)."""
    session.page.evaluate(MARK_SCRIPT)
    locator.click()
    return session.page.evaluate("window.__settle.input ?? window.__settle.mark")


def islands(size: int = 100_000) -> list[tuple[float, float]]:
    """Level-0 points (x, y) inside the gigapixel slide's islands: each island's slot centre (the builder's layout,
    :func:`benchmarks.gigapixel_slide.island_mask`), kept where its mask says tissue."""
    import math

    from benchmarks.gigapixel_slide import GigapixelSpec, island_mask

    spec = GigapixelSpec(size=size)
    mask = island_mask(spec)
    cells = mask.shape[0]
    margin = math.ceil(0.04 * cells)
    per_row = math.ceil(math.sqrt(spec.islands))
    slot_y, slot_x = (cells - 2 * margin) / math.ceil(spec.islands / per_row), (cells - 2 * margin) / per_row
    points = []
    for index in range(spec.islands):
        row, col = divmod(index, per_row)
        cy, cx = margin + slot_y * (row + 0.5), margin + slot_x * (col + 0.5)
        if mask[int(cy), int(cx)]:
            points.append((cx * spec.mask_cell, cy * spec.mask_cell))
    return points


class CpuTrees:
    """CPU seconds (user + system, ``psutil``) of the server, its Dask worker and this process's Chromium, from
    :meth:`start` to :meth:`read`: processes that start meanwhile count from zero, those that end are lost."""

    def __init__(self, server_pid: int):
        self.server = psutil.Process(server_pid)
        self.me = psutil.Process()
        self.base: dict[int, float] = {}

    def _groups(self) -> dict[str, dict[int, float]]:
        groups: dict[str, dict[int, float]] = {"server": {}, "worker": {}, "chromium": {}}
        with contextlib.suppress(psutil.Error):
            groups["server"][self.server.pid] = _seconds(self.server)
        for child in self._children(self.server):
            with contextlib.suppress(psutil.Error):
                cmdline = " ".join(child.cmdline())
                group = "worker" if "spawn_main" in cmdline or "dask" in cmdline.lower() else "server"
                groups[group][child.pid] = _seconds(child)
        for child in self._children(self.me):
            with contextlib.suppress(psutil.Error):
                if "chrom" in child.name().lower() and child.pid not in groups["server"]:
                    groups["chromium"][child.pid] = _seconds(child)
        return groups

    @staticmethod
    def _children(process: psutil.Process) -> list[psutil.Process]:
        try:
            return process.children(recursive=True)
        except psutil.Error:
            return []

    def start(self) -> None:
        self.base = {pid: s for group in self._groups().values() for pid, s in group.items()}

    def read(self) -> dict[str, float]:
        """Seconds per group since :meth:`start`, and the page's share (server + Chromium over all)."""
        found = {name: sum(s - self.base.get(pid, 0.0) for pid, s in group.items())
                 for name, group in self._groups().items()}
        total = sum(found.values())
        return {**found, "page_share": (found["server"] + found["chromium"]) / total if total else None}


def _seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class TreeMemory(ServerMemory):
    """The server's RSS and its children's, summed (:class:`benchmarks.slides_gigapixel.ServerMemory`), sampled every
    :data:`SAMPLE_S` seconds; :meth:`peak` gives the largest since the last call (MiB), and :attr:`split` that
    sample's parts: the server's own RSS and its children's (the Dask worker's) summed."""

    def __init__(self, server_pid: int):
        super().__init__(server_pid, SAMPLE_S)
        self.split = (0.0, 0.0)
        self._split_peak = (0.0, 0.0)

    def now_mib(self) -> float:
        parts = self.parts_mib()
        if sum(parts) > sum(self._split_peak):
            self._split_peak = parts
        return sum(parts)

    def peak(self) -> float:
        peak, self.peak_mib = max(self.peak_mib, self.now_mib()), 0.0
        self.split, self._split_peak = tuple(round(v, 1) for v in self._split_peak), (0.0, 0.0)
        return peak


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


@contextlib.contextmanager
def _app_on(slides: Path, workdir: Path, timeout_s: float, chromium: Path):
    """The app on ``slides`` (its only slides folder) with an empty store, and a Chromium page on it
    (:class:`benchmarks.browser_latency.Session`), its first page drawn; yields ``(session, server, url)``."""
    from playwright.sync_api import sync_playwright

    from benchmarks.browser_latency import VIEWPORT, Session

    with contextlib.ExitStack() as stack:
        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        stack.callback(browser.close)
        session = Session(browser.new_page(viewport=VIEWPORT), 1000.0, timeout_s)
        stack.enter_context(environment(APP_SLIDES=str(slides), APP_SLIDE_STORE=str(workdir / "store")))
        server, url = stack.enter_context(streamlit_server(REPO / "checkpoints", workdir / "streamlit.log",
                                                           free_port(), time.monotonic() + timeout_s))
        session.measure(lambda: session.page.goto(url, wait_until="commit"), True)
        yield session, server, url


def _open_slide_page(session) -> dict:
    """The Slide page chosen: seconds to its first tiles and to its Analyse button."""
    from benchmarks.browser_latency import ANALYSE_SHOWN, slide_drawn, slide_first

    _, act = slide_first(session, 0)
    sample = session.measure_until(act, slide_drawn(), then={"button": ANALYSE_SHOWN})
    return dict(first_tiles_s=sample.seconds, analyse_button_s=sample.marks["button"])


def gigapixel_actions(slide: Path, timeout_s: float, chromium: Path) -> dict:
    """The gigapixel slide's actions (module docstring); a dict of every figure, the load average beside each."""
    report: dict = dict(slide=str(slide), load_before=_load())
    points = islands()
    first, second = points[0], points[-1]
    rect = lambda p: (p[0] - VIEW_PX / 2, p[1] - VIEW_PX / 3, VIEW_PX, VIEW_PX * 2 / 3)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="slide-analysis-") as tmp:
        slides = Path(tmp) / "slides"
        slides.mkdir()
        (slides / slide.name).symlink_to(slide)
        with _app_on(slides, Path(tmp), timeout_s, chromium) as (session, server, _), TreeMemory(server.pid) as memory:
            report.update(_open_slide_page(session), load_opened=_load())
            fit(session, rect(first))
            session._settle(first_panel=False)  # the view told to the page, its tiles drawn
            report.update(memory_outline_mib=memory.peak(), memory_outline_split_mib=memory.split)
            # The most tiled images the viewer held at once (the slide, the outline, the overlay and any layer still
            # loading over it), looked at every 0.1 s from here on.
            session.page.evaluate(f"() => {{ window.__mostItems = 0; setInterval(() => {{ const v = {VIEWER}; "
                                  "if (v) window.__mostItems = Math.max(window.__mostItems, "
                                  "v.viewer.world.getItemCount()); }, 100); }")
            cpu = CpuTrees(server.pid)
            cpu.start()
            received0, sent0 = session.websocket.received, session.websocket.sent
            started = time.monotonic()
            button = session.page.get_by_role("button", name="Analyse the slide").first
            clicked = _click(session, button)
            report.update(analyse_first_cells_s=(wait_js(session, OVERLAY_DRAWN, timeout_s, POLL_MS) - clicked) / 1000,
                          load_first_cells=_load())
            view_drawn = wait_js(session, VIEW_DRAWN, timeout_s, POLL_MS)
            before = session.page.evaluate(f"() => {VIEWER}.dataset.view")
            report.update(analyse_view_cells_s=(view_drawn - clicked) / 1000,
                          load_analyse=_load(), view_chunks=session.page.evaluate(
                              f"() => /In view: [\\d,]+ of ([\\d,]+)/.exec({VIEWER}.querySelector('.status')"
                              ".textContent)[1]"))
            panned = fit(session, rect(second))
            # The status line counts the new view once the page has had it: the viewer reports it (its data-view),
            # and a refresh after that one (one may have been on its way with the old view) draws the page's answer.
            said = wait_js(session, f"(() => {{ const v = {VIEWER}; return v.dataset.view !== {json.dumps(before)} "
                           "&& (window.__renders = Number(v.dataset.renders)); })()", timeout_s, POLL_MS)
            report.update(pan_view_cells_s=(wait_js(session, f"(() => Number({VIEWER}.dataset.renders) >= "
                                                    f"window.__renders + 2 && {VIEW_DRAWN})()", timeout_s, POLL_MS)
                                            - panned) / 1000, pan_view_reported_s=(said - panned) / 1000,
                          load_pan=_load())
            left = ANALYSIS_S - (time.monotonic() - started)
            if left > 0:
                session.page.wait_for_timeout(left * 1000)
            minutes = (time.monotonic() - started) / 60
            report.update(window_s=minutes * 60, cpu=cpu.read(), load_window=_load(), memory_analysis_mib=memory.peak(),
                          memory_analysis_split_mib=memory.split,
                          websocket_kb_per_min=(session.websocket.received - received0
                                                + session.websocket.sent - sent0) / 1024 / minutes,
                          status=session.page.evaluate(f"() => {VIEWER}.querySelector('.status').textContent"))
            session.page.evaluate(f"() => {VIEWER}.viewer.viewport.goHome(true)")
            session.page.wait_for_timeout(2000)
            try:
                report["overlays"] = _each_overlay(session, memory, timeout_s)
            except Exception as err:  # noqa: BLE001  (the figures so far are kept, the failure said)
                report["overlays_error"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            report["most_tiled_images"] = session.page.evaluate("() => window.__mostItems")
            report["memory_peak_mib"] = max([report["memory_outline_mib"], report["memory_analysis_mib"]]
                                            + [o["memory_peak_mib"] for o in report.get("overlays", [])])
            report["server_log_warnings"] = [line for line in (Path(tmp) / "streamlit.log").read_text().splitlines()
                                             if "Warning" in line or "WARNING" in line or "8787" in line][:10]
    return report


def _each_overlay(session, memory: TreeMemory, timeout_s: float) -> list[dict]:
    """Each overlay of the radio "Overlay" chosen in turn from the second (the first, P(tumour), is shown), then the
    first again: seconds to redrawn and the memory's peak while shown."""
    from app.analysis.readings import LABELS

    radio = session.page.locator('[data-testid="stRadio"]').filter(has_text=OVERLAY_LABEL).first
    options = [(label, kind) for kind, label in [("tumour", OVERLAY_LABEL), *((k, LABELS[k]) for k in READINGS)]
               if radio.get_by_text(label, exact=True).count()]
    found = []
    for label, kind in [*options[1:], options[0]]:
        memory.peak()
        clicked = session.page.evaluate("() => performance.now()")
        radio.get_by_text(label, exact=True).click()
        shown = wait_js(session, overlay_shown(kind), SWITCH_TIMEOUT_S)
        try:  # chunks finishing meanwhile add layers of their own: within a bounded time, else said
            loaded = (wait_js(session, overlay_drawn(kind), SWITCH_TIMEOUT_S) - clicked) / 1000
        except Exception as err:  # noqa: BLE001  (playwright's TimeoutError)
            loaded = f"not within {SWITCH_TIMEOUT_S:.0f} s ({type(err).__name__})"
        session.page.wait_for_timeout(HOLD_S * 1000)
        found.append(dict(overlay=label, kind=kind, shown_s=(shown - clicked) / 1000, loaded_s=loaded,
                          tiles=_tile_timings(session, clicked), memory_peak_mib=memory.peak(),
                          memory_split_mib=memory.split, load=_load()))
    return found


def _tile_timings(session, clicked: float) -> dict:
    """The overlay's tiles (P(tumour) and the readings: any but the outline's) fetched after the click (the browser's
    resource timings): how many, when the first was asked for and when the last came in (s after the click), and
    the server's answer time (request sent to its first byte: the tile made, or read from the cache) as median and
    maximum in ms. A switch itself asks for none (the viewer colours the values tiles it holds): any here are the
    tiles of chunks that finished meanwhile."""
    entries = session.page.evaluate(
        "(clicked) => performance.getEntriesByType('resource').filter((e) => e.startTime >= clicked "
        "&& e.name.includes('/slides/overlays/') && e.name.includes('.png') && !e.name.includes('/outline/'))"
        ".map((e) => [e.startTime, e.requestStart, e.responseStart, e.responseEnd])", clicked)
    if not entries:
        return dict(count=0)
    waits = sorted(response - request for _, request, response, _ in entries)
    return dict(count=len(entries), first_asked_s=round((min(e[0] for e in entries) - clicked) / 1000, 3),
                last_in_s=round((max(e[3] for e in entries) - clicked) / 1000, 3),
                server_ms_median=round(waits[len(waits) // 2], 1), server_ms_max=round(waits[-1], 1))


def whole_slide(timeout_s: float, chromium: Path) -> dict:
    """The CMU demo slide whole in the app, then through ``python -m app.slides``; seconds, CPU and ratio."""
    report: dict = dict(load_before=_load())
    with tempfile.TemporaryDirectory(prefix="slide-whole-") as tmp:
        empty = Path(tmp) / "no-slides"
        empty.mkdir()
        with _app_on(empty, Path(tmp), timeout_s, chromium) as (session, server, _):
            report.update(_open_slide_page(session))
            slide_path = _demo_slide_path()
            cpu = CpuTrees(server.pid)
            cpu.start()
            button = session.page.get_by_role("button", name="Analyse the slide").first
            clicked = _click(session, button)
            first_cells = wait_js(session, OVERLAY_DRAWN, timeout_s, POLL_MS)
            done_at = wait_js(session, SLIDE_DONE, timeout_s, POLL_MS)
            report.update(app_first_cells_s=(first_cells - clicked) / 1000, app_whole_s=(done_at - clicked) / 1000,
                          app_cpu=cpu.read(), load_app=_load())
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "app.slides", str(slide_path), "--out", str(Path(tmp) / "out"),
                               "--checkpoint", str(CHECKPOINT)], cwd=REPO, check=True, capture_output=True,
                              text=True)
        said = re.search(r"chunks computed, ([\d.]+) s", done.stdout)
        report.update(command_wall_s=time.monotonic() - started, load_command=_load(),
                      command_s=float(said.group(1)) if said else None)
    if report["command_s"]:  # the command's own seconds of the slide, its cluster's start not counted
        report["ratio"] = report["app_whole_s"] / report["command_s"]
    return report


def _demo_slide_path() -> Path:
    from app.slides.library import list_slides

    found = [entry.path for entry in list_slides() if entry.path.name == CMU_SLIDE]
    if not found:
        raise SystemExit(f"{CMU_SLIDE} is not among the demo slides")
    return found[0]


def main(mode: str, timeout_s: float, chromium: Path) -> dict:
    """``mode`` ``"gigapixel"`` (the slide built first where it is not in the user cache) or ``"whole"``; the report."""
    from benchmarks.browser_latency import cpu_model
    from benchmarks.gigapixel_slide import gigapixel_slide
    from benchmarks.train_step import instruction_sets

    header = dict(cpu=cpu_model(), cpus=os.cpu_count(), instruction_set=instruction_sets(),
                  at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if mode == "gigapixel":
        return {**header, **gigapixel_actions(gigapixel_slide()[0], timeout_s, chromium)}
    return {**header, **whole_slide(timeout_s, chromium)}


def cli(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.slide_analysis_browser --gigapixel | --whole-slide`` (what ``python -m
    benchmarks.browser_latency --page slide --gigapixel`` runs): the report printed, and written to ``--json``."""
    import argparse

    from benchmarks.concurrent_sessions import CHROMIUM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gigapixel", action="store_true", help="the gigapixel slide's actions")
    mode.add_argument("--whole-slide", action="store_true", help="the CMU slide whole, the app against the command")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per wait at most")
    parser.add_argument("--chromium", type=Path, default=CHROMIUM, help="the Chromium executable")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    report = main("gigapixel" if args.gigapixel else "whole", args.timeout, args.chromium)
    print(printed(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def printed(report: dict) -> str:
    """The report as indented JSON, numbers rounded."""
    def rounded(value):
        if isinstance(value, float):
            return round(value, 3)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    return json.dumps(rounded(report), indent=2)


if __name__ == "__main__":
    sys.exit(cli())
