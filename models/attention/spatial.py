"""Spatial attention: a (group) convolution followed by a sigmoid.

* :class:`InputSpatialAttention` (alpha_F): on a layer's input, from the mean
  and max over channels (CBAM statistics), one map per input orientation. On a
  planar input the statistics are lifted and max-pooled over the group, so the
  map is rotation invariant. With ``statistics=False`` and a 1x1 kernel it is
  the co-attentive baseline alpha_RH of Romero & Hoogendoorn (2020): attention
  over the rotation axis computed from all channels.
* :class:`FullSpatialAttention`: on the un-summed responses f~ of an attentive
  convolution; for every (output channel, output orientation, input
  orientation) a map from the statistics over input channels, filtered with
  the group-transformed 7x7 filter of that output channel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu import attention_kernels
from ..gconv import group_bank, group_conv, group_filters, lifting_bank, lifting_conv, lifting_filters, uniform_init_
from ..groups import Group, get_group
from .statistics import channel_statistics, maximum

__all__ = ["InputSpatialAttention", "FullSpatialAttention"]


class InputSpatialAttention(nn.Module):
    """Spatial attention on a layer's input (alpha_F, or alpha_RH without statistics).

    Args:
        group: the group.
        kernel_size: filter size (the paper: 7; alpha_RH: 1).
        lifting: True for planar inputs ``(B, C, X, Y)``.
        dilation: filter dilation; padding keeps the size.
        statistics: pool mean and max over channels first (True), or filter all
            ``in_channels`` channels directly (False, alpha_RH).
        in_channels: needed only when ``statistics`` is False.
        wscale: initialisation scale.

    Shape: planar ``(B, C, X, Y)`` -> ``(B, 1, X, Y)``; group
    ``(B, C, G, X, Y)`` -> ``(B, 1, G, X, Y)``. Values in (0, 1).
    """

    def __init__(
        self, group: str | Group, kernel_size: int = 7, *, lifting: bool, dilation: int = 1,
        statistics: bool = True, in_channels: int | None = None, wscale: float = 1.0,
    ):
        super().__init__()
        self.group = get_group(group)
        self.lifting = lifting
        self.dilation = dilation
        self.padding = dilation * (kernel_size // 2)
        self.statistics = statistics
        if not statistics and in_channels is None:
            raise ValueError("InputSpatialAttention without statistics needs in_channels")
        channels = 2 if statistics else in_channels
        orientations = () if lifting else (self.group.order,)
        self.weight = nn.Parameter(torch.empty(1, channels, *orientations, kernel_size, kernel_size))
        uniform_init_(self.weight, channels * kernel_size**2, wscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_statistics(channel_statistics(x, dim=1) if self.statistics else x)

    def filter_bank(self) -> torch.Tensor:
        """The filter over the group that :meth:`from_statistics` runs: ``(G, 2, k, k)`` on an image (the G responses
        then maxed over), ``(G, 2 G, k, k)`` on a group map (with the group convolution's Haar weight)."""
        return (lifting_bank if self.lifting else group_bank)(self.weight, self.group)

    def from_statistics(self, x: torch.Tensor) -> torch.Tensor:
        """The attention from the channel statistics (mean, then max: ``(B, 2[, G], X, Y)``), or from the input
        itself when ``statistics`` is False. Shape: -> ``(B, 1[, G], X, Y)``."""
        conv = lifting_conv if self.lifting else group_conv
        out = conv(x, self.weight, self.group, padding=self.padding, dilation=self.dilation)
        if self.lifting:
            out = out.amax(dim=2)  # (B, 1, X, Y): invariant to the orientation of the filter
        return torch.sigmoid(out)


class FullSpatialAttention(nn.Module):
    """Spatial attention on the un-summed responses f~ of an attentive convolution.

    Args:
        out_channels: C_out of the convolution (one filter pair each).
        group: the group.
        kernel_size: filter size (the paper: 7).
        lifting: True when the convolution is a lifting one.
        dilation: filter dilation; padding keeps the size.
        wscale: initialisation scale.

    Shape: lifting f~ ``(B, C_out, G, C_in, X, Y)`` -> ``(B, C_out, G, 1, X, Y)``;
    group f~ ``(B, C_out, G, C_in, G_in, X, Y)`` -> ``(B, C_out, G, 1, G_in, X, Y)``.
    The mean and max filters are applied as two depthwise convolutions and summed.
    Unlike the other group convolutions the paper's code applies no Haar weight here.
    """

    def __init__(
        self, out_channels: int, group: str | Group, kernel_size: int = 7, *,
        lifting: bool, dilation: int = 1, wscale: float = 1.0,
    ):
        super().__init__()
        self.group = get_group(group)
        self.lifting = lifting
        self.dilation = dilation
        self.padding = dilation * (kernel_size // 2)
        orientations = () if lifting else (self.group.order,)
        self.weight = nn.Parameter(torch.empty(out_channels, 2, *orientations, kernel_size, kernel_size))
        uniform_init_(self.weight, 2 * kernel_size**2, wscale)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        # Statistics over input channels, axis 3 of f~: (B, O, G, [G_in,] X, Y) each.
        out = self.from_statistics(f.mean(dim=3), maximum(f, dim=3))
        return out.unsqueeze(3)

    def from_statistics(self, mean: torch.Tensor, peak: torch.Tensor, mean_scale: float = 1.0) -> torch.Tensor:
        """The attention: the sigmoid of :meth:`logits_from_statistics`, same arguments and shapes."""
        return torch.sigmoid(self.logits_from_statistics(mean, peak, mean_scale))

    def filter_pairs(self) -> torch.Tensor:
        """The group-transformed filter pair of every map.

        Shape: lifting ``(O * G, 2, k, k)``; group ``(G_in * O * G, 2, k, k)``, the maps
        ordered (h, o, g), h first: the efficient attentive convolution lays its
        statistics out as (B, X, Y, G_in, O, G), which then needs no copy.
        """
        k = self.weight.shape[-1]
        if self.lifting:
            return lifting_filters(self.weight, self.group).reshape(-1, 2, k, k)  # from (O, G, 2, k, k)
        return group_filters(self.weight, self.group).permute(3, 0, 1, 2, 4, 5).reshape(-1, 2, k, k)

    def logits_from_statistics(self, mean: torch.Tensor, peak: torch.Tensor, mean_scale: float = 1.0) -> torch.Tensor:
        """The attention before its sigmoid, from the mean and max of the channel-attended f~ over input channels.

        Args:
            mean: the mean over input channels, or a multiple of it (see ``mean_scale``).
            peak: the max over input channels.
            mean_scale: factor applied to ``mean`` (by scaling its filter, which is
                far smaller), so callers holding the sum can pass it with 1 / C_in.

        Shape: lifting ``(B, C_out, G, X, Y)`` each -> same; group
        ``(B, C_out, G, G_in, X, Y)`` each -> same.
        """
        filters = self.filter_pairs()
        k = filters.shape[-1]
        if not self.lifting:
            mean, peak = mean.permute(0, 3, 1, 2, 4, 5), peak.permute(0, 3, 1, 2, 4, 5)  # (B, G_in, O, G, X, Y)
        groups = filters.shape[0]
        b, size, lead = mean.shape[0], mean.shape[-2:], mean.shape[1:-2]

        weights = filters[:, 0] * mean_scale, filters[:, 1]
        compiled = attention_kernels.available(mean, filters) and attention_kernels.depthwise_pair_supported(groups, k)
        # The kernels, and oneDNN's depthwise convolutions (the weight gradient above all) run
        # faster on channels-last float32 tensors; without oneDNN (float64) slower.
        layout = torch.channels_last if compiled or mean.dtype == torch.float32 else torch.contiguous_format
        mean, peak = (stat.reshape(b, groups, *size).contiguous(memory_format=layout) for stat in (mean, peak))
        if compiled:  # both convolutions in one pass, both ways
            out = attention_kernels.depthwise_pair(mean, peak, *weights, self.padding, self.dilation)
        else:
            conv = dict(padding=self.padding, dilation=self.dilation, groups=groups)
            out = F.conv2d(mean, weights[0][:, None], **conv) + F.conv2d(peak, weights[1][:, None], **conv)
        # (B, groups, X, Y) in (B, X, Y, groups) memory when channels last: view it without a copy.
        out = out.permute(0, 2, 3, 1).reshape(b, *size, *lead)  # (B, X, Y, [G_in,] O, G)
        if self.lifting:
            return out.permute(0, 3, 4, 1, 2)  # (B, O, G, X, Y)
        return out.permute(0, 4, 5, 3, 1, 2)  # (B, O, G, G_in, X, Y)
