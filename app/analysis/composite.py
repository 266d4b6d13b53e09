"""The paper's composite attention picture: the product over attentive layers of their spatial attention.

What the paper's own visualisation code draws (the disabled ``if False:`` blocks of
``experiments/pcam/models/densenet.py`` fA_P4DenseNet.forward, ``experiments/rot_mnist/models/z2cnn.py``
fA_P4CNN.forward and ``experiments/cifar10/models/allcnnc.py`` in dwromero/att_gconvs): every
spatial attention module's raw sigmoid ``att_map`` (alpha_s, the factor of what the layer *removes*),

* the lifting layer's ``(B, 1, X, Y)`` repeated over the G orientations,
* every group layer's ``(B, 1, G, x, y)`` stretched to the image size by
  ``torch.nn.UpsamplingBilinear2d`` (bilinear, ``align_corners=True``),

multiplied together over the layers: ``(B, G, S, S)``. Their plot is its sum over orientations, with no
normalisation, and the arrow field its per-orientation values. Layers without spatial attention are
skipped. Full-attention layers (a_p4cnn's), which the paper drew no composite for, enter with the
:func:`~app.analysis.reductions.reduce_attention` means of their alpha_s (over output channels and input
orientations).

Every factor is a group feature map (planes move with the image, the orientation axis is re-indexed), and
``align_corners=True`` sampling is symmetric under quarter turns and flips, so the composite transforms
exactly with the image: ``composite(g.x) = g.composite(x)`` to round-off (tested, p4m, 1e-5).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from models.attention.parts import AttentionParts

from .reductions import MapSelection, reduce_attention

__all__ = ["paper_composite", "COMPOSITE_DESCRIPTION"]

COMPOSITE_DESCRIPTION = ("The paper's composite: the product over every attentive layer of its spatial attention "
                         "α_s (what the layer removes), stretched over the image, one map per orientation; the "
                         "paper plots the sum over orientations, unnormalised.")

SPATIAL = MapSelection(reading="spatial")


def paper_composite(attention: Mapping[str, AttentionParts], size: int, orientations: int) -> torch.Tensor | None:
    """The composite ``(B, G, size, size)`` of one forward pass's attention, in float64.

    Args:
        attention: every attentive layer's parts (``Trace.attention``, in whichever frame the result is wanted).
        size: the image size S the maps are stretched to.
        orientations: G, the group's number of elements (4 for p4, 8 for p4m; 1 for a planar network).

    Returns:
        The product, or None when no layer has spatial attention.
    """
    composite = None
    for parts in attention.values():
        if parts.spatial is None:
            continue
        spatial = reduce_attention(parts, SPATIAL).double()  # (B, H, x, y), H = 1 or G
        if spatial.shape[-2:] != (size, size):
            spatial = F.interpolate(spatial, size=(size, size), mode="bilinear", align_corners=True)
        spatial = spatial.expand(-1, orientations, -1, -1)  # a lifting layer's one map, repeated
        composite = spatial if composite is None else composite * spatial
    return None if composite is None else composite.contiguous()
