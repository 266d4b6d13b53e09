"""The Slide page: a whole slide or an image in a deep-zoom viewer, its tissue outline, and the tumour probability
per cell over it once analysed; a click on a cell opens it in the patch page.

The slides are the server's (:mod:`app.slides.library`): its folder, the two real demo slides and the demo images
(:mod:`app.slides.demos`: the CMU-1 region, the PCam test mosaic whose cells' truth is known and is scored), listed by
name, and the session's uploads. An ordinary image is a slide of one level whose scale the user gives: region mode
and slide mode are this one page, on one reader, one grid and one engine (issue 59).
The viewer (``slide_viewer.js``, a components-v2 element) fetches the slide's tiles over HTTP from the same server
(:mod:`app.slides.tiles`): panning and zooming never rerun this page. An analysis runs on Dask (a local cluster
per server process, or ``$AAGC_DASK_SCHEDULER``'s), fed by the server's one chunk scheduler
(:mod:`app.slides.schedule`): the chunks in the viewer's view first, then the rest of the slide coarse to fine, the
cluster shared fairly between the slides being analysed. Each finished chunk goes into the slide's chunk store,
which every session shares: a slide analysed once shows its heatmap to everyone, and an analysis cut short (the page
left, the server stopped) resumes from its finished chunks.

The sidebar's Stain control shows the slide as scanned or normalised to PCam's stain (Macenko's or Reinhard's, from
the slide's own estimate, :mod:`app.slides.stain`), beside swatches of the slide's estimated haematoxylin and eosin
and PCam's: the viewer's tiles are normalised by the tile routes as they are asked for, and Analyse runs on the
normalised pixels, in a store of its own.

The sidebar's Precision control asks for the network's precision: auto (bfloat16 where the workers' CPUs compute it
natively and it was measured faster, else float32), float32, the exact path, or bfloat16; a line below it says which
the plan decided and why (:mod:`app.slides.precision`). Each precision's analysis has a store of its own.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import streamlit as st

from models import Group, load_checkpoint
from models.cpu.allocator import release_freed_memory
from models.cpu.user_cache import cache_root
from models.precision import PRECISIONS, Precision

from ..analysis.compute import display_group
from ..analysis.readings import BRIGHT, LABELS
from ..analysis.transforms import element_name
from ..cells.mosaic import score_cells
from ..slides.connection import close_server_clients as close_dask_client
from ..slides.connection import scheduler_address
from ..slides.connection import server_client as dask_client
from ..slides.connection import server_connecting as _connecting
from ..slides.engine import cell_context
from ..slides.library import IMAGE_SUFFIXES, UPLOAD_SUFFIXES, SlideEntry, list_slides, save_upload
from ..slides.moved import moved_slide
from ..slides.order import clamp_view
from ..slides.overlay_colours import RANGE
from ..slides.overlay_routes import VIEWER_JS, overlay_base
from ..slides.overlay_tiles import VALUES, cell_value, chunk_rect, first_corner, register
from ..slides.precision import resolve_precision
from ..slides.proof import compare_moved, move_cells
from ..slides.reader import SlideError, open_slide
from ..slides.run import SCHEDULER_ENV, SlidePlan, assemble, plan_slide
from ..slides.scale import slide_scale
from ..slides.schedule import ChunkScheduler, Progress, current_scheduler, scheduler_for
from ..slides.stain import StainError, StainEstimate, known_slide_stain, pcam_target, slide_stain
from ..slides.tiles import VENDOR, inline_descriptor, route_id, wait_for_tiles
from ..slides.workers import cluster_devices, describe_cluster
from .inputs import REGION_CELL_KEY, REGION_CELL_SOURCE, LoadedModel, RegionCell
from .refresh import keeps_interval, refresh_interval

# slides_left: the app leaves the Slide page; start_dask_client, close_dask_client: the server makes its Dask client
# as it starts (app/server.py says why there) and closes it at shutdown
__all__ = ["slide_page", "slides_left", "viewer_rect", "start_dask_client", "close_dask_client"]
start_dask_client = _connecting

_HERE = Path(__file__).resolve().parent
VIEWER_HEIGHT_PX = 620
TUMOUR = "tumour"
PLANNING_LOOK_S = 0.2  # how often the page looks whether a slide's plan is made
PLAN_WAIT_S = 2.0  # the longest a slide's plan waits for the viewer's first tiles (none come without a browser)
OPENED = "slide-cell-opened"
UPLOADS = "slide-uploads"  # this session's uploaded slides: upload file id -> entry
OVERLAY_OPACITY = 0.55
# The score of a mosaic and the proof of a moved slide are computed from the whole slide's cells at each refresh: only
# on slides of at most this many cells (the CMU slide: 1,485; the gigapixel benchmark slide: 641,601).
SCORED_CELLS = 20_000
# A refresh names the chunks finished since the last one, at most this many (a few KB); more, and the viewer reloads
# the overlay's tiles in view instead.
CHANGED_CHUNKS = 64
# The proof's largest difference of P(tumour) said as a caption below these, a warning above: float32's round-off
# (3e-7 measured on the PCam mosaic), bfloat16's rounding (2e-3 there, each product rounded to 8 bits of mantissa).
PROOF_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.02}
PLANS_PER_SLIDE = 6  # a session's plans of one slide kept (scales typed, moves), the latest
SLIDES_PLANNED = 3  # the slides a session keeps plans of, the latest
# this session's plans: slide id -> OrderedDict (path, checkpoint, mpp, element, stain, precision) -> Future
PLANS = "slide-plans"
# The Stain control's choices (app.slides.stain.METHODS): both normalisations are offered, as the command line's
# --stain: looked at on the two real slides, Macenko's (PCam's eosin at PCam's concentration range) made the CMU slide
# far more purple than Reinhard's (PCam's colour means and spreads), and Reinhard's made the TCGA frozen section paler.
STAIN_CHOICES = {"none": "as scanned", "macenko": "normalised to PCam: Macenko",
                 "reinhard": "normalised to PCam: Reinhard"}
# The Precision control's choices (models.precision.PRECISIONS), as the command line's --precision.
PRECISION_CHOICES = {name: f"{name} (exact)" if name == "float32" else name for name in PRECISIONS}
REPORTED = "slide-reported"  # this session's viewer: store key -> (version, the chunks finished it was told of)
VIEW = "slide-view"  # the level-0 rectangle the viewer shows, clamped: (store key, x, y, width, height)
VIEWER_ID = "slide-viewer-id"  # this session's name for the chunk scheduler (its views, its sign of life)
CHOSEN = "slide-chosen"  # the slide chosen in the sidebar, kept while another page is shown
LOOKED_AT = "slide-looked-at"  # the stores this session's page showed last: told to the scheduler when left
# Where analyses are kept, shared by every session: $APP_SLIDE_STORE, else the project's user cache.
STORE = Path(os.environ.get("APP_SLIDE_STORE") or cache_root() / "slides")

# The viewer's code comes from the server's route (VIEWER_JS), named by its digest; the page sends only its loader.
_VIEWER = st.components.v2.component(
    "aagc_slide_viewer",
    html='<div class="slide-viewer-host"></div>',
    css=(_HERE / "slide_viewer.css").read_text(),
    js=(_HERE / "slide_viewer_loader.js").read_text().replace(
        "__VERSION__", hashlib.sha256(VIEWER_JS.read_bytes()).hexdigest()[:16]),
)


_PLANNER = ThreadPoolExecutor(2, thread_name_prefix="slide-plan")


def _planning(slide_id: str, path: str, checkpoint: str, mpp: float | None, element: int = 0,
              stain: str = "none", precision: str = "auto") -> Future:
    """This session's plan of the slide moved by ``element`` (:func:`_make_plan`), kept per slide: the latest
    :data:`PLANS_PER_SLIDE` of each of the session's latest :data:`SLIDES_PLANNED` slides, so that one user's tries of
    scales never push out another's plans (a cache shared by all sessions did, issue 66)."""
    plans: OrderedDict = st.session_state.setdefault(PLANS, OrderedDict())
    of_slide = plans.setdefault(slide_id, OrderedDict())
    plans.move_to_end(slide_id)
    while len(plans) > SLIDES_PLANNED:
        plans.popitem(last=False)
    key = (path, checkpoint, mpp, element, stain, precision)
    if key not in of_slide:
        of_slide[key] = _make_plan(slide_id, path, checkpoint, mpp, element, stain, precision)
    of_slide.move_to_end(key)
    while len(of_slide) > PLANS_PER_SLIDE:
        of_slide.popitem(last=False)
    return of_slide[key]


def _make_plan(slide_id: str, path: str, checkpoint: str, mpp: float | None, element: int = 0,
               stain: str = "none", precision: str = "auto") -> Future:
    """The plan of the slide moved by ``element`` (its scale, grid, thumbnail and tissue: 0.5 s of CPU on the CMU
    slide), its pixels normalised by ``stain``, in ``precision`` (:func:`_decided`), made in the background once the
    viewer has its first tiles, which
    need no plan: on two cores the plan made beside them delayed the first tiles of the page's first visit by
    seconds. The slide's stain estimate is made there too (kept per file), for the sidebar's swatches."""
    # The wait as it is now, not when a thread of the pool takes the plan up: a plan queued behind others would
    # otherwise wait as long as whatever PLAN_WAIT_S says then (a test's 600 s held both threads for ten minutes).
    wait_s = PLAN_WAIT_S

    def plan() -> SlidePlan:
        # The patch page's requests kept their memory (models.cpu.allocator): a slide's analysis needs none of it,
        # and the server with its workers stays within its bound only without it.
        release_freed_memory()
        wait_for_tiles(route_id(slide_id, element, stain), wait_s)
        made = plan_slide(Path(path), Path(checkpoint), STORE, mpp, element=element, stain=stain,
                          precision=_decided(precision, checkpoint))
        try:
            # Kept: the sidebar shows it from the page's next run on, without waiting for it (from the plan's own
            # thumbnail where it is the slide's as scanned: reading it is most of the estimate's cost).
            slide_stain(path, made.thumbnail if element == 0 else None)
        except (StainError, SlideError):
            pass  # its sentence is kept too, and said in the sidebar
        return made

    return _PLANNER.submit(plan)


def _decided(requested: str, checkpoint: str) -> str | Precision:
    """``auto`` asked of every worker of the scheduler ``$AAGC_DASK_SCHEDULER`` names
    (:func:`app.slides.precision.resolve_precision`); else the request, which the plan decides by this machine's CPU,
    the one a local cluster's workers share (and where the scheduler does not answer: Analyse then says why)."""
    if requested != "auto" or scheduler_address() is None:
        return requested
    try:
        client = dask_client()
        model, _ = load_checkpoint(checkpoint)  # whether its network has a bfloat16 path at all
        return resolve_precision(requested, model, client)
    except OSError:
        return requested


def _descriptor(route: str) -> dict | None:
    """The Deep Zoom descriptor of the slide the tile routes name ``route`` (:func:`app.slides.tiles.moved_id`), for
    the viewer to open without asking for it; None where it cannot be read (the viewer then asks the ``.dzi``
    route, which says why)."""
    try:
        return inline_descriptor(route)
    except Exception:  # OpenSlide's errors for a file it cannot read: the page has said so already
        return None


def _transform_ui(group: Group) -> int:
    """Sidebar: a quarter turn and, for a p4m model, a mirror of the whole slide: the element of the group it is
    moved by (0: as scanned). The moved slide is a slide of its own, analysed by the same engine, and the page
    proves its maps are the original's moved (:mod:`app.slides.proof`)."""
    st.sidebar.header("Transform")
    quarter = st.sidebar.radio("Rotate the slide by", [0, 90, 180, 270], format_func=lambda d: f"{d}°",
                               horizontal=True, key="slide_rotate",
                               help="The turned slide is analysed as a slide of its own; once the slide as scanned "
                                    "is too, the page compares their heatmaps cell by cell.")
    mirror = group.order == 8 and st.sidebar.toggle("Mirror (flip the rows after rotating)", key="slide_mirror")
    return quarter // 90 + 4 * mirror


def _swatch(rgb) -> str:
    r, g, b = (int(v) for v in rgb)
    return (f'<span title="rgb({r}, {g}, {b})" style="display:inline-block;width:1.1em;height:1.1em;'
            f'vertical-align:-0.2em;border-radius:2px;border:1px solid rgba(0,0,0,.25);background:rgb({r},{g},{b})">'
            '</span>')


def _stain_ui(entry: SlideEntry) -> str:
    """Sidebar: the slide's estimated haematoxylin and eosin beside PCam's, as swatches, and the Stain control: the
    slide as scanned (``"none"``) or normalised to PCam's stain (:data:`STAIN_CHOICES`). The estimate is the one the
    plan made (:func:`app.slides.stain.known_slide_stain`): this run never waits for it."""
    st.sidebar.header("Stain")
    found = known_slide_stain(entry.path)
    try:
        reference = pcam_target()
    except StainError as err:  # a card without its reference stain: python -m tools.pcam_stain writes it
        found = str(err).rstrip(".")
    if isinstance(found, StainEstimate):
        (slide_h, slide_e), (pcam_h, pcam_e) = found.swatches(), reference.swatches()
        st.sidebar.markdown(f"<small>H and E: this slide {_swatch(slide_h)} {_swatch(slide_e)} &nbsp; "
                            f"PCam {_swatch(pcam_h)} {_swatch(pcam_e)}</small>", unsafe_allow_html=True)
    elif isinstance(found, str):
        st.sidebar.caption(f"{found.rstrip('.')}; shown and analysed as scanned only.")
    else:
        st.sidebar.caption("This slide's stain is estimated from its tissue once its tissue is found.")
    chosen = st.sidebar.radio("Stain", list(STAIN_CHOICES), key="slide_stain", format_func=STAIN_CHOICES.get,
                              disabled=isinstance(found, str), label_visibility="collapsed",
                              help="Normalised: each pixel's colour mapped from this slide's stain, estimated from "
                                   "its tissue, to PCam's, the stain the model was trained on: Macenko maps the H and "
                                   "E vectors and their concentration ranges, Reinhard the colour means and spreads. "
                                   "The tiles are normalised as they are shown, and Analyse runs on those pixels (an "
                                   "analysis of its own, never mixed with the one as scanned).")
    return "none" if isinstance(found, str) else chosen


def _precision_ui() -> str:
    """Sidebar: the network's precision asked for (:data:`PRECISION_CHOICES`); the plan decides ``auto``, and the
    page says what it decided below (:func:`_precision_said`)."""
    st.sidebar.header("Precision")
    return st.sidebar.radio("Precision", list(PRECISION_CHOICES), key="slide_precision", horizontal=True,
                            format_func=PRECISION_CHOICES.get, label_visibility="collapsed",
                            help="auto: bfloat16 where the CPUs that run the analysis compute it natively "
                                 "(AMX-BF16), where it was measured several times faster than float32, else float32; "
                                 "float32: the exact path, the one the proof's tolerances are of; bfloat16 as asked, "
                                 "emulated (slow) on a CPU without it. Each precision is an analysis of its own, never "
                                 "mixed.")


def _precision_said(plan: SlidePlan) -> None:
    """Sidebar, below the Precision control: which precision the plan's analysis runs in, and why."""
    st.sidebar.caption(f"Runs in {plan.precision.name}: {plan.precision.reason}.")


def _truth(entry: SlideEntry, element: int) -> np.ndarray | None:
    """The true label of each cell of the slide moved by ``element`` (-1: none), where the slide has them."""
    return None if entry.truth is None else move_cells(np.load(entry.truth), element)


def _upload_ui() -> None:
    """Sidebar: a slide to upload; once kept (:func:`app.slides.library.save_upload`), listed to this session and
    chosen."""
    limit_mb = int(st.get_option("server.maxUploadSize"))
    upload = st.sidebar.file_uploader(f"Upload a slide or an H&E image (one file, up to {limit_mb:,} MB)",
                                      key="slide_upload", type=[suffix.lstrip(".") for suffix in UPLOAD_SUFFIXES],
                                      help="An image's scale is asked for once it is uploaded. Larger slides, and "
                                           "MIRAX or VMS folders: the server's slides folder.")
    kept = st.session_state.setdefault(UPLOADS, {})
    if upload is None or upload.file_id in kept:
        return
    try:
        from secrets import token_hex  # here: this function is the only part of the page the quotas change

        # The session's own quota counts its uploads under a name of its own (app.slides.uploads).
        session = st.session_state.setdefault("upload_session", token_hex(8))
        entry = save_upload(upload.name, upload.getbuffer(), limit_mb * 2**20, session=session)
    except SlideError as err:
        st.sidebar.error(str(err))
        return
    kept[upload.file_id] = entry
    st.session_state["slide"] = entry.slide_id


def _slide_ui(entries: list[SlideEntry]) -> SlideEntry:
    by_id = {entry.slide_id: entry for entry in entries}
    uploaded = {entry.slide_id: entry for entry in st.session_state.get(UPLOADS, {}).values()}
    by_id = {**uploaded, **by_id}
    # Streamlit drops a widget's state on a run that does not draw it: the slide chosen is kept beside it, so that
    # the patch page (a click on a cell opens it) and back shows that slide again, its analysis looked at again.
    if "slide" not in st.session_state and st.session_state.get(CHOSEN) in by_id:
        st.session_state["slide"] = st.session_state[CHOSEN]
    chosen = st.sidebar.selectbox("Slide", list(by_id), key="slide",
                                  format_func=lambda i: by_id[i].name + (" (demo)" if by_id[i].demo else
                                                                         " (uploaded)" if i in uploaded else ""),
                                  help="Your uploads, the slides and images in the server's slides folder "
                                       "($APP_SLIDES), then the demo slides and images.")
    st.session_state[CHOSEN] = chosen
    return by_id[chosen]


def _info_ui(entry: SlideEntry) -> float | None:
    """Sidebar: the slide's levels, scale and label; the scale to analyse it at (None: none known yet)."""
    try:
        with open_slide(entry.path) as slide:
            scale = slide_scale(slide.properties)
            levels = ", ".join(f"{w:,} x {h:,}" for w, h in slide.level_dimensions)
            kind = ("an image of one level" if slide.vendor == "image" else
                    f"{slide.vendor}, {slide.level_count} level(s)")
            if entry.microns_per_pixel is not None:
                st.sidebar.caption(f"{kind}: {levels} px. Scale: {entry.microns_per_pixel} µm/px, recorded with this "
                                   "demo image.")
                return entry.microns_per_pixel
            st.sidebar.caption(f"{kind}: {levels} px. Scale: {scale.sentence}.")
            for name in ("label", "macro"):
                if name in slide.associated:
                    st.sidebar.image(slide.associated_image(name), caption=name, width=160)
    except SlideError as err:
        st.error(str(err))
        return None
    if scale.source == "none":
        given = st.sidebar.number_input("Scale of level 0 (µm per pixel)", min_value=0.05, max_value=20.0,
                                        value=None, step=0.01, key=f"mpp-{entry.slide_id}",
                                        help="Your scanner's or slide level's: about 0.25 at 40x, 0.5 at 20x, 1.0 at "
                                             "10x.")
        return None if given is None else float(given)
    return scale.microns_per_pixel


def _layers(plan: SlidePlan, shown: str | None, version: dict | None) -> dict:
    """The viewer's tiled layers over the slide (:mod:`app.slides.overlay_tiles`): the tissue outline and, where
    ``shown`` is an overlay (``"tumour"`` or a reading of attention), that one with its colour range, units and
    ``version`` (what changed since the last refresh, :func:`_changes`). A few hundred bytes, whatever the slide."""
    overlay = register(plan)
    base = dict(base=overlay_base(overlay.key), **overlay.pyramid.descriptor())
    layers = dict(outline={**base, "kind": "outline"})
    if shown is not None:
        units = "P(tumour)" if shown == TUMOUR else f"{LABELS[shown].split(':')[0]} (first attentive layer)"
        # Its tiles are the values tiles of every overlay, which the viewer colours: a switch fetches nothing.
        layers["overlay"] = {**base, "kind": shown, "tiles": VALUES, "opacity": OVERLAY_OPACITY, "low": RANGE[0],
                             "high": RANGE[1], "units": units, **(version or {})}
    return layers


def _changes(plan: SlidePlan, done: set) -> dict:
    """What this session's viewer of ``plan`` has not been told yet: ``version`` (one more each time chunks
    finished), ``since`` (the version the viewer must hold for ``rects`` to bring it up to date) and ``rects``, the
    level-0 rectangles of the chunks finished since (None: too many, reload the overlay's tiles in view). With no
    chunk finished since, the last message again (the viewer holds its version already): a refresh that changes
    nothing is the same message, which Streamlit does not send twice."""
    reported = st.session_state.setdefault(REPORTED, {})
    key = plan.store.folder.name
    version, told, said = reported.get(key, (0, frozenset(), None))
    new = done - told
    if not new:
        return said or dict(version=version, since=version, rects=[])
    rects = ([chunk_rect(plan.grid, *index) for index in sorted(new)] if len(new) <= CHANGED_CHUNKS and version
             else None)
    said = dict(version=version + 1, since=version, rects=rects)
    reported[key] = (version + 1, frozenset(done), said)
    return said


def _grid(plan: SlidePlan) -> dict:
    """The cells' lattice in level-0 pixels, for the viewer's one function from a position to a cell (hover and
    click)."""
    (top, left), (cell_rows, cell_cols) = first_corner(plan.grid), plan.grid.cell_size_px()
    return dict(top=top, left=left, rows=plan.grid.cells.rows,
                cols=plan.grid.cells.cols, height=cell_rows, width=cell_cols)


def _me() -> str:
    """This session's name for the chunk scheduler: its views count, and it shows it still looks, under it."""
    return st.session_state.setdefault(VIEWER_ID, uuid.uuid4().hex)


def _look(plan: SlidePlan, rect: tuple[float, float, float, float]) -> None:
    """The viewer shows ``rect`` (left, top, width, height, level-0 pixels, clamped to the slide) of ``plan``'s
    slide: kept for an Analyse to come, and told to the scheduler, which re-orders what still waits so that the
    chunks in view go first."""
    st.session_state[VIEW] = (plan.store.folder.name, *rect)
    scheduler = current_scheduler()
    if scheduler is not None:
        scheduler.view(plan.store.folder.name, rect, viewer=_me())


def _seen(plan: SlidePlan, state_key: str) -> None:
    """The viewer's view message, clamped to the slide, to :func:`_look`; a message that is no rectangle is
    ignored."""
    rect = viewer_rect(plan.grid.size, (st.session_state.get(state_key) or {}).get("view"))
    if rect is not None and st.session_state.get(VIEW) != (plan.store.folder.name, *rect):
        _look(plan, rect)


def viewer_rect(size: tuple[int, int], view) -> tuple[float, float, float, float] | None:
    """``(left, top, width, height)`` of the viewer's ``view`` message (``x``, ``y``, ``width``, ``height`` in level-0
    pixels, from the browser: any value at all) clamped to a slide of ``size`` (rows, cols) by the scheduler's own
    rule (:func:`app.slides.order.clamp_view`); None where it is no rectangle of numbers."""
    if not isinstance(view, dict):
        return None
    return clamp_view([view.get(name) for name in ("x", "y", "width", "height")], size)


def _view_of(plan: SlidePlan) -> tuple[float, float, float, float] | None:
    """The view this session's viewer last reported of ``plan``'s slide, if any."""
    kept = st.session_state.get(VIEW)
    return tuple(kept[1:]) if kept and kept[0] == plan.store.folder.name else None


def _progress(scheduler: ChunkScheduler | None, plans: list[SlidePlan]) -> list[Progress]:
    """The scheduler's progress of each of ``plans`` it analyses (this session still looking at them)."""
    if scheduler is None:
        return []
    found = (scheduler.progress(p.store.folder.name, viewer=_me()) for p in plans)
    return [progress for progress in found if progress is not None]


RUNNING = ("running", "background")  # the states of an analysis still at work (Progress.state)


def _running(progress: list[Progress]) -> bool:
    return any(p.state in RUNNING for p in progress)


def _left_behind(scheduler: ChunkScheduler | None, plans: list[SlidePlan]) -> None:
    """Tell the scheduler that this session no longer looks at the stores its page showed before, where it now shows
    others (another slide, scale or turn chosen): their analyses keep their finished chunks and go on in the
    background, below the ones someone looks at."""
    keys = [p.store.folder.name for p in plans]
    before = st.session_state.get(LOOKED_AT) or []
    st.session_state[LOOKED_AT] = keys
    if scheduler is not None:
        for key in before:
            if key not in keys:
                scheduler.stop(key, viewer=_me())


def slides_left() -> None:
    """This session shows no slide now (another page chosen): the analyses its Slide page showed go on in the
    background, below the ones someone looks at, until it shows them again."""
    _left_behind(current_scheduler(), [])


def _open_cell(plan: SlidePlan, entry: SlideEntry, state_key: str) -> None:
    """The viewer's click: the cell's context, read as the engine read it, handed to the patch page; a cell not
    evaluated (or not there: a browser may send anything) opens nothing."""
    try:
        i, j = (int(v) for v in st.session_state[state_key]["cell"])
    except (TypeError, ValueError):
        return
    found = cell_value(register(plan), i, j)
    if isinstance(found, str) or found["state"] != "evaluated":
        return
    with moved_slide(open_slide(entry.path), plan.element) as slide:
        pixels = cell_context(slide, plan.grid, i, j, plan.stain)  # as the engine judged it: normalised, if it was
    truth, labels = None, _truth(entry, plan.element)
    if labels is not None and labels[i, j] >= 0:
        truth = list(plan.card.get("class_names") or ["no_tumor", "tumor"])[int(labels[i, j])]
    moved = f" ({element_name(plan.element)})" if plan.element else ""
    moved += f", stain normalised to PCam ({plan.stain.method})" if plan.stain is not None else ""
    st.session_state[REGION_CELL_KEY] = RegionCell(pixels, f"{entry.name}{moved}, cell ({i}, {j})",
                                                   plan.grid.model_microns_per_pixel, truth)
    st.session_state["view"] = "Patch"
    st.session_state["image_source"] = REGION_CELL_SOURCE
    st.session_state[OPENED] = True  # the viewer's fragment reruns alone: it then reruns the whole page


def slide_page(loaded: LoadedModel) -> None:
    """The page: the slide picked in the sidebar, in the viewer, with its analysis by ``loaded``."""
    _upload_ui()
    entries = list_slides()
    if not entries and not st.session_state.get(UPLOADS):
        st.info("No slides here: put .svs, .ndpi, .mrxs, .tif ... files in `slides/` (or the folder `$APP_SLIDES` "
                "names; in Docker, mount one: `docker run -v /path/to/slides:/slides -e APP_SLIDES=/slides ...`).")
        return
    if not (VENDOR / "openseadragon").is_dir():
        st.warning("The deep-zoom viewer is not installed on this server: `make vendor` fetches OpenSeadragon.")
        return
    if loaded.path is None:
        slides_left()  # the slide shown before is left now (it stayed looked at until the scheduler's timeout)
        st.info(f"{loaded.name} is an upload, held by this session only: a slide is analysed by worker processes "
                "that load the model from the server's disk. Pick a shipped checkpoint to analyse slides.")
        return
    entry = _slide_ui(entries)
    mpp = _info_ui(entry)
    element = _transform_ui(display_group(loaded.model))
    stain = _stain_ui(entry)
    precision = _precision_ui()
    checkpoint = str(loaded.path)
    if entry.note:
        (st.warning if entry.truth is None else st.caption)(entry.note)
    if mpp is None:
        image = entry.path.suffix.lower() in IMAGE_SUFFIXES
        st.info(f"{entry.name} " + ("is an image, which records no scale" if image else
                                    "records neither its scale nor its objective power")
                + ": it is not analysed until its scale (µm per pixel) is given in the sidebar.")
    route = route_id(entry.slide_id, element, stain)  # what the tile routes call the slide moved, normalised
    def planned(g: int) -> Future:
        return _planning(entry.slide_id, str(entry.path), checkpoint, mpp if mpp is not None else 1.0, g, stain,
                         precision)

    planning = planned(element)
    # A moved slide's page needs the slide as scanned too (its maps are compared with it, and analysed with it).
    scanned = planned(0) if element else None
    if not (planning.done() and (scanned is None or scanned.done())):
        slides_left()  # the slide shown before is left now, not once this one's plan is made (seconds on a large slide)
        _view_while_planning(entry, mpp, [planning] + ([scanned] if scanned else []), route)
        return
    try:
        plan = planning.result()
        original = scanned.result() if scanned else None  # the slide as scanned, for the proof
    except (SlideError, StainError) as err:
        slides_left()  # a slide that cannot be planned still leaves the one shown before
        st.error(str(err))
        return
    _precision_said(plan)
    caption = (f"{plan.grid.cells.rows * plan.grid.cells.cols:,} cells of 32 px at "
               f"{plan.grid.model_microns_per_pixel} µm/px; {len(plan.chunks)} chunks with tissue")
    plans = [plan] + ([original] if original is not None else [])
    scheduler = current_scheduler()
    _left_behind(scheduler, plans)
    progress = _progress(scheduler, plans)
    active = _running(progress)
    if active:  # shown again: this session looks at it (again), and its views count
        for each in plans:
            scheduler.analyse(each, viewer=_me(), view=_view_of(each) if each is plan else None)
    stored = [p.store.finished() for p in plans]  # one listing of each store's folder per run
    finished = len(stored[0] & set(plan.chunks))
    missing = [p for p, done in zip(plans, stored, strict=True) if not done >= set(p.chunks)]
    if mpp is not None and missing and not active:
        _connecting()  # the cluster starts while the user looks at the slide
        left, right = st.columns([1, 3])
        if left.button("Analyse the slide", type="primary", key=f"analyse-{entry.slide_id}"):
            try:
                client = dask_client()
            except OSError as err:  # SchedulerUnreachable: one sentence naming the address
                st.error(f"The analysis cannot start: {err}.")
                return
            scheduler = scheduler_for(client, os.environ.get(SCHEDULER_ENV) or None)
            for each in missing:  # a moved slide with the slide as scanned, for the proof (the view is the moved one's)
                scheduler.analyse(each, viewer=_me(), view=_view_of(each) if each is plan else None)
            st.rerun()
        also = " (and the slide as scanned, for the proof)" if original in missing else ""
        right.caption(f"{finished} of {len(plan.chunks)} chunks analysed so far{also} (kept: an analysis cut short "
                      f"resumes from them). Runs on {_where()}, in {plan.precision.name}.")
    for each in progress:
        if each.lost:
            st.error(each.sentence())
        elif each.errors:
            st.error(f"{len(each.errors)} chunk(s) failed: {each.errors[0]}")
    interval = refresh_interval(_rate(progress), _view_done(progress)) if active else None
    _live_view(plan, entry, mpp, caption, interval, route, original)


def _where() -> str:
    """Where analyses run, in words: the cluster's workers as they are now (``3 workers, 2 with a GPU, on the Dask
    scheduler at ...``), or, while the client still connects, what it connects to."""
    address = os.environ.get(SCHEDULER_ENV)
    connecting = _connecting()
    if not connecting.done():
        return f"the Dask scheduler at {address} (connecting)" if address else "a local Dask cluster (starting)"
    if connecting.exception() is not None:
        reason = getattr(connecting.exception(), "reason", connecting.exception())
        return (f"the Dask scheduler at {address}, which does not answer now ({reason})" if address else
                f"a local Dask cluster, which did not start ({reason})")
    return _cluster_sentence(address or "")


@st.cache_data(ttl=30, show_spinner=False)
def _cluster_sentence(address: str) -> str:
    """The cluster's workers described (``address``: the scheduler's, "" for the local cluster), asked at most every
    30 s (workers come and go)."""
    try:
        return describe_cluster(cluster_devices(dask_client()), address or None)
    except OSError as err:
        return f"the Dask scheduler at {address or 'this server'}, which does not answer now ({err})"


def _viewer(route: str, mpp: float | None, caption: str, layers: dict, cells: dict | None = None,
            opened=None, seen=None) -> None:
    """The slide the tile routes call ``route`` in the deep-zoom viewer (its state under ``slide-viewer-{route}``),
    with the tiled ``layers`` over it (:func:`_layers`); ``opened`` is called when a cell is clicked, ``seen`` when
    the view settles after a pan or zoom (only this fragment reruns)."""
    callbacks = {} if opened is None else {"on_cell_change": opened}
    if seen is not None:
        callbacks["on_view_change"] = seen
    _VIEWER(key=f"slide-viewer-{route}", height="content",
            data=dict(dzi=f"slides/{route}.dzi", descriptor=_descriptor(route), height=VIEWER_HEIGHT_PX,
                      caption=caption, layers=layers, cells=cells, micronsPerPixel=mpp),
            **callbacks)


def _view_while_planning(entry: SlideEntry, mpp: float | None, planning: list[Future], route: str) -> None:
    """The slide in the viewer, without overlays, while its plans are made; the page again once they are."""

    @st.fragment(run_every=PLANNING_LOOK_S)
    def view() -> None:
        if all(each.done() for each in planning):
            st.rerun(scope="app")
        _viewer(route, mpp, "Finding the tissue ...", layers={})

    view()


def _view_done(progress: list[Progress]) -> bool:
    """Whether every running analysis of the page has all its chunks in the view in (a view over glass, or not yet
    reported, is not: the first cells must not wait for a long interval)."""
    running = [p for p in progress if p.state in RUNNING]
    return bool(running) and all(p.in_view and p.in_view_done >= p.in_view for p in running)


def _rate(progress: list[Progress]) -> float | None:
    """Chunks a second of the page's running analyses together (None before any is measured)."""
    rates = [p.rate for p in progress if p.state in RUNNING and p.rate]
    return sum(rates) if rates else None


def _live_view(plan: SlidePlan, entry: SlideEntry, mpp: float | None, caption: str, interval: float | None,
               route: str, original: SlidePlan | None) -> None:
    """The viewer with what is analysed so far; while an analysis runs (``interval`` not None), refreshed every
    ``interval`` seconds (:mod:`app.ui.refresh`: about a chunk's time) with the chunks finished since (a few hundred
    bytes: the viewer fetches the overlay's tiles over them again, and keeps its place and zoom), until the last is
    in. For a moved slide, the proof against the slide as scanned (``original``) over the cells both have."""
    state_key = f"slide-viewer-{route}"
    active = interval is not None

    @st.fragment(run_every=interval)
    def view() -> None:
        _seen(plan, state_key)  # first: the status line below counts the view the viewer shows now
        done = plan.store.finished() & set(plan.chunks)
        analysed = bool(done) and mpp is not None
        text = caption
        progress = _progress(current_scheduler(), [plan] + ([original] if original is not None else []))
        if active:  # in the viewer's status line, not a bar above it: the view never moves when the analysis ends
            text = f"Analysing. {progress[0].sentence() if progress else ''} {caption}"
        # The choice is there from the start (its place kept: the view never moves), the overlay once a chunk is in.
        chosen = _overlay_ui(plan, done) if mpp is not None else None
        shown = chosen if analysed else None
        if analysed:
            so_far = "" if active else f"; {len(done):,} of {len(plan.chunks):,} chunks analysed"
            text += (f"{so_far} (grey stripes: not yet). Hover a cell for its P(tumour), click it to open it in the "
                     "patch page.")
        _viewer(route, mpp, text, _layers(plan, shown, _changes(plan, done) if analysed else None),
                _grid(plan) if analysed else None,
                opened=lambda: _open_cell(plan, entry, state_key), seen=lambda: _seen(plan, state_key))
        if st.session_state.pop(OPENED, False):
            st.rerun(scope="app")
        if analysed:
            what = BRIGHT.get(shown, "Bright: the model gives the cell a high tumour probability.")
            st.caption(f"{what} Colours: viridis over 0 to 1; grey stripes: chunks not yet analysed; cyan: the tissue "
                       "outline. A research model trained on lymph-node patches (PCam), not a diagnostic device: on "
                       "other tissue it is outside what it learned.")
        # Below the viewer, so that what they say as chunks finish never moves it.
        small = plan.grid.cells.rows * plan.grid.cells.cols <= SCORED_CELLS
        if analysed and (entry.truth is not None or original is not None) and not small:
            st.caption(f"The score and the proof are computed on slides of at most {SCORED_CELLS:,} cells: this one "
                       f"has {plan.grid.cells.rows * plan.grid.cells.cols:,}.")
        elif analysed and (entry.truth is not None or original is not None):
            arrays = assemble(plan, _results(plan, done))
            if entry.truth is not None:
                _show_score(arrays, _truth(entry, plan.element), complete=len(done) == len(plan.chunks))
            if original is not None:
                _show_proof(original, arrays, plan.element)
        if active and not _running(progress):
            st.rerun()  # the whole page, once: the analysis is in (or stopped), the refreshing stops
        if active and not keeps_interval(interval, _rate(progress), _view_done(progress)):
            st.rerun()  # the whole page, which sets the fragment's interval anew: chunks come faster or slower, or
            # the view's are all in (or a pan or zoom brought chunks not yet in)

    view()


def _results(plan: SlidePlan, done: set) -> dict:
    """The finished chunks of a small slide (:data:`SCORED_CELLS`), read (from the store's memory once read)."""
    return {index: result for index in done if (result := plan.store.get(*index)) is not None}


def _show_proof(original: SlidePlan, arrays: dict, element: int) -> None:
    """The moved slide's maps against the slide as scanned, moved the same way: equal up to round-off over the cells
    both runs have evaluated (:func:`app.slides.proof.compare_moved`), or up to bfloat16's rounding where both ran in
    bfloat16 (:data:`PROOF_TOLERANCE`)."""
    done = _results(original, original.store.finished() & set(original.chunks))
    found = compare_moved(assemble(original, done), arrays, element) if done else None
    if found is None or not found.cells_compared:
        st.caption(f"Proof of equivariance: once the slide as scanned is analysed too (Analyse does both), this "
                   f"{element_name(element)} slide's heatmap is compared with its heatmap moved the same way.")
        return
    text = (f"Proof of equivariance: P(tumour) of the slide moved by {element_name(element)} against the slide as "
            f"scanned, its heatmap moved the same way: max |difference| = {found.probability_difference:.1e} over "
            f"{found.cells_compared:,} cells analysed in both")
    if found.attention_difference:
        text += "; attention (kept in float16) " + ", ".join(
            f"{LABELS[reading].split(':')[0]} {difference:.1e}"
            for reading, difference in sorted(found.attention_difference.items()))
    if found.cells_in_one_only:
        text += (f"; {found.cells_in_one_only:,} cells analysed in one run only (each run evaluates the chunks its "
                 "tissue mask touches, cut from its own top-left corner)")
    precision = original.precision.name  # the moved slide's plan asked for the same, decided alike
    if precision != "float32":
        text += f"; in {precision}, whose rounding is most of that (float32, the exact path, is within 1e-5)"
    (st.caption if found.probability_difference < PROOF_TOLERANCE[precision] else st.warning)(text + ".")


def _show_score(arrays: dict, labels: np.ndarray, complete: bool) -> None:
    """The heatmap against the true labels of the cells that have one (the PCam test mosaic's patch centres)."""
    if labels.shape != arrays["evaluated"].shape:
        st.warning(f"The true labels cover {labels.shape[0]} x {labels.shape[1]} cells, the grid "
                   f"{arrays['evaluated'].shape[0]} x {arrays['evaluated'].shape[1]}: not scored.")
        return
    score = score_cells(arrays["probabilities"][..., -1], labels)
    if score.scored:
        so_far = "" if complete else " analysed so far"
        st.success(f"Against the true labels of the patch centres{so_far}: {score.summary()}.")


def _overlay_ui(plan: SlidePlan, done: set) -> str:
    """The overlay to show: the tumour probability, or the first attentive layer's attention in one of the patch
    page's readings (the ones the model has, as a finished chunk says)."""
    looked = itertools.islice(sorted(done), 16)  # a chunk of glass has none: a few are enough to know
    example = next((result for index in looked if (result := plan.store.get(*index)) is not None
                    and result.attention), None)
    have = example.attention if example is not None else {}
    readings = [r for r in ("spatial", "removed", "kept") if r in have or (r == "kept" and "removed" in have)]
    options = [TUMOUR] + readings
    return st.radio("Overlay", options, horizontal=True, key="slide_overlay",
                    format_func=lambda o: "P(tumour) per cell" if o == TUMOUR else LABELS[o])
