"""The app's speed as a user sees it: per action, the click to the last change of the page in Chromium.

This runs ``python -m app.warm`` as ``make run`` does (``--no-warm``: not), then starts
``streamlit run app/server.py`` (as ``make run``; headless, on a free port, with
``APP_CHECKPOINTS`` on ``--checkpoints``, the repository's ``checkpoints/`` by
default) and drives Debian's Chromium with Playwright's sync API in a
1440 x 900 window. The page opens as the app opens it (for ``checkpoints/``
the PCam H&E model on the first gallery tumour patch); then each action runs
``--repeats`` times, every repeat a change of state (90 degrees and back, the
next gallery image, another upload, ...):

=================  =====================================================================================
first-cold         the first navigation, right after the server's health endpoint answers (once)
first-warm         ``page.reload()``: a new session of the same server, model and analyses cached
quarter-turn       a ``[data-turn]`` button of the page's own turn controls where there is one, else the
                   sidebar radio "Rotate by" (90 degrees, then back to 0)
mirror             a ``[data-mirror]`` control where there is one, else the sidebar toggle "Mirror ..."
gallery-change     the sidebar selectbox "Gallery image" to its next option
new-upload         a new PNG (a gallery patch moved by a p4m element) into the image uploader
layer-change       the main panel's selectbox "Layer" to its next option
reading-change     the reading picker above the maps ("Attention shown") to its next option
tab-switch         the tab "Equivariance proof", then "Arrow field", alternately
watch-turn         the turn viewer's "Watch it turn" (``[data-play]``) on a picture not turned before (every repeat
                   after the first changes the gallery image first, untimed), timed to its first frame drawn
                   (the viewer's ``data-frame``), not to a still page: an animation plays on
angle-step         rot-MNIST page: the sidebar slider "(Then) rotate by an arbitrary angle", one key step
slide-first        Slide page, its first visit in the browser session (and the server's: the slide not yet planned;
                   the Dask cluster starts with the server): the sidebar radio "View" to "Slide" (once per
                   session), timed to the first frame the viewer draws with the slide's tiles (its ``data-drawn``),
                   and then to the button "Analyse the slide" shown (the slide's plan made)
slide-view         Slide page, visited again: the radio "View" to "Patch" (untimed), then to "Slide", timed as
                   slide-first
slide-change       Slide page: the sidebar selectbox "Slide" to its next option, timed to the new slide's first
                   frame drawn with tiles
slide-pan          Slide page: a 240-pixel mouse drag across the viewer, timed from the mouse's release to the
                   last frame the viewer drew (its ``drawnAt``), once the page is still
slide-zoom         Slide page: one mouse-wheel step in at the viewer's centre (and out, alternately), timed as
                   slide-pan
slide-analyse      Slide page: the button "Analyse the slide" (once: the server's slide store is a new, empty
                   folder for this run), timed to the first frame drawn with the first cells' overlay
=================  =====================================================================================

The H&E page (``--page he``) is the page the app opens on; the rot-MNIST page
(``--page rot_mnist``) is the sidebar's dataset "rot-MNIST" with the checkpoint
``a_p4cnn_rot_mnist``, where quarter-turn and angle-step are measured; the
Slide page (``--page slide``) is the sidebar's view "Slide" on the server's
first slide (``$APP_SLIDES``' first, else the CMU demo slide). An
action whose control is not on the page is reported as not available.

Settled, per action: an init script puts a ``MutationObserver`` on the
document (subtree, child lists, attributes, text) and, by wrapping
``Element.prototype.attachShadow``, on every shadow root as it is attached
(Streamlit's v2 custom components mount in one); it keeps ``performance.now()``
of the last mutation (but those of react-aria's hidden live announcer, which a
selectbox pick clears seven seconds later) and of the first input event (pointer down, key down,
change, input) after the action's mark. The page is still once, at the same
time, no mutation came for ``--quiet-ms`` (1000 by default) and no websocket
frame for as long, Streamlit's script is not running (``stApp``'s
``data-test-script-state`` is ``notRunning`` and the status widget's running
icon is gone), every visible plotly chart is drawn and every visible image in
the main block or a component has loaded; a navigation also waits for a first
drawn panel (a plotly chart, or an image, canvas or svg in a component). The
time reported is the last mutation minus the input event (a navigation: minus
the new document's time origin), so the quiet wait itself is not counted.
Pixels drawn on a canvas are no mutation: a canvas redraw counts through the
mutations that go with it (the turn viewer, :mod:`app.ui.turn_viewer`, sets its
buttons' ``aria-pressed`` and its status line in the task that draws).
Each action has a hard ``--timeout``. Besides, the payload bytes of
websocket frames received and sent between the mark and the still page
(Streamlit's protobuf messages; pictures Streamlit serves over HTTP, such as
``st.image``'s, are not counted). Iframes (v1 components) are not observed.

With ``--sessions N`` all of it runs N times, each time with a new server and a new browser, and each action's
repeats of every session are reported together: the once-a-session actions (first-cold, slide-first,
slide-analyse) then have N samples.

Reported: median, min and max over the repeats, and the median kilobytes
received and sent; ``--json`` also keeps every repeat (:data:`RESULT_KEYS`).
The exit status is 0 when every available action was measured without an
error (a failed repeat is named under the table, not raised). Measure on an otherwise idle machine: the browser, the
server and the forward passes share its cores.

Run from the repository root::

    python -m benchmarks.browser_latency
    python -m benchmarks.browser_latency --page he --actions first-warm,quarter-turn --repeats 5
    python -m benchmarks.browser_latency --page slide --sessions 5
    python -m benchmarks.browser_latency --page slide --gigapixel      # benchmarks/slide_analysis_browser.py
    python -m benchmarks.browser_latency --page slide --whole-slide
    python -m benchmarks.browser_latency --checkpoints /tmp/ckpts --page he --json out/browser_latency.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image  # noqa: E402

from benchmarks.concurrent_sessions import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    FILE_INPUT,
    environment,
    free_port,
    streamlit_server,
    upload_pixels,
)

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
except ImportError:  # main() says what is missing
    sync_playwright = None
    PlaywrightError = RuntimeError

REPO = Path(__file__).resolve().parent.parent
VIEWPORT = dict(width=1440, height=900)
QUIET_MS = 1000.0
TIMEOUT_S = 120.0
POLL_MS = 100
LOCATE_TIMEOUT_MS = 30_000  # a control that is on the page is found well within this
ROT_MNIST_TITLE = "rot-MNIST"
ROT_MNIST_CHECKPOINT = "a_p4cnn_rot_mnist"
MIRROR_LABEL = "Mirror (flip the rows after rotating)"
# "Then rotate by ..." beside the sidebar's turns, "Rotate by ..." where the page turns in its own viewer.
ANGLE_LABEL = re.compile(r"rotate by an arbitrary angle", re.IGNORECASE)
TABS = ("Equivariance proof", "Arrow field")
PAGES = {"he": "H&E", "rot_mnist": "rot-MNIST", "slide": "Slide"}
# Every action's entry in the JSON's "results" has these keys.
RESULT_KEYS = ("page", "action", "label", "available", "control", "settled_s", "received_bytes", "sent_bytes",
               "mutations", "errors", "median_s", "min_s", "max_s", "received_kb_median", "sent_kb_median",
               "tiles", "tile_ms_median", "marks")
# The slide viewer's element (in a component's shadow root) and its first frame drawn with tiles.
SLIDE_VIEWER = ".slide-viewer"
PAN_PX = 240
# Deep-zoom tiles fetched since the action's mark, as the browser timed them (fetch start to last byte).
TILES_SCRIPT = """
() => performance.getEntriesByType('resource')
  .filter((e) => e.startTime >= window.__settle.mark && /_files\\/\\d+\\/\\d+_\\d+\\.jpeg$/.test(e.name))
  .map((e) => e.responseEnd - e.startTime)
"""

# Runs in every new document before the page's own scripts.
INIT_SCRIPT = """
(() => {
  if (window.__settle) return;
  const state = window.__settle = {last: performance.now(), mutations: 0, mark: 0, input: null, release: null,
                                   roots: []};
  // Every deep-zoom tile a slide viewer fetches is timed, not only the first 250 (the browser's default buffer).
  performance.setResourceTimingBufferSize(1e6);
  const options = {subtree: true, childList: true, attributes: true, characterData: true};
  // react-aria's live announcer (what a screen reader says on a pick) is cleared seconds later: not a redraw.
  const spoken = (node) => (node.nodeType === 1 ? node : node.parentElement)?.closest('[data-live-announcer]');
  const note = (records) => {
    const seen = records.filter((record) => !spoken(record.target)).length;
    if (seen) { state.last = performance.now(); state.mutations += seen; }
  };
  const observe = (root) => new MutationObserver(note).observe(root, options);
  // A document's observer does not see into shadow roots: observe each one as it is attached.
  const attachShadow = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    const root = attachShadow.call(this, init);
    state.roots.push(root);
    observe(root);
    return root;
  };
  for (const type of ["pointerdown", "keydown", "change", "input"]) {
    window.addEventListener(type, () => { if (state.input === null) state.input = performance.now(); }, true);
  }
  window.addEventListener("pointerup", () => { state.release = performance.now(); }, true);
  observe(document);
})();
"""
MARK_SCRIPT = ("() => { const s = window.__settle; s.mark = performance.now(); s.input = null; s.release = null; "
               "s.mutations = 0; }")
POLL_SCRIPT = """
() => {
  const s = window.__settle;
  if (!s) return null;
  const app = document.querySelector('[data-testid="stApp"]');
  const visible = (e) => e.checkVisibility();
  const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].filter(visible);
  const inRoots = (selector) => s.roots.flatMap((root) => [...root.querySelectorAll(selector)]);
  const images = [...document.querySelectorAll('[data-testid="stMain"] img'), ...inRoots('img')].filter(visible);
  return {
    now: performance.now(), last: s.last, mutations: s.mutations, mark: s.mark, input: s.input, release: s.release,
    script: app ? app.getAttribute('data-test-script-state') : null,
    running: document.querySelector('[data-testid="stStatusWidgetRunningIcon"]') !== null,
    charts: charts.length, drawn: charts.filter((e) => e.querySelector('.main-svg')).length,
    loading: images.filter((e) => !e.complete).length,
    component_panels: inRoots('img, canvas, svg').filter(visible).length,
    exception: document.querySelector('[data-testid="stException"]') !== null,
  };
}
"""


class NotAvailable(Exception):
    """The action's control is not on the page."""


class SettleTimeout(Exception):
    """The page did not go still within the action's timeout."""


@dataclass(frozen=True)
class Action:
    """One kind of user action: its CLI name, its name in the table, the pages it is measured on."""

    key: str
    label: str
    pages: tuple[str, ...]


ACTIONS = (
    Action("first-cold", "first page, cold", ("he",)),
    Action("first-warm", "first page, warm", ("he",)),
    Action("quarter-turn", "quarter turn", ("he", "rot_mnist")),
    Action("mirror", "mirror", ("he",)),
    Action("layer-change", "layer change", ("he",)),
    Action("reading-change", "reading change", ("he",)),
    Action("tab-switch", "tab switch", ("he",)),
    Action("gallery-change", "gallery change", ("he",)),
    Action("watch-turn", "Watch it turn, first frame", ("he",)),
    Action("new-upload", "new upload", ("he",)),  # last on its page: it leaves the image source on "upload"
    Action("angle-step", "arbitrary-angle step", ("rot_mnist",)),
    Action("slide-first", "first visit, first tiles drawn", ("slide",)),
    Action("slide-view", "visited again, first tiles drawn", ("slide",)),
    Action("slide-change", "another slide, first tiles drawn", ("slide",)),
    Action("slide-pan", "pan, settled", ("slide",)),
    Action("slide-zoom", "zoom, settled", ("slide",)),
    Action("slide-analyse", "Analyse, first cells drawn", ("slide",)),
)


@dataclass
class Sample:
    """One repeat: seconds from the input to the last mutation, websocket payload bytes, mutations counted, and
    the milliseconds of each deep-zoom tile fetched meanwhile."""

    seconds: float
    received: int
    sent: int
    mutations: int
    tiles_ms: list[float] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)


@dataclass
class ActionResult:
    """Every repeat of one action on one page, and why it is missing where it is."""

    page: str
    action: Action
    available: bool = True
    control: str = ""
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        times = [s.seconds for s in self.samples]
        received = [s.received for s in self.samples]
        sent = [s.sent for s in self.samples]
        return dict(page=self.page, action=self.action.key, label=self.action.label, available=self.available,
                    control=self.control, settled_s=times, received_bytes=received, sent_bytes=sent,
                    mutations=[s.mutations for s in self.samples], errors=self.errors,
                    median_s=statistics.median(times) if times else None, min_s=min(times, default=None),
                    max_s=max(times, default=None),
                    received_kb_median=statistics.median(received) / 1024 if received else None,
                    sent_kb_median=statistics.median(sent) / 1024 if sent else None,
                    tiles=[len(s.tiles_ms) for s in self.samples],
                    tile_ms_median=statistics.median(tiles) if (tiles := [t for s in self.samples for t in s.tiles_ms])
                    else None,
                    marks={name: [s.marks[name] for s in self.samples if name in s.marks]
                           for name in dict.fromkeys(n for s in self.samples for n in s.marks)})


class WebsocketBytes:
    """Payload bytes of every websocket frame of a page, received and sent, and when the last one came."""

    def __init__(self, page):
        self.received = self.sent = 0
        self.last_frame = time.monotonic()
        page.on("websocket", self._watch)

    def _watch(self, websocket) -> None:
        websocket.on("framereceived", lambda payload: self._add("received", payload))
        websocket.on("framesent", lambda payload: self._add("sent", payload))

    def _add(self, direction: str, payload: str | bytes) -> None:
        size = len(payload.encode() if isinstance(payload, str) else payload)
        setattr(self, direction, getattr(self, direction) + size)
        self.last_frame = time.monotonic()


class Session:
    """A Chromium page on the app with the settle detector installed; :meth:`measure` times one input."""

    def __init__(self, page, quiet_ms: float, timeout_s: float):
        self.page, self.quiet_ms, self.timeout_s = page, quiet_ms, timeout_s
        page.add_init_script(INIT_SCRIPT)
        page.set_default_timeout(LOCATE_TIMEOUT_MS)
        self.sidebar = page.locator('[data-testid="stSidebar"]')
        self.websocket = WebsocketBytes(page)

    def measure(self, act: Callable[[], object], navigation: bool = False, end: str | None = None,
                from_release: bool = False) -> Sample:
        """Run ``act`` (one click, key, upload or navigation) and wait until the page is still; timed to the last
        mutation, or to the time the JS function ``end`` returns then; from the input event, or with
        ``from_release`` from the last pointer's release (a drag lasts as long as the hand moves).

        Raises:
            SettleTimeout: not still within the timeout.
            RuntimeError: the page shows an exception.
        """
        received, sent = self.websocket.received, self.websocket.sent
        if not navigation:
            self.page.evaluate(MARK_SCRIPT)
        act()
        poll = self._settle(first_panel=navigation)
        # A new document's clock starts at its navigation; otherwise from the input event the action caused.
        start = 0.0 if navigation else (poll["input"] if poll["input"] is not None else poll["mark"])
        if from_release and poll["release"] is not None:
            start = poll["release"]
        if poll["exception"]:
            raise RuntimeError("the page shows an exception")
        last = poll["last"] if end is None else self.page.evaluate(end)
        return Sample(max(0.0, last - start) / 1000, self.websocket.received - received,
                      self.websocket.sent - sent, poll["mutations"], self.page.evaluate(TILES_SCRIPT))

    def measure_until(self, act: Callable[[], object], condition: str, settle: bool = True,
                      then: dict[str, str] | None = None) -> Sample:
        """Run ``act`` and time it from its input event to the first animation frame on which the JS expression
        ``condition`` holds, and to each of ``then``'s conditions after it (the sample's ``marks``, by name); then
        (``settle``) wait for the still page (not timed), so that the next action starts on it: not after an
        Analyse, whose page refreshes until the analysis is done.

        Raises:
            SettleTimeout: the condition did not hold, or the page was not still, within the timeout.
        """
        received, sent = self.websocket.received, self.websocket.sent
        self.page.evaluate(MARK_SCRIPT)
        act()
        try:
            self.page.wait_for_function(f"() => ({condition}) && (window.__settle.seen = performance.now())",
                                        polling="raf", timeout=self.timeout_s * 1000)
        except PlaywrightError as error:
            raise SettleTimeout(f"{condition} did not hold within {self.timeout_s:.0f} s") from error
        poll, seen = self.page.evaluate(POLL_SCRIPT), self.page.evaluate("window.__settle.seen")
        start = poll["input"] if poll["input"] is not None else poll["mark"]
        sample = Sample(max(0.0, seen - start) / 1000, self.websocket.received - received,
                        self.websocket.sent - sent, poll["mutations"])
        for name, later in (then or {}).items():
            try:
                self.page.wait_for_function(f"() => ({later}) && (window.__settle.later = performance.now())",
                                            polling="raf", timeout=self.timeout_s * 1000)
            except PlaywrightError as error:
                raise SettleTimeout(f"{later} did not hold within {self.timeout_s:.0f} s") from error
            sample.marks[name] = max(0.0, self.page.evaluate("window.__settle.later") - start) / 1000
        if settle:
            self._settle(first_panel=False)
        sample.tiles_ms = self.page.evaluate(TILES_SCRIPT)  # the tiles of the view it settled on
        return sample

    def _settle(self, first_panel: bool) -> dict:
        deadline = time.monotonic() + self.timeout_s
        poll = None
        while time.monotonic() < deadline:
            with contextlib.suppress(PlaywrightError):  # a navigation can destroy the context mid-poll
                poll = self.page.evaluate(POLL_SCRIPT)
            if poll is not None and self._still(poll, first_panel):
                return poll
            self.page.wait_for_timeout(POLL_MS)
        raise SettleTimeout(f"not still after {self.timeout_s:.0f} s (last poll: {poll})")

    def _still(self, poll: dict, first_panel: bool) -> bool:
        idle = poll["script"] == "notRunning" and not poll["running"]
        drawn = poll["drawn"] == poll["charts"] and poll["loading"] == 0
        shown = not first_panel or poll["drawn"] + poll["component_panels"] > 0
        quiet = (poll["now"] - poll["last"] >= self.quiet_ms
                 and (time.monotonic() - self.websocket.last_frame) * 1000 >= self.quiet_ms)
        return idle and drawn and shown and quiet

    def combobox(self, label: str):
        return self.page.get_by_role("combobox", name=label, exact=True).first

    def radio(self, label: str):
        return self.sidebar.locator('[data-testid="stRadio"]').filter(has_text=label).first


def open_options(session: Session, combobox, attempts: int = 3):
    """Open a Streamlit selectbox's list; its options. A click now and then leaves the list shut: click again."""
    options = session.page.locator('[role="listbox"] [role="option"]')
    for _ in range(attempts):
        combobox.click()
        try:
            options.first.wait_for(timeout=5_000)
            return options
        except PlaywrightError:
            session.page.keyboard.press("Escape")
    raise RuntimeError(f"the selectbox's list did not open in {attempts} clicks")


def next_option(session: Session, combobox) -> Callable[[], None]:
    """Open a Streamlit selectbox; return the click on the option after its current one (the first after the last)."""
    current = combobox.input_value().strip()
    options = open_options(session, combobox)
    texts = [text.strip() for text in options.all_inner_texts()]
    if len(texts) < 2:
        session.page.keyboard.press("Escape")
        raise NotAvailable(f"only {len(texts)} option")
    following = (texts.index(current) + 1) % len(texts) if current in texts else 0
    return options.nth(following).click


def selectbox_action(label: str, container: str) -> Callable[[Session, int], tuple[str, Callable]]:
    """The action "pick the next option of the selectbox ``label``"."""

    def prepare(session: Session, repeat: int) -> tuple[str, Callable]:
        combobox = session.combobox(label)
        if not combobox.count():
            raise NotAvailable(f"no selectbox {label!r}")
        return f"{container} selectbox {label!r}", next_option(session, combobox)

    return prepare


def quarter_turn(session: Session, repeat: int) -> tuple[str, Callable]:
    page = session.page
    if page.locator('[data-turn="90"]').count():  # the page's own turn controls (CSS pierces open shadow roots)
        back = next((f'[data-turn="{d}"]' for d in (0, 180) if page.locator(f'[data-turn="{d}"]').count()),
                    '[data-turn="90"]')
        return "[data-turn] buttons", page.locator('[data-turn="90"]' if repeat % 2 == 0 else back).first.click
    radio = session.radio("Rotate by")
    if not radio.count():
        raise NotAvailable("no [data-turn] button and no radio 'Rotate by'")
    checked = radio.locator("label:has(input:checked)")
    target = "0°" if checked.count() and checked.first.inner_text().strip() == "90°" else "90°"
    return "sidebar radio 'Rotate by'", radio.get_by_text(target, exact=True).click


def mirror(session: Session, repeat: int) -> tuple[str, Callable]:
    component = session.page.locator("[data-mirror]")
    if component.count():
        return "[data-mirror] control", component.first.click
    toggle = session.sidebar.get_by_text(MIRROR_LABEL, exact=True)
    if not toggle.count():
        raise NotAvailable("no [data-mirror] control and no toggle 'Mirror'")
    return "sidebar toggle 'Mirror'", toggle.click


def gallery_change(session: Session, repeat: int) -> tuple[str, Callable]:
    if not session.combobox("Gallery image").count():
        gallery = session.radio("Source").get_by_text("Gallery", exact=True)
        if not gallery.count():
            raise NotAvailable("no image source 'Gallery'")
        session.measure(gallery.click)
    return selectbox_action("Gallery image", "sidebar")(session, repeat)


def new_upload(session: Session, repeat: int, folder: Path) -> tuple[str, Callable]:
    uploader = session.page.locator(FILE_INPUT)
    if not uploader.count():
        source = session.sidebar.get_by_text("Upload an image", exact=True)
        if not source.count():
            raise NotAvailable("no image source 'Upload an image'")
        session.measure(source.click)
    if not uploader.count():
        raise NotAvailable("no image uploader")
    pixels, name = upload_pixels(repeat)  # a different gallery patch, element and width every repeat
    path = folder / name
    Image.fromarray(pixels).save(path)
    return "sidebar uploader", lambda: uploader.last.set_input_files(str(path))


def tab_switch(session: Session, repeat: int) -> tuple[str, Callable]:
    tabs = [session.page.get_by_role("tab", name=name, exact=True) for name in TABS]
    if not all(tab.count() for tab in tabs):
        raise NotAvailable(f"no tabs {' and '.join(TABS)}")
    target = next((tab for tab in tabs if tab.first.get_attribute("aria-selected") != "true"), tabs[0])
    return f"tabs {' / '.join(TABS)}", target.first.click


# The turn viewer marks the animation frame it draws (``root.dataset.frame``); a picture's first is frame 0.
FIRST_FRAME = "window.__settle.roots.some((root) => root.querySelector('[data-frame]'))"
FORGET_FRAMES = ("() => window.__settle.roots.forEach((root) => root.querySelectorAll('[data-frame]')"
                 ".forEach((element) => delete element.dataset.frame))")


def watch_turn(session: Session, repeat: int) -> tuple[str, Callable]:
    if repeat:  # a picture whose animation the server has not computed yet
        _, change = gallery_change(session, repeat)
        session.measure(change)
    play = session.page.locator("[data-play]")
    if not play.count():
        raise NotAvailable("no [data-play] control (the turn viewer's Watch it turn)")
    session.page.evaluate(FORGET_FRAMES)
    return "[data-play] control", play.first.click


def angle_step(session: Session, repeat: int) -> tuple[str, Callable]:
    thumb = (session.sidebar.locator('[data-testid="stSlider"]').filter(has_text=ANGLE_LABEL)
             .get_by_role("slider"))  # Streamlit's thumb is an <input type="range">
    if not thumb.count():
        raise NotAvailable("no slider 'Rotate by an arbitrary angle'")
    thumb.first.focus()
    key = "ArrowRight" if repeat % 2 == 0 else "ArrowLeft"
    return f"sidebar slider 'rotate by an arbitrary angle', {key}", lambda: session.page.keyboard.press(key)


def slide_drawn(other_than: str = "") -> str:
    """The JS condition: a slide viewer on the page (another slide's than ``other_than``) has drawn a frame with
    tiles. (The roots of components since removed are still in the list: only those on the page count.)"""
    return (f"window.__settle.roots.some((root) => [...root.querySelectorAll('{SLIDE_VIEWER}[data-drawn]')]"
            f".some((viewer) => viewer.isConnected && viewer.dataset.dzi !== {json.dumps(other_than)}))")


# When the slide viewer on the page last drew a frame (its ``drawnAt``): a pan or zoom is settled at its last frame,
# whatever else moves after it (OpenSeadragon fades its zoom buttons out over seconds).
LAST_FRAME = (f"() => Math.max(...window.__settle.roots.flatMap((root) => [...root.querySelectorAll('{SLIDE_VIEWER}')])"
              ".filter((viewer) => viewer.isConnected).map((viewer) => viewer.drawnAt ?? 0))")


def slide_viewer(session: Session):
    viewer = session.page.locator(f"{SLIDE_VIEWER}[data-drawn]")
    if not viewer.count():
        raise NotAvailable("no slide viewer with tiles drawn")
    return viewer.first


def slide_first(session: Session, repeat: int) -> tuple[str, Callable]:
    views = session.radio("View")
    if not views.get_by_text("Slide", exact=True).count():
        raise NotAvailable("no view 'Slide' in the sidebar")
    return "sidebar radio 'View'", views.get_by_text("Slide", exact=True).click


def slide_view(session: Session, repeat: int) -> tuple[str, Callable]:
    control, act = slide_first(session, repeat)
    session.measure(session.radio("View").get_by_text("Patch", exact=True).click)  # away from it, untimed
    return control, act


def slide_change(session: Session, repeat: int) -> tuple[str, Callable]:
    shown = slide_viewer(session).get_attribute("data-dzi")
    control, act = selectbox_action("Slide", "sidebar")(session, repeat)
    return control, (act, slide_drawn(other_than=shown))


def viewer_centre(session: Session) -> tuple[float, float]:
    box = slide_viewer(session).locator(".view").bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def slide_pan(session: Session, repeat: int) -> tuple[str, Callable]:
    x, y = viewer_centre(session)
    step = PAN_PX if repeat % 2 == 0 else -PAN_PX
    mouse = session.page.mouse

    def drag() -> None:
        mouse.move(x, y)
        mouse.down()
        mouse.move(x + step, y + step / 2, steps=6)
        mouse.up()

    return f"mouse drag of {PAN_PX} px", drag


def slide_zoom(session: Session, repeat: int) -> tuple[str, Callable]:
    x, y = viewer_centre(session)
    session.page.mouse.move(x, y)
    delta = -100 if repeat % 2 == 0 else 100  # in, then out: the view stays on the slide
    return "mouse wheel at the viewer's centre", lambda: session.page.mouse.wheel(0, delta)


MARKS = {"button": "button 'Analyse the slide' shown"}  # the names of Sample.marks, in the table
# The Slide page shows its button "Analyse the slide" (the slide's plan is made).
ANALYSE_SHOWN = "[...document.querySelectorAll('button')].some((b) => b.innerText.includes('Analyse the slide'))"
# A slide viewer on the page has drawn its overlay of analysed cells.
OVERLAY_DRAWN = ("window.__settle.roots.some((root) => [...root.querySelectorAll("
                 f"'{SLIDE_VIEWER}[data-overlay=\"drawn\"]')].some((viewer) => viewer.isConnected))")


def slide_analyse(session: Session, repeat: int) -> tuple[str, Callable]:
    button = session.page.get_by_role("button", name="Analyse the slide")
    for _ in range(4):  # the next slides, until one with a scale
        if button.count():
            break
        _, (act, drawn) = slide_change(session, repeat)
        session.measure_until(act, drawn)
    if not button.count():
        raise NotAvailable("no button 'Analyse the slide' (the slide is analysed already, or has no scale)")
    return "button 'Analyse the slide'", button.first.click


def open_slide_page(session: Session) -> None:
    """Switch to the view "Slide" and wait for its first tiles (not timed)."""
    _, act = slide_first(session, 0)
    session.measure_until(act, slide_drawn())


def open_rot_mnist(session: Session) -> None:
    """Switch the page to the rot-MNIST dataset and its checkpoint ``a_p4cnn_rot_mnist`` (not timed)."""
    dataset = session.radio("Dataset").get_by_text(ROT_MNIST_TITLE, exact=True)
    if not dataset.count():
        raise NotAvailable(f"no dataset {ROT_MNIST_TITLE!r} in the sidebar")
    session.measure(dataset.click)
    checkpoint = session.combobox("Checkpoint")
    if not checkpoint.input_value().startswith(ROT_MNIST_CHECKPOINT + ":"):
        option = open_options(session, checkpoint).filter(has_text=ROT_MNIST_CHECKPOINT + ":")
        if not option.count():
            raise NotAvailable(f"no checkpoint {ROT_MNIST_CHECKPOINT}")
        session.measure(option.first.click)


ONCE = ("first-cold", "slide-first", "slide-analyse")  # measured once a session: what they time happens once


def run_action(session: Session, page_name: str, action: Action, repeats: int, url: str,
               upload_folder: Path) -> ActionResult:
    """``repeats`` measurements of ``action``; a missing control or a failure is recorded, not raised."""
    result = ActionResult(page_name, action)
    preparers = {
        "quarter-turn": quarter_turn, "mirror": mirror, "gallery-change": gallery_change,
        "new-upload": lambda s, r: new_upload(s, r, upload_folder),
        "layer-change": selectbox_action("Layer", "main"),
        "reading-change": selectbox_action("Attention shown", "main"),
        "tab-switch": tab_switch, "angle-step": angle_step, "watch-turn": watch_turn,
        "slide-first": slide_first, "slide-view": slide_view, "slide-change": slide_change, "slide-pan": slide_pan,
        "slide-zoom": slide_zoom,
        "slide-analyse": slide_analyse,
    }
    for repeat in range(1 if action.key in ONCE else repeats):
        try:
            if action.key == "first-cold":
                result.control = "navigation"
                result.samples.append(session.measure(lambda: session.page.goto(url, wait_until="commit"), True))
            elif action.key == "first-warm":
                result.control = "page.reload()"
                result.samples.append(session.measure(lambda: session.page.reload(wait_until="commit"), True))
            elif action.key == "watch-turn":
                result.control, act = preparers[action.key](session, repeat)
                result.samples.append(session.measure_until(act, FIRST_FRAME))
            elif action.key in ("slide-first", "slide-view"):
                result.control, act = preparers[action.key](session, repeat)
                then = {"button": ANALYSE_SHOWN} if action.key == "slide-first" else None
                result.samples.append(session.measure_until(act, slide_drawn(), then=then))
            elif action.key == "slide-change":
                result.control, (act, drawn) = preparers[action.key](session, repeat)
                result.samples.append(session.measure_until(act, drawn))
            elif action.key == "slide-analyse":
                result.control, act = preparers[action.key](session, repeat)
                result.samples.append(session.measure_until(act, OVERLAY_DRAWN, settle=False))
            elif action.key in ("slide-pan", "slide-zoom"):
                result.control, act = preparers[action.key](session, repeat)
                result.samples.append(session.measure(act, end=LAST_FRAME, from_release=action.key == "slide-pan"))
            else:
                result.control, act = preparers[action.key](session, repeat)
                result.samples.append(session.measure(act))
        except NotAvailable as why:
            result.available, result.control = False, str(why)
            break
        except (PlaywrightError, SettleTimeout, RuntimeError) as error:
            result.errors.append(f"repeat {repeat + 1}: {str(error).splitlines()[0]}")
    return result


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), or what :mod:`platform` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def warm_up(folder: Path) -> float:
    """``python -m app.warm`` on ``folder``, as ``make run`` runs it before the server; its seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "app.warm"], cwd=REPO, env={**os.environ, "APP_CHECKPOINTS": str(folder)},
                   check=True, capture_output=True)
    return time.monotonic() - start


def run(folder: Path, pages: list[str], keys: list[str], repeats: int, quiet_ms: float, timeout_s: float,
        chromium: Path, port: int, workdir: Path, warm: bool = True, sessions: int = 1) -> dict:
    """Every requested action on every requested page, in :data:`ACTIONS`' order, in each of ``sessions`` sessions
    (a new server and browser each); the report as a dict, each action's repeats of every session together."""
    from benchmarks.train_step import instruction_sets

    warm_s = warm_up(folder) if warm else None
    results: dict[tuple[str, str], ActionResult] = {}
    for number in range(sessions):
        folder_of_session = workdir / f"session-{number}"
        folder_of_session.mkdir()
        found, chromium_version = run_session(folder, pages, keys, repeats, quiet_ms, timeout_s, chromium, port,
                                              folder_of_session)
        for result in found:
            if sessions > 1:
                result.errors = [f"session {number + 1}, {error}" for error in result.errors]
            kept = results.setdefault((result.page, result.action.key), result)
            if kept is not result:
                kept.samples += result.samples
                kept.errors += result.errors
    return dict(cpu=cpu_model(), cpus=os.cpu_count(), instruction_set=instruction_sets(),
                streamlit=importlib.metadata.version("streamlit"), chromium=chromium_version,
                checkpoints=str(folder), warm_up_s=warm_s, sessions=sessions,
                viewport=VIEWPORT, quiet_ms=quiet_ms, timeout_s=timeout_s, repeats=repeats,
                results=[r.as_dict() for r in results.values()])


def run_session(folder: Path, pages: list[str], keys: list[str], repeats: int, quiet_ms: float, timeout_s: float,
                chromium: Path, port: int, workdir: Path) -> tuple[list[ActionResult], str]:
    """One session: a new server and a new browser, every requested action measured; the results and Chromium's
    version."""
    results = []
    with contextlib.ExitStack() as stack:
        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        stack.callback(browser.close)
        session = Session(browser.new_page(viewport=VIEWPORT), quiet_ms, timeout_s)
        # The browser is up before the server: the cold navigation follows the health answer at once.
        deadline = time.monotonic() + timeout_s
        if "slide" in pages:  # a store of its own, empty: the analysis is timed from nothing done
            stack.enter_context(environment(APP_SLIDE_STORE=str(workdir / "slide-store")))
        _, url = stack.enter_context(streamlit_server(folder, workdir / "streamlit.log", port or free_port(),
                                                      deadline))
        cold = run_action(session, "he", ACTIONS[0], 1, url, workdir)
        for page_name in pages:
            wanted = [a for a in ACTIONS[1:] if page_name in a.pages and a.key in keys]
            opening = {"rot_mnist": open_rot_mnist, "slide": open_slide_page}.get(page_name)
            if opening and wanted and wanted[0].key != "slide-first":  # the first visit opens the page itself
                try:
                    opening(session)
                except NotAvailable as why:
                    results += [ActionResult(page_name, a, False, str(why)) for a in wanted]
                    continue
            results += [run_action(session, page_name, a, repeats, url, workdir) for a in wanted]
        results = ([cold] if "first-cold" in keys and "he" in pages else []) + results
        return results, browser.version


def markdown(report: dict) -> str:
    """The header (CPU, instruction set, versions) and the table of the report."""

    def number(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [f"CPU: {report['cpu']}, {report['cpus']} CPUs | {report['instruction_set']}",
             f"Streamlit {report['streamlit']} | Chromium {report['chromium']} | checkpoints {report['checkpoints']}"
             f" | still = {report['quiet_ms']:.0f} ms without a change | {report['repeats']} repeats"
             f" | {report.get('sessions', 1)} session(s)",
             "warm-up before the server (python -m app.warm, as make run): "
             + ("none (--no-warm)" if report.get("warm_up_s") is None else f"{report['warm_up_s']:.1f} s"),
             "", "| action | median s | min | max | KB received (median) | KB sent |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        name = r["label"] if r["page"] == "he" else f"{PAGES[r['page']]}: {r['label']}"
        if not r["available"]:
            lines.append(f"| {name} | not available ({r['control']}) | | | | |")
            continue
        tiles = "" if r.get("tile_ms_median") is None else (
            f"; tiles {statistics.median(r['tiles']):.0f}, {r['tile_ms_median']:.0f} ms median")
        lines.append(f"| {name} | {number(r['median_s'], 2)} | {number(r['min_s'], 2)} | {number(r['max_s'], 2)} "
                     f"| {number(r['received_kb_median'], 1)}{tiles} | {number(r['sent_kb_median'], 1)} |")
        for mark, values in (r.get("marks") or {}).items():
            lines.append(f"| {name}, then to the {MARKS.get(mark, mark)} | {statistics.median(values):.2f} "
                         f"| {min(values):.2f} | {max(values):.2f} | | |")
    notes = [f"- {r['label']}: {error}" for r in report["results"] for error in r["errors"]]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=Path, default=REPO / "checkpoints", help="the folder the app lists")
    parser.add_argument("--page", "--model", choices=["he", "rot_mnist", "slide", "both", "all"], default="both",
                        help="the H&E page the app opens on, the rot-MNIST page, both (default), the Slide page, or "
                             "all three")
    parser.add_argument("--actions", default=",".join(a.key for a in ACTIONS),
                        help="comma-separated, of: " + ", ".join(a.key for a in ACTIONS))
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements per action and session (first-cold, slide-first, slide-analyse: one)")
    parser.add_argument("--sessions", type=int, default=1,
                        help="times to run it all, each with a new server and browser (default 1)")
    parser.add_argument("--quiet-ms", type=float, default=QUIET_MS, help="still: this long without a change")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per action at most")
    parser.add_argument("--port", type=int, default=0, help="the server's port (default: a free one)")
    parser.add_argument("--chromium", type=Path, default=CHROMIUM, help="the Chromium executable")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-warm", action="store_true",
                        help="start the server without make run's warm-up (python -m app.warm): the cold first page "
                             "then measures the padding borders too, unless an earlier run stored them")
    parser.add_argument("--gigapixel", action="store_true",
                        help="with --page slide: the gigapixel slide analysed in the page instead "
                             "(benchmarks.slide_analysis_browser: Analyse, a pan, websocket bytes, CPU share, memory "
                             "per overlay, overlay switches)")
    parser.add_argument("--whole-slide", action="store_true",
                        help="with --page slide: the CMU slide whole in the app against python -m app.slides on it")
    args = parser.parse_args(argv)
    if args.gigapixel or args.whole_slide:  # its own module, which uses this one's Session
        command = [sys.executable, "-m", "benchmarks.slide_analysis_browser",
                   "--gigapixel" if args.gigapixel else "--whole-slide", "--timeout", str(args.timeout * 5),
                   "--chromium", str(args.chromium)] + (["--json", str(args.json)] if args.json else [])
        return subprocess.run(command, cwd=REPO).returncode
    keys = [key.strip() for key in args.actions.split(",") if key.strip()]
    unknown = sorted(set(keys) - {a.key for a in ACTIONS})
    if unknown:
        parser.error(f"unknown actions {unknown}; known: {[a.key for a in ACTIONS]}")
    if args.repeats < 1 or args.sessions < 1:
        parser.error("--repeats and --sessions must be at least 1")
    if sync_playwright is None:
        parser.error("the playwright package is missing (pip install -r requirements-dev.txt)")
    if not args.chromium.exists():
        parser.error(f"{args.chromium} not found (apt-get install chromium)")
    pages = {"both": ["he", "rot_mnist"], "all": ["he", "rot_mnist", "slide"]}.get(args.page, [args.page])
    with tempfile.TemporaryDirectory(prefix="browser_latency-") as workdir:
        report = run(args.checkpoints, pages, keys, args.repeats, args.quiet_ms, args.timeout, args.chromium,
                     args.port, Path(workdir), warm=not args.no_warm, sessions=args.sessions)
    print(markdown(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["available"] is False or not r["errors"] for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
