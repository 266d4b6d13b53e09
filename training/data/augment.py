"""Batch augmentations that run on tensors, on whatever device the batch lives on.

``flip_and_crop`` is the "CIFAR10+" augmentation of the paper's CIFAR-10 experiments (as in
the ResNet paper): a random horizontal flip and a random 32x32 crop of the image padded by 4
zero pixels. It is done for the whole batch with two gathers instead of a loop per image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["flip_and_crop"]


def flip_and_crop(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Flip each image horizontally with probability 1/2, then crop it at a random shift.

    Output ``b`` is ``padded[b, :, dy:dy+H, dx:dx+W]`` of the zero-padded image (``dy``, ``dx``
    uniform in ``0..2*padding``), mirrored left-right when its coin says so. The random numbers
    are drawn on the generator's device, so a seed gives the same batch on CPU and GPU.

    Args:
        images: ``(B, C, H, W)``.
        generator: the source of all randomness (flip first, then row shifts, then column shifts).
        padding: zero pixels added on each side before cropping.

    Returns:
        ``(B, C, H, W)``, same dtype and device as ``images``.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    b, c, h, w = images.shape
    flip = torch.rand(b, generator=generator, device=generator.device) < 0.5
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=generator.device)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=generator.device)
    flip, dy, dx = flip.to(images.device), dy.to(images.device), dx.to(images.device)
    padded = F.pad(images, (padding, padding, padding, padding))  # (B, C, H + 2p, W + 2p)
    rows = dy[:, None] + torch.arange(h, device=images.device)  # (B, H)
    columns = torch.arange(w, device=images.device).expand(b, w)
    columns = dx[:, None] + torch.where(flip[:, None], w - 1 - columns, columns)  # (B, W), reversed if flipped
    out = padded.gather(2, rows[:, None, :, None].expand(b, c, h, w + 2 * padding))  # (B, C, H, W + 2p)
    return out.gather(3, columns[:, None, None, :].expand(b, c, h, w))  # (B, C, H, W)
