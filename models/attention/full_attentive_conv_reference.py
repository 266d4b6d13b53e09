"""The full attentive group convolution (Romero et al. 2020, eq. 10-12), straightforward version.

A (lifting or group) convolution sums, for every output channel o and output
orientation g, the responses of every input channel c (and input orientation
h) to its filter:

    y(x, o, g) = sum_{c, h} f~(x, o, g, c, h),
    f~(x, o, g, c, h) = sum_y f_c(y, h) (L_g psi)_{o, c}(y - x, h).

The attentive convolution weighs the terms before summing. Channel attention
(one MLP per output channel on the spatial mean/max of f~) gives
alpha_c(o, g, c, h); spatial attention (a filter per output channel on the
mean/max over c of alpha_c f~) gives alpha_s(x, o, g, h); as in the paper's
code they act on the residual branch:

    y(x, o, g) = sum_{c, h} f~ - alpha_s * alpha_c * f~.

This version materialises f~, as the paper's code does, so it costs C_in * G_in
times the memory of a plain group convolution's output. It is the test oracle of
the memory-efficient default in ``full_attentive_conv.py``, which computes the
same function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gconv import GroupConv, LiftingConv, check_group_input, group_filters, lifting_filters
from ..pooling import spatial_avg_pool
from .parts import AttentiveLayer

__all__ = ["ReferenceAttentiveLiftingConv", "ReferenceAttentiveGroupConv"]


class _FullAttention(AttentiveLayer):
    """Mixin: build f~, attend to it, sum over the input axes."""

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        f = self.unsummed_responses(x)
        attended, parts = self.attend(f)
        out = self.sum_inputs(attended)
        if self.pool > 1:
            out = spatial_avg_pool(out, self.pool)
        return (out, parts) if return_attention else out

    def _depthwise(self, planar: torch.Tensor, filters: torch.Tensor, inputs: int) -> torch.Tensor:
        # One conv group per input plane: filters (inputs * outputs, 1, k, k).
        return F.conv2d(
            planar, filters, stride=self.stride, padding=self.padding,
            dilation=self.dilation, groups=inputs,
        )


class ReferenceAttentiveLiftingConv(_FullAttention, LiftingConv):
    """Full attentive lifting convolution. Arguments as :class:`LiftingConv` plus the attention modules.

    Shape: ``(B, C_in, X, Y)`` -> ``(B, C_out, G, X', Y')``. f~ is
    ``(B, C_out, G, C_in, X', Y')``; attention parts: channel
    ``(B, C_out, G, C_in, 1, 1)``, spatial ``(B, C_out, G, 1, X', Y')``.
    """

    attention_group_axes = (2,)

    def unsummed_responses(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"{type(self).__name__} expects (B, {self.in_channels}, X, Y), got {tuple(x.shape)}")
        o, c, n, k = self.out_channels, self.in_channels, self.group.order, self.kernel_size
        # (O, G, C, k, k) -> (C, O, G, k, k): group c of the conv holds the filters that see input c
        filters = lifting_filters(self.weight, self.group).permute(2, 0, 1, 3, 4)
        out = self._depthwise(x, filters.reshape(c * o * n, 1, k, k), c)
        out = out.view(x.shape[0], c, o, n, *out.shape[-2:])  # (B, C, O, G, X', Y')
        return out.permute(0, 2, 3, 1, 4, 5)  # (B, O, G, C, X', Y')

    def sum_inputs(self, f: torch.Tensor) -> torch.Tensor:
        return f.sum(dim=3)


class ReferenceAttentiveGroupConv(_FullAttention, GroupConv):
    """Full attentive group convolution. Arguments as :class:`GroupConv` plus the attention modules.

    Shape: ``(B, C_in, G, X, Y)`` -> ``(B, C_out, G, X', Y')``. f~ is
    ``(B, C_out, G, C_in, G_in, X', Y')``; attention parts: channel
    ``(B, C_out, G, C_in, G_in, 1, 1)``, spatial ``(B, C_out, G, 1, G_in, X', Y')``.

    The sum over (C_in, G_in) carries the group's Haar weight like
    :class:`GroupConv`. (The paper's code uses 2 pi / G here, which equals the
    Haar weight for p4 but is a quarter of it for p4m, where it has no p4m
    full-attention model; we keep the attentive layer consistent with the plain one.)
    """

    attention_group_axes = (2, 4)

    def unsummed_responses(self, x: torch.Tensor) -> torch.Tensor:
        check_group_input(x, self.in_channels, self.group, type(self).__name__)
        o, c, n, k = self.out_channels, self.in_channels, self.group.order, self.kernel_size
        # (O, G, C, G_in, k, k) -> (C, G_in, O, G, k, k)
        filters = group_filters(self.weight, self.group).permute(2, 3, 0, 1, 4, 5)
        planar = x.reshape(x.shape[0], c * n, *x.shape[-2:])  # (B, C * G_in, X, Y)
        out = self._depthwise(planar, filters.reshape(c * n * o * n, 1, k, k), c * n)
        out = out.view(x.shape[0], c, n, o, n, *out.shape[-2:])  # (B, C, G_in, O, G, X', Y')
        return out.permute(0, 3, 4, 1, 2, 5, 6)  # (B, O, G, C, G_in, X', Y')

    def sum_inputs(self, f: torch.Tensor) -> torch.Tensor:
        return self.group.haar_measure * f.sum(dim=(3, 4))
