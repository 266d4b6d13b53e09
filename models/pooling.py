"""Pooling for group feature maps ``(B, C, G, X, Y)``.

Spatial pooling acts on every plane alike, so it commutes with the group action
whenever the pooling windows tile the plane exactly (window == stride and the
size divisible by it, or a window covering the whole plane); the paper's
architectures keep to that (strided convolutions break equivariance, see its
appendix). Pooling over the group axis gives invariant planar maps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["spatial_max_pool", "spatial_avg_pool", "group_max_pool", "group_mean_pool"]


def _planar(pool, x: torch.Tensor, kernel_size: int, stride: int | None) -> torch.Tensor:
    if x.dim() == 4:  # planar (Z2) networks share the architectures
        return pool(x, kernel_size, stride)
    b, c, n = x.shape[:3]
    out = pool(x.reshape(b, c * n, *x.shape[-2:]), kernel_size, stride)  # (B, C * G, X, Y)
    return out.view(b, c, n, *out.shape[-2:])  # (B, C, G, X', Y')


def spatial_max_pool(x: torch.Tensor, kernel_size: int, stride: int | None = None) -> torch.Tensor:
    """Max pooling of every plane. Shape: ``(B, C, G, X, Y)`` -> ``(B, C, G, X', Y')`` (or planar 4-D)."""
    return _planar(F.max_pool2d, x, kernel_size, stride)


def spatial_avg_pool(x: torch.Tensor, kernel_size: int, stride: int | None = None) -> torch.Tensor:
    """Average pooling of every plane. Shape as :func:`spatial_max_pool`."""
    return _planar(F.avg_pool2d, x, kernel_size, stride)


def group_max_pool(x: torch.Tensor) -> torch.Tensor:
    """Max over the group axis. Shape: ``(B, C, G, X, Y)`` -> ``(B, C, X, Y)``."""
    return x.amax(dim=2)


def group_mean_pool(x: torch.Tensor) -> torch.Tensor:
    """Mean over the group axis. Shape: ``(B, C, G, X, Y)`` -> ``(B, C, X, Y)``."""
    return x.mean(dim=2)
