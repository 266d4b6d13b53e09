"""Attention parts and feature maps -> one 2-D map per orientation, ``(B, H, X, Y)``.

What the network multiplies by is the effective attention ``1 - channel * spatial``
(alpha+, :meth:`models.attention.parts.AttentionParts.effective`), in [0, 1]; a
:class:`MapSelection` can ask for another reading instead
(:data:`models.attention.parts.READINGS`): ``"removed"``, alpha- = channel * spatial,
exactly 1 - alpha+ after every mean below, or ``"spatial"``, alpha_s alone (the
paper's pictures). The table is for alpha+; the others have the same shapes. Its shape
depends on the layer type; each is reduced to the orientation axis the layer's
output carries (H = G) or to a single invariant map (H = 1):

=================  ===================================  =======================================
layer              effective map                        shown (``MapSelection`` defaults)
=================  ===================================  =======================================
alpha_F lifting    ``(B, C_in, X, Y)``                  mean over C_in (or one channel); H = 1
alpha_F group      ``(B, C_in, G, X, Y)``               mean over C_in (or one channel); H = G
full lifting       ``(B, C_out, G, C_in, X', Y')``      mean over C_in, mean over C_out (or one); H = G
full group         ``(B, C_out, G, C_in, G_in, X', Y')``  as lifting, then mean over G_in (or one)
alpha_RH           ``(B, 1, [G,] X, Y)``                as is
=================  ===================================  =======================================

Means are of the effective map, so every value stays in [0, 1] and reads as
"the average factor the layer applied". The mean over input channels is taken
on the channel part alone, which is exact because the spatial part does not
depend on the input channel; the means over output channels and input
orientations come after the product, where both parts depend on them. The full
map (``B * C_out * G * C_in * G_in * X * Y`` values) is never built.

Feature maps ``(B, C, G, X, Y)`` become the mean over channels of ``|f|``: the
size of the response in each orientation whatever its sign. (The features are
the convolutions' outputs before batch norm, so a ReLU of them would not be
what the next layer sees either; the magnitude is the honest summary.)

Means and channel choices treat every orientation alike, so they commute with
the group action: reduce(g.f) = g.reduce(f). Choosing one input orientation
does not (g re-indexes that axis too); the live proof in :mod:`app.analysis.compute`
therefore transforms the un-reduced parts and reduces afterwards, which is
exact for every choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from models.attention.parts import READINGS, AttentionParts

__all__ = ["MEANS", "MapSelection", "attention_layout", "reduce_attention", "reduce_readings", "reduce_features",
           "describe_reduction", "selectable", "upsample"]

# Layout of the effective map: (name, number of axes, group axes).
LAYOUTS = {
    (4, ()): "input_lifting",
    (5, (2,)): "input_group",
    (6, (2,)): "full_lifting",
    (7, (2, 4)): "full_group",
}
# Axis of the input channels, and of the output channels (full layers only).
IN_CHANNEL_AXIS = {"input_lifting": 1, "input_group": 1, "full_lifting": 3, "full_group": 3}
OUT_CHANNEL_AXIS = 1
IN_ORIENTATION_AXIS = 4


@dataclass(frozen=True)
class MapSelection:
    """Which slice of an attention map to show; None means the mean over that axis.

    Attributes:
        channel: alpha_F layers: the input channel; full layers: the output channel.
        in_orientation: full group layers only: the input orientation h.
        reading: which quantity (:data:`models.attention.parts.READINGS`): ``"kept"`` (alpha+, the default),
            ``"removed"`` (alpha-) or ``"spatial"`` (alpha_s).
    """

    channel: int | None = None
    in_orientation: int | None = None
    reading: str = "kept"

    def __post_init__(self):
        if self.reading not in READINGS:
            raise ValueError(f"unknown reading {self.reading!r}; expected one of {READINGS}")


MEANS = MapSelection()


def attention_layout(parts: AttentionParts) -> str:
    """``"input_lifting"``, ``"input_group"``, ``"full_lifting"`` or ``"full_group"``, from the parts' shapes."""
    present = parts.channel if parts.channel is not None else parts.spatial
    key = (present.dim(), tuple(parts.group_axes))
    if key not in LAYOUTS:
        raise ValueError(f"unknown attention layout: {present.dim()} axes, group axes {parts.group_axes}")
    return LAYOUTS[key]


def selectable(parts: AttentionParts) -> tuple[int, int]:
    """How many channels and input orientations a :class:`MapSelection` can choose from (0: none)."""
    layout = attention_layout(parts)
    full = layout.startswith("full")
    axis = OUT_CHANNEL_AXIS if full else IN_CHANNEL_AXIS[layout]
    channels = max(t.shape[axis] for t in (parts.channel, parts.spatial) if t is not None)
    orientations = 0
    if layout == "full_group":
        orientations = max(t.shape[IN_ORIENTATION_AXIS] for t in (parts.channel, parts.spatial) if t is not None)
    return channels, orientations


def reduce_attention(parts: AttentionParts, selection: MapSelection = MEANS) -> torch.Tensor:
    """The effective attention of one layer as one map per orientation.

    Args:
        parts: the layer's :class:`AttentionParts` (batch B).
        selection: which channel / input orientation, or means (the default).

    Returns:
        ``(B, H, X, Y)`` in [0, 1]; H = G for group layers, 1 for alpha_F and alpha_RH
        lifting layers (whose attention is on the image, rotation invariant). In the parts' dtype, but for
        the ``"kept"`` reading: float64, since float32's ``1 - x`` keeps only a few digits of an x near 1e-4
        (a layer that acts almost nowhere) and rounds its distinct values together.

    Raises:
        ValueError: a selection outside the layer's channels or orientations, or the ``"spatial"``
            reading of a layer without spatial attention.
    """
    layout = attention_layout(parts)
    full = layout.startswith("full")
    channel, spatial = parts.channel, parts.spatial
    if selection.reading == "spatial":
        if spatial is None:
            raise ValueError("this layer has no spatial attention: its spatial reading (alpha_s) does not exist")
        channel = None
    if selection.channel is not None:
        axis = OUT_CHANNEL_AXIS if full else IN_CHANNEL_AXIS[layout]
        channel, spatial = (_pick(t, axis, selection.channel, "channel") for t in (channel, spatial))
    if channel is not None:
        # Only the channel part spans the input channels; spatial has size 1 there.
        channel = channel.mean(dim=IN_CHANNEL_AXIS[layout], keepdim=True)
    present = [t for t in (channel, spatial) if t is not None]
    product = present[0] if len(present) == 1 else present[0] * present[1]
    # Every mean below is linear, so the "removed" maps are exactly 1 - the "kept" ones, up to round-off.
    effective = 1 - product.double() if selection.reading == "kept" else product
    if layout == "full_group":
        if selection.in_orientation is not None:
            effective = _pick(effective, IN_ORIENTATION_AXIS, selection.in_orientation, "input orientation")
        effective = effective.mean(dim=IN_ORIENTATION_AXIS)  # (B, O', G, 1, X, Y)
    elif selection.in_orientation is not None:
        raise ValueError(f"an input orientation can be chosen only for full group layers, not {layout}")
    if full:
        effective = effective.mean(dim=OUT_CHANNEL_AXIS)  # (B, G, 1, X, Y)
    b, size = effective.shape[0], effective.shape[-2:]
    return effective.reshape(b, -1, *size)  # (B, H, X, Y)


def reduce_readings(parts: AttentionParts, selection: MapSelection = MEANS) -> dict[str, torch.Tensor]:
    """Every reading of one layer from the same parts, in float64: ``{"kept", "removed"[, "spatial"]}``.

    ``kept`` is computed as ``1 - removed`` in float64, so that rank statistics of the two are exact
    negatives (a float32 ``1 - x`` would round distinct values of x together); ``spatial`` is absent for a
    layer without spatial attention. The selection's own reading is ignored. Shapes as :func:`reduce_attention`.
    """
    double = AttentionParts(*(None if t is None else t.double() for t in (parts.channel, parts.spatial)),
                            group_axes=parts.group_axes)
    removed = reduce_attention(double, replace(selection, reading="removed"))
    readings = {"kept": 1 - removed, "removed": removed}
    if parts.spatial is not None:
        readings["spatial"] = reduce_attention(double, replace(selection, reading="spatial"))
    return readings


def _pick(t: torch.Tensor | None, axis: int, index: int, what: str) -> torch.Tensor | None:
    """Index ``index`` of ``axis`` kept as a size-1 axis; parts of size 1 there broadcast and stay."""
    if t is None or t.shape[axis] == 1:
        return t
    if not 0 <= index < t.shape[axis]:
        raise ValueError(f"{what} must be in [0, {t.shape[axis]}), got {index}")
    return t.narrow(axis, index, 1)


def reduce_features(features: torch.Tensor) -> torch.Tensor:
    """Response strength per orientation: mean over channels of ``|f|``.

    Shape: group ``(B, C, G, X, Y)`` -> ``(B, G, X, Y)``; planar ``(B, C, X, Y)`` -> ``(B, 1, X, Y)``.
    """
    if features.dim() == 5:
        return features.abs().mean(dim=1)
    return features.abs().mean(dim=1, keepdim=True)


def describe_reduction(layout: str, selection: MapSelection = MEANS) -> str:
    """One sentence for the UI saying what a reduced attention map shows."""
    channel = "input channel" if layout.startswith("input") else "output channel"
    parts = [f"{channel} {selection.channel}" if selection.channel is not None else f"mean over {channel}s"]
    if layout.startswith("full"):
        parts.append("mean over input channels")
    if layout == "full_group":
        h = selection.in_orientation
        parts.append(f"input orientation {h}" if h is not None else "mean over input orientations")
    per = "one map per orientation" if layout != "input_lifting" else "one map (attention on the image)"
    if selection.reading == "spatial":
        parts = [p for p in parts if not p.startswith("mean over input channels")]
        if not layout.startswith("full"):
            parts = ["the same for every input channel"]
    return f"{READING_FORMULAS[selection.reading]}, {', '.join(parts)}; {per}."


# What each reading's maps are, for captions.
READING_FORMULAS = {
    "kept": "Effective attention α⁺ = 1 − α_c·α_s (what the layer keeps)",
    "removed": "Removed share α⁻ = α_c·α_s (what the layer subtracts)",
    "spatial": "Spatial attention α_s alone (as the paper's figures draw it)",
}


def upsample(maps: torch.Tensor, size: int) -> torch.Tensor:
    """Stretch maps ``(B, H, x, y)`` over the ``size`` x ``size`` image, for overlays.

    Bilinear with ``align_corners=False``: the map's pixels tile the image, their
    centres at the centres of equal cells. Valid convolutions lose a border of a
    few pixels and pooling halves the grid, so this places each value within
    that border of its receptive field's centre. The sampling grid is symmetric
    under quarter turns and flips, so upsampling commutes with the group action.
    """
    if maps.shape[-2:] == (size, size):
        return maps
    return F.interpolate(maps, size=(size, size), mode="bilinear", align_corners=False)
