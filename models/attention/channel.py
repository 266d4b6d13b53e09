"""Channel attention: an MLP on the spatial mean and max of each channel (CBAM-style).

Two families, as in the paper:

* input channel attention (alpha_F): one weight per input channel (and input
  orientation) of a layer's input;
* full channel attention: one MLP per output channel, applied to the un-summed
  responses f~ of the convolution, giving one weight per (output channel,
  output orientation, input channel, input orientation).

On group inputs the MLP weights carry an orientation axis and are re-indexed by
the group like a 1x1 group-convolution filter (the paper's "group-shifted
matrix-valued kernels"), so that the attention is equivariant: for output
orientation g and input orientation h the weight used is w[..., index(g^-1 h)].
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..groups import Group, get_group
from .statistics import spatial_statistics

__all__ = ["InputChannelAttention", "FullChannelAttention", "group_shifted"]


def group_shifted(weight: torch.Tensor, group: Group) -> torch.Tensor:
    """Every group-shifted copy of a weight whose last axis is indexed by group elements.

    Shape: ``(..., G_in)`` -> ``(..., G, G_in)`` with out[..., g, h] = weight[..., index(g^-1 h)].
    """
    return weight[..., group.permutations.to(weight.device)]


def _kaiming(weight: torch.Tensor) -> torch.Tensor:
    # The paper's init for these MLPs: torch's default Linear init.
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    return weight


class InputChannelAttention(nn.Module):
    """alpha_F channel attention on a layer's input.

    Args:
        channels: input channels C.
        reduction: hidden width is ``max(channels // reduction, 1)``.
        group: None for planar inputs, else the group of the input.

    Shape: planar ``(B, C, X, Y)`` -> ``(B, C, 1, 1)``; group
    ``(B, C, G, X, Y)`` -> ``(B, C, G, 1, 1)``. Values in (0, 1).
    """

    def __init__(self, channels: int, reduction: int = 1, group: str | Group | None = None):
        super().__init__()
        self.group = get_group(group) if group is not None else None
        hidden = max(channels // reduction, 1)
        orientations = () if self.group is None else (self.group.order,)
        self.weight_fc1 = nn.Parameter(_kaiming(torch.empty(hidden, channels, *orientations)))
        self.weight_fc2 = nn.Parameter(_kaiming(torch.empty(channels, hidden, *orientations)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, peak = spatial_statistics(x)  # (B, C) or (B, C, G)
        if self.group is None:
            def mlp(v):
                return torch.relu(v @ self.weight_fc1.t()) @ self.weight_fc2.t()
        else:
            fc1 = group_shifted(self.weight_fc1, self.group)  # (L, C, G, G_in)
            fc2 = group_shifted(self.weight_fc2, self.group)  # (C, L, G, G_in)

            def mlp(v):
                hidden = torch.relu(torch.einsum("lcgh,bch->blg", fc1, v))
                return torch.einsum("clgh,blh->bcg", fc2, hidden)
        return torch.sigmoid(mlp(mean) + mlp(peak))[..., None, None]


class FullChannelAttention(nn.Module):
    """Channel attention on the un-summed responses of an attentive convolution.

    One MLP per output channel, shared over output orientations through the
    group shift.

    Args:
        out_channels: C_out of the convolution.
        in_channels: C_in of the convolution.
        reduction: hidden width is ``max(in_channels // reduction, 1)``.
        group: the group.
        lifting: True when the convolution is a lifting one (planar input).

    Shape: lifting f~ ``(B, C_out, G, C_in, X, Y)`` -> ``(B, C_out, G, C_in, 1, 1)``;
    group f~ ``(B, C_out, G, C_in, G_in, X, Y)`` -> ``(B, C_out, G, C_in, G_in, 1, 1)``.
    """

    def __init__(self, out_channels, in_channels, reduction=1, *, group, lifting):
        super().__init__()
        self.group = get_group(group)
        self.lifting = lifting
        hidden = max(in_channels // reduction, 1)
        orientations = () if lifting else (self.group.order,)
        shape1 = (out_channels, hidden, in_channels, *orientations)
        shape2 = (out_channels, in_channels, hidden, *orientations)
        self.weight_fc1 = nn.Parameter(_kaiming(torch.empty(shape1)))
        self.weight_fc2 = nn.Parameter(_kaiming(torch.empty(shape2)))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.from_statistics(*spatial_statistics(f))[..., None, None]

    def from_statistics(self, mean: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
        """The attention from the spatial mean and max of f~.

        Shape: ``(B, C_out, G, C_in[, G_in])`` each -> same.
        """
        if self.lifting:
            def mlp(v):
                hidden = torch.relu(torch.einsum("olc,bogc->bogl", self.weight_fc1, v))
                return torch.einsum("ocl,bogl->bogc", self.weight_fc2, hidden)
        else:
            fc1 = group_shifted(self.weight_fc1, self.group)  # (O, L, C, G, G_in)
            fc2 = group_shifted(self.weight_fc2, self.group)  # (O, C, L, G, G_in)

            def mlp(v):
                hidden = torch.relu(torch.einsum("olcgh,bogch->boglh", fc1, v))
                return torch.einsum("oclgh,boglh->bogch", fc2, hidden)
        return torch.sigmoid(mlp(mean) + mlp(peak))

    def rows_from_statistics(self, mean: torch.Tensor, peak: torch.Tensor, rows: slice) -> torch.Tensor:
        """:meth:`from_statistics` for the (output channel, orientation) pairs ``rows`` of the flattened O * G axis.

        Shape: ``(B, q, C_in[, G_in])`` each, q = len(rows) -> same.
        """
        n = self.group.order
        if self.lifting:
            owner = torch.arange(self.weight_fc1.shape[0] * n, device=mean.device)[rows] // n
            fc1, fc2 = self.weight_fc1[owner], self.weight_fc2[owner]  # (q, L, C), (q, C, L)

            def mlp(v):
                return torch.einsum("qcl,bql->bqc", fc2, torch.relu(torch.einsum("qlc,bqc->bql", fc1, v)))
        else:
            # (O, ., ., G, G_in) -> (O * G, ., ., G_in), then the requested rows
            fc1 = group_shifted(self.weight_fc1, self.group).permute(0, 3, 1, 2, 4).flatten(0, 1)[rows]
            fc2 = group_shifted(self.weight_fc2, self.group).permute(0, 3, 1, 2, 4).flatten(0, 1)[rows]

            def mlp(v):
                return torch.einsum("qclh,bqlh->bqch", fc2, torch.relu(torch.einsum("qlch,bqch->bqlh", fc1, v)))
        return torch.sigmoid(mlp(mean) + mlp(peak))
