"""Large 3x3 convolutions in inference through NNPACK's FFT, bundled with PyTorch's CPU build.

Where it applies, the PCam DenseNets' first dense layer (72 -> 72 channels on 94 x 94 planes), NNPACK
convolved 1.6x (8 images) to 2.1x (16) faster than oneDNN's direct convolution on the host first measured
(``python -m benchmarks.fast_paths``); on a Xeon on 2026-11-28, 8 images: 1.4x on AVX2 code (46.9 against
67.5 ms), the case the app's latency needs, and 0.95x with AVX-512 (46.2 against 43.9 ms). As accurately:
it works in 16 x 16 FFT tiles, exact but for round-off, which is then of the direct sum's size (errors
against float64 of about 1e-7 of the sum of absolute terms, tests/test_nnpack.py).

When it applies: no gradient wanted (NNPACK's backward pass is not used), float32 on the CPU, a 3x3
filter, stride 1, no dilation, at least 64 input channels, at least 2 images and both output sides at
least ``MIN_OUTPUT_SIDE``. The last two conditions matter for accuracy, not only speed: for one image
PyTorch calls NNPACK's inference routine, and for several NNPACK picks the algorithm by tile counts,
choosing 8 x 8 Winograd tiles for outputs up to 72 pixels a side (that is, F(6x6, 3x3), whose round-off
is some 50 times the direct sum's: 5e-6 of it, measured); at 73 or more it always takes the FFT.
``AAGC_NNPACK=0`` switches it off.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["MIN_OUTPUT_SIDE", "applies", "conv3x3"]

MIN_OUTPUT_SIDE = 80  # NNPACK takes FFT tiles from 73 on; a margin above it
MIN_CHANNELS = 64  # below, oneDNN is as fast or faster (measured: 24 and 40 channels on 94 x 94, one image)


@functools.cache
def _available() -> bool:
    # The first call also initialises NNPACK, which its convolution needs.
    return bool(torch._nnpack_available())


def applies(x: torch.Tensor, filters: torch.Tensor, stride: int, padding: int, dilation: int) -> bool:
    """Whether :func:`conv3x3` computes ``F.conv2d(x, filters, ...)`` here (see the module's docstring)."""
    if torch.is_grad_enabled() and (x.requires_grad or filters.requires_grad):
        return False
    if x.dim() != 4 or x.device.type != "cpu" or x.dtype != torch.float32 or filters.dtype != torch.float32:
        return False
    if filters.shape[-2:] != (3, 3) or stride != 1 or dilation != 1 or x.shape[1] < MIN_CHANNELS or x.shape[0] < 2:
        return False
    out = [side + 2 * padding - 2 for side in x.shape[-2:]]
    return min(out) >= MIN_OUTPUT_SIDE and os.environ.get("AAGC_NNPACK", "1") != "0" and _available()


def conv3x3(x: torch.Tensor, filters: torch.Tensor, padding: int) -> torch.Tensor:
    """``F.conv2d(x, filters, padding=padding)`` through NNPACK. Shape: ``(B, C_in, X, Y)``, ``(C_out, C_in, 3, 3)``
    -> ``(B, C_out, X + 2 padding - 2, Y + 2 padding - 2)``."""
    return torch._nnpack_spatial_convolution(x.contiguous(), filters.contiguous(), None, [padding, padding], [1, 1])
