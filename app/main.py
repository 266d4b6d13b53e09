"""The attention-map explorer: ``streamlit run app/main.py`` (or ``make run``).

A thin page over the compute layer: the sidebar picks a model (``checkpoints/``
or ``$APP_CHECKPOINTS``, or an upload), an image (gallery or upload) and how
it is drawn; the main panel shows, for the image moved by the chosen group
element (and optionally rotated by any angle), one attention map per
orientation, the arrow fields of every transform, the live equivariance proof,
the prediction, pathology mode for H&E models, and downloads. All numbers come
from :func:`app.compute.analyse`, cached per (model, image, element, selections).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # `streamlit run app/main.py` puts app/ on sys.path, not the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402

from app.allocator import retain_freed_memory  # noqa: E402
from app.angles import angle_deviation  # noqa: E402
from app.cache import LRUCache, analysis_key  # noqa: E402
from app.compute import Analysis, analyse, display_group  # noqa: E402
from app.pathology import dataset_name, is_pathology, is_proxy, proxy_statement  # noqa: E402
from app.plots import image_rgb  # noqa: E402
from app.reductions import MEANS  # noqa: E402
from app.transforms import apply_element, rotate_by_angle  # noqa: E402
from app.ui_inputs import LoadedModel, checkpoint_folder, image_ui, model_ui, transform_ui  # noqa: E402
from app.ui_views import (  # noqa: E402
    arrow_layer_ui,
    display_ui,
    layer_ui,
    panel_marks,
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


@st.cache_resource
def analyses() -> LRUCache:
    """Analyses by (model id, image digest, element, selections): one process-wide LRU."""
    return LRUCache(maxsize=8)


def analysed(loaded: LoadedModel, image, element: int, selections: dict) -> tuple[Analysis, tuple]:
    key = analysis_key(loaded.model_id, image, element, selections)
    return analyses().get_or_compute(key, lambda: analyse(loaded.model, loaded.card, image, element, selections)), key


def model_summary(loaded: LoadedModel) -> str:
    card = loaded.card
    metrics = card.get("metrics") or {}
    error = metrics.get("test_error", metrics.get("test_error_logged_by_paper_code"))
    parts = [f"**{loaded.name}**", card.get("arch", ""), card.get("group") or "planar (not equivariant)",
             dataset_name(card) or "unknown dataset",
             f"test error {100 * error:.2f} %" if error is not None else "no test error on its card"]
    return " · ".join(p for p in parts if p)


def main() -> None:
    st.set_page_config(page_title="Equivariant attention explorer", layout="wide")
    st.title("Equivariant attention explorer")
    allocator_tuned()
    loaded = model_ui(checkpoint_folder())
    if loaded is None:
        return
    card, model = loaded.card, loaded.model
    st.markdown(model_summary(loaded))
    if is_proxy(card):
        st.warning(proxy_statement(card), icon="⚠️")
    elif is_pathology(card) and (card.get("dataset") or {}).get("notes"):
        st.caption(f"{card['dataset']['notes']}. Data: {card['dataset'].get('source', 'not stated')}. "
                   "A research model, not a diagnostic device.")
    chosen = image_ui(card)
    if chosen is None:
        display_ui()
        return
    element, degrees = transform_ui(display_group(model), planar=model.group is None)
    colorscale, opacity, data_range = display_ui()
    # The user's element first, then the arbitrary rotation; analysed as a new image when the angle is not 0.
    image, first = chosen.pixels, element
    if degrees:
        image, first = rotate_by_angle(apply_element(chosen.pixels, element), degrees), 0
    current, key = analysed(loaded, image, first, {})
    pick_layer, pick_channel, pick_orientation = st.columns([2, 1, 1])
    with pick_layer:
        layer_key = layer_ui(current, loaded.model_id)
    kind, name = layer_key.split("/", 1)
    layer = getattr(current, kind)[name]
    selection = selection_ui(layer, f"{loaded.model_id}-{name}", pick_channel, pick_orientation)
    if selection != MEANS:
        current, key = analysed(loaded, image, first, {name: selection})
        layer = current.attention[name]
    size = current.images.shape[-1]
    zrange = value_range(layer, data_range)
    marks = panel_marks(card, size, chosen.microns_per_pixel)

    left, right = st.columns([1, 2])
    with left:
        st.image(image_rgb(current.images[0]), width=160, caption="The image as the model sees it (before "
                 "normalisation)")
        st.caption(chosen.info.text)
    with right:
        probabilities = current.probabilities[0]
        top = int(probabilities.argmax())
        st.metric("Prediction", current.class_names[top], f"p = {probabilities[top]:.3f}", delta_color="off")
        if is_pathology(card):
            if len(current.class_names) == 2:
                st.write(f"P({current.class_names[1]}) = **{probabilities[1]:.3f}**")
            show_true_label(card, current, chosen.true_label)
            show_calibration(card, current)
            if marks is not None:
                scale = (f"{chosen.microns_per_pixel:.3f} µm/px" if chosen.microns_per_pixel else
                         "the model's training scale (assumed: an upload's µm/px is unknown)")
                st.caption(f"Dashed square: the central 32 x 32 pixels, the region PCam's label refers to. "
                           f"Scale bar: {marks.bar_label} at {scale}.")

    st.subheader(f"{name}: one map per orientation")
    show_maps(current, layer, colorscale, opacity, zrange, marks)

    if is_pathology(card):
        st.subheader("Attention on nuclei")
        show_nuclei(card, current)

    st.subheader("Arrow field")
    arrow_key = arrow_layer_ui(current, layer_key, loaded.model_id)
    field = None
    if arrow_key is None:
        st.info("No layer of this model has an orientation axis (a planar CNN): no arrows to draw.")
    else:
        arrow_kind, arrow_name = arrow_key.split("/", 1)
        field = show_arrows(current, getattr(current, arrow_kind)[arrow_name])

    st.subheader("Live equivariance proof")
    show_proof(current, layer, colorscale, opacity, zrange, loaded.model_id)
    if degrees:
        original, _ = analysed(loaded, chosen.pixels, element, {name: selection} if selection != MEANS else {})
        show_angle_deviation(angle_deviation(original, current, degrees))

    st.subheader("Prediction for every group transform")
    show_prediction(current)

    st.subheader("Export")
    metadata = dict(model=loaded.name, arch=card.get("arch"), image=chosen.source, element=element,
                    degrees=degrees, fit=chosen.info.text, layer=layer_key)
    show_export(current, layer, field, arrow_key or "", colorscale, opacity, zrange, metadata)


main()
