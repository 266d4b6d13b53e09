"""Builds the layers of an architecture for one group (or none) and one attention variant.

The paper's architectures are the same graph with planar layers (Z2), p4 or
p4m layers, with or without attention; this factory is the one place that
choice is made, so each architecture is written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from ..attention import (
    AttentiveGroupConv,
    AttentiveLiftingConv,
    FullChannelAttention,
    FullSpatialAttention,
    InputAttentiveGroupConv,
    InputAttentiveLiftingConv,
    InputChannelAttention,
    InputSpatialAttention,
)
from ..gconv import GroupConv, LiftingConv, PooledConv2d
from ..groups import get_group
from ..normalization import GroupBatchNorm

__all__ = ["ATTENTION_VARIANTS", "LayerFactory", "he_normal_init_"]

# none: plain; full: alpha (channel + spatial on the un-summed responses);
# channel / spatial: alpha_CH / alpha_SP; input: alpha_F; rotation: alpha_RH.
ATTENTION_VARIANTS = ("none", "full", "channel", "spatial", "input", "rotation")


def he_normal_init_(model: nn.Module) -> None:
    """N(0, 2 / fan_in) for every planar convolution (He et al.), as the paper's planar ResNet and DenseNet."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / module.weight[0].numel()))


@dataclass(frozen=True)
class LayerFactory:
    """Layer constructors for one network.

    Args:
        group: ``None`` (planar), ``"p4"`` or ``"p4m"``.
        attention: one of :data:`ATTENTION_VARIANTS`.
        wscale: initialisation scale of the convolutions.
        bn_eps: BatchNorm epsilon (the paper: 2e-5).
    """

    group: str | None
    attention: str = "none"
    wscale: float = 1.0
    bn_eps: float = 2e-5

    def __post_init__(self):
        if self.attention not in ATTENTION_VARIANTS:
            raise ValueError(f"attention must be one of {ATTENTION_VARIANTS}, got {self.attention!r}")
        if self.group is None and self.attention != "none":
            raise ValueError("attention needs a group (p4 or p4m); planar networks have none")
        if self.group is not None:
            get_group(self.group)

    def lift(self, in_ch, out_ch, k, padding=0, *, reduction=1, att_kernel=7, att_dilation=1):
        """First layer: image -> group (or a planar conv)."""
        return self._conv(True, in_ch, out_ch, k, padding, reduction, att_kernel, att_dilation)

    def conv(self, in_ch, out_ch, k, padding=0, *, reduction=1, att_kernel=7, att_dilation=1, pool=1):
        """Hidden layer: group -> group (or a planar conv); ``pool``: average-pool its output (``GroupConv``)."""
        return self._conv(False, in_ch, out_ch, k, padding, reduction, att_kernel, att_dilation, pool)

    def plain_conv(self, in_ch, out_ch, k, padding=0):
        """A group -> group (or planar) convolution without attention, whatever the variant."""
        return LayerFactory(self.group, "none", self.wscale, self.bn_eps).conv(in_ch, out_ch, k, padding)

    def batch_norm(self, channels: int) -> nn.Module:
        if self.group is None:
            return nn.BatchNorm2d(channels, eps=self.bn_eps)
        return GroupBatchNorm(channels, eps=self.bn_eps)

    def _conv(self, lifting, in_ch, out_ch, k, padding, reduction, att_kernel, att_dilation, pool=1):
        if self.group is None:
            if pool > 1:
                return PooledConv2d(in_ch, out_ch, k, padding=padding, pool=pool)
            return nn.Conv2d(in_ch, out_ch, k, padding=padding, bias=False)
        g, variant = self.group, self.attention
        args = (g, in_ch, out_ch, k)
        kwargs = dict(padding=padding, wscale=self.wscale, pool=pool)
        if variant == "none":
            return (LiftingConv if lifting else GroupConv)(*args, **kwargs)
        if variant in ("full", "channel", "spatial"):
            channel = spatial = None
            if variant != "spatial":
                channel = FullChannelAttention(out_ch, in_ch, reduction, group=g, lifting=lifting)
            if variant != "channel":
                spatial = FullSpatialAttention(
                    out_ch, g, att_kernel, lifting=lifting, dilation=att_dilation, wscale=self.wscale
                )
            layer = AttentiveLiftingConv if lifting else AttentiveGroupConv
        else:
            if variant == "input":
                channel = InputChannelAttention(in_ch, reduction, group=None if lifting else g)
                spatial = InputSpatialAttention(
                    g, att_kernel, lifting=lifting, dilation=att_dilation, wscale=self.wscale
                )
            else:  # rotation: 1x1 filter over all channels, no statistics
                channel = None
                spatial = InputSpatialAttention(
                    g, 1, lifting=lifting, statistics=False, in_channels=in_ch, wscale=self.wscale
                )
            layer = InputAttentiveLiftingConv if lifting else InputAttentiveGroupConv
        return layer(*args, **kwargs, channel_attention=channel, spatial_attention=spatial)
