"""What no plain CNN shows: one image through a planar CNN and an equivariant one, under a rotation or mirror g.

For each model one spatial map per image, stretched over the image:

* planar model: Grad-CAM (:mod:`app.analysis.gradcam`) on the last features of the network that
  still form a grid (Z2CNN: the 4 x 4 output of c6 after batch norm and ReLU, which c7
  reads), for the class it predicts on x, the same class for x and g.x;
* equivariant model: the effective attention of its first attentive layer that has
  an orientation axis, averaged over the orientations (:func:`comparable_layer`).
  The mean over orientations is one map per image, like Grad-CAM, and it moves
  with the image like the image itself: g only re-indexes the orientations, which
  a mean does not see. It comes from :func:`app.analysis.compute.analyse`, which already
  holds maps(g.x) and g.maps(x) for every element of the model's group.

The deviation of a map under g is

    deviation = ||map(g.x) - g.map(x)||_2 / ||map(x)||_2

over all pixels of the maps stretched over the image (bilinear upsampling commutes
with quarter turns and mirrors, so it adds nothing), in float64; g only moves pixels,
so ``||g.map(x)|| = ||map(x)||``. 0 means the map turned exactly with the image; an
equivariant model shows float32 round-off (about 1e-7); a map of x = 0 gives 0 when
map(g.x) is 0 too, else infinity. The Grad-CAM maps are compared unnormalised: a
plain CNN whose evidence for the class merely weakens under g counts as deviating.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

import models
from models import Network

from ..analysis.checkpoints import CheckpointEntry
from ..analysis.compute import Analysis, LayerMaps, analyse
from ..analysis.gradcam import image_grad_cam
from ..analysis.transforms import apply_element, element_name
from ..pictures.plots import map_panels

if TYPE_CHECKING:
    from .inputs import LoadedModel

__all__ = ["ComparedMaps", "Comparison", "compare", "comparable_layer", "relative_deviation", "comparison_pair",
           "format_deviation", "show_comparison"]


@dataclass(frozen=True)
class ComparedMaps:
    """One model's map of x, of g.x, and of x moved by g, each ``(S, S)`` over the image.

    Attributes:
        method: ``"Grad-CAM"`` or ``"attention"`` (``"features"`` for an equivariant model without attention).
        layer: the layer the maps come from.
        description: what the maps are, one sentence.
        original: map(x).
        of_moved: map(g.x).
        moved: g.map(x).
        deviation: ``||of_moved - moved|| / ||original||`` (see the module docstring).
        guaranteed: whether g is in the model's group, so that the deviation must be round-off.
        prediction, moved_prediction: the class the model predicts for x and for g.x.
    """

    method: str
    layer: str
    description: str
    original: np.ndarray
    of_moved: np.ndarray
    moved: np.ndarray
    deviation: float
    guaranteed: bool
    prediction: str
    moved_prediction: str


@dataclass(frozen=True)
class Comparison:
    """A planar and an equivariant model on one image x and its transform g.x.

    Attributes:
        element: g (0..7, p4m numbering: quarter turns, then the mirrored ones).
        element_name: e.g. ``"rot 90°"``.
        image, moved_image: ``(C, S, S)`` x and g.x in [0, 1].
        plain, equivariant: each model's maps and deviation.
    """

    element: int
    element_name: str
    image: np.ndarray
    moved_image: np.ndarray
    plain: ComparedMaps
    equivariant: ComparedMaps

    @property
    def plain_deviation(self) -> float:
        return self.plain.deviation

    @property
    def equivariant_deviation(self) -> float:
        return self.equivariant.deviation


def relative_deviation(of_moved: np.ndarray, moved: np.ndarray, original: np.ndarray) -> float:
    """``||of_moved - moved||_2 / ||original||_2`` in float64; 0 / 0 is 0 and x / 0 infinity (see module docstring)."""
    error = float(np.linalg.norm((np.asarray(of_moved, np.float64) - np.asarray(moved, np.float64)).ravel()))
    scale = float(np.linalg.norm(np.asarray(original, np.float64).ravel()))
    if scale == 0:
        return 0.0 if error == 0 else float("inf")
    return error / scale


def comparable_layer(analysis: Analysis, name: str | None = None) -> LayerMaps:
    """The equivariant model's layer set beside Grad-CAM.

    The first attentive layer with an orientation axis (what the app's layer picker opens
    on); without one the first attentive layer; without attention the first convolution
    with an orientation axis (response strength). ``name`` picks a layer instead.

    Raises:
        ValueError: ``name`` is not a layer of the analysis.
    """
    if name is not None:
        if name not in analysis.attention and name not in analysis.features:
            raise ValueError(f"unknown layer {name!r}; choose from {', '.join(analysis.features)}")
        return analysis.layer(name)
    attentive = list(analysis.attention.values())
    oriented = [layer for layer in attentive if layer.orientations > 1]
    if oriented or attentive:
        return (oriented or attentive)[0]
    return next((layer for layer in analysis.features.values() if layer.orientations > 1),
                next(iter(analysis.features.values())))


def compare(
    plain: Network, plain_card: dict, equivariant: Network, equivariant_card: dict, image: np.ndarray, element: int,
    *, target: int | None = None, plain_layer: str | None = None, equivariant_layer: str | None = None,
) -> Comparison:
    """Everything the comparison view draws, without Streamlit.

    Args:
        plain: a planar network in eval mode; its card.
        equivariant: a group network in eval mode; its card. Both cards must take the image.
        image: float ``(C, S, S)`` in [0, 1] in the user's frame, fitted to the models (x).
        element: g, 0..7 in p4m numbering; elements outside the equivariant model's group
            (mirrors for p4 models) are allowed, with ``guaranteed`` False.
        target: the class Grad-CAM explains, for x and g.x alike; None: the planar model's
            prediction on x.
        plain_layer: the convolution whose input Grad-CAM explains; None: the last one that reads
            more than 1 x 1 positions (:func:`app.analysis.gradcam.default_layer`).
        equivariant_layer: the attention layer; None: :func:`comparable_layer`.

    Returns:
        A :class:`Comparison`.

    Raises:
        ValueError: a planar model that is not planar, an equivariant one that is, models in
            training mode, an image either card does not take, an element outside 0..7 or an
            unknown layer.
    """
    if equivariant.group is None:
        raise ValueError("the equivariant model of the comparison is planar; choose a group network")
    if not 0 <= element < 8:
        raise ValueError(f"g must be a p4m element 0..7, got {element}")
    image = np.asarray(image, dtype=np.float32)
    moved_image = apply_element(image, element)
    return Comparison(
        element=element,
        element_name=element_name(element),
        image=image,
        moved_image=moved_image,
        plain=_plain_maps(plain, plain_card, image, moved_image, element, target, plain_layer),
        equivariant=_equivariant_maps(equivariant, equivariant_card, image, element, equivariant_layer),
    )


def _class_name(card: dict, index: int) -> str:
    names = card.get("class_names") or []
    return str(names[index]) if 0 <= index < len(names) else str(index)


def _plain_maps(model: Network, card: dict, image: np.ndarray, moved_image: np.ndarray, element: int,
                target: int | None, layer: str | None) -> ComparedMaps:
    first = image_grad_cam(model, card, image, layer, target)
    explained = int(first.classes[0])
    second = image_grad_cam(model, card, moved_image, first.layer, explained)
    original, of_moved = first.maps[0], second.maps[0]  # (S, S) each
    moved = apply_element(np.ascontiguousarray(original), element)  # g.map(x)
    name = _class_name(card, explained)
    rows, cols = first.coarse.shape[-2:]
    return ComparedMaps(
        method="Grad-CAM",
        layer=first.layer,
        description=f"Grad-CAM of class {name} on the {rows} x {cols} features that {first.layer} reads: where the "
                    "gradient of the class score says the evidence lies.",
        original=original,
        of_moved=of_moved,
        moved=moved,
        deviation=relative_deviation(of_moved, moved, original),
        guaranteed=False,
        prediction=_class_name(card, int(first.probabilities[0].argmax())),
        moved_prediction=_class_name(card, int(second.probabilities[0].argmax())),
    )


def _equivariant_maps(model: Network, card: dict, image: np.ndarray, element: int,
                      layer: str | None) -> ComparedMaps:
    analysis = analyse(model, card, image)
    chosen = comparable_layer(analysis, layer)
    size = analysis.images.shape[-1]
    maps = chosen.upsampled(size, "maps").mean(axis=1)  # (T, S, S): mean over orientations of maps(g_t.x)
    original = maps[0]
    guaranteed = element in analysis.elements
    if guaranteed:
        # analyse already holds maps(g.x) and g.maps(x) (the live proof); the mean over orientations of g.maps(x)
        # is g acting on the plane of the mean, because g only re-indexes the orientations.
        t = analysis.elements.index(element)
        of_moved, moved = maps[t], chosen.upsampled(size, "expected")[t].mean(axis=0)
        moved_probabilities = analysis.probabilities[t]
    else:
        # Not an element of the model's group (a mirror for a p4 model): its own forward pass, no promise.
        other = analyse(model, card, image, element)
        of_moved = comparable_layer(other, chosen.name).upsampled(size, "maps")[0].mean(axis=0)
        moved = apply_element(np.ascontiguousarray(original), element)
        moved_probabilities = other.probabilities[0]
    over = f"mean over its {chosen.orientations} orientations" if chosen.orientations > 1 else "no orientation axis"
    what = "Effective attention" if chosen.kind == "attention" else "Response strength"
    return ComparedMaps(
        method="attention" if chosen.kind == "attention" else "features",
        layer=chosen.name,
        description=f"{what} of {chosen.name} ({over}): where the network looks, one map per image.",
        original=original,
        of_moved=of_moved,
        moved=moved,
        deviation=relative_deviation(of_moved, moved, original),
        guaranteed=guaranteed,
        prediction=analysis.class_names[int(analysis.probabilities[0].argmax())],
        moved_prediction=analysis.class_names[int(moved_probabilities.argmax())],
    )


def _attentive(arch: str) -> bool:
    try:
        return getattr(models.model_info(arch).config, "attention", "none") != "none"
    except ValueError:  # an architecture outside the registry
        return False


def comparison_pair(entries: list[CheckpointEntry]) -> tuple[CheckpointEntry, CheckpointEntry] | None:
    """A planar and an equivariant checkpoint trained on the same dataset, taking the same images, or None.

    Among the readable entries of :func:`app.analysis.checkpoints.list_checkpoints`: the first planar
    one (by name) that has an equivariant partner; among its partners attentive ones first,
    then by name. For the shipped checkpoints: z2cnn_rot_mnist and a_p4cnn_rot_mnist.
    """
    usable = [e for e in entries if not e.error and e.card and e.dataset]

    def takes(entry: CheckpointEntry) -> tuple:
        spec = entry.card.get("input") or {}
        return entry.dataset, spec.get("size"), spec.get("channels")

    for plain in (e for e in usable if e.group is None):
        partners = [e for e in usable if e.group is not None and takes(e) == takes(plain)]
        if partners:
            return plain, min(partners, key=lambda e: (not _attentive(e.arch), e.name))
    return None


def format_deviation(value: float) -> str:
    """``0.412`` for visible deviations, ``1.9e-07`` for round-off."""
    if not np.isfinite(value):
        return "∞"
    return f"{value:.3f}" if value == 0 or value >= 1e-3 else f"{value:.1e}"


def show_comparison(plain: LoadedModel, equivariant: LoadedModel, image: np.ndarray, element: int, *,
                    colorscale: str = "Viridis", opacity: float = 0.6, result: Comparison | None = None) -> Comparison:
    """Streamlit: both models' maps of x, of g.x and of x moved by g over the images, and their deviations.

    Args:
        plain: a loaded planar model (e.g. z2cnn_rot_mnist).
        equivariant: a loaded group model on the same dataset (e.g. a_p4cnn_rot_mnist).
        image: float ``(C, S, S)`` in [0, 1], fitted to both models.
        element: g, 0..7 (p4m numbering).
        colorscale, opacity: of the maps.
        result: ``compare(...)`` of these models, image and element, when the caller has it (cached).

    Returns:
        The :class:`Comparison` drawn.
    """
    if result is None:
        result = compare(plain.model, plain.card, equivariant.model, equivariant.card, image, element)
    g = result.element_name
    if element == 0:
        st.info("g is the identity: every map trivially agrees with itself. Rotate or mirror the image to compare.")
    st.caption(f"Each row: the model's map of the image x, of the transformed image g.x (g = {g}), and the map of x "
               "moved by g. A map that follows the image makes the last two panels identical.")
    rows = (
        (plain, result.plain, "comparison_plain",
         f"The plain CNN {plain.name} has no notion of rotation: its saliency on the transformed image is not "
         "its saliency moved with the image."),
        (equivariant, result.equivariant, "comparison_equivariant",
         f"The equivariant {equivariant.name} computes the same features in every orientation: its map of g.x is "
         "its map of x moved by g, up to float32 round-off." if result.equivariant.guaranteed else
         f"{g} is not in {equivariant.model.group.name}, the group of {equivariant.name}: it promises nothing for "
         "this transform."),
    )
    for loaded, maps, key, sentence in rows:
        st.markdown(f"**{loaded.name}**: {maps.method} ({maps.layer}); predicts {maps.prediction} for x, "
                    f"{maps.moved_prediction} for g.x")
        figure_column, number_column = st.columns([4, 1])
        with figure_column:
            st.plotly_chart(_maps_figure(result, maps, colorscale, opacity), key=key,
                            config={"displaylogo": False})
        with number_column:
            st.metric(f"Deviation, {loaded.name}", format_deviation(maps.deviation),
                      help="||map(g.x) - g.map(x)|| / ||map(x)||: 0 when the map turns exactly with the image.")
        st.caption(f"{maps.description} {sentence}")
    st.caption("Deviation = ||map(g.x) − g.map(x)|| / ||map(x)||, root sum of squares over every pixel of the maps "
               "stretched over the image: 0 means the map moved exactly with the image, 1 means an error as large "
               "as the map itself. Grad-CAM: Selvaraju et al. 2017, on the last features that still form a "
               "spatial grid, for the class the plain CNN predicts on x (the same class for g.x).")
    return result


def _maps_figure(result: Comparison, maps: ComparedMaps, colorscale: str, opacity: float):
    """Three panels on one colour scale: map(x) over x, map(g.x) and g.map(x) over g.x."""
    panels = np.stack([maps.original, maps.of_moved, maps.moved])  # (3, S, S)
    images = np.stack([result.image, result.moved_image, result.moved_image])  # (3, C, S, S)
    low = 0.0 if maps.method == "Grad-CAM" else float(panels.min())
    high = float(panels.max())
    titles = ["map(x), on x", f"map(g.x), on g.x (g = {result.element_name})", "g.map(x): map of x moved by g"]
    return map_panels(images, panels, titles, colorscale=colorscale, opacity=opacity, zmin=low,
                      zmax=high if high > low else low + 1e-6, colour_title=maps.method, columns=3)
