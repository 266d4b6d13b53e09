"""The region page: a whole H&E region through the PCam model, cell by cell, and a way into any cell.

The sidebar picks a region (the PCam test mosaic, whose cells' truth is known; the CMU-1 region; an upload with
its micrometres per pixel), the method (of those that are the model's own function: for a model with attention,
exact crops only, and the sidebar says why) and the attention's reading. The page shows the tumour probability as a
surface over the tissue with its p = 0.5 contour (and, on the mosaic, dashed outlines of the patches labelled
tumour) beside the first attention layer's map stitched across the region, with the mosaic's score against the
true labels. Clicking a cell (or picking one of the most probable) opens its 96 x 96 context in the patch
explorer, with everything the patch view has. Results are cached per (model, region, scale, method), each with
every reading of the attention (another reading needs no new evaluation); at most ``$APP_CONCURRENT_ANALYSES``
evaluations run at once across sessions (:class:`app.analysis.cache.LRUCache`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import streamlit as st

from models import Group

from ..analysis.cache import LRUCache, image_digest
from ..analysis.compute import display_group
from ..analysis.images import FORMATS, MAX_UPLOAD_BYTES, ImageError, read_image
from ..analysis.pathology import model_microns_per_pixel
from ..analysis.readings import BRIGHT
from ..analysis.transforms import apply_element, element_name
from ..gallery import list_regions
from ..region.demo import pcam_test_mosaic, score_cells
from ..region.evaluation import (
    DEFAULT_READING,
    MAX_SIDE,
    RegionError,
    RegionResult,
    default_method,
    evaluate_region,
    exact_methods,
    first_attentive_layer,
    inexact_method,
)
from ..region.overlays import READING_LABELS
from ..region.plots import clicked_cell, region_figure
from .inputs import IMAGE_TYPES, REGION_CELL_KEY, REGION_CELL_SOURCE, LoadedModel, decoded_images

__all__ = ["ChosenRegion", "RegionCell", "region_page", "REGION_CELL_KEY"]

MOSAIC, CMU, UPLOAD = "PCam test mosaic (truth known)", "CMU-1 region (not lymph node)", "Upload a region"
METHOD_LABELS = {
    "crops": "Exact: every cell in its own 96 x 96 context",
    "tiles": "Fast: shared trunk over tiles, exact for this model",  # offered only where it is (exact_methods)
}
FIGURE_WIDTH_PX = 470  # two figures side by side at 1440 px with the sidebar open
HEATMAP_KEY, PICK_KEY = "region_heatmap", "region_cell_pick"


@dataclass(frozen=True)
class ChosenRegion:
    """A region to evaluate: ``(3, H, W)`` pixels in [0, 1], its scale and, for the mosaic, its cells' truth.

    ``element`` is the group element the user applied: ``labels`` and ``name`` are already moved by it, the
    pixels only when they are needed (:meth:`shown_pixels`), which is once per region as results are cached.
    ``digest`` identifies the unmoved pixels (of the file's bytes, cheaper than of the decoded pixels).
    """

    pixels: np.ndarray
    name: str
    microns_per_pixel: float | None
    source: str
    digest: str
    labels: np.ndarray | None = None
    note: str = ""
    element: int = 0

    def moved(self, element: int) -> ChosenRegion:
        """The region moved by a group element, its cells' truth with it."""
        if element == 0:
            return self
        labels = None if self.labels is None else apply_element(self.labels[None], element)[0]
        return dataclasses.replace(self, labels=labels, element=element,
                                   name=f"{self.name} ({element_name(element)})")

    def shown_pixels(self) -> np.ndarray:
        return apply_element(self.pixels, self.element) if self.element else self.pixels


@dataclass(frozen=True)
class RegionCell:
    """A cell sent to the patch explorer: its 96 x 96 context at the model's scale."""

    pixels: np.ndarray
    name: str
    microns_per_pixel: float
    true_label: str | None


@st.cache_resource
def region_results() -> LRUCache:
    """Evaluated regions (each up to about 80 MB at 4096 px): a few per process."""
    return LRUCache(maxsize=4, concurrency=int(os.environ.get("APP_CONCURRENT_ANALYSES", "2")))


@st.cache_data(max_entries=2, show_spinner="Building the mosaic of the model's test patches ...")
def _mosaic(model_id: str, _card: dict):
    return pcam_test_mosaic(_card)


def region_input_ui(loaded: LoadedModel) -> ChosenRegion | None:
    """Sidebar: the region and its scale. None (with a message on the page) when there is nothing to evaluate."""
    st.sidebar.header("Region")
    source = st.sidebar.radio("Region", [MOSAIC, CMU, UPLOAD], key="region_source")
    if source == MOSAIC:
        mosaic = _mosaic(loaded.model_id, loaded.card)
        return ChosenRegion(mosaic.image, "PCam test mosaic", mosaic.microns_per_pixel, mosaic.source,
                            image_digest(mosaic.image), mosaic.labels)
    if source == CMU:
        item = next(iter(list_regions()), None)
        if item is None:
            st.error("The CMU-1 region is missing from app/gallery (run `python -m app.gallery.make_gallery "
                     "--cmu-wheel ...`).")
            return None
        read = _read(item.path.read_bytes(), item.name)
        note = ("CMU-1 is not lymph-node tissue like PCam's (Camelyon16) patches: the model was never trained on "
                "such tissue, and its output here is not a diagnosis. It shows the machinery on a real slide region.")
        return None if read is None else ChosenRegion(read[0], item.name, item.microns_per_pixel,
                                                       f"{item.source}. {item.credit}.", read[1], note=note)
    upload = st.sidebar.file_uploader(f"Region image ({', '.join(FORMATS)}, up to {MAX_SIDE} x {MAX_SIDE})",
                                      type=IMAGE_TYPES, key="region_upload",
                                      max_upload_size=MAX_UPLOAD_BYTES // 2**20)
    mpp = st.sidebar.number_input("Micrometres per pixel of the upload", min_value=0.0, value=None,
                                  step=0.05, format="%.3f", key="region_mpp",
                                  help="Your scanner's or slide level's: about 0.25 at 40x, 0.5 at 20x, 1.0 at 10x.")
    if upload is None:
        st.info("Upload an H&E region in the sidebar and give its micrometres per pixel.")
        return None
    read = _read(upload.getvalue(), upload.name)
    if read is None:
        return None
    if mpp is None:
        st.warning(f"Give {upload.name}'s micrometres per pixel in the sidebar: the model reads tissue at "
                   f"{model_microns_per_pixel(loaded.card)} um/px, and the region is resampled to it.")
        return None
    return ChosenRegion(read[0], upload.name, float(mpp), "your upload", read[1])


def _read(data: bytes, name: str) -> tuple[np.ndarray, str] | None:
    """The decoded region (cached by the bytes' SHA-256, which also names it) or None with the error shown."""
    digest = image_digest(data)
    try:
        return decoded_images().get_or_compute(("region", digest), lambda: read_image(
            data, max_pixels=MAX_SIDE * MAX_SIDE)), digest
    except ImageError as err:
        st.error(f"Cannot use {name}: {err}")
        return None


def method_ui(loaded: LoadedModel) -> str:
    """Sidebar: the methods that are the model's own function (:func:`exact_methods`), its default first chosen.

    For a model with attention that is "crops" alone: the shared trunk is at chance there, so it is not one click
    away; the sidebar says why it is missing, with the measured numbers.
    """
    methods = exact_methods(loaded.model)
    if methods == ("crops",):
        reason = inexact_method(loaded.model, "tiles", loaded.name)
        st.sidebar.caption("Method: exact, each cell in its own 96 x 96 context (no fast method for this model)."
                           + (f" {reason}" if reason else ""))
        return "crops"
    return st.sidebar.radio("Method", methods, index=methods.index(default_method(loaded.model)),
                            format_func=METHOD_LABELS.get,
                            key=f"region_method-{loaded.name}")  # each model starts on its own default


def reading_ui(loaded: LoadedModel) -> str:
    """Sidebar: which reading of the attention the right-hand panel shows; the paper's (alpha_s) by default."""
    if not first_attentive_layer(loaded.model):
        return DEFAULT_READING  # nothing to read: the evaluation ignores it
    readings = list(READING_LABELS)
    return st.sidebar.radio("Attention shows", readings, index=readings.index(DEFAULT_READING),
                            format_func=READING_LABELS.get, key="region_reading")


def region_key(loaded: LoadedModel, region: ChosenRegion, method: str) -> tuple:
    """The cache key of a result: everything the evaluation depends on. Not the reading: one evaluation holds every
    reading of the attention (:meth:`RegionResult.in_reading`), so another reading is shown without a new one."""
    return "region", loaded.model_id, region.digest, region.element, region.microns_per_pixel, method


def evaluated_region(loaded: LoadedModel, region: ChosenRegion, method: str, key: tuple | None = None,
                     reading: str = DEFAULT_READING) -> RegionResult | None:
    """The region's result in ``reading``, from the cache or computed with a progress bar; None (with the error
    shown) on bad input."""
    key = key or region_key(loaded, region, method)
    bar = st.progress(0.0, text=f"Evaluating {region.name} cell by cell ...")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Evaluating {region.name}: {done} of {total} forward passes")

    # A mosaic's seams are contexts of four unrelated patches: only the patch centres, whose truth is known.
    cells = None if region.labels is None else region.labels >= 0
    try:
        return region_results().get_or_compute(key, lambda: evaluate_region(
            loaded.model, loaded.card, region.shown_pixels(), region.microns_per_pixel, method=method,
            progress=progress, cells=cells)).in_reading(reading)
    except RegionError as err:
        st.error(str(err))
        return None
    finally:
        bar.empty()


def _open_cell(cell: RegionCell) -> None:
    """Button callback: hand the cell to the patch view (runs before the rerun, so widget keys may change)."""
    st.session_state[REGION_CELL_KEY] = cell
    st.session_state["view"] = "Patch"
    st.session_state["image_source"] = REGION_CELL_SOURCE


def transform_ui(group: Group) -> int:
    """Sidebar: a quarter turn and, for p4m, a mirror of the whole region (grid and tiles map onto themselves)."""
    st.sidebar.header("Transform")
    quarter = st.sidebar.radio("Rotate the region by", [0, 90, 180, 270], format_func=lambda d: f"{d}°",
                               horizontal=True, key="region_rotate")
    mirror = group.order == 8 and st.sidebar.toggle("Mirror (flip the rows after rotating)", key="region_mirror")
    return quarter // 90 + 4 * mirror


def show_proof(moved: RegionResult, original: RegionResult, element: int) -> None:
    """The heatmap of the moved region against the original's heatmap moved: equal up to round-off."""
    expected = apply_element(original.positive[None], element)[0]
    same_cells = np.array_equal(np.isfinite(moved.positive), np.isfinite(expected))
    error = float(np.nanmax(np.abs(moved.positive - expected))) if same_cells else float("inf")
    text = (f"Proof of equivariance: the heatmap of the region moved by {element_name(element)} against the "
            f"original's heatmap moved the same way: max |difference| = {error:.1e} over "
            f"{int(np.isfinite(expected).sum())} cells")
    if moved.attention is not None and original.attention is not None:
        attention = float(np.nanmax(np.abs(moved.attention - apply_element(original.attention[None], element)[0])))
        text += f"; attention {attention:.1e}"
    (st.caption if error < 1e-4 else st.warning)(text + ("." if same_cells else "; the evaluated cells differ."))


def region_page(loaded: LoadedModel) -> None:
    """The whole region view."""
    region = region_input_ui(loaded)
    method = method_ui(loaded)
    reading = reading_ui(loaded)
    element = transform_ui(display_group(loaded.model))
    if region is None:
        return
    if region.note:
        st.warning(region.note, icon="⚠️")
    shown = region.moved(element)
    key = region_key(loaded, shown, method)
    if st.session_state.get("region_shown") != key:  # another region: its cells are not the last one's
        st.session_state["region_shown"] = key
        st.session_state.pop(PICK_KEY, None)
    result = evaluated_region(loaded, shown, method, key, reading)
    if result is None:
        return
    summary(result, shown)
    if element:
        original = evaluated_region(loaded, region, method, reading=reading)
        if original is not None:
            show_proof(result, original, element)
    region = shown
    selected = _selected_cell(result)
    truth = region.labels is not None and st.toggle(
        "Show the truth: dashed outlines of the patches labelled tumour", value=True, key="region_truth")
    left, right = st.columns(2)
    with left:
        st.markdown(f"**P({result.class_names[-1]})** over the tissue")
        st.plotly_chart(_figure(key, "probability", selected, truth, result, region.labels),
                        on_select="rerun", selection_mode="points", key=HEATMAP_KEY, width="content",
                        config={"displaylogo": False})
        st.caption(probability_caption(result, truth))
    with right:
        if result.attention is not None:
            st.markdown(f"**Attention** of the first attentive layer, {result.attention_layer}")
            figure = _figure(key, "attention", selected, False, result, None)
            st.plotly_chart(figure, key="region_attention", width="content", config={"displaylogo": False})
            st.caption(attention_caption(result, figure.data[1].zmin, figure.data[1].zmax))
        else:
            st.info("This model has no attention layer: only the tumour probability is shown.")
    st.caption(f"Source: {region.source}")
    cell_ui(result, region, selected)


def _figure(key: tuple, show: str, selected: tuple[int, int] | None, truth: bool, result: RegionResult,
            labels: np.ndarray | None):
    """:func:`region_figure` of a cached result (a few tenths of a second each): reruns, e.g. clicks, reuse it.
    The truth marks are drawn from ``labels`` when ``truth`` is on."""
    # ``key`` names the evaluation, which holds every reading: the attention's figure is keyed by the reading too
    # (without it, switching the reading could bring back the previous reading's map from the cache).
    reading = result.reading if show == "attention" else ""
    return _cached_figure(key, show, reading, selected, truth, result, labels)


@st.cache_data(max_entries=8, show_spinner=False)
def _cached_figure(key: tuple, show: str, reading: str, selected: tuple[int, int] | None, truth: bool,
                   _result: RegionResult, _labels: np.ndarray | None):
    return region_figure(_result, show, _labels if truth else None, selected, width_px=FIGURE_WIDTH_PX)


def probability_caption(result: RegionResult, truth: bool) -> str:
    """What the left panel draws."""
    grid = result.grid
    text = (f"Each {grid.cell} x {grid.cell} px cell's probability belongs to its centre; between centres it is "
            "interpolated, and it is drawn on tissue only (glass stays clear). Black line: p = 0.5.")
    if truth:
        text += " Dashed cyan: the 96 x 96 patches PCam labels tumour (the label is of their central 32 x 32 px)."
    return text


def attention_caption(result: RegionResult, low: float, high: float) -> str:
    """What the right panel draws, and what its colours span."""
    return (f"{READING_LABELS.get(result.reading, result.reading)}, mean over orientations. "
            f"{BRIGHT[result.reading]} Colours span the 2nd to 98th percentile of its values on tissue "
            f"({low:.3f} to {high:.3f}), values beyond drawn at the ends. Drawn on tissue: each evaluated cell's "
            "centre from its own 96 x 96 context, the pixels around it the mean of the contexts covering them.")


def _selected_cell(result: RegionResult) -> tuple[int, int] | None:
    """The cell to outline and offer: a new click on the heatmap wins over the picker's last value."""
    # The chart keeps its last selection over reruns (until its figure changes): a click counts once.
    clicked = clicked_cell(st.session_state.get(HEATMAP_KEY), result)
    if clicked is not None and clicked != st.session_state.get("region_last_click"):
        st.session_state[PICK_KEY] = clicked  # before the picker is drawn, so it shows the clicked cell
    st.session_state["region_last_click"] = clicked
    picked = st.session_state.get(PICK_KEY)
    if picked is None or not (0 <= picked[0] < result.grid.rows and 0 <= picked[1] < result.grid.cols) \
            or not result.evaluated[tuple(picked)]:
        return None
    return tuple(picked)


def summary(result: RegionResult, region: ChosenRegion) -> None:
    """One line of counts and time, and the score against the truth where it is known."""
    total = result.grid.rows * result.grid.cols
    shown = result.positive[result.evaluated]
    height, width = result.image.shape[1:]
    scale = f"{result.model_microns_per_pixel} um/px"
    if result.microns_per_pixel != result.model_microns_per_pixel:
        scale += f", resampled from {result.microns_per_pixel} um/px"
    st.caption(f"{region.name}: {height} x {width} px at {scale}. {int(result.evaluated.sum())} of {total} cells "
               f"evaluated in {result.seconds:.1f} s ({METHOD_LABELS[result.method].split(':')[0].lower()}); "
               f"{(shown > 0.5).mean():.0%} of them above p = 0.5.")
    if region.labels is not None:
        score = score_cells(result.positive, region.labels)
        st.success(f"Against the true labels of the patch centres: {score.summary()}.")


def cell_ui(result: RegionResult, region: ChosenRegion, selected: tuple[int, int] | None) -> None:
    """Pick a cell (click on the heatmap, or one of the most probable) and open it in the patch explorer."""
    cells = np.argwhere(result.evaluated)
    order = np.argsort(-result.positive[result.evaluated], kind="stable")[:20]
    options = [tuple(int(v) for v in cells[k]) for k in order]
    if selected is not None and selected not in options:
        options.insert(0, selected)
    elif selected is None:
        st.session_state.pop(PICK_KEY, None)

    def label(cell: tuple[int, int]) -> str:
        truth = "" if region.labels is None or region.labels[cell] < 0 else \
            f", truth {result.class_names[int(region.labels[cell])]}"
        return f"cell ({cell[0]}, {cell[1]}): P = {result.positive[cell]:.3f}{truth}"

    chosen = st.selectbox("Cell to open (click one on the heatmap, or pick one of the most probable)", options,
                          format_func=label, key=PICK_KEY)
    if chosen is None:
        return
    true_label = None
    if region.labels is not None and region.labels[chosen] >= 0:
        true_label = result.class_names[int(region.labels[chosen])]
    cell = RegionCell(result.context(*chosen), f"{region.name}, cell {chosen}", result.model_microns_per_pixel,
                      true_label)
    st.button("Open this cell in the patch explorer", on_click=_open_cell, args=(cell,), type="primary",
              key="region_open_cell")
