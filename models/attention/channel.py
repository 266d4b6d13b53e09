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
        return self.from_statistics(*spatial_statistics(x))[..., None, None]

    def from_statistics(self, mean: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
        """The attention from each channel's spatial mean and max. Shape: ``(B, C[, G])`` each -> same."""
        if self.group is None:
            def mlp(v):
                return torch.relu(v @ self.weight_fc1.t()) @ self.weight_fc2.t()
        else:
            fc1 = group_shifted(self.weight_fc1, self.group)  # (L, C, G, G_in)
            fc2 = group_shifted(self.weight_fc2, self.group)  # (C, L, G, G_in)

            def mlp(v):
                hidden = torch.relu(torch.einsum("lcgh,bch->blg", fc1, v))
                return torch.einsum("clgh,blh->bcg", fc2, hidden)
        return torch.sigmoid(mlp(mean) + mlp(peak))

    def matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP's two layers as matrices on flattened statistics, the group shift applied: hidden = relu(v @ first),
        logits = hidden @ second, with v ``(B, C * G)`` (index c G + h), hidden ``(B, L * G)`` and logits ``(B, C * G)``
        (planar: G = 1). The same function as :meth:`from_statistics`, up to the order of its sums: two matrix
        products for both statistics at once, where the einsums cost more than the arithmetic in inference.

        Shape: ``(C * G, L * G)`` and ``(L * G, C * G)``.
        """
        if self.group is None:
            return self.weight_fc1.t(), self.weight_fc2.t()
        fc1 = group_shifted(self.weight_fc1, self.group)  # (L, C, G, G_in): first[(c, h), (l, g)] = fc1[l, c, g, h]
        fc2 = group_shifted(self.weight_fc2, self.group)  # (C, L, G, G_in): second[(l, h), (c, g)] = fc2[c, l, g, h]
        first = fc1.permute(1, 3, 0, 2).reshape(fc1.shape[1] * fc1.shape[3], -1)
        second = fc2.permute(1, 3, 0, 2).reshape(fc2.shape[1] * fc2.shape[3], -1)
        return first, second


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
        o, n = mean.shape[1], mean.shape[2]
        if self.lifting:  # one MLP per o, shared by the orientations g
            fc1, fc2 = (w[:, None].expand(-1, n, -1, -1) for w in (self.weight_fc1, self.weight_fc2))
            fc1, fc2 = fc1.reshape(o * n, *fc1.shape[2:]), fc2.reshape(o * n, *fc2.shape[2:])
            stats = torch.stack((mean, peak)).flatten(2, 3)  # (2, B, O * G, C)
        else:  # one MLP per (o, g, h): (O, ., ., G, G_in) -> (O * G * G_in, ., .)
            fc1, fc2 = (group_shifted(w, self.group).permute(0, 3, 4, 1, 2).flatten(0, 2)
                        for w in (self.weight_fc1, self.weight_fc2))
            stats = torch.stack((mean, peak)).permute(0, 1, 2, 3, 5, 4).flatten(2, 4)  # (2, B, O * G * G_in, C)
        # Both statistics in one call, the weights on the left: the matmuls are small and
        # batched over the MLPs, and this layout runs them about twice as fast as einsum's.
        v = stats.permute(2, 3, 0, 1).flatten(2)  # (MLPs, C, 2 * B)
        out = torch.bmm(fc2, torch.relu(torch.bmm(fc1, v))).unflatten(2, (2, -1))  # (MLPs, C, 2, B)
        logits = out[:, :, 0] + out[:, :, 1]  # (MLPs, C, B)
        # The sigmoid, which keeps its output for the backward pass, writes it in the layout the
        # compiled attention kernels read, (B, C[, G_in], O, G): they then need no copy of their own.
        if self.lifting:
            alpha = torch.sigmoid(logits.view(o, n, -1, logits.shape[-1]).permute(3, 2, 0, 1).contiguous())
            return alpha.permute(0, 2, 3, 1)  # (B, O, G, C)
        logits = logits.view(o, n, mean.shape[4], -1, logits.shape[-1]).permute(4, 3, 2, 0, 1).contiguous()
        return torch.sigmoid(logits).permute(0, 3, 4, 1, 2)  # (B, O, G, C, G_in)

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
