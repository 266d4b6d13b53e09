"""The patch page's readings of attention: which quantity the maps show, what bright means, which a model has.

An attentive layer computes ``f - alpha_s * alpha_c * f``, so one layer can be read three ways
(:data:`models.attention.parts.READINGS`), and the paper adds a fourth picture:

=============  ======================================  ============================================
reading        maps                                    bright means
=============  ======================================  ============================================
``kept``       alpha+ = 1 - alpha_c * alpha_s          the layer keeps more of its input
``removed``    alpha- = alpha_c * alpha_s = 1 - alpha+  the layer removes more of its input
``spatial``    alpha_s, the spatial sigmoid            the layer removes more (the paper's figures)
``composite``  product over layers of alpha_s          every layer removes more (the paper's Fig. 5)
=============  ======================================  ============================================

The page starts on ``spatial`` where a model has it: the paper's figures draw it, so what a user sees compares
with them, and bright marks where the layer acts on its input (alpha+ is close to 1 over most of a patch and
brightest on empty glass, which reads as "the network looks at the glass"). Channel-only attention has no
alpha_s, so no ``spatial`` reading and no composite; a planar model has no orientations to compose over.
Numpy in, numpy out; no Streamlit.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from models import Network
from models.attention.parts import AttentiveLayer

from .compute import LayerMaps, proof_errors
from .reductions import MapSelection

__all__ = ["COMPOSITE", "PAGE_READINGS", "LAYER_READINGS", "LABELS", "BRIGHT", "COLOUR_TITLES", "DEFAULT_WHY",
           "PageReadings", "page_readings", "layer_selections", "composite_sum"]

COMPOSITE = "composite"
PAGE_READINGS = ("kept", "removed", "spatial", COMPOSITE)
LAYER_READINGS = PAGE_READINGS[:3]  # each layer's own map: the pages that compare models offer these
# The symbol first: a narrow picker cuts a label's end, and the symbol is what the captions and the paper name.
LABELS = {
    "kept": "α⁺: what the network keeps (1 − α_c·α_s)",
    "removed": "α⁻: what it removes (α_c·α_s = 1 − α⁺)",
    "spatial": "α_s: where it removes, as the paper's figures draw it",
    COMPOSITE: "∏ α_s: the paper's composite over layers",
}
BRIGHT = {
    "kept": "Bright: the layer keeps more of its input here (α⁺, what it multiplies by).",
    "removed": "Bright: the layer removes more of its input here (α⁻ = 1 − α⁺).",
    "spatial": "Bright: the layer removes more here (α_s; the paper's figures call this attention).",
    COMPOSITE: ("Bright: the product over every attentive layer of α_s is high here, i.e. every layer removes "
                "much here: where the network as a whole acts (the paper's Fig. 5 picture)."),
}
COLOUR_TITLES = {"kept": "kept α⁺", "removed": "removed α⁻", "spatial": "α_s", COMPOSITE: "Σ_h ∏ α_s"}
DEFAULT_WHY = ("The page starts on α_s, the paper's reading: its figures draw it, so the maps compare with them, "
               "and bright marks where a layer acts on its input. α⁺ inverts what is removed: close to 1 almost "
               "everywhere, brightest where the layer leaves its input alone (on H&E patches, often empty glass).")


@dataclasses.dataclass(frozen=True)
class PageReadings:
    """What the reading control offers for one model.

    Attributes:
        options: the readings it has, in :data:`PAGE_READINGS` order (empty: no attentive layer).
        default: the one the page starts on.
        missing: why the others are not offered, one sentence or empty.
        spatial: attentive layer name -> whether it has spatial attention (alpha_s).
    """

    options: tuple[str, ...]
    default: str | None
    missing: str
    spatial: dict[str, bool]


def page_readings(model: Network) -> PageReadings:
    """The readings ``model`` has: read from its attentive modules, without a forward pass."""
    spatial = {name: module.spatial_attention is not None for name, module in model.named_modules()
               if isinstance(module, AttentiveLayer)}
    if not spatial:
        return PageReadings((), None, "", spatial)
    options, missing = ["kept", "removed"], ""
    if any(spatial.values()):
        options.append("spatial")
        if model.group is not None:
            options.append(COMPOSITE)
        else:
            missing = ("No composite: a planar network has no orientation axis, and the paper's composite is a "
                       "product per orientation.")
    else:
        missing = ("No α_s and no composite: this model's attention is channel-only (α_c, one weight per channel "
                   "and orientation), it has no spatial attention map α_s; α⁻ = α_c shows what it removes.")
    return PageReadings(tuple(options), "spatial" if "spatial" in options else "kept", missing, spatial)


def layer_selections(readings: PageReadings, reading: str) -> dict[str, MapSelection]:
    """The selection of every attentive layer for the page's ``reading`` (means over channels and orientations).

    The composite's layers show its factors, alpha_s. A layer without spatial attention in a model with some
    shows alpha- (its caption says so): alpha_s does not exist there.
    """
    per_layer = "spatial" if reading == COMPOSITE else reading
    return {name: MapSelection(reading=per_layer if per_layer != "spatial" or has else "removed")
            for name, has in readings.spatial.items()}


def composite_sum(composite: LayerMaps) -> LayerMaps:
    """The paper's plot of its composite: the sum over orientations, ``(T, 1, S, S)``, with the proof of the sum.

    The sum is invariant to the orientation axis's re-indexing, so g.sum(x) is the sum's planes moved by g.
    """
    maps = composite.maps.sum(axis=1, keepdims=True, dtype=np.float64)  # (T, 1, S, S)
    expected = composite.expected.sum(axis=1, keepdims=True, dtype=np.float64)  # (T, 1, S, S)
    return LayerMaps(composite.name, composite.kind, composite.layout, composite.description,
                     maps.astype(np.float32), expected.astype(np.float32), *proof_errors(maps, expected))
