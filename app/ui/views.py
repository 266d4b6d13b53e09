"""Streamlit views of one analysis: maps, arrow fields, the proof, the prediction, pathology mode, export.

Each ``*_ui()`` draws widgets and returns their values; each ``show_*()`` draws
figures built by :mod:`app.pictures.plots` and :mod:`app.pictures.figures` from an
:class:`~app.analysis.compute.Analysis`. Nothing here computes beyond those calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from models import get_group

from ..analysis.angles import AngleDeviation
from ..analysis.compute import Analysis, LayerMaps
from ..analysis.nuclei import NucleiAttention, attention_on_nuclei
from ..analysis.padding import border_left_out
from ..analysis.pathology import (
    calibration_at,
    centre_region,
    is_pathology,
    model_microns_per_pixel,
    nuclei_masks,
    scale_bar_microns,
)
from ..analysis.readings import BRIGHT, COLOUR_TITLES, COMPOSITE, DEFAULT_WHY
from ..analysis.reductions import MapSelection
from ..analysis.turning import TurnSequence, turn_degrees
from ..pictures.arrow_svg import arrow_panels_svg
from ..pictures.arrows import ARROW_MODES, ArrowField, arrow_field
from ..pictures.export import export_npz
from ..pictures.figures import ORIENTATION_COLOURS, render_arrow_field_png, render_map_row_png
from ..pictures.map_style import DIVERGING, MPL_COLOUR_MAPS, RANGE_MODES, as_displayed, colour_range, display_maps
from ..pictures.plots import (
    COLOUR_MAPS,
    PanelMarks,
    nuclei_figure,
    probability_figure,
    proof_figure,
    reliability_figure,
)
from ..pictures.turn_frames import animation_payload, viewer_payload
from .turn_viewer import turn_viewer

__all__ = ["Display", "STYLES", "proof_range", "default_arrow_key", "display_ui", "layer_ui", "selection_ui",
           "arrow_layer_ui", "default_arrow_field", "default_arrow_mode", "maps_payload", "show_maps", "show_arrows",
           "show_proof", "show_prediction", "show_calibration",
           "show_angle_deviation", "show_export", "panel_marks", "maps_png", "arrows_png", "value_range",
           "orientation_titles", "layer_keys", "default_layer_key", "arrow_spacing", "arrows_svg", "show_nuclei",
           "show_true_label", "card_nuclei_summary", "layer_of", "colour_title", "NUCLEI_OUTLINE"]



@dataclass(frozen=True)
class Display:
    """How maps are drawn: colour map, opacity at the top of the range, colour range (``RANGE_MODES``), style,
    and whether the nuclei are outlined on them."""

    colorscale: str = "Viridis"
    opacity: float = 0.75
    range_mode: str = "robust"
    style: str = "overlay"
    outline_nuclei: bool = False

    @property
    def signed(self) -> bool:
        return self.range_mode == "deviation"

    @property
    def matplotlib_colormap(self) -> str:
        """The colour map of the PNG exports: matplotlib's name of the shown one."""
        return DIVERGING if self.signed else MPL_COLOUR_MAPS.get(self.colorscale, "viridis")

    @property
    def shown_colorscale(self) -> str:
        """Deviations get a diverging map whatever the choice: blue below the orientations' mean, red above."""
        return DIVERGING if self.signed else self.colorscale


STYLES = {"overlay": "over the image", "side": "image | map"}
FLAT_SPAN = 0.05  # attention whose robust range is narrower than this is called nearly flat


def display_ui(pathology: bool = False, rgb: bool = False) -> Display:
    """Sidebar: how the maps are drawn; H&E models start with the equalised range (their attention is crowded
    near 1 over most of the tissue, which a linear range paints in one colour). RGB models can outline the
    nuclei (haematoxylin-dense tissue) on every map."""
    st.sidebar.header("Display")
    style = st.sidebar.radio("Maps", list(STYLES), format_func=STYLES.get, horizontal=True, key="map_style",
                             help="Over the image: the more attention, the more colour; where it is low the "
                                  "image shows through. Image | map: the image, then the opaque maps.")
    modes = list(RANGE_MODES)
    # One choice per kind of model, so that switching from an H&E model to a digit model starts from its default.
    range_mode = st.sidebar.radio("Colour range", modes, format_func=RANGE_MODES.get,
                                  key=f"range_mode-{'he' if pathology else 'other'}",
                                  index=modes.index("equalised" if pathology else "robust"),
                                  help="From the layer's own values, shared by every orientation and transform. "
                                       "Deviation: each orientation minus the mean over orientations, blue "
                                       "below and red above. Equalised: each colour covers as many pixels. The "
                                       "padding border is left out of the range.")
    colorscale = st.sidebar.selectbox("Colour map", COLOUR_MAPS, key="colorscale", disabled=range_mode == "deviation")
    opacity = st.sidebar.slider("Map opacity", 0.0, 1.0, 0.75, 0.05, key="opacity", disabled=style == "side")
    outline = rgb and st.sidebar.checkbox(
        "Outline nuclei", key="outline_nuclei",
        help="A thin white line around the nuclei of the image under each map: tissue dense in haematoxylin "
             "(colour deconvolution), so attention can be read against them without hiding the map.")
    return Display(colorscale, opacity, range_mode, style, outline)


def _layer_label(key: str) -> str:
    if key == COMPOSITE:
        return "the paper's composite (∏ α_s)"
    kind, name = key.split("/", 1)
    return f"{name} ({'attention' if kind == 'attention' else 'features'})"


def layer_ui(analysis: Analysis, model_id: str) -> str:
    """Main panel: which layer to show, ``"attention/NAME"`` or ``"features/NAME"``.

    Attentive layers come first (the default is the first with orientations); models
    without attention show their group feature maps.
    """
    keys = layer_keys(analysis)
    return st.selectbox("Layer", keys, index=keys.index(default_layer_key(analysis)), format_func=_layer_label,
                        key=f"layer-{model_id}",
                        help="Attentive layers show their attention in the reading chosen beside; every "
                             "convolution also shows its response strength (features).")


def layer_keys(analysis: Analysis) -> list[str]:
    """Every layer the page can show, ``"attention/NAME"`` then ``"features/NAME"``, in forward order."""
    return [f"attention/{n}" for n in analysis.attention] + [f"features/{n}" for n in analysis.features]


def default_layer_key(analysis: Analysis) -> str:
    """The layer shown first: the first attentive one with orientations whose map of the image as given is not
    nearly flat (2nd-98th percentiles at least FLAT_SPAN apart), else the first attentive one with orientations,
    else any with them, else the first.

    A layer can learn to act almost nowhere (the shipped fa_p4m_densenet_pcam's second and third attention layers
    remove about 1e-4 of their input): its map then says little at first sight, however exactly it turns. Channel
    attention alone is flat in every layer, and stays on its first."""
    keys = layer_keys(analysis)
    oriented = [k for k in keys if layer_of(analysis, k).orientations > 1]
    attentive = [k for k in oriented if layer_of(analysis, k).kind == "attention"]

    def lively(key: str) -> bool:
        low, high = colour_range(layer_of(analysis, key).maps[0], "robust")  # the captions' "nearly flat" range
        return high - low >= FLAT_SPAN

    return next((k for k in attentive if lively(k)), (attentive or oriented or keys)[0])


def layer_of(analysis: Analysis, key: str) -> LayerMaps:
    """The maps of a key of :func:`layer_keys`, or of ``"composite"`` (:attr:`Analysis.composite`)."""
    if key == COMPOSITE:
        return analysis.composite
    kind, name = key.split("/", 1)
    return getattr(analysis, kind)[name]


def selection_ui(layer: LayerMaps, widget_key: str, left, right) -> MapSelection:
    """Pickers for full-attention layers (output channel, input orientation; in containers ``left``, ``right``).

    The mean is the default of both; the reading stays the layer's own.
    """
    if layer.kind != "attention" or not layer.layout.startswith("full"):
        return layer.selection
    channel = left.selectbox("Output channel", ["mean"] + list(range(layer.channels)), key=f"channel-{widget_key}")
    orientation = "mean"
    if layer.in_orientations:
        orientation = right.selectbox("Input orientation", ["mean"] + list(range(layer.in_orientations)),
                                      key=f"in-orientation-{widget_key}")
    return MapSelection(None if channel == "mean" else int(channel),
                        None if orientation == "mean" else int(orientation), layer.selection.reading)


def orientation_titles(analysis: Analysis, layer: LayerMaps) -> list[str]:
    """Panel titles: the orientation's group element, or one invariant map."""
    if layer.orientations == 1:
        return ["on the image (no orientation axis)"]
    group = get_group(analysis.group)
    return [f"h = {group.describe(h)}" for h in range(layer.orientations)]


def value_range(layer: LayerMaps, display: Display, size: int, border: int = 0) -> tuple[float, float]:
    """The colour range of a layer's maps as ``display`` shows them, shared by every panel and transform."""
    if display.range_mode == "equalised":
        return 0.0, 1.0  # quantiles
    return colour_range(display_maps(layer, size, display.range_mode, border, transform=0), display.range_mode,
                        border, attention=layer.kind == "attention")


def proof_range(layer: LayerMaps, display: Display, size: int, border: int = 0) -> tuple[float, float]:
    """The proof's range: it shows the maps themselves, so deviations fall back to the robust range."""
    mode = "full" if display.range_mode == "full" else "robust"
    return colour_range(layer.upsampled(size)[0], mode, border, attention=layer.kind == "attention")


def panel_marks(card: dict, size: int, microns_per_pixel: float | None) -> PanelMarks | None:
    """Pathology marks (the central 32 x 32, a scale bar) for H&E models, else None."""
    if not is_pathology(card):
        return None
    mpp = microns_per_pixel or model_microns_per_pixel(card) or 1.0
    bar = scale_bar_microns(size, mpp)
    return PanelMarks(centre_region(size), bar / mpp, f"{bar:.0f} µm")


def _padding_everywhere(border: int, size: int, consequence: str) -> str:
    """The caption's sentence for a border too wide to leave out (:func:`app.analysis.padding.border_left_out`)."""
    free = size - 2 * border
    where = (f"up to {border} px from the edge, leaving only the central {free} x {free} px free of it, too few to "
             "go by" if free > 0 else "at every position")
    return f" The zero padding shapes this layer {where}, so {consequence}."


def show_maps(analysis: Analysis, layer: LayerMaps, display: Display, zrange: tuple[float, float],
              marks: PanelMarks | None, border: int = 0, key: str = "maps",
              turning: Callable[[], Iterator[TurnSequence]] | None = None) -> None:
    """One panel per orientation of the current image's maps, over or beside the image, one colour scale, in the
    turn viewer; ``key`` tells it from others of the page. ``turning`` gives the layer's maps of the image turned
    through 360 degrees a batch of angles at a time (:func:`app.analysis.turning.turning_chunks`), for the viewer's
    "Watch it turn", which plays the first frames while the rest are computed."""
    size = analysis.images.shape[-1]
    attention = layer.kind == "attention"
    payload = maps_payload(analysis, layer, display, zrange, marks, border, key)

    def chunks(picture: str) -> Iterator[dict]:
        start = 0
        for chunk in turning():
            shown = as_displayed(chunk.maps, layer, display.range_mode, border)
            yield animation_payload(chunk, shown, zrange, picture, start)
            start += len(chunk.degrees)

    def animation(picture: str) -> tuple[int, Iterator[dict]]:
        return len(turn_degrees()), chunks(picture)

    turn_viewer(payload, key=key, animation=animation if turning is not None else None)
    # What bright means first: the one sentence a reader needs to read the colours at all.
    caption = (f"**{BRIGHT[layer.selection.reading]}** " if attention else "") + layer.description
    # The values' own percentiles: the colour range already, when that is the range shown.
    low, high = zrange if display.range_mode == "robust" else colour_range(layer.upsampled(size)[0], "robust", border)
    # Enough decimals to tell the ends of a narrow range apart.
    places = max(3, int(np.ceil(-np.log10(max(high - low, 1e-12)))) + 1)
    caption += (f" Colours: {RANGE_MODES[display.range_mode]}; the values' 2nd-98th percentiles are "
                f"{low:.{places}f} and {high:.{places}f}.")
    if layer.kind == "attention" and high - low < FLAT_SPAN:
        caption += (f" This map is nearly flat (it varies by less than {FLAT_SPAN} on attention's 0-1 scale), so "
                    + ("the colours show where it is relatively high and low, not large differences."
                       if display.range_mode == "equalised" else
                       "the equalised range shows best where it is relatively high and low."))
    if border_left_out(border, size):
        caption += (f" Outside the dotted square ({border} px from the edge) the zero padding shapes this layer; "
                    "it is left out of the colour range and the arrows.")
    elif border:
        caption += _padding_everywhere(border, size, "every position sets the colour range")
    if payload["outlines"] is not None:
        caption += NUCLEI_OUTLINE
    caption += (" A turn shows these maps moved by g (the network's own maps of g.x equal them to the proof's error)."
                if analysis.equivariant else " A turn shows the network's own maps of each turned image.")
    if attention and layer.selection.reading == "spatial":
        caption += " " + DEFAULT_WHY
    st.caption(caption)


def maps_payload(analysis: Analysis, layer: LayerMaps, display: Display, zrange: tuple[float, float],
                 marks: PanelMarks | None, border: int = 0, key: str = "maps") -> dict:
    """The turn viewer's payload (:func:`app.pictures.turn_frames.viewer_payload`) of ``layer`` as ``display``
    draws it. An equivariant network's maps of every g.x are its maps of x moved: only x's travel, and the browser
    moves them; a planar network's are its own, one set per transform."""
    size = analysis.images.shape[-1]
    if analysis.equivariant:
        maps = display_maps(layer, size, display.range_mode, border, transform=0)[None]  # (1, H, S, S)
    else:
        maps = display_maps(layer, size, display.range_mode, border)  # (T, H, S, S)
    quantity = COLOUR_TITLES[layer.selection.reading] if layer.kind == "attention" else "|features|"
    outlines = nuclei_masks(analysis.images[:1])[0] if display.outline_nuclei else None  # (S, S)
    return viewer_payload(analysis, layer, maps, orientation_titles(analysis, layer), zrange=zrange,
                          colormap=display.matplotlib_colormap, opacity=display.opacity, signed=display.signed,
                          style=display.style, colour_title=colour_title(quantity, display), marks=marks,
                          border=border, outlines=outlines, viewer=key)


NUCLEI_OUTLINE = " White outlines: the nuclei (haematoxylin-dense tissue, colour deconvolution) of the image."


def colour_title(quantity: str, display: Display) -> str:
    """The colour bar's title: the quantity, and how the range mode transformed it."""
    return {"deviation": f"{quantity} - mean", "equalised": f"{quantity}: quantile"}.get(display.range_mode, quantity)


def default_arrow_key(analysis: Analysis) -> str | None:
    """The arrow field shown first: the first convolution's features with orientations (the lifting layer's
    oriented filters on the image, selective along strokes and nuclei edges), else any layer with orientations."""
    keys = [k for k in layer_keys(analysis) if layer_of(analysis, k).orientations > 1]
    return next((k for k in keys if k.startswith("features/")), keys[0] if keys else None)


def arrow_layer_ui(analysis: Analysis, model_id: str, composite: bool = False) -> tuple[str, str] | None:
    """Which layer's orientations the arrow field draws, and what an arrow's length shows; None without any.

    Attention layers draw the page's reading; with ``composite`` the composite's orientations come first.
    """
    keys = [k for k in layer_keys(analysis) if layer_of(analysis, k).orientations > 1]
    if composite and analysis.composite is not None:
        keys.insert(0, COMPOSITE)
    if not keys:
        return None
    left, right = st.columns([2, 3])
    first = COMPOSITE if keys[0] == COMPOSITE else default_arrow_key(analysis)
    key = left.selectbox("Arrow field of", keys, index=keys.index(first), format_func=_layer_label,
                         key=f"arrow-layer-{model_id}-{'composite' if keys[0] == COMPOSITE else 'layers'}")
    mode = right.radio("Arrow length", list(ARROW_MODES),
                       index=list(ARROW_MODES).index(default_arrow_mode(layer_of(analysis, key))),
                       horizontal=True, key=f"arrow_mode-{analysis.group}",
                       help="; ".join(f"{m}: {text}" for m, text in ARROW_MODES.items()))
    return key, mode


def default_arrow_mode(layer: LayerMaps) -> str:
    """What an arrow's length shows at first: four orientations read well as four arrows per cell; eight (p4m)
    crowd it, so those start with one."""
    return "dominant" if layer.orientations > 4 else "selectivity"


def default_arrow_field(analysis: Analysis, borders: dict[str, int]) -> tuple[str, ArrowField | None]:
    """The arrow field the arrow tab opens on (its default layer and length), and its layer key: what the export
    draws while that tab is closed. ``("", None)`` for a model without orientations."""
    key = default_arrow_key(analysis)
    if key is None:
        return "", None
    layer, size = layer_of(analysis, key), analysis.images.shape[-1]
    return key, arrow_field(layer, size, spacing=arrow_spacing(size), mode=default_arrow_mode(layer),
                            border=borders.get(key, 0))


def arrows_png(field: ArrowField, analysis: Analysis, t: int, dpi: int = 75) -> bytes:
    return render_arrow_field_png(field, t, analysis.images[t], title=analysis.element_names[t], dpi=dpi)


# The arrow panels' width on the page: two rows of four 96-pixel panels about as tall as the plotly figure they
# replace (0.85 of the wide layout's main column).
ARROWS_WIDTH_PX = 980


def arrow_spacing(size: int) -> int:
    """Cell side of the page's arrow fields: 7 x 7 arrows on 28-pixel digits, 12 x 12 on 96-pixel patches."""
    return max(4, size // 12)


def arrows_svg(field: ArrowField, analysis: Analysis) -> str:
    """What the page shows of an arrow field: every transform of the image in rows of four, one SVG."""
    return arrow_panels_svg(field, analysis.images, list(analysis.element_names))


def show_arrows(analysis: Analysis, layer: LayerMaps, mode: str = "selectivity", border: int = 0) -> ArrowField:
    """The arrow field of every transform of the image, side by side, on one scale."""
    size = analysis.images.shape[-1]
    field = arrow_field(layer, size, spacing=arrow_spacing(size), mode=mode, border=border)
    st.image(arrows_svg(field, analysis), width=ARROWS_WIDTH_PX)
    legend = " ".join(
        f"<span style='color:{ORIENTATION_COLOURS[h]}'>{'▷' if h >= 4 else '▶'} {get_group(analysis.group).describe(h)}"
        "</span>" for h in range(layer.orientations))
    st.markdown(f"<small>{legend}</small>", unsafe_allow_html=True)
    shown = {"selectivity": "by how much that orientation's mean response there exceeds the weakest "
                            "orientation's (where all respond alike, as on empty background, there is no arrow)",
             "dominant": "one arrow per cell, for the strongest orientation, as long as its lead over the second",
             "response": "as long as its mean response there"}[mode]
    padding = (f" Cells within {border} px of the edge, where the zero padding shapes the layer, are left out."
               if border_left_out(border, size) else
               _padding_everywhere(border, size, "every cell is drawn and sets the scale") if border else "")
    reading = {"attention": f" The maps are {COLOUR_TITLES[layer.selection.reading]} per orientation.",
               COMPOSITE: " The maps are the composite ∏ α_s per orientation."}.get(layer.kind, "")
    st.caption(f"At each {field.spacing} px cell, arrows point where each orientation's filter points, "
               f"{shown}.{reading} One scale for every panel (full length: {field.scale:.3g}); arrows under "
               f"{100 * field.min_length:.0f} % of it are not drawn. Hollow arrows: mirrored orientations. Each "
               f"panel is a transform of the image: the field turns (and flips) with it.{padding}")
    return field


def show_proof(analysis: Analysis, layer: LayerMaps, display: Display, zrange: tuple[float, float],
               model_id: str) -> None:
    """maps(g.x) beside g.maps(x), their difference, the max error; then every layer's error."""
    names = list(analysis.element_names)
    t = st.selectbox("Transform g", list(range(1, len(names))), format_func=lambda i: names[i], key="proof_element")
    maps, expected = layer.maps[t], layer.expected[t]  # (H, X, Y): what the numbers are measured on
    left, right = st.columns(2)
    left.metric(f"max |maps(g.x) - g.maps(x)|, {layer.name}", f"{layer.max_abs_error[t]:.2e}")
    right.metric("relative to max |g.maps(x)|", f"{layer.relative_error[t]:.2e}")
    if not analysis.equivariant:
        st.warning("This is a planar CNN: it is not equivariant, and the differences show how far it is from it.")
    st.plotly_chart(proof_figure(analysis.images[t], maps, expected, orientation_titles(analysis, layer),
                                 colorscale=display.colorscale, zmin=zrange[0], zmax=zrange[1]),
                    key="proof", config={"displaylogo": False})
    st.caption("First the transformed image g.x. Top: the maps the network computed on g.x. Middle: the maps of "
               "the original x, moved by g (planes rotated with the image, orientation axis permuted). Bottom: "
               "their difference, on its own symmetric scale. An equivariant network shows float32 round-off. The "
               "maps are shown at the layer's own resolution, where the numbers above are measured.")
    rows = [dict(layer=name, kind=kind, layout=lm.layout, max_abs_error=float(lm.max_abs_error.max()),
                 max_relative_error=float(lm.relative_error.max()))
            for kind, layers in (("attention", analysis.attention), ("features", analysis.features))
            for name, lm in layers.items()]
    if analysis.composite is not None:
        c = analysis.composite
        rows.append(dict(layer="the paper's composite", kind=COMPOSITE, layout=c.layout,
                         max_abs_error=float(c.max_abs_error.max()), max_relative_error=float(c.relative_error.max())))
    st.markdown("**Every layer, worst over all group elements**")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key=f"errors-{model_id}",
                 column_config={"max_abs_error": st.column_config.NumberColumn(format="%.2e"),
                                "max_relative_error": st.column_config.NumberColumn(format="%.2e")})


def show_prediction(analysis: Analysis) -> None:
    """Class probabilities of the image and of every group transform of it."""
    table = pd.DataFrame(analysis.probabilities, columns=list(analysis.class_names),
                         index=list(analysis.element_names))
    table.index.name = "transform"
    st.plotly_chart(probability_figure(analysis.probabilities, list(analysis.class_names),
                                       list(analysis.element_names)), key="probabilities",
                    config={"displaylogo": False})
    st.dataframe(table.style.format("{:.4f}"), key="probability_table")
    st.caption(f"Largest change of any probability over the transforms: {analysis.probability_error:.2e}.")


def show_calibration(card: dict, analysis: Analysis) -> None:
    """Pathology mode: this patch's probability against the test set's reliability diagram."""
    probabilities = analysis.probabilities[0]
    confidence = float(probabilities.max())
    calibration = calibration_at(card, confidence)
    metrics = card.get("metrics") or {}
    if calibration is None:
        st.info("This model's card has no reliability data, so its probabilities cannot be read as frequencies.")
        return
    st.write(calibration.text)
    extra = [f"ECE {metrics['test_ece']:.3f}" if metrics.get("test_ece") is not None else "",
             f"AUC {metrics['test_auc']:.3f}" if metrics.get("test_auc") is not None else ""]
    if any(extra):
        st.caption("Test set: " + ", ".join(e for e in extra if e) + ".")
    st.plotly_chart(reliability_figure(metrics["test_reliability"], confidence), key="reliability",
                    config={"displaylogo": False})


def show_angle_deviation(deviation: AngleDeviation) -> None:
    """The measured deviation of a rotation by an arbitrary angle."""
    if deviation.exact:
        st.success(f"{deviation.degrees:.0f}° is a quarter turn: a group element, so equivariance is exact.")
    else:
        st.info(f"{deviation.degrees:.0f}° is not a group element: the pixels were resampled, so equivariance "
                "holds only approximately. Measured inside the inscribed disc, against the nearest quarter turn "
                f"({90 * deviation.quarter_turns}°) for the orientation axis:")
    st.metric("max change of a class probability", f"{deviation.probability_error:.3f}")
    st.dataframe(pd.DataFrame([dict(layer=k, relative_deviation=v) for k, v in deviation.layer_errors.items()]),
                 hide_index=True, key="angle_deviation",
                 column_config={"relative_deviation": st.column_config.NumberColumn(format="%.3f")})


def maps_png(analysis: Analysis, layer: LayerMaps, display: Display, zrange: tuple[float, float],
             border: int = 0) -> bytes:
    size = analysis.images.shape[-1]
    return render_map_row_png(display_maps(layer, size, display.range_mode, border, transform=0), analysis.images[0],
                              orientation_titles(analysis, layer), cmap=display.matplotlib_colormap, vmin=zrange[0],
                              vmax=zrange[1], opacity=display.opacity)


def show_export(analysis: Analysis, layer: LayerMaps, field: ArrowField | None, field_layer: str, display: Display,
                zrange: tuple[float, float], metadata: dict, border: int = 0,
                fig5: Callable[[], bytes] | None = None) -> None:
    """Download buttons; the files are made only when clicked. ``fig5`` makes the paper's Fig. 5 picture of the
    image (models with a composite only)."""
    stem = f"{metadata.get('model', 'model')}_{layer.name}".replace("/", "_").replace(" ", "_")
    left, middle, right = st.columns(3)
    left.download_button("Maps (PNG)", functools.partial(maps_png, analysis, layer, display, zrange, border),
                         file_name=f"{stem}_maps.png", mime="image/png", key="export_maps")
    if field is not None:
        middle.download_button("Arrow field (PNG)", functools.partial(arrows_png, field, analysis, 0, 150),
                               file_name=f"{stem}_arrows.png", mime="image/png", key="export_arrows")
    right.download_button("Maps, proof and arrows (NPZ)",
                          functools.partial(export_npz, analysis, None, field, field_layer, metadata),
                          file_name=f"{stem}.npz", mime="application/octet-stream", key="export_npz")
    st.caption("The NPZ holds every layer's maps(g.x), g.maps(x) and errors, the images, the probabilities and the "
               "arrow field, with names, shapes and a JSON description; read it with "
               "`np.load(f, allow_pickle=False)`.")
    if fig5 is not None:
        st.download_button("The paper's Fig. 5 of this image (PNG)", fig5, file_name=f"{stem}_fig5.png",
                           mime="image/png", key="export_fig5")
        st.caption("Fig. 5 as the paper lays it out: the image as shown, turned 90° and mirrored, each with the "
                   "composite over layers (the product of every layer's α_s, summed over orientations; log "
                   "colour scale, since its edges are orders of magnitude above its interior) and its arrow field. "
                   "Made when clicked: one more pass through the network.")


def show_true_label(card: dict, analysis: Analysis, true_label: str | None) -> None:
    """Pathology mode: a gallery patch's verified label beside the model's probability for it."""
    if true_label is None:
        return
    names = list(analysis.class_names)
    probability = analysis.probabilities[0]
    text = f"True label: **{true_label}**"
    if true_label in names:
        right = names[int(probability.argmax())] == true_label
        text += (f" · the model gives it p = {probability[names.index(true_label)]:.3f} "
                 f"({'correct' if right else 'wrong'}: its most probable class "
                 f"{'is' if right else 'is not'} the label)")
    st.write(text)
    if true_label and card["dataset"].get("test_files"):
        st.caption("Gallery PCam patches come from PCam's test split: no shipped model trained on them.")


def card_nuclei_summary(card: dict, reading: str = "kept") -> str:
    """The card's test-set summary of the first attentive layer against nuclei in ``reading``, in words; where the
    card holds only the single-reading measurement that cards had before the readings, why it shows none; empty
    where the card has no measurement."""
    measured = card.get("attention_on_nuclei") or {}
    readings = measured.get("readings")
    if measured and not isinstance(readings, dict):
        return (f"This card's test-set measurement ({measured.get('measured_on', 'of an earlier version')}) "
                "predates the readings of attention and is not shown: it measured one unnamed map, and the model "
                "is retired with the data reader it was measured with (docs/pathology.md).")
    if not isinstance(readings, dict) or reading not in readings:
        return ""
    entry = readings[reading]
    numbers, patches = entry["summary"], card["attention_on_nuclei"]["patches"]

    def interval(name: str, digits: int) -> str:
        s = numbers[name]
        return f"{s['mean']:+.{digits}f} [{s['low']:+.{digits}f}, {s['high']:+.{digits}f}]"

    rho, gap, nuclei = numbers["spearman"], numbers["tissue_minus_background"], numbers["nuclei_minus_stroma"]
    text = (f"Over the {patches} test patches, {entry['summary_of']} in the {reading} reading: ρ = "
            f"{interval('spearman', 2)} (mean, 95 % interval; sd {rho['sd']:.2f}), positive on "
            f"{100 * rho['share_positive']:.0f} % of them")
    if gap["n"]:
        text += f"; tissue minus background {interval('tissue_minus_background', 3)} ({gap['n']} patches with glass)"
    if nuclei["n"]:
        text += f"; nuclei minus the rest of the tissue {interval('nuclei_minus_stroma', 3)} ({nuclei['n']} patches)"
    return text + "."


def nuclei_panels(analysis: Analysis, result: NucleiAttention) -> go.Figure:
    """The "Attention on nuclei" tab's figure: the patch, its haematoxylin, the layer's attention, that on tissue."""
    reading = analysis.attention[result.layer].selection.reading
    return nuclei_figure(analysis.images[0], result.haematoxylin, result.attention, result.tissue,
                         ["the patch", "haematoxylin (nuclei)", f"{result.layer} attention ({reading})",
                          "attention on tissue only"])


def show_nuclei(card: dict, analysis: Analysis) -> None:
    """Pathology mode: the first attention layer against haematoxylin and background, for this patch (Fig. 5)."""
    result = attention_on_nuclei(analysis)
    if result is None:
        st.info("This model has no attentive layer (or the image is not RGB): nothing to compare with nuclei.")
        return
    reading = analysis.attention[result.layer].selection.reading
    st.plotly_chart(nuclei_panels(analysis, result), key="nuclei", config={"displaylogo": False})
    st.write(result.text)
    st.caption(f"Attention here: {analysis.attention[result.layer].description} The paper (Fig. 5): the "
               "network learns to focus on the nuclei of the cells and to remove background; its figures draw "
               "α_s, the factor of what a layer removes. Haematoxylin by colour deconvolution (Ruifrok & "
               "Johnston); tissue: largest optical density above 0.15 on average over 11 x 11 pixels (glass, lumens "
               "and fat are background); nuclei: tissue whose 3 x 3 mean haematoxylin exceeds 0.35. "
               + card_nuclei_summary(card, reading))
