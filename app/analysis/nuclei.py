"""The paper's Fig. 5 claim, measured on one H&E patch: does the first attention layer focus on nuclei and
suppress background?

"The network learns to focus on the nuclei of the cells and to remove background" (Romero et al. 2020, Fig. 5).
For a patch and the first attentive layer of a model (its effective attention alpha-plus in [0, 1], the app's
reduction: mean over channels and orientations, stretched over the patch):

* ``spearman``: rank correlation, over all pixels, of the map with the haematoxylin concentration, the stain of
  nuclei (colour deconvolution, :func:`models.stain.rgb_to_hed`). Positive: more attention where nuclei are;
* ``tissue_mean`` / ``background_mean``: the mean attention on tissue and on background (glass, lumens, fat: a
  pixel is tissue when the largest optical density, averaged over its 11 x 11 neighbourhood, exceeds 0.15,
  :func:`models.stain.region_tissue_mask`). Many PCam patches are all tissue, so ``background_mean`` is None when
  less than :data:`MIN_BACKGROUND` of the patch is background.

Numpy in, numpy out; no Streamlit. ``benchmarks/attention_on_nuclei.py`` runs it over a test set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.stain import region_tissue_mask, rgb_to_hed

from .compute import Analysis

__all__ = ["NucleiAttention", "attention_on_nuclei", "nuclei_statistics", "spearman", "first_attention_layer",
           "MIN_BACKGROUND"]

MIN_BACKGROUND = 0.05  # share of the patch: with less background than this, its mean is not reported


@dataclass(frozen=True)
class NucleiAttention:
    """One patch's attention against its nuclei and its background.

    Attributes:
        layer: the attentive layer measured.
        spearman: rank correlation of attention with haematoxylin over all pixels (NaN for a constant map).
        tissue_mean, background_mean: mean attention on tissue and on background (None: too little background).
        tissue_fraction: share of the patch's pixels that are tissue.
        attention: ``(S, S)`` the map; haematoxylin: ``(S, S)`` the concentration; tissue: ``(S, S)`` bool.
    """

    layer: str
    spearman: float
    tissue_mean: float | None
    background_mean: float | None
    tissue_fraction: float
    attention: np.ndarray
    haematoxylin: np.ndarray
    tissue: np.ndarray

    @property
    def text(self) -> str:
        """One sentence for the page."""
        where = ("no background to compare with" if self.background_mean is None else
                 f"mean attention {self.tissue_mean:.3f} on tissue against {self.background_mean:.3f} on background")
        return (f"{self.layer}: rank correlation of attention with haematoxylin (nuclei) ρ = {self.spearman:+.2f}; "
                f"{where} ({100 * self.tissue_fraction:.0f} % of the patch is tissue).")


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a flat array, ties sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two arrays of equal size (Pearson's on average ranks); NaN if one is constant."""
    ra, rb = _average_ranks(np.ravel(a)), _average_ranks(np.ravel(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / scale) if scale > 0 else float("nan")


def first_attention_layer(analysis: Analysis) -> str | None:
    """The first attentive layer in forward order, None for a model without attention."""
    return next(iter(analysis.attention), None)


def attention_on_nuclei(analysis: Analysis, transform: int = 0, layer: str | None = None) -> NucleiAttention | None:
    """Measure the Fig. 5 claim on one transform of the analysed image (None: no attentive layer, or not RGB).

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


def nuclei_statistics(image: np.ndarray, attention: np.ndarray, layer: str) -> NucleiAttention:
    """The Fig. 5 numbers of one RGB patch ``(3, S, S)`` in [0, 1] and its attention map ``(S, S)``."""
    rgb = 255.0 * image.transpose(1, 2, 0)  # (S, S, 3) on 0..255
    haematoxylin = rgb_to_hed(rgb)[..., 0]
    tissue = region_tissue_mask(rgb)
    background = ~tissue
    return NucleiAttention(
        layer=layer,
        spearman=spearman(attention, haematoxylin),
        tissue_mean=float(attention[tissue].mean()) if tissue.any() else None,
        background_mean=float(attention[background].mean()) if background.mean() >= MIN_BACKGROUND else None,
        tissue_fraction=float(tissue.mean()),
        attention=attention,
        haematoxylin=haematoxylin,
        tissue=tissue,
    )
