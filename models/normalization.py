"""Batch normalisation of group feature maps, shared over the group axis."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["GroupBatchNorm"]


class GroupBatchNorm(nn.BatchNorm3d):
    """BatchNorm whose statistics and affine parameters are shared by all G orientations of a channel.

    Sharing over the group axis is what keeps it equivariant: ``nn.BatchNorm3d``
    on ``(B, C, G, X, Y)`` pools over (B, G, X, Y) per channel, exactly as the
    paper's code does, and its state-dict names match the paper's checkpoints.

    Shape: ``(B, C, G, X, Y)`` -> same.
    """

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() != 5:
            raise ValueError(f"GroupBatchNorm expects (B, C, G, X, Y), got {tuple(x.shape)}")
