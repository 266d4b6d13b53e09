"""Stain on the patch page: the patch as scanned or normalised to PCam's stain, and how far the model's answer and
its attention move when the stain moves, beside how far they move under the group (the equivariance proof).

An exactly equivariant model is exactly stable to a quarter turn or a mirror; nothing makes it stable to another
lab's pink and purple. :func:`stain_stability` measures it on one patch: the patch under
:data:`PERTURBATIONS` (Tellez et al. 2019's HED jitter at their two sizes, seeded so that a rerun repeats), each
as scanned and normalised, through the model in two batches of eight (the page's own batch size, so that the
unperturbed patch's numbers are bit for bit the page's), giving per perturbation P(tumour) and the first attentive
layer's alpha_s map, its mean absolute change from the unperturbed patch's map and their Pearson correlation.

Normalisation (:mod:`models.stain_normalise`) acts on each pixel's colour alone given the two stain estimates, so
it commutes with every element of p4m; it is applied to the patch as scanned, before the page's arbitrary angle.
Numpy in, numpy out; no Streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models import Network
from models.attention.parts import AttentiveLayer
from models.card import stain_reference as card_stain_reference
from models.stain_normalise import HED_LIGHT, HED_STRONG, METHODS, StainError, StainEstimate, hed_jitter, normalise

from .compute import Analysis
from .frames import InputFrame
from .padding import border_left_out
from .pathology import is_pathology
from .reductions import MapSelection, reduce_attention, upsample
from .transforms import apply_element, rotate_by_angle

__all__ = ["STAIN_LABELS", "Perturbation", "PERTURBATIONS", "SEED", "StainedImage", "StainStability",
           "GroupSpread", "stain_reference", "stained", "tumour_index", "stain_stability", "group_spread",
           "pearson", "first_spatial_layer", "patch_rgb", "patch_image"]

# What the page calls each of the library's METHODS (tests hold the keys equal to them).
STAIN_LABELS = {"none": "as scanned", "macenko": "normalised to PCam (Macenko)",
                "reinhard": "normalised to PCam (Reinhard)"}


@dataclass(frozen=True)
class Perturbation:
    """One stain perturbation: HED jitter ``c' = c (1 + a) + b`` per stain, ``a`` in (-sigma, sigma), ``b`` in
    (-bias, bias), drawn from a generator seeded with ``(SEED, index)``; sigma = bias = 0 is the patch itself."""

    index: int
    name: str
    sigma: float
    bias: float

    @property
    def identity(self) -> bool:
        return self.sigma == 0 and self.bias == 0

    def apply(self, rgb: np.ndarray) -> np.ndarray:
        """uint8 ``(S, S, 3)`` -> the perturbed uint8 pixels (``rgb`` itself for the identity)."""
        if self.identity:
            return rgb
        return hed_jitter(rgb, self.sigma, self.bias, np.random.default_rng([SEED, self.index]))


SEED = 67  # the number: every draw of every perturbation comes from (SEED, its index)
# Eight in all, the page's batch: the patch itself, four of Tellez's HED-light and three of HED-strong.
PERTURBATIONS = (
    Perturbation(0, "the patch", 0.0, 0.0),
    *(Perturbation(i, f"HED-light {i}", *HED_LIGHT) for i in range(1, 5)),
    *(Perturbation(i, f"HED-strong {i - 4}", *HED_STRONG) for i in range(5, 8)),
)


def stain_reference(card: dict) -> StainEstimate | None:
    """The stain the page normalises to: the card's own ``stain_reference`` (PCam's, written by
    ``python -m tools.pcam_stain``; :func:`models.card.stain_reference`) for an H&E model, else None.

    Raises:
        StainError: a card whose ``stain_reference`` is malformed.
    """
    return card_stain_reference(card) if is_pathology(card) else None


def patch_rgb(image: np.ndarray) -> np.ndarray:
    """``(3, S, S)`` in [0, 1] -> uint8 ``(S, S, 3)``, rounded (a gallery patch's values are already k / 255)."""
    return np.clip(np.rint(255.0 * np.moveaxis(image, 0, -1)), 0, 255).astype(np.uint8)


def patch_image(rgb: np.ndarray) -> np.ndarray:
    """uint8 ``(S, S, 3)`` -> float32 ``(3, S, S)`` in [0, 1]."""
    return np.ascontiguousarray(np.moveaxis(rgb, -1, 0), dtype=np.float32) / np.float32(255.0)


@dataclass(frozen=True)
class StainedImage:
    """What the model sees: ``pixels`` ``(3, S, S)`` in [0, 1] in ``method``'s stain, or the patch as scanned with
    ``error``, the sentence saying why it could not be normalised."""

    pixels: np.ndarray
    method: str
    error: str | None = None

    @property
    def label(self) -> str:
        return STAIN_LABELS["none" if self.error else self.method]


def stained(image: np.ndarray, method: str, reference: StainEstimate | None) -> StainedImage:
    """``image`` ``(3, S, S)`` in [0, 1] normalised by ``method`` (one of :data:`models.stain_normalise.METHODS`) to
    ``reference``, from its own stain estimate. ``"none"`` (or no reference) returns ``image`` itself; a patch whose
    stain cannot be estimated (too little tissue, grey, blank) comes back as scanned with StainError's sentence."""
    if method == "none" or reference is None:
        return StainedImage(image, "none")
    try:
        return StainedImage(patch_image(normalise(patch_rgb(image), method, reference)), method)
    except StainError as error:
        return StainedImage(image, method, str(error))


def tumour_index(class_names) -> int:
    """The class whose probability is P(tumour): the one named tumour (``"tumor"``, ``"tumour"``), else the last."""
    names = [str(n).lower() for n in class_names]
    return next((i for i, n in enumerate(names) if n in ("tumor", "tumour")), len(names) - 1)


def first_spatial_layer(model: Network) -> str | None:
    """The first attentive layer with spatial attention (alpha_s), in forward order; None where there is none."""
    return next((name for name, module in model.named_modules()
                 if isinstance(module, AttentiveLayer) and module.spatial_attention is not None), None)


def pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson's correlation of two maps over all their values (float64); exactly 1 for a map with itself, None
    where either is constant (no correlation is defined)."""
    da, db = (np.asarray(v, dtype=np.float64).ravel() for v in (a, b))
    da, db = da - da.mean(), db - db.mean()
    saa, sbb = float(da @ da), float(db @ db)
    if saa == 0 or sbb == 0:
        return None
    # sqrt(saa * sbb) rather than sqrt(saa) * sqrt(sbb): for a == b it is saa exactly (a correctly rounded square
    # root of a correctly rounded square), so a map's correlation with itself is exactly 1.
    return float(np.clip(float(da @ db) / np.sqrt(saa * sbb), -1.0, 1.0))


def _inside(maps: np.ndarray, border: int) -> np.ndarray:
    """``(..., S, S)`` without the padding border the page leaves out (:func:`app.analysis.padding.border_left_out`)."""
    size = maps.shape[-1]
    band = border_left_out(border, size)
    return maps[..., band:size - band, band:size - band] if band else maps


@dataclass(frozen=True)
class StainStability:
    """One patch under :data:`PERTURBATIONS`, as scanned (``"none"``) and normalised (``methods[1]``).

    Attributes:
        perturbations: the N perturbations, the patch itself first.
        methods: ``("none", normalisation)``.
        layer: the first attentive layer with alpha_s (None: the model has none; no maps then).
        images: method -> ``(N, 3, S, S)`` in [0, 1], what the model saw (after the page's angle, if any).
        probability: method -> ``(N,)`` P(tumour).
        maps: method -> ``(N, H, S, S)`` the layer's alpha_s, mean over channels, per orientation, at the image's
            size (as the page draws it); None without a layer.
        change: method -> ``(N,)`` mean |maps_i - maps_0| inside the padding border (0 for the patch itself).
        correlation: method -> ``(N,)`` Pearson's r of maps_i with maps_0 inside the border (1 for the patch
            itself; NaN where a map is constant).
        border: the padding border left out of both, in pixels (0: none left out).
        error: StainError's sentence where the normalised column could not be made (then only ``"none"``).
    """

    perturbations: tuple[Perturbation, ...]
    methods: tuple[str, ...]
    layer: str | None
    images: dict[str, np.ndarray]
    probability: dict[str, np.ndarray]
    maps: dict[str, np.ndarray | None]
    change: dict[str, np.ndarray]
    correlation: dict[str, np.ndarray]
    border: int
    error: str | None = None

    def spread(self, method: str) -> float:
        """max - min of P(tumour) over the perturbations (the patch itself included)."""
        p = self.probability[method]
        return float(p.max() - p.min())

    def mean_change(self, method: str) -> float:
        """The mean over the perturbed patches (the patch itself left out) of their maps' mean |change|."""
        return float(self.change[method][1:].mean())

    def lowest_correlation(self, method: str) -> float:
        """The perturbed maps' lowest correlation with the patch's own (NaN: none defined)."""
        r = self.correlation[method][1:]
        return float(np.nanmin(r)) if np.isfinite(r).any() else float("nan")


def _placed(image: np.ndarray, element: int, degrees: float) -> np.ndarray:
    """The page's geometry after the stain: its element, then its arbitrary angle (the page analyses the result
    with element 0 then; without an angle it passes the element to the analysis, which applies it first)."""
    return rotate_by_angle(apply_element(image, element), degrees) if degrees else apply_element(image, element)


def stain_stability(model: Network, card: dict, image: np.ndarray, reference: StainEstimate,
                    method: str = "macenko", border: int = 0, element: int = 0, degrees: float = 0.0,
                    perturbations: tuple[Perturbation, ...] = PERTURBATIONS) -> StainStability:
    """``image`` under every perturbation, as scanned and normalised by ``method`` to ``reference``.

    Args:
        model: an H&E network in eval mode (only read).
        card: its card (input convention, class names).
        image: ``(3, S, S)`` in [0, 1], the patch as scanned, before the page's element and angle.
        reference: the stain normalised to (:func:`stain_reference`).
        method: ``"macenko"`` or ``"reinhard"``.
        border: the layer's padding border in pixels (:mod:`app.analysis.padding`), left out of the change and the
            correlation as the page leaves it out of its colours.
        element, degrees: the page's geometry, applied after the stain as the page applies it.
        perturbations: at most eight, the patch itself first.

    Returns:
        A :class:`StainStability`. A perturbation is drawn from its own seeded generator, so two calls agree
        exactly; the patch itself (perturbation 0) keeps the page's pixels, so its P(tumour) as scanned is the
        page's as-scanned P(tumour), and in ``method`` the page's normalised one.
    """
    if method not in METHODS[1:]:
        raise ValueError(f"stain stability compares 'none' with a normalisation, one of {METHODS[1:]}, not {method!r}")
    if not 0 < len(perturbations) <= 8 or not perturbations[0].identity:
        raise ValueError("stain stability takes one to eight perturbations, the patch itself first")
    rgb = patch_rgb(image)
    perturbed = [p.apply(rgb) for p in perturbations]  # uint8 (S, S, 3) each
    scanned = [image if p.identity else patch_image(x) for p, x in zip(perturbations, perturbed, strict=True)]
    columns, error = {"none": scanned}, None
    try:
        columns[method] = [patch_image(normalise(x, method, reference)) for x in perturbed]
    except StainError as err:
        error = str(err)
    layer = first_spatial_layer(model)
    frame = InputFrame.from_card(card, model.group)
    tumour = tumour_index(card.get("class_names") or ["0", "1"])
    dtype = next(model.parameters()).dtype
    images, probability, maps, change, correlation = {}, {}, {}, {}, {}
    for name, column in columns.items():
        batch = np.stack([_placed(x.astype(np.float32), element, degrees) for x in column])  # (N, 3, S, S)
        with torch.inference_mode():
            logits, trace = model.trace(frame.to_network(torch.from_numpy(batch).to(dtype)))
            probabilities = torch.softmax(logits.double(), dim=1).numpy()  # as the page's analysis computes them
            alpha = None
            if layer is not None:
                parts = frame.attention_to_user(trace.attention[layer])
                alpha = reduce_attention(parts, MapSelection(reading="spatial"))  # (N, H, X, Y)
                alpha = upsample(alpha.float(), batch.shape[-1]).numpy()  # (N, H, S, S)
        images[name], probability[name], maps[name] = batch, probabilities[:, tumour], alpha
        if alpha is None:
            change[name] = correlation[name] = np.full(len(batch), np.nan)
            continue
        core = _inside(alpha, border).astype(np.float64)  # (N, H, s, s)
        change[name] = np.abs(core - core[:1]).reshape(len(core), -1).mean(axis=1)
        correlation[name] = np.array([np.nan if r is None else r for r in (pearson(c, core[0]) for c in core)])
    return StainStability(tuple(perturbations), tuple(columns), layer, images, probability, maps, change,
                          correlation, border_left_out(border, image.shape[-1]), error)


@dataclass(frozen=True)
class GroupSpread:
    """The same numbers under the group, from the page's analysis (its equivariance proof): P(tumour)'s max - min
    over the transforms, and over the transforms g other than the identity the mean of mean |maps(g.x) - g.maps(x)|
    of the layer and the lowest Pearson correlation of maps(g.x) with g.maps(x) (None without the layer)."""

    transforms: int
    spread: float
    mean_change: float | None
    lowest_correlation: float | None


def group_spread(analysis: Analysis, layer: str | None, border: int = 0) -> GroupSpread:
    """:class:`GroupSpread` of an analysis whose ``layer`` is in the spatial reading (alpha_s), measured at the
    patch's size inside ``border`` as :func:`stain_stability` measures the stain's."""
    p = analysis.probabilities[:, tumour_index(analysis.class_names)]
    mean_change = lowest = None
    if layer is not None and layer in analysis.attention:
        lm = analysis.attention[layer]
        size = analysis.images.shape[-1]
        maps, expected = (_inside(lm.upsampled(size, which), border)[1:] for which in ("maps", "expected"))
        mean_change = float(np.abs(maps.astype(np.float64) - expected).mean())  # (T - 1, H, s, s)
        found = [r for r in (pearson(m, e) for m, e in zip(maps, expected, strict=True)) if r is not None]
        lowest = min(found) if found else None
    return GroupSpread(len(p), float(p.max() - p.min()), mean_change, lowest)
