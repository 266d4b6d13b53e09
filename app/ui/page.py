"""The patch page and its kin, laid out: what ``app/main.py`` runs for every visitor (:func:`main`).

A thin page over the compute layer: the sidebar picks a model (``checkpoints/``
or ``$APP_CHECKPOINTS``, or an upload), an image (gallery or upload) and how
it is drawn; the main panel shows, for the image moved by the chosen group
element (and optionally rotated by any angle), one attention map per
orientation, the arrow fields of every transform, the live equivariance proof,
the prediction, pathology mode for H&E models, and downloads. All numbers come
from :func:`app.analysis.compute.analyse`, cached per (model, image, element, selections). The page runs
inside one error boundary (:mod:`app.ui.boundary`): a fault shows a short message, never a traceback.
"""

from __future__ import annotations

import functools

import streamlit as st

from models.cpu.allocator import retain_freed_memory

from ..analysis.angles import angle_deviation
from ..analysis.cache import image_digest
from ..analysis.checkpoints import CheckpointError, error_text, list_checkpoints
from ..analysis.compute import Analysis, display_group
from ..analysis.pathology import dataset_name, is_pathology, is_proxy, proxy_statement
from ..analysis.readings import COMPOSITE, layer_selections, page_readings
from ..analysis.releases import is_release
from ..analysis.stain_stability import first_spatial_layer, stained
from ..analysis.transforms import apply_element, rotate_by_angle
from ..analysis.variants import variants_of
from ..pictures.fig5 import fig5_png
from ..pictures.plots import image_rgb
from .caches import analysed, analyses, padding_of, turned
from .comparison import compare, comparison_pair, show_comparison
from .inputs import LoadedModel, checkpoint_folder, image_ui, load_entry, model_ui, transform_ui
from .readings import analysed_in_reading, reading_ui, show_composite
from .releases_page import show_ours_against_paper
from .slide_page import slide_page, slides_left
from .stain_view import STAIN_TAB, page_reference, show_stain_stability, stain_ui
from .variants_page import variants_page
from .views import (
    arrow_layer_ui,
    default_arrow_field,
    display_ui,
    layer_of,
    layer_ui,
    panel_marks,
    proof_range,
    selection_ui,
    show_angle_deviation,
    show_arrows,
    show_calibration,
    show_export,
    show_maps,
    show_nuclei,
    show_prediction,
    show_proof,
    show_true_label,
    value_range,
)


@st.cache_resource
def allocator_tuned() -> bool:
    """Once per process: keep freed memory for the next forward pass (a third faster on the DenseNet)."""
    return retain_freed_memory()


def model_summary(loaded: LoadedModel) -> str:
    card = loaded.card
    parts = [f"**{loaded.name}**", card["arch"], card["group"] or "planar (not equivariant)",
             dataset_name(card) or "unknown dataset", error_text(card)]
    return " · ".join(p for p in parts if p)


VARIANTS = "Variants"
OURS_VS_PAPER = "Ours against the paper's"


def view_ui(card: dict, entries: list) -> str:
    """Sidebar: the page to show. H&E models: a patch, or a whole slide or image; models with attentive siblings
    trained on the same data (Table 1's variants): one model's image, or every variant at once."""
    if is_pathology(card):
        views = ["Patch", "Slide"]
        help_text = ("Slide: a whole slide or an H&E image in a deep-zoom viewer, each cell of its tissue judged as "
                     "PCam labels a patch, with its tumour probability and attention.")
    elif len(variants_of(card, entries)) > 1:
        views, help_text = ["Image", VARIANTS], "Variants: the image through every attention variant of Table 1."
    else:
        return "Image"
    if st.session_state.get("view") not in views:
        st.session_state.pop("view", None)  # the other kind of model's choice
    return st.sidebar.radio("View", views, horizontal=True, key="view", help=help_text)


# Streamlit's default top padding pushes the maps below a 900-pixel window.
COMPACT = "<style>.block-container {padding-top: 2.2rem; padding-bottom: 1rem;}</style>"
MAPS_WIDTH_PX = 820  # the maps' column at 1440 px wide, sidebar open


def main() -> None:
    st.set_page_config(page_title="Equivariant attention explorer", layout="wide")
    st.markdown(COMPACT, unsafe_allow_html=True)
    allocator_tuned()
    loaded = model_ui(checkpoint_folder())
    if loaded is None:
        st.title("Equivariant attention explorer")
        return
    card, model = loaded.card, loaded.model
    st.markdown(f"#### Equivariant attention explorer &nbsp; <small>{model_summary(loaded)}</small>",
                unsafe_allow_html=True)
    entries = list_checkpoints(checkpoint_folder())
    view = view_ui(card, entries)
    if is_proxy(card):
        st.warning(proxy_statement(card), icon="⚠️")
    if view == "Slide":
        st.caption("A whole slide or an image at every zoom; analysed, each 32 x 32 cell of its tissue judged in its "
                   "96 x 96 context, as PCam labels a patch. Click a cell to open it in the patch explorer.")
        slide_page(loaded)
        return
    slides_left()  # a slide analysed under the Slide page is no longer looked at by this session
    if view == VARIANTS:
        st.caption("One image through every attention variant of the paper's Table 1 at once: where each kind of "
                   "attention looks, per orientation. Rotate or mirror the image in the sidebar: every row turns "
                   "with it.")
    else:
        st.caption("Each panel shows the chosen layer's attention for one orientation of its filters, in the "
                   "reading picked above the maps (what bright means is said under them). Turn or mirror the "
                   "image with the buttons above the maps: the panels turn with it and trade places at once, "
                   "exactly (the page already holds every transform; the proof tab measures it).")
    chosen = image_ui(card)
    # H&E models with PCam's reference stain in their card: the patch as scanned or normalised to it, before the
    # geometry (normalisation acts on each pixel's colour alone: it commutes with every turn and mirror). Drawn
    # while no image is chosen too, so that the choice outlives a switch to an upload not made yet.
    reference = page_reference(card) if view != VARIANTS else None
    method = stain_ui(reference)
    if chosen is None:
        display_ui()
        return
    shown = stained(chosen.pixels, method, reference)
    if shown.error:
        st.warning(f"{shown.error} The patch is shown as scanned.", icon="🎨")
    # The patch page turns and mirrors in its viewer, in the browser; the Variants page moves its rows here.
    element, degrees = transform_ui(display_group(model), planar=model.group is None, turns=view == VARIANTS)
    display = display_ui(is_pathology(card), rgb=card["input"]["channels"] == 3)
    # The user's element first, then the arbitrary rotation; analysed as a new image when the angle is not 0.
    image, first = shown.pixels, element
    if degrees:
        image, first = rotate_by_angle(apply_element(shown.pixels, element), degrees), 0
    if view == VARIANTS:
        variants_page(loaded, entries, image, first, display)
        return
    readings = page_readings(model)
    left, right = st.columns([1, 3.2])
    with right:
        pick_reading, pick_layer, pick_channel, pick_orientation = st.columns([2.8, 1.8, 1, 1])
        reading = reading_ui(readings, pick_reading)
    selections = layer_selections(readings, reading) if reading else {}
    with st.spinner(f"Analysing the image with {loaded.name}: every group transform, every layer ..."):
        current, key = analysed(loaded, image, first, selections)
        borders = padding_of(loaded.model_id, loaded)
    size = current.images.shape[-1]
    marks = panel_marks(card, size, chosen.microns_per_pixel)
    with left:  # before the maps: a view that fails below still leaves the prediction on the page
        show_summary(card, current, chosen, marks, shown.label if reference is not None else "")

    if reading == COMPOSITE:
        layer_key, layer = COMPOSITE, current.composite
        # Every attentive layer is a factor: the widest padding border is the composite's.
        border = max((b for k, b in borders.items() if k.startswith("attention/")), default=0)
        with right:
            zrange = show_composite(current, display, marks, border, MAPS_WIDTH_PX)
    else:
        with right:
            with pick_layer:
                layer_key = layer_ui(current, loaded.model_id)
            name = layer_key.split("/", 1)[1]
            layer = layer_of(current, layer_key)
            selection = selection_ui(layer, f"{loaded.model_id}-{name}", pick_channel, pick_orientation)
        if selection != layer.selection:
            selections = {**selections, name: selection}
            with st.spinner("Reducing the attention for that selection ..."):
                current, key = analysed(loaded, image, first, selections)
            layer = current.attention[name]
        border = borders.get(layer_key, 0)
        zrange = value_range(layer, display, size, border)
        with right:
            show_maps(current, layer, display, zrange, marks, border,
                      turning=functools.partial(turned, loaded, image, layer_key, layer.selection))

    pathology = is_pathology(card)
    names = ["Arrow field", "Equivariance proof", "Predictions per transform"]
    names += ["Attention on nuclei", "Calibration"] if pathology else []
    names += [STAIN_TAB] if reference is not None else []
    pair = comparison_pair(entries)
    names += (["Plain CNN vs equivariant"] if pair else []) + ([OURS_VS_PAPER] if is_release(card) else [])
    names += ["Export", "About the model"]
    # Only the open tab is computed and sent (a switch reruns the page; everything else is then already in the
    # browser, which Streamlit sends as a reference, not again).
    tabs = dict(zip(names, st.tabs(names, key="tab", on_change="rerun"), strict=True))

    field, arrow_key = None, ""
    if tabs["Arrow field"].open:
        with tabs["Arrow field"]:
            picked = arrow_layer_ui(current, loaded.model_id, composite=reading == COMPOSITE)
            if picked is None:
                st.info("No layer of this model has an orientation axis (a planar CNN): no arrows to draw.")
            else:
                arrow_key, mode = picked
                arrow_border = border if arrow_key == COMPOSITE else borders.get(arrow_key, 0)
                field = show_arrows(current, layer_of(current, arrow_key), mode, arrow_border)
    if tabs["Equivariance proof"].open:
        with tabs["Equivariance proof"]:
            show_proof(current, layer, display, proof_range(layer, display, size, border), loaded.model_id)
            if degrees:
                original, _ = analysed(loaded, chosen.pixels, element, selections)
                show_angle_deviation(angle_deviation(original, current, degrees))
    if tabs["Predictions per transform"].open:
        with tabs["Predictions per transform"]:
            show_prediction(current)
    if pathology and tabs["Attention on nuclei"].open:
        with tabs["Attention on nuclei"]:
            # In the page's reading (the composite's layers carry alpha_s): the card has the test-set summary of
            # each, so the same forward pass serves the maps and this tab.
            show_nuclei(card, current)
    if pathology and tabs["Calibration"].open:
        with tabs["Calibration"]:
            show_calibration(card, current)
    if reference is not None and tabs[STAIN_TAB].open:
        with tabs[STAIN_TAB]:
            # The group's row measures alpha_s: the page's image in the spatial reading (the default, cached).
            spatial = analysed_in_reading(loaded, image, first, "spatial")
            layer_border = borders.get(f"attention/{first_spatial_layer(model)}", 0)
            show_stain_stability(loaded, chosen.pixels, shown.method, spatial, layer_border, display, marks,
                                 element, degrees)
    if pair and tabs["Plain CNN vs equivariant"].open:
        with tabs["Plain CNN vs equivariant"]:
            show_plain_versus_equivariant(pair, current, display)
    if is_release(card) and tabs[OURS_VS_PAPER].open:
        with tabs[OURS_VS_PAPER]:
            show_ours_against_paper(loaded, entries, image, first, display)
    if tabs["Export"].open:
        with tabs["Export"]:
            if field is None:  # the arrow tab is closed: the export draws its default field
                arrow_key, field = default_arrow_field(current, borders)
            metadata = dict(model=loaded.name, arch=card.get("arch"), image=chosen.source, element=element,
                            degrees=degrees, fit=chosen.info.text, layer=layer_key, reading=reading,
                            stain=shown.label)
            fig5 = None
            if current.composite is not None:
                title = (chosen.source or "image")[:24]
                fig5 = functools.partial(fig5_png, model, card, [current.images[0]], [title])
            show_export(current, layer, field, arrow_key, display, zrange, metadata, border, fig5)
    if tabs["About the model"].open:
        with tabs["About the model"]:
            show_about(card)


def show_summary(card: dict, current: Analysis, chosen, marks, stain: str = "") -> None:
    """The image, the prediction and, for H&E, the true label and what the marks on the maps mean; ``stain`` says
    in which stain the model sees the patch (empty: no stain control)."""
    st.image(image_rgb(current.images[0]), width=170,
             caption="What the model sees" + (f": the patch {stain}" if stain else ""))
    probabilities = current.probabilities[0]
    top = int(probabilities.argmax())
    st.metric("Prediction", current.class_names[top], f"p = {probabilities[top]:.3f}", delta_color="off")
    if is_pathology(card):
        if len(current.class_names) == 2:
            st.write(f"P({current.class_names[1]}) = **{probabilities[1]:.3f}**")
        show_true_label(card, current, chosen.true_label)
        if marks is not None:
            scale = (f"{chosen.microns_per_pixel:.3f} µm/px" if chosen.microns_per_pixel else
                     "the model's training scale (assumed: an upload's µm/px is unknown)")
            if stain.startswith("normalised"):
                st.caption(f"Stain: {stain}. The model sees, and every map is drawn over, the normalised patch "
                           "(sidebar: Stain).")
            st.caption(f"Dashed square: the central 32 x 32 pixels, the region PCam's label refers to. "
                       f"Scale bar: {marks.bar_label} at {scale}.")
    st.caption(chosen.info.text)


COMPARE_WITH = {1: "rot 90°", 2: "rot 180°", 3: "rot 270°", 4: "mirror"}


def show_plain_versus_equivariant(pair, current: Analysis, display) -> None:
    """The image (as the page shows it) through a plain CNN and an equivariant one, under a chosen g."""
    try:
        plain, equivariant = (load_entry(entry) for entry in pair)
    except (CheckpointError, OSError) as err:
        st.error(f"Cannot load the models to compare: {err}")
        return
    spec, image = plain.card["input"], current.images[0]
    if image.shape != (spec["channels"], spec["size"], spec["size"]):
        st.info(f"The comparison runs {plain.name} and {equivariant.name}, which take {spec['size']} x "
                f"{spec['size']} {'grey' if spec['channels'] == 1 else 'colour'} images: pick one of those models "
                "(or a model with the same input) to compare on the image shown here.")
        return
    element = st.radio("Transform g", list(COMPARE_WITH), format_func=COMPARE_WITH.get, horizontal=True,
                       key="compare_element")
    key = (plain.model_id, equivariant.model_id, image_digest(image), element)
    result = analyses().get_or_compute(key, lambda: compare(plain.model, plain.card, equivariant.model,
                                                            equivariant.card, image, element))
    show_comparison(plain, equivariant, image, element, colorscale=display.colorscale, result=result)


def show_about(card: dict) -> None:
    """The model's dataset, where it came from and how far to trust it."""
    dataset = card["dataset"]
    st.write(f"Dataset: {dataset.get('source', dataset['name'])}")
    if dataset.get("notes"):
        st.write(dataset["notes"] + ".")
    if card.get("source"):
        st.write(f"Source: {card['source']}.")
    for note in card.get("notes", []):
        st.caption(note)
    if is_pathology(card):
        st.write("A research model, not a diagnostic device.")
    training = card.get("training") or {}
    if training.get("command"):
        st.code(training["command"], language="bash")

