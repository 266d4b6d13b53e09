"""Many users at once: N browser sessions upload different images to one app server at the same time.

This starts ``streamlit run app/server.py`` as a subprocess on a free localhost
port (headless, no file watcher, ``APP_CHECKPOINTS`` on ``--checkpoints``) and
drives one headless Chromium with Playwright's async API. Each session is its
own browser context, i.e. its own Streamlit session: it opens the page (the app
opens on its default checkpoint, the PCam H&E model for ``checkpoints/``),
switches the image source to "Upload an image", uploads an image no other
session has, and waits until the analysis is drawn (the caption naming the
upload's size, then the end of the script run and every plotly chart in view,
not those in closed tabs). One session runs
alone first (the warm-up: it loads the model and pays for the first forward
pass); then ``--sessions`` sessions run together (``asyncio.gather``).

The images are crops of the PCam gallery patches (``app/gallery``), each moved
by one of the eight p4m elements and cut to a different width (96 x 72 to
96 x 95, so the app's caption "... of the 96 x W upload ..." differs between
any 24 of them), saved as PNGs with one file name per session. Every session
then checks that it got its own image and only its own:

* the uploader shows its file name, and the page names no other session's file;
* the caption names its upload's size;
* the picture "as the model sees it" is closer to its own fitted image than to
  any other session's (mean absolute difference of the served JPEG);
* the "Prediction" metric (class and ``p = ...`` to 3 decimals) is what
  :func:`app.analysis.compute.analyse` computes offline for that exact image, with the
  checkpoint the app opens with.

Measured: sessions served / N; per session, the time from the upload to its
analysis on the page (the caption, drawn once the server has analysed the
image), to every panel drawn, and from opening the page to that (median, max);
the wall time of the N sessions, the server's CPU time meanwhile and the whole
machine's (the browser runs on the same machine: where the server's share is
small, the times measure Chromium drawing N pages more than the app); how
often the server loaded a checkpoint (the cached loader of :mod:`app.ui.inputs`
prints one ``loaded checkpoint PATH`` line per load, counted in the server's
log: 1 means one model shared by every session); the server's memory (Linux
``/proc/PID/status``): peak RSS (``VmHWM``) after the warm-up session and at the
end, the largest RSS sampled every 0.2 s, and the extra peak that the N
concurrent sessions cost.

Everything is bounded by ``--timeout`` (every wait uses what is left of it);
the server and the browser stop in any case. It needs Debian's Chromium
(``apt-get install chromium``; Playwright's own browser download does not work on
these machines) and the ``playwright`` package. The exit status is 0 when every
session was served and passed its checks.

Run from the repository root::

    python -m benchmarks.concurrent_sessions
    python -m benchmarks.concurrent_sessions --sessions 5 --timeout 300 --json out/concurrent_sessions.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urljoin

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

try:
    from playwright.async_api import async_playwright
except ImportError:  # main() and the test say what is missing
    async_playwright = None

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT = dict(width=1400, height=1000)
MAX_SESSIONS = 95  # the images are distinct for 96 indices; the warm-up takes the one after the sessions
WIDTHS = 24  # upload widths 95, 94, ..., 72: the caption tells any 24 consecutive sessions apart
LOAD_LINE = re.compile(r"^loaded checkpoint (.+)$", re.MULTILINE)
UPLOAD_PROMPT = "Upload an image in the sidebar"
FILE_INPUT = '[data-testid="stFileUploader"] input[type="file"]'
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'  # the session's script run has ended
SAMPLE_EVERY_S = 0.2


@dataclass(frozen=True)
class Upload:
    """One session's image and what the page must show for it.

    Attributes:
        index: the session (the warm-up has the index after the last session).
        path: the PNG written for it; ``path.name`` is unique among the sessions.
        rows, cols: its size.
        caption: the part of the app's fit caption that names this upload's size.
        label: the class the model predicts for it (computed offline).
        probability: the model's probability of that class.
        rgb: ``(S, S, 3)`` uint8, the fitted image as the app draws it.
    """

    index: int
    path: Path
    rows: int
    cols: int
    caption: str
    label: str
    probability: float
    rgb: np.ndarray = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class SessionResult:
    """What one browser session saw, its times and the checks it failed (none when ``ok``)."""

    index: int
    file: str
    ok: bool = False
    failures: list[str] = field(default_factory=list)
    step: str = "starting"
    open_s: float | None = None
    to_caption_s: float | None = None
    to_panels_s: float | None = None
    session_s: float | None = None
    shown_label: str | None = None
    shown_p: str | None = None
    expected_p: str | None = None
    image_distance: float | None = None
    nearest_other_distance: float | None = None


@contextlib.contextmanager
def environment(**values: str):
    """Environment variables set for what starts inside (a server started by :func:`streamlit_server` inherits
    them), restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proc_status(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process in MiB; empty where ``/proc`` is not readable."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024  # the kernel writes kB
    except OSError:
        pass
    return values


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (``/proc/PID/stat``); None where it is not readable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def machine_busy_seconds() -> float | None:
    """CPU time all cores of the machine spent busy so far (``/proc/stat``, everything but idle and iowait)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return None
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # user nice system idle iowait ...


class MemorySampler:
    """A thread reading a process's memory (:meth:`now_mib`: its ``VmRSS``) every ``every`` seconds; ``peak_mib`` is
    the largest seen."""

    def __init__(self, pid: int, every: float = SAMPLE_EVERY_S):
        self.pid, self.every, self.peak_mib, self.samples = pid, every, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now_mib(self) -> float | None:
        """The process's resident memory now, MiB (None once it has ended)."""
        return proc_status(self.pid).get("VmRSS")

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            now = self.now_mib()
            if now is not None:
                self.peak_mib, self.samples = max(self.peak_mib, now), self.samples + 1

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def count_loads(log: str) -> Counter:
    """How often the server loaded each checkpoint: the ``loaded checkpoint PATH`` lines of its log."""
    return Counter(Path(path.strip()).name for path in LOAD_LINE.findall(log))


def opening_checkpoint(folder: Path):
    """The checkpoint entry the app opens with for ``folder`` (the app's own choice)."""
    from app.analysis.checkpoints import list_checkpoints
    from app.ui.inputs import default_checkpoint

    entries = list_checkpoints(folder)
    if not entries:
        raise SystemExit(f"no checkpoint in {folder}")
    return entries[default_checkpoint(entries)]


def upload_pixels(index: int) -> tuple[np.ndarray, str]:
    """Image ``index``: a PCam gallery patch moved by a p4m element and cut to a width of its own; and its name.

    Gallery patch ``index % 12``, element ``(index // 12) % 8`` (four rotations, then mirrored), the left
    ``95 - index % 24`` columns: distinct for indices 0 to 95.
    """
    from app.gallery import list_gallery

    patches = list_gallery(kind="he")
    item = patches[index % len(patches)]
    element = (index // len(patches)) % 8
    with Image.open(item.path) as image:
        pixels = np.asarray(image.convert("RGB"))  # (96, 96, 3)
    moved = np.rot90(pixels, element % 4)
    if element >= 4:
        moved = np.flip(moved, axis=1)
    cols = moved.shape[1] - 1 - index % WIDTHS
    return np.ascontiguousarray(moved[:, :cols]), f"upload-{index:02d}-{item.path.stem}.png"


def make_uploads(folder: Path, count: int, checkpoint: Path) -> list[Upload]:
    """Write ``count`` distinct PNGs into ``folder`` and compute what the app must show for each, offline.

    The expected prediction goes through the app's own path: :func:`app.analysis.images.read_image` of the PNG's
    bytes, :func:`app.analysis.images.fit_to_model` (resize, the app's default), :func:`app.analysis.compute.analyse`
    of the identity.
    """
    from app.analysis.compute import analyse
    from app.analysis.images import fit_to_model, read_image
    from app.pictures.plots import image_rgb
    from models import load_checkpoint

    model, card = load_checkpoint(checkpoint)
    size, channels = int(card["input"]["size"]), int(card["input"]["channels"])
    uploads, digests = [], set()
    for index in range(count):
        pixels, name = upload_pixels(index)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        data = buffer.getvalue()
        digests.add(hashlib.sha256(data).hexdigest())
        path = folder / name
        path.write_bytes(data)
        fitted = fit_to_model(read_image(data), size, channels, "resize")
        analysis = analyse(model, card, fitted.pixels)
        probabilities = analysis.probabilities[0]
        top = int(probabilities.argmax())
        rows, cols = pixels.shape[:2]
        uploads.append(Upload(index, path, rows, cols, f"of the {rows} x {cols} upload to {size} x {size}",
                              analysis.class_names[top], float(probabilities[top]), image_rgb(fitted.pixels)))
    if len(digests) != count:
        raise RuntimeError(f"only {len(digests)} of the {count} uploads differ")
    return uploads


@contextlib.contextmanager
def streamlit_server(folder: Path, log: Path, port: int, deadline: float):
    """``streamlit run app/server.py`` (as ``make run`` and the Docker image) on ``port`` serving ``folder``; yields
    ``(process, url)`` once healthy, which is after the server has prepared the first visit.

    The server always stops afterwards (terminate, then kill after 15 s).
    """
    env = dict(os.environ, APP_CHECKPOINTS=str(folder.resolve()), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "streamlit", "run", "app/server.py", "--server.headless", "true",
               "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
               "--server.fileWatcherType", "none"]
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_healthy(url + "_stcore/health", server, log, deadline)
        yield server, url
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def wait_healthy(url: str, server: subprocess.Popen, log: Path, deadline: float) -> None:
    """Poll Streamlit's health endpoint until it answers ``ok``; raise with the server's log otherwise."""
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and response.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer before the deadline:\n{log.read_text()}")


def left_ms(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic()) * 1000


async def wait_for_panels(page) -> None:
    """Until the script run has ended, the turn viewer, the open tab's arrow field (an SVG picture) and every
    chart in view are drawn; no exception.

    Call it once something of the new run is on the page: before, the previous run's end would do.
    """
    await page.locator(IDLE).wait_for(state="attached")
    await page.locator(".turn-viewer[data-ready='1']").wait_for()  # the maps, drawn by the browser
    arrows = page.locator('[data-testid="stMain"] img[src^="data:image/svg+xml"]')
    await arrows.first.wait_for(state="visible")
    await page.wait_for_function("(image) => image.complete && image.naturalWidth > 0",
                                 arg=await arrows.first.element_handle())
    charts = page.locator('[data-testid="stPlotlyChart"]:visible')
    for i in range(await charts.count()):
        await charts.nth(i).locator(".main-svg").first.wait_for(state="visible")
    if await page.locator('[data-testid="stException"]').count():
        raise RuntimeError("the page shows an exception: " + await page.locator('[data-testid="stException"]')
                           .first.inner_text())


async def shown_image(page, context, url: str) -> np.ndarray:
    """The picture "as the model sees it" (the main block's first image), as served, ``(S, S, 3)`` uint8."""
    src = await page.locator('[data-testid="stMain"] [data-testid="stImage"] img').first.get_attribute("src")
    response = await context.request.get(urljoin(url, src))
    with Image.open(io.BytesIO(await response.body())) as image:
        return np.asarray(image.convert("RGB"))


def check_page(result: SessionResult, upload: Upload, uploads: list[Upload], chips: list[str], body: str,
               label: str, delta: str, picture: np.ndarray) -> None:
    """Append to ``result.failures`` every way the page is not this upload's analysis alone."""
    if chips != [upload.name]:
        result.failures.append(f"the uploader shows {chips}, not [{upload.name!r}]")
    strangers = [u.name for u in uploads if u.name != upload.name and (u.name in body or u.name in chips)]
    if strangers:
        result.failures.append(f"the page names other sessions' files: {strangers}")
    if upload.caption not in body:
        result.failures.append(f"no caption {upload.caption!r}")
    match = re.search(r"p = (\d+\.\d{3})", delta)
    result.shown_label, result.shown_p = label.strip(), match.group(1) if match else delta
    result.expected_p = f"{upload.probability:.3f}"
    # Equal to 3 decimals; the server's float may round the other way only at a half-unit boundary.
    if result.shown_label != upload.label or not match or abs(float(match.group(1)) - upload.probability) > 5.01e-4:
        result.failures.append(f"prediction {result.shown_label} p = {result.shown_p}, "
                               f"expected {upload.label} p = {result.expected_p}")
    distances = {}
    for other in uploads:
        shown = picture
        if shown.shape != other.rgb.shape:
            shown = np.asarray(Image.fromarray(picture).resize(other.rgb.shape[1::-1], Image.Resampling.BILINEAR))
        distances[other.name] = float(np.abs(shown.astype(np.float64) - other.rgb).mean())
    result.image_distance = distances.pop(upload.name)
    result.nearest_other_distance = min(distances.values(), default=None)
    if result.nearest_other_distance is not None and result.image_distance >= result.nearest_other_distance:
        result.failures.append(f"the picture is as close to another session's image "
                               f"({result.nearest_other_distance:.2f}) as to its own ({result.image_distance:.2f})")


async def run_session(browser, url: str, upload: Upload, uploads: list[Upload], deadline: float,
                      result: SessionResult) -> None:
    """One user: open the page, switch to upload, upload ``upload``, wait for the panels, check them.

    Fills ``result`` as it goes (``step`` says what it is waiting for).
    """
    started = time.monotonic()
    context = await browser.new_context(viewport=VIEWPORT)
    try:
        context.set_default_timeout(left_ms(deadline))
        page = await context.new_page()
        result.step = "opening the page"
        await page.goto(url)
        radio = page.get_by_text("Upload an image", exact=True)
        await radio.wait_for()
        result.open_s = time.monotonic() - started
        result.step = "switching to upload"
        await radio.click()
        await page.get_by_text(UPLOAD_PROMPT, exact=False).wait_for()
        # That run must have ended, so that nothing of the gallery image's analysis is left on the page.
        await page.locator(IDLE).wait_for(state="attached")
        await page.locator('[data-testid="stMetric"]').first.wait_for(state="detached")
        result.step = "uploading"
        uploaded = time.monotonic()
        await page.locator(FILE_INPUT).set_input_files(str(upload.path))
        result.step = "waiting for the analysis"
        await page.get_by_text(upload.caption, exact=False).first.wait_for()
        result.to_caption_s = time.monotonic() - uploaded
        result.step = "waiting for the panels"
        await wait_for_panels(page)
        result.to_panels_s = time.monotonic() - uploaded
        result.session_s = time.monotonic() - started
        result.step = "reading the page"
        chips = [await chip.get_attribute("title") or "" for chip in
                 await page.locator('[data-testid="stFileChipName"]').all()]
        body = await page.inner_text("body")
        label = await page.locator('[data-testid="stMetricValue"]').first.inner_text()
        delta = await page.locator('[data-testid="stMetricDelta"]').first.inner_text()
        picture = await shown_image(page, context, url)
        check_page(result, upload, uploads, chips, body, label, delta, picture)
        result.step = "done"
    except Exception as err:  # a session that fails is reported, the others go on
        result.failures.append(f"{type(err).__name__} while {result.step}: "
                               f"{str(err).splitlines()[0] if str(err) else ''}")
    finally:
        with contextlib.suppress(Exception):
            await context.close()


async def bounded(browser, url: str, upload: Upload, uploads: list[Upload], deadline: float) -> SessionResult:
    """:func:`run_session` stopped at the deadline; a session that did not finish says where it was."""
    result = SessionResult(upload.index, upload.name)
    try:
        await asyncio.wait_for(run_session(browser, url, upload, uploads, deadline, result),
                               max(1.0, deadline - time.monotonic()))
    except TimeoutError:
        result.failures.append(f"the deadline passed while {result.step}")
    result.ok = not result.failures
    return result


async def drive(chromium: Path, url: str, warmup: Upload, uploads: list[Upload], pid: int, deadline: float) -> dict:
    """The warm-up session alone, the server's memory after it, then every session at once."""
    everyone = uploads + [warmup]
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            first = await bounded(browser, url, warmup, everyone, deadline)
            await asyncio.sleep(1.0)  # let the warm-up's session go idle
            after_one, cpu_before, busy_before = proc_status(pid), cpu_seconds(pid), machine_busy_seconds()
            started = time.monotonic()
            with MemorySampler(pid) as sampler:
                results = await asyncio.gather(*(bounded(browser, url, upload, everyone, deadline)
                                                 for upload in uploads))
                wall = time.monotonic() - started
                cpu = cpu_seconds(pid) - cpu_before if cpu_before is not None else None
                busy = machine_busy_seconds() - busy_before if busy_before is not None else None
                await asyncio.sleep(1.0)
            return dict(warmup=first, after_one=after_one, results=list(results), wall_s=wall, cpu_s=cpu, busy_s=busy,
                        sampled_peak_mib=sampler.peak_mib, samples=sampler.samples, at_end=proc_status(pid))
        finally:
            await browser.close()


def stats(values: list[float | None]) -> dict[str, float | None]:
    values = [v for v in values if v is not None]
    return dict(median=statistics.median(values) if values else None, max=max(values) if values else None)


def measure(folder: Path, sessions: int, workdir: Path, port: int = 0, timeout: float = 600.0,
            chromium: Path = CHROMIUM) -> dict:
    """Run the whole measurement (see the module docstring) and return its numbers.

    Args:
        folder: the checkpoint folder the server lists (``APP_CHECKPOINTS``).
        sessions: how many sessions run at once, 1 to ``MAX_SESSIONS``.
        workdir: where the uploads and the server's log (``streamlit.log``) are written.
        port: the server's port; 0 picks a free one.
        timeout: seconds for everything; every wait uses what is left.
        chromium: the Chromium executable Playwright drives.

    Returns:
        A JSON-ready dict: ``served``, times, ``model_loads``, memory in MiB, and ``sessions_detail``.
    """
    if async_playwright is None:
        raise RuntimeError("the playwright package is missing (pip install -r requirements-dev.txt)")
    if not chromium.exists():
        raise RuntimeError(f"{chromium} not found (apt-get install chromium)")
    if not 1 <= sessions <= MAX_SESSIONS:
        raise ValueError(f"sessions must be 1 to {MAX_SESSIONS}, got {sessions}")
    deadline = time.monotonic() + timeout
    load_before = os.getloadavg()
    entry = opening_checkpoint(folder)
    uploads = make_uploads(workdir, sessions + 1, entry.path)
    warmup, uploads = uploads[-1], uploads[:-1]
    log = workdir / "streamlit.log"
    with streamlit_server(folder, log, port or free_port(), deadline) as (server, url):
        run = asyncio.run(drive(chromium, url, warmup, uploads, server.pid, deadline))
    loads = count_loads(log.read_text())
    results: list[SessionResult] = run["results"]
    peak, after_one = run["at_end"].get("VmHWM"), run["after_one"].get("VmHWM")
    return dict(
        sessions=sessions, served=sum(r.ok for r in results), checkpoint=entry.name,
        warmup_served=run["warmup"].ok,
        to_caption_s=stats([r.to_caption_s for r in results]), to_panels_s=stats([r.to_panels_s for r in results]),
        session_s=stats([r.session_s for r in results]), warmup_to_caption_s=run["warmup"].to_caption_s,
        warmup_to_panels_s=run["warmup"].to_panels_s, wall_s=run["wall_s"], server_cpu_s=run["cpu_s"],
        machine_busy_s=run["busy_s"],
        model_loads=dict(loads), total_loads=sum(loads.values()),
        peak_rss_mib=peak, sampled_peak_rss_mib=run["sampled_peak_mib"] or None, rss_samples=run["samples"],
        peak_rss_after_one_mib=after_one, rss_after_one_mib=run["after_one"].get("VmRSS"),
        extra_peak_mib=peak - after_one if peak is not None and after_one is not None else None,
        machine=dict(platform=platform.platform(), cpus=os.cpu_count(), load_average_before=load_before[0]),
        failures={r.file: r.failures for r in [run["warmup"], *results] if r.failures},
        sessions_detail=[asdict(run["warmup"]) | dict(warmup=True)] + [asdict(r) for r in results],
    )


def markdown(report: dict) -> str:
    """The report as a markdown table."""

    def mib(value):
        return "n/a" if value is None else f"{value:.0f} MiB"

    def sec(value):
        return "n/a" if value is None else f"{value:.1f} s"

    n = report["sessions"]
    counts = report["model_loads"]
    loads = (f"{max(counts.values())} ({', '.join(f'{name}: {count}' for name, count in counts.items())})"
             if counts else "none logged")
    rows = [
        ("sessions served", f"{report['served']} / {n}"),
        ("upload to its analysis on the page (caption), median / max",
         f"{sec(report['to_caption_s']['median'])} / {sec(report['to_caption_s']['max'])}"),
        ("upload to the run's end, every chart in view drawn, median / max",
         f"{sec(report['to_panels_s']['median'])} / {sec(report['to_panels_s']['max'])}"),
        ("whole session (open, switch, upload, panels), median / max",
         f"{sec(report['session_s']['median'])} / {sec(report['session_s']['max'])}"),
        (f"wall time of the {n} sessions", sec(report["wall_s"])),
        (f"server CPU time during the {n} sessions", sec(report["server_cpu_s"])),
        ("CPU time of the whole machine meanwhile (browser, server, anything else) / cores x wall",
         f"{sec(report['machine_busy_s'])} / {sec(report['wall_s'] * report['machine']['cpus'])}"),
        ("one session alone (warm-up): upload to caption / to panels",
         f"{sec(report['warmup_to_caption_s'])} / {sec(report['warmup_to_panels_s'])}"),
        ("model loads per checkpoint, most (each checkpoint the page used)", loads),
        ("server peak RSS (VmHWM) at the end", mib(report["peak_rss_mib"])),
        ("server RSS, largest sample", mib(report["sampled_peak_rss_mib"])),
        ("server peak RSS after one session", mib(report["peak_rss_after_one_mib"])),
        ("server RSS after one session (idle)", mib(report["rss_after_one_mib"])),
        (f"extra peak for {n} sessions at once", mib(report["extra_peak_mib"])),
    ]
    machine = report["machine"]
    lines = [f"Concurrent sessions on {report['checkpoint']} ({machine['cpus']} CPUs, load average "
             f"{machine['load_average_before']:.1f} before the run)", "", "| measure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    for file, failures in report["failures"].items():
        lines.append(f"\n{file}: " + "; ".join(failures))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help=f"sessions at once, 1 to {MAX_SESSIONS}")
    parser.add_argument("--port", type=int, default=0, help="the server's port (default: a free one)")
    parser.add_argument("--checkpoints", type=Path, default=REPO / "checkpoints", help="the folder the app lists")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--chromium", type=Path, default=CHROMIUM, help="the Chromium executable")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    if not 1 <= args.sessions <= MAX_SESSIONS:
        parser.error(f"--sessions must be 1 to {MAX_SESSIONS}")
    with tempfile.TemporaryDirectory(prefix="concurrent_sessions-") as workdir:
        report = measure(args.checkpoints, args.sessions, Path(workdir), args.port, args.timeout, args.chromium)
    print(markdown(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["served"] == report["sessions"] and report["warmup_served"] else 1


if __name__ == "__main__":
    sys.exit(main())
