"""The paper's Fig. 5 claim, measured on one H&E patch: does attention focus on nuclei and suppress background?

"The network learns to focus on the nuclei of the cells and to remove background" (Romero et al. 2020, Fig. 5).
For a patch and one map of it (an attentive layer's map in one reading, mean over channels and orientations,
stretched over the patch; or the paper's composite), :func:`map_numbers` gives

* ``spearman``: rank correlation, over all pixels, of the map with the haematoxylin concentration, the stain of
  nuclei (colour deconvolution, :func:`models.stain.rgb_to_hed`). Positive: larger values where nuclei are;
* ``tissue_minus_background``: mean on tissue minus mean on background (glass, lumens, fat: a pixel is tissue
  when the largest optical density, averaged over its 11 x 11 neighbourhood, exceeds 0.15,
  :func:`models.stain.region_tissue_mask`). Many PCam patches are all tissue, so it is NaN unless at least
  :data:`MIN_BACKGROUND` of the patch is background;
* ``nuclei_minus_stroma``: mean on nuclei (:func:`models.stain.nuclei_mask`) minus mean on the rest of the
  tissue (stroma, cytoplasm), NaN unless each covers at least :data:`MIN_NUCLEI` of the patch;
* both differences ``_relative``: divided by the map's mean over the patch, so that maps of different scales
  (alpha+ near 0.8, the composite near 1e-4) compare.

The stains of a patch (:class:`PatchStains`) are computed once for all its maps. Numpy in, numpy out; no
Streamlit. ``benchmarks/attention_on_nuclei.py`` runs it over a test set in every reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from models.stain import nuclei_mask, region_tissue_mask, rgb_to_hed

from .compute import Analysis
from .pathology import rgb_255

__all__ = ["NucleiAttention", "PatchStains", "attention_on_nuclei", "nuclei_statistics", "map_numbers", "spearman",
           "first_attention_layer", "MIN_BACKGROUND", "MIN_NUCLEI", "NUMBERS"]

MIN_BACKGROUND = 0.05  # share of the patch: with less background than this, its mean is not reported
# Share of the patch that nuclei, and the rest of the tissue, must each cover for their difference to be
# reported: 5 % is 461 of 96 x 96 pixels, about ten nuclei 8 pixels across, so one nucleus does not decide it.
MIN_NUCLEI = 0.05
# What map_numbers gives for one map, in this order.
NUMBERS = ("spearman", "tissue_minus_background", "tissue_minus_background_relative", "nuclei_minus_stroma",
           "nuclei_minus_stroma_relative")


@dataclass(frozen=True)
class PatchStains:
    """One RGB patch's haematoxylin and masks, shared by every map measured on it.

    Attributes:
        haematoxylin: ``(S, S)`` the concentration.
        tissue, nuclei: ``(S, S)`` bool masks (nuclei lie inside tissue).
        centred_ranks: the haematoxylin's average ranks minus their mean, flat, for :func:`spearman`.
    """

    haematoxylin: np.ndarray
    tissue: np.ndarray
    nuclei: np.ndarray
    centred_ranks: np.ndarray

    @classmethod
    def of(cls, image: np.ndarray) -> PatchStains:
        """The stains of a patch ``(3, S, S)`` in [0, 1]."""
        rgb = rgb_255(image)  # (S, S, 3) on 0..255
        haematoxylin = rgb_to_hed(rgb)[..., 0]
        ranks = _average_ranks(haematoxylin.ravel())
        return cls(haematoxylin, region_tissue_mask(rgb), nuclei_mask(rgb), ranks - ranks.mean())

    @property
    def background(self) -> np.ndarray:
        return ~self.tissue

    @property
    def stroma(self) -> np.ndarray:
        """Tissue that is not nuclei."""
        return self.tissue & ~self.nuclei


@dataclass(frozen=True)
class NucleiAttention:
    """One patch's attention against its nuclei and its background.

    Attributes:
        layer: the attentive layer measured.
        spearman: rank correlation of attention with haematoxylin over all pixels (NaN for a constant map).
        tissue_mean, background_mean: mean attention on tissue and on background (None: too little background).
        tissue_fraction: share of the patch's pixels that are tissue.
        attention: ``(S, S)`` the map; haematoxylin: ``(S, S)`` the concentration; tissue: ``(S, S)`` bool.
        nuclei_mean, stroma_mean: mean attention on nuclei and on the rest of the tissue (None: either covers
            less than :data:`MIN_NUCLEI` of the patch).
        nuclei_fraction: share of the patch's pixels that are nuclei.
    """

    layer: str
    spearman: float
    tissue_mean: float | None
    background_mean: float | None
    tissue_fraction: float
    attention: np.ndarray
    haematoxylin: np.ndarray
    tissue: np.ndarray
    nuclei_mean: float | None = None
    stroma_mean: float | None = None
    nuclei_fraction: float = 0.0

    @property
    def text(self) -> str:
        """Two sentences for the page."""
        where = ("no background to compare with" if self.background_mean is None else
                 f"mean attention {self.tissue_mean:.3f} on tissue against {self.background_mean:.3f} on background")
        nuclei = ("too few nuclei or too little stroma to compare" if self.nuclei_mean is None else
                  f"{self.nuclei_mean:.3f} on nuclei against {self.stroma_mean:.3f} on the rest of the tissue")
        return (f"{self.layer}: rank correlation of attention with haematoxylin (nuclei) ρ = {self.spearman:+.2f}; "
                f"{where} ({100 * self.tissue_fraction:.0f} % of the patch is tissue). Mean attention {nuclei} "
                f"({100 * self.nuclei_fraction:.0f} % of the patch is nuclei).")


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a flat array, ties sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse]


def _correlate_ranks(values: np.ndarray, centred_ranks: np.ndarray) -> float:
    """Pearson's correlation of ``values``' average ranks with already centred ranks; NaN if either is constant."""
    ranks = _average_ranks(np.ravel(values))
    ranks = ranks - ranks.mean()
    scale = np.sqrt((ranks * ranks).sum() * (centred_ranks * centred_ranks).sum())
    return float((ranks * centred_ranks).sum() / scale) if scale > 0 else float("nan")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two arrays of equal size (Pearson's on average ranks); NaN if one is constant."""
    rb = _average_ranks(np.ravel(b))
    return _correlate_ranks(a, rb - rb.mean())


def _mean_difference(values: np.ndarray, inside: np.ndarray, outside: np.ndarray, share: float) -> float:
    """Mean of ``values`` on ``inside`` minus on ``outside``; NaN unless each covers ``share`` of the pixels."""
    if inside.mean() < share or outside.mean() < share or not inside.any() or not outside.any():
        return math.nan
    return float(values[inside].mean() - values[outside].mean())


def map_numbers(stains: PatchStains, values: np.ndarray) -> dict[str, float]:
    """The :data:`NUMBERS` of one map ``(S, S)`` on a patch (module docstring); NaN where one is not defined.

    Tissue against background needs some tissue and :data:`MIN_BACKGROUND` of background; nuclei against stroma
    :data:`MIN_NUCLEI` of each. The relative differences divide by the map's mean over the whole patch.
    """
    mean = float(values.mean())
    # Any tissue at all: a patch that is nearly all glass still says how its few tissue pixels are treated.
    gap = _mean_difference(values, stains.tissue, stains.background, 0.0) \
        if stains.background.mean() >= MIN_BACKGROUND else math.nan
    nuclei = _mean_difference(values, stains.nuclei, stains.stroma, MIN_NUCLEI)
    return {
        "spearman": _correlate_ranks(values, stains.centred_ranks),
        "tissue_minus_background": gap,
        "tissue_minus_background_relative": gap / mean if mean else math.nan,
        "nuclei_minus_stroma": nuclei,
        "nuclei_minus_stroma_relative": nuclei / mean if mean else math.nan,
    }


def first_attention_layer(analysis: Analysis) -> str | None:
    """The first attentive layer in forward order, None for a model without attention."""
    return next(iter(analysis.attention), None)


def attention_on_nuclei(analysis: Analysis, transform: int = 0, layer: str | None = None) -> NucleiAttention | None:
    """Measure the Fig. 5 claim on one transform of the analysed image (None: no attentive layer, or not RGB).

    The map is the layer's in whichever reading the analysis reduced it to (its ``selection.reading``).

    Args:
        analysis: from :func:`app.analysis.compute.analyse` on an RGB patch.
        transform: which of the analysed transforms (0: the image as given).
        layer: an attentive layer's name (default: the first).
    """
    layer = layer or first_attention_layer(analysis)
    image = analysis.images[transform]  # (C, S, S) in [0, 1]
    if layer is None or image.shape[0] != 3:
        return None
    attention = analysis.attention[layer].upsampled(image.shape[-1])[transform].mean(axis=0)  # (H, S, S) -> (S, S)
    return nuclei_statistics(image, attention, layer)


def nuclei_statistics(image: np.ndarray, attention: np.ndarray, layer: str,
                      stains: PatchStains | None = None) -> NucleiAttention:
    """The Fig. 5 numbers of one RGB patch ``(3, S, S)`` in [0, 1] and its attention map ``(S, S)``.

    ``stains``: the patch's, where they were already computed (:meth:`PatchStains.of`).
    """
    stains = stains or PatchStains.of(image)
    tissue, background = stains.tissue, stains.background
    nuclei, stroma = stains.nuclei, stains.stroma
    enough_nuclei = nuclei.mean() >= MIN_NUCLEI and stroma.mean() >= MIN_NUCLEI
    return NucleiAttention(
        layer=layer,
        spearman=_correlate_ranks(attention, stains.centred_ranks),
        tissue_mean=float(attention[tissue].mean()) if tissue.any() else None,
        background_mean=float(attention[background].mean()) if background.mean() >= MIN_BACKGROUND else None,
        tissue_fraction=float(tissue.mean()),
        attention=attention,
        haematoxylin=stains.haematoxylin,
        tissue=tissue,
        nuclei_mean=float(attention[nuclei].mean()) if enough_nuclei else None,
        stroma_mean=float(attention[stroma].mean()) if enough_nuclei else None,
        nuclei_fraction=float(nuclei.mean()),
    )
