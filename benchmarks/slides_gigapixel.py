"""The gigapixel slide of issue 59: opened to its tissue outline, and the server's memory while it is viewed.

    python -m benchmarks.slides --gigapixel              # 100,000 x 100,000 px, built once (benchmarks.gigapixel_slide)
    python -m benchmarks.slides --gigapixel 8192 --tiles 40

Measured, on the slide :mod:`benchmarks.gigapixel_slide` builds (cached after the first run):

- ``open to outline``: in a fresh process (this file with a hidden ``--open`` flag, so that nothing is warm but the
  imports and the disk's cache), what the Slide page computes before its viewer draws the tissue outline: the
  slide opened and its scale read (the sidebar), :func:`app.slides.run.plan_slide` (the checkpoint's card, scale,
  grid, thumbnail, tissue mask, chunks with tissue), the store asked for finished chunks, and the outline's tiles
  at the whole slide's zoom (made as the overlay route makes them). Its seconds, part by part, and what the plan
  added to that process's peak memory. The goal is 5 s.
- ``server while viewed``: ``app/server.py`` on a free port with the slide alone in ``$APP_SLIDES``; the
  descriptor, then deep-zoom tiles as a viewer asks for them: every tile of the levels that fit a 1,400 x 1,000
  viewer (the slide opened whole), then zoom paths from there to level 0's neighbourhood, a viewport of tiles per
  level, at points on tissue (four in five) or anywhere, each ended by two pans. ``--tiles`` of them one at a time
  (their median and 95th percentile), then as many others six at a time, as a browser fetches them. Before the
  tiles, where Chromium and Playwright are installed, the app is open in Chromium on its Slide page (so the server
  holds what the page computed, as while a user views the slide): the seconds from choosing the page to its first
  tiles drawn, and to the tissue outline drawn over them. The server's RSS with its children's (``psutil``), sampled
  every 50 ms, and its own peak (``VmHWM``) at the end. The goal is under 1.5 GB.

Before each of the two parts the slide's pages are dropped from the kernel's cache (``posix_fadvise``), so that
both read it from disk, as a slide not viewed lately is. The load average is printed with the figures: on a shared
machine they are only as good as its quiet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from app.slides.tiles import TILE_SIZE
from benchmarks.concurrent_sessions import (
    CHROMIUM,
    CHROMIUM_ARGS,
    MemorySampler,
    environment,
    free_port,
    proc_status,
    streamlit_server,
)
from benchmarks.gigapixel_slide import GigapixelSpec, gigapixel_slide

__all__ = ["gigapixel_report", "open_to_outline", "viewer_tiles", "print_report"]

REPO = Path(__file__).resolve().parents[1]
VIEWPORT = (1400, 1000)  # the viewer's pixels, width and height
OPEN_GOAL_S, MEMORY_GOAL_MIB = 5.0, 1.5 * 1024
SAMPLE_EVERY_S = 0.05
CONCURRENT = 6  # a browser's connections per host


def open_to_outline(slide: Path, checkpoint: Path) -> dict:
    """Seconds of each step the Slide page takes before it draws the outline, and the memory the plan added (MiB,
    this process's peak over its resident size before). Run in a fresh process (:func:`_open_in_child`)."""
    from app.slides.overlay_tiles import overlay_tile, register
    from app.slides.reader import open_slide
    from app.slides.run import THUMBNAIL_SIDE, plan_slide
    from app.slides.scale import slide_scale

    before = proc_status(os.getpid()).get("VmRSS", 0.0)
    with tempfile.TemporaryDirectory(prefix="gigapixel-store-") as store:
        start = time.perf_counter()
        with open_slide(slide) as opened:  # the sidebar: levels and scale
            scale = slide_scale(opened.properties)
            thumbnail_level = opened.best_level(max(opened.dimensions) / THUMBNAIL_SIDE)
        sidebar = time.perf_counter()
        plan = plan_slide(slide, checkpoint, Path(store), scale.microns_per_pixel)
        planned = time.perf_counter()
        finished = sum(plan.store.get(*index) is not None for index in plan.chunks)
        stored = time.perf_counter()
        picture = _outline_tiles(plan, register, overlay_tile)
        drawn = time.perf_counter()
    peak = proc_status(os.getpid()).get("VmHWM", 0.0)
    return dict(open_to_outline_s=drawn - start, sidebar_s=sidebar - start, plan_s=planned - sidebar,
                store_s=stored - planned, outline_s=drawn - stored, thumbnail_level=thumbnail_level,
                cells=[plan.grid.cells.rows, plan.grid.cells.cols], chunk_grid=list(plan.grid.chunks),
                chunks_with_tissue=len(plan.chunks), finished_chunks=finished,
                tissue_share=float(plan.tissue.mean()), outline_png_bytes=picture,
                plan_peak_extra_mib=peak - before, plan_process_peak_mib=peak)


def _outline_tiles(plan, register, overlay_tile) -> int:
    """The outline's tiles the viewer asks for at the whole slide's zoom (the overlays' deepest level that fits
    :data:`VIEWPORT` whole), made as the overlay route makes them: their bytes in all."""
    overlay = register(plan)
    geometry = overlay.pyramid
    fits = [level for level in range(geometry.min_level, geometry.max_level + 1)
            if all(side <= view for side, view in zip(geometry.level_size(level), VIEWPORT, strict=True))]
    level = max(fits, default=geometry.min_level)
    cols, rows = geometry.level_tiles(level)
    return sum(len(overlay_tile(overlay, "outline", level, col, row)) for col in range(cols) for row in range(rows))


def _open_in_child(slide: Path, checkpoint: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.slides_gigapixel", "--open", str(slide),
                           "--checkpoint", str(checkpoint)], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the open-to-outline process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def viewer_tiles(generator, tissue: np.ndarray, count: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """``count`` distinct deep-zoom tiles ``(level, col, row)`` in the order a viewer asks for them: the levels that
    fit the viewport whole, then zoom paths (a viewport's tiles per level, down to one of the three deepest
    levels, then two pans to the right) at points on ``tissue`` (a boolean thumbnail of the slide) or anywhere."""
    count = min(count, sum(c * r for c, r in generator.level_tiles))
    rng = np.random.default_rng(seed)
    order: dict[tuple[int, int, int], None] = {}  # insertion-ordered set: a browser fetches a tile once
    deepest = generator.level_count - 1
    fits = [lvl for lvl in range(generator.level_count)
            if all(d <= v for d, v in zip(generator.level_dimensions[lvl], VIEWPORT, strict=True))]
    overview = max(fits, default=0)
    for level in range(overview + 1):
        cols, rows = generator.level_tiles[level]
        order.update(((level, c, r), None) for r in range(rows) for c in range(cols))
    on_tissue = np.argwhere(tissue)
    idle = 0
    while len(order) < count and idle < 100:  # a slide nearly all fetched already: stop rather than search on
        before = len(order)
        if len(on_tissue) and rng.random() < 0.8:
            row, col = on_tissue[rng.integers(len(on_tissue))] + rng.random(2)
            y, x = row / tissue.shape[0], col / tissue.shape[1]  # where, as a share of the slide's height, width
        else:
            y, x = rng.random(2)
        last = int(rng.integers(deepest - 2, deepest + 1))
        for level in range(overview + 1, last + 1):
            order.update(dict.fromkeys(_viewport(generator, level, x, y)))
        width = generator.level_dimensions[last][0]
        for step in (1, 2):
            order.update(dict.fromkeys(_viewport(generator, last, x + step * VIEWPORT[0] / width, y)))
        idle = idle + 1 if len(order) == before else 0
    return list(order)[:count]


def _viewport(generator, level: int, x: float, y: float) -> list[tuple[int, int, int]]:
    """The tiles of a viewport centred on (x, y), shares of the slide's width and height, at ``level``."""
    width, height = generator.level_dimensions[level]
    cols, rows = generator.level_tiles[level]
    side = TILE_SIZE  # without its overlap
    c0, c1 = int((x * width - VIEWPORT[0] / 2) // side), int((x * width + VIEWPORT[0] / 2) // side)
    r0, r1 = int((y * height - VIEWPORT[1] / 2) // side), int((y * height + VIEWPORT[1] / 2) // side)
    return [(level, c, r) for r in range(max(r0, 0), min(r1, rows - 1) + 1)
            for c in range(max(c0, 0), min(c1, cols - 1) + 1)]


class ServerMemory(MemorySampler):
    """A thread summing the resident memory of a process and its children every :data:`SAMPLE_EVERY_S`;
    ``peak_mib`` is the largest sum seen."""

    def __init__(self, pid: int, every: float = SAMPLE_EVERY_S):
        import psutil  # installed with dask's distributed, which the slides need

        super().__init__(pid, every)
        self.process = psutil.Process(pid)

    def now_mib(self) -> float:
        return sum(self.parts_mib())

    def parts_mib(self) -> tuple[float, float]:
        """``(the process's own RSS, its children's summed)`` now, MiB."""
        import psutil

        try:
            children = self.process.children(recursive=True)
        except psutil.Error:  # the server itself has ended
            children = []
        return _rss_mib(self.process), sum((_rss_mib(child) for child in children), 0.0)


def _rss_mib(process) -> float:
    """``process``'s resident memory, MiB; 0 for one that has ended (a child may end between the listing and the
    reading)."""
    import psutil

    try:
        return process.memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def server_while_viewed(slide: Path, count: int) -> dict:
    """The server with ``slide`` alone in its listing, asked for its descriptor and ``count`` tiles one at a time,
    then ``count`` others :data:`CONCURRENT` at a time: tile milliseconds and the server's memory (MiB)."""
    from app.slides.reader import open_slide
    from app.slides.tiles import deep_zoom
    from app.slides.tissue import tissue_mask

    with open_slide(slide) as opened:
        tissue, _ = tissue_mask(opened.thumbnail(512))
    generator = deep_zoom(str(slide), slide.stat().st_mtime_ns)
    addresses = viewer_tiles(generator, tissue, 2 * count)
    one_by_one, together = addresses[:count], addresses[count:]
    deep_zoom.cache_clear()  # the server opens its own
    with tempfile.TemporaryDirectory(prefix="gigapixel-server-") as folder, environment(
            APP_SLIDES=folder, APP_SLIDE_STORE=str(Path(folder) / "store")):
        (Path(folder) / slide.name).symlink_to(slide)
        from app.slides.library import list_slides

        slide_id = list_slides(Path(folder), None)[0].slide_id
        with contextlib.ExitStack() as stack:
            server, url = stack.enter_context(streamlit_server(REPO / "checkpoints", Path(folder) / "server.log",
                                                               free_port(), time.monotonic() + 180))
            memory = stack.enter_context(ServerMemory(server.pid))
            start_mib = memory.now_mib()

            def fetch(address: tuple[int, int, int]) -> float:
                level, col, row = address
                began = time.perf_counter()
                with urllib.request.urlopen(f"{url}slides/{slide_id}_files/{level}/{col}_{row}.jpeg") as answer:
                    answer.read()
                return 1000 * (time.perf_counter() - began)

            page = _page_in_chromium(stack, url)  # the Slide page's plan and outline in the server, as a user's
            page["server_after_page_mib"] = memory.now_mib()
            began = time.perf_counter()
            urllib.request.urlopen(f"{url}slides/{slide_id}.dzi").read()
            descriptor_ms = 1000 * (time.perf_counter() - began)
            alone = [fetch(address) for address in one_by_one]
            began = time.perf_counter()
            with ThreadPoolExecutor(CONCURRENT) as pool:
                shared = list(pool.map(fetch, together))
            together_s = time.perf_counter() - began
            end_mib, hwm = memory.now_mib(), proc_status(server.pid).get("VmHWM")
    peak = max(memory.peak_mib, end_mib, hwm or 0.0)
    return dict(**page, descriptor_ms=descriptor_ms, tiles=len(alone) + len(shared),
                tile_levels=len({a[0] for a in addresses}),
                tile_median_ms=statistics.median(alone), tile_p95_ms=float(np.percentile(alone, 95)),
                tile_concurrent_median_ms=statistics.median(shared) if shared else None,
                concurrent_tiles_per_s=len(shared) / together_s if shared else None,
                server_start_mib=start_mib, server_end_mib=end_mib, server_peak_mib=peak,
                server_vmhwm_mib=hwm, memory_samples=memory.samples)


def _page_in_chromium(stack: contextlib.ExitStack, url: str) -> dict:
    """The app in Chromium, its Slide page chosen: seconds from the click to the viewer open with the tissue outline
    over the slide (the server has planned the slide: its memory counts), then to its first tile drawn. The page
    stays open (``stack`` closes it). Empty where Chromium or Playwright is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {}
    if not CHROMIUM.exists():
        return {}
    playwright = stack.enter_context(sync_playwright())
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
    stack.callback(browser.close)
    page = browser.new_page(viewport=dict(width=VIEWPORT[0], height=VIEWPORT[1]))
    page.set_default_timeout(120_000)
    page.goto(url)
    page.get_by_text("What the model sees").wait_for()  # the app's first page, drawn
    began = time.perf_counter()
    page.locator('[data-testid="stSidebar"]').get_by_text("Slide", exact=True).click()
    # The viewer draws the slide's tiles first; the page draws it again with the outline once the tissue is found.
    page.locator(".slide-viewer[data-drawn]").first.wait_for()
    drawn = time.perf_counter()
    page.locator(".slide-viewer[data-outline='drawn']").first.wait_for()
    return dict(page_outline_s=time.perf_counter() - began, page_first_tile_s=drawn - began)


def _evict(path: Path) -> bool:
    """Ask the kernel to drop ``path``'s pages from its cache, so that what is measured next reads the slide from
    disk, as a slide not viewed lately is (this file only: the machine's other work keeps its cache). Whether it
    could be asked."""
    if not hasattr(os, "posix_fadvise"):
        return False
    with open(path, "rb") as file:
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return True


def gigapixel_report(side: int, checkpoint: Path, tiles: int) -> dict:
    """Build (or find) the slide of ``side`` pixels, then measure it as the module's docstring says."""
    spec = GigapixelSpec(size=side)
    started = time.perf_counter()
    path, built = gigapixel_slide(spec)
    report = dict(slide=path.name, side=side, microns_per_pixel=spec.microns_per_pixel,
                  slide_bytes=path.stat().st_size, built_s=built["build_s"] if built else None,
                  ready_s=time.perf_counter() - started, load_before=os.getloadavg())
    report["cold"] = _evict(path)
    report.update(_open_in_child(path, checkpoint))
    if tiles:
        _evict(path)
        report.update(server_while_viewed(path, tiles))
    report["load_after"] = os.getloadavg()
    return report


def print_report(report: dict) -> None:
    side, built = report["side"], report["built_s"]
    print(f"gigapixel slide: {side:,} x {side:,} px at {report['microns_per_pixel']} um/px, "
          f"{report['slide_bytes'] / 1e6:,.0f} MB ({f'built in {built:.1f} s' if built else 'cached'}); "
          f"{'read from disk: its pages dropped from the cache before each part' if report['cold'] else 'cached'}")
    verdict = "met" if report["open_to_outline_s"] <= OPEN_GOAL_S else "NOT met"
    print(f"open to tissue outline: {report['open_to_outline_s']:.2f} s (sidebar {report['sidebar_s']:.2f}, plan "
          f"{report['plan_s']:.2f}, store {report['store_s']:.2f}, outline {report['outline_s']:.2f}); thumbnail "
          f"from level {report['thumbnail_level']}, {report['cells'][0]:,} x {report['cells'][1]:,} cells, "
          f"{report['chunks_with_tissue']:,} of {report['chunk_grid'][0] * report['chunk_grid'][1]:,} chunks with "
          f"tissue; the plan added {report['plan_peak_extra_mib']:.0f} MiB to its process's peak; goal "
          f"{OPEN_GOAL_S:.0f} s: {verdict}")
    if "server_peak_mib" in report:
        verdict = "met" if report["server_peak_mib"] < MEMORY_GOAL_MIB else "NOT met"
        print(f"server while viewed: peak {report['server_peak_mib']:.0f} MiB (at start "
              f"{report['server_start_mib']:.0f}, at end {report['server_end_mib']:.0f}); {report['tiles']} tiles "
              f"over {report['tile_levels']} "
              f"deep-zoom levels: median {report['tile_median_ms']:.1f} ms (95th percentile "
              f"{report['tile_p95_ms']:.1f}) one at a time, median {report['tile_concurrent_median_ms']:.1f} ms "
              f"{CONCURRENT} at a time; goal {MEMORY_GOAL_MIB:.0f} MiB: {verdict}")
    if "page_outline_s" in report:
        print(f"in Chromium, the Slide page chosen to its first tiles drawn: {report['page_first_tile_s']:.2f} s, to "
              f"the tissue outline drawn: {report['page_outline_s']:.2f} s; the server then held "
              f"{report['server_after_page_mib']:.0f} MiB")
    load = ", ".join(f"{v:.2f}" for v in report["load_before"])
    print(f"load average before: {load}; after: {', '.join(f'{v:.2f}' for v in report['load_after'])}")


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the open-to-outline measurement, in a process of its own")
    parser.add_argument("--open", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(open_to_outline(args.open, args.checkpoint)))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
