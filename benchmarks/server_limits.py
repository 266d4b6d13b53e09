"""A hostile visitor's slides against the real server: coarse deep-zoom tiles of crafted large single-level images,
8 at a time, with the server's memory and its health check watched throughout.

This starts ``streamlit run app/server.py`` on a free localhost port with ``APP_SLIDES`` on a folder of crafted
slides, small on disk (one colour: they compress to kilobytes), and for each slide asks for ``--tiles`` coarse
tiles (deep-zoom levels 0 to 11, tile (0, 0), over and over), ``--parallel`` at a time, of the slide and of its
moved views (``-g1`` .. ``-g7``, ``--moved`` tiles each). Meanwhile it samples the RSS of the server and its
children (psutil) every 0.1 s and asks ``/_stcore/health`` every 0.25 s. The crafted slides:

- ``png-9400``: a 9,400 x 9,400 PNG (an image the server decodes, then serves from its pyramid);
- ``tiff-20480``: a 20,480 x 20,480 single-level tiled TIFF (read by OpenSlide, coarser levels built once);
- ``tiff-204800``: a 204,800 x 204,800 single-level tiled TIFF (refused: every tile a 404 sentence).

The TIFFs are written by :func:`tiled_tiff` with every tile's offset on one compressed tile: a 204,800-pixel TIFF
is 330 KB. Prints one JSON object: per slide, the server's RSS before, the tiles' statuses and times (median,
max), the peak RSS while they are served, and the health checks' slowest answer.

Run from the repository root::

    python -m benchmarks.server_limits
    python -m benchmarks.server_limits --slides png-9400 --tiles 48 --json out/server_limits.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.concurrent_sessions import free_port, streamlit_server

REPO = Path(__file__).resolve().parents[1]
COARSE_LEVELS = range(12)
CRAFTED = {"png-9400": ("png", 9400), "tiff-20480": ("tif", 20480), "tiff-204800": ("tif", 204800)}
COLOUR = (222, 130, 190)  # an H&E pink


def single_colour_png(path: Path, side: int, colour=COLOUR) -> Path:
    """A ``side`` x ``side`` RGB PNG of one colour (deflate makes it about 1/1000 of its pixels' bytes)."""
    Image.new("RGB", (side, side), colour).save(path)
    return path


def tiled_tiff(path: Path, side: int, tile: int = 1024, colour=COLOUR) -> Path:
    """A ``side`` x ``side`` RGB tiled TIFF of one colour, deflate tiles, one level: every tile's offset names the
    same compressed tile, so the file is the tile table and one tile (classic TIFF, little-endian)."""
    blob = zlib.compress(np.full((tile, tile, 3), colour, dtype=np.uint8).tobytes(), 9)
    count = (-(-side // tile)) ** 2
    bits_at = 8 + len(blob)
    offsets_at = bits_at + 6
    counts_at = offsets_at + 4 * count
    ifd_at = counts_at + 4 * count
    entries = [(256, 4, 1, side), (257, 4, 1, side), (258, 3, 3, bits_at), (259, 3, 1, 8), (262, 3, 1, 2),
               (277, 3, 1, 3), (284, 3, 1, 1), (322, 4, 1, tile), (323, 4, 1, tile),
               (324, 4, count, offsets_at), (325, 4, count, counts_at)]
    with open(path, "wb") as out:
        out.write(b"II" + struct.pack("<HI", 42, ifd_at) + blob + struct.pack("<3H", 8, 8, 8))
        out.write(struct.pack(f"<{count}I", *([8] * count)) + struct.pack(f"<{count}I", *([len(blob)] * count)))
        out.write(struct.pack("<H", len(entries)))
        for tag, kind, n, value in entries:
            packed = struct.pack("<H", value) + b"\0\0" if kind == 3 and n == 1 else struct.pack("<I", value)
            out.write(struct.pack("<HHI", tag, kind, n) + packed)
        out.write(struct.pack("<I", 0))
    return path


def craft(folder: Path, name: str) -> Path:
    """The crafted slide ``name`` (a key of :data:`CRAFTED`) in ``folder``."""
    kind, side = CRAFTED[name]
    path = folder / f"{name}.{kind}"
    return single_colour_png(path, side) if kind == "png" else tiled_tiff(path, side)


class Watch:
    """Samples, in a thread, the RSS of ``pid`` and its children (MiB) every 0.1 s and the health check's answer
    time every 0.25 s, until stopped."""

    def __init__(self, pid: int, health_url: str):
        self.pid, self.health_url = pid, health_url
        self.peak_mib, self.health_s, self.health_failures = 0.0, [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._memory, daemon=True),
                         threading.Thread(target=self._health, daemon=True)]

    def _memory(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self._stop.wait(0.1):
            with contextlib.suppress(psutil.Error):
                total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                self.peak_mib = max(self.peak_mib, total / 2**20)

    def _health(self) -> None:
        while not self._stop.wait(0.25):
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.health_url, timeout=5) as response:
                    response.read()
                self.health_s.append(time.perf_counter() - started)
            except OSError as err:
                self.health_failures.append(str(err))

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def fetch(url: str, timeout: float = 60) -> tuple[int, float, str, dict]:
    """``(status, seconds, body as text for an error or '' for an image, headers by lower-case name)`` of a GET."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
            return response.status, time.perf_counter() - started, "", _lower(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, time.perf_counter() - started, err.read().decode(errors="replace"), _lower(err.headers)


def _lower(headers) -> dict:
    return {name.lower(): value for name, value in headers.items()}


def coarse_tiles(base: str, slide_id: str, count: int, parallel: int) -> list[tuple[int, float, str, dict]]:
    """``count`` coarse tiles of ``slide_id`` (levels :data:`COARSE_LEVELS`, tile (0, 0), in turn), ``parallel``
    at a time."""
    urls = [f"{base}slides/{slide_id}_files/{COARSE_LEVELS[i % len(COARSE_LEVELS)]}/0_0.jpeg" for i in range(count)]
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(fetch, urls))


def summary(results: list[tuple[int, float, str, dict]]) -> dict:
    times = [seconds for _, seconds, _, _ in results]
    statuses = sorted({status for status, *_ in results})
    errors = sorted({body.strip() for status, _, body, _ in results if status != 200})
    return {"statuses": statuses, "median_s": round(float(np.median(times)), 3), "max_s": round(max(times), 3),
            "errors": errors}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slides", nargs="+", default=list(CRAFTED), choices=list(CRAFTED))
    parser.add_argument("--tiles", type=int, default=48)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--moved", type=int, default=8, help="tiles of each moved view -g1..-g7")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from app.slides.entries import entry_of

    report = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder, scratch = Path(scratch) / "slides", Path(scratch)
        folder.mkdir()
        paths = {name: craft(folder, name) for name in args.slides}
        os.environ.update(APP_SLIDES=str(folder), APP_SLIDE_UPLOADS=str(scratch / "uploads"),
                          APP_SLIDE_PYRAMIDS=str(scratch / "pyramids"))
        deadline = time.monotonic() + args.timeout
        with streamlit_server(REPO / "checkpoints", scratch / "server.log", free_port(), deadline) as (server, url):
            import psutil

            for name, path in paths.items():
                slide_id = entry_of(path, False).slide_id
                root = psutil.Process(server.pid)
                idle = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
                with Watch(server.pid, url + "_stcore/health") as watch:
                    started = time.perf_counter()
                    tiles = coarse_tiles(url, slide_id, args.tiles, args.parallel)
                    wall = time.perf_counter() - started
                    moved = [r for g in range(1, 8) for r in coarse_tiles(url, f"{slide_id}-g{g}", args.moved,
                                                                           args.parallel)]
                report[name] = {"bytes": path.stat().st_size, "rss_before_mib": round(idle),
                                "tiles": summary(tiles), "tiles_wall_s": round(wall, 2),
                                "moved": summary(moved), "peak_rss_mib": round(watch.peak_mib),
                                "health_max_s": round(max(watch.health_s, default=0), 3),
                                "health_checks": len(watch.health_s), "health_failures": len(watch.health_failures)}
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(text)  # noqa: T201 - a benchmark's output
    return report


if __name__ == "__main__":
    main()
