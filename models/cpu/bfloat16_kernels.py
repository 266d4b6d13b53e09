"""The PCam networks' inference in bfloat16, channels last, between oneDNN's convolutions (``bfloat16_kernels.cpp``).

oneDNN convolves bfloat16 channels-last maps at 6-9 times its float32 rate on a CPU with AMX (a 3x3 conv of 72 to 72
channels on 94 x 94 planes: 344 against 55 G multiply-adds/s on one Sapphire Rapids core), but a network only gains
that where what runs between its convolutions reads and writes the same tensors: PyTorch's autocast around the
float32 network measured 1.0x, its casts and float32 reductions eating the gain. These kernels are that in-between
work on bfloat16 channels-last maps, inference only (no gradient wanted):

* :func:`relu_bn`: a DenseNet's ``relu(bn(cat(parts)))``, the running statistics folded into one scale and shift;
* :func:`attend`: alpha_F, ``f - alpha_s (alpha_c f)``, with the channel and spatial statistics accumulated in
  float32 from the bfloat16 input, the channel MLP in PyTorch in float32 (it is tiny), and the spatial filter as
  AMX tile products of split statistics and weights, or a direct float32 loop (its 16 -> 8 channels are too few for
  oneDNN's blocked kernels: 27 G multiply-adds/s in float32 and 54 in bfloat16 there); the gate optionally pooled,
  or written twice for a convolution by split weights, in its own pass.

A map ``(B, C, [G,] X, Y)`` is held channels last: its memory is ``(B, X, Y, C, G)`` (:func:`channels_last`), so
that a group map's view as ``(B, C * G, X, Y)`` is a channels-last tensor for oneDNN and back, with no copy. Every
result is rounded once from float32, to nearest even as PyTorch's own cast. Which layers use them the layers decide
(``models.attention.input_attentive_conv``, ``models.cpu.relu_bn``); this package imports nothing of
them, and a layer or input these kernels do not cover runs PyTorch's path.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .native_build import build_library

__all__ = ["available", "applies", "channels_last", "is_channels_last", "empty_channels_last", "relu_bn", "attend",
           "SpatialFilter", "tiles", "ORIENTATIONS"]

SOURCE = Path(__file__).with_name("bfloat16_kernels.cpp")
ORIENTATIONS = (1, 4, 8)  # the orientation counts compiled (an image, p4, p4m)
_SLACK = 16  # floats readable past the spatial filter's padded planes (its loads are 16 wide)


def available() -> bool:
    """Whether the kernels are built here (see :mod:`models.cpu.native_build`)."""
    return build_library(SOURCE) is not None


def applies(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: bfloat16 on the CPU, no gradient wanted, the kernels built."""
    return (all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and available())


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` ``(B, C, [G,] X, Y)`` has the memory of a contiguous ``(B, X, Y, C[, G])``."""
    order = (0, 2, 3, 1) if x.dim() == 4 else (0, 3, 4, 1, 2)
    return x.permute(order).is_contiguous()


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(B, C, [G,] X, Y)`` with the memory of a contiguous ``(B, X, Y, C[, G])`` (``x`` itself if it has)."""
    if is_channels_last(x):
        return x
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x.permute(0, 3, 4, 1, 2).contiguous().permute(0, 3, 4, 1, 2)


def empty_channels_last(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An uninitialised ``(B, C, [G,] X, Y)`` tensor held channels last."""
    if len(shape) == 4:
        b, c, x, y = shape
        return torch.empty(b, x, y, c, dtype=dtype).permute(0, 3, 1, 2)
    b, c, g, x, y = shape
    return torch.empty(b, x, y, c, g, dtype=dtype).permute(0, 3, 4, 1, 2)


def _pointer(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _geometry(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _call(name: str, geometry: torch.Tensor, *args) -> int:
    function = getattr(build_library(SOURCE), name)
    function.restype = ctypes.c_int
    with torch.profiler.record_function(f"aagc::{name}"):  # named in profiles (benchmarks.engine_profile)
        return function(_pointer(geometry), ctypes.c_int64(torch.get_num_threads()), *args)


def relu_bn(parts: tuple[torch.Tensor, ...], scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor | None:
    """``relu(cat(parts, dim=1) * scale + shift)``, scale and shift per channel of the concatenation (float32).

    Shape: parts ``(B, C_i, [G,] X, Y)`` bfloat16, each pixel's ``C_i * G`` values contiguous (a cropped view of a
    channels-last map is fine) -> ``(B, sum C_i, [G,] X, Y)`` channels last; None where a part is laid out otherwise.
    """
    planar = parts[0].dim() == 4
    grouped = [p.unsqueeze(2) if planar else p for p in parts]  # (B, C_i, G, X, Y), G = 1 if planar
    b, _, g, rows, cols = grouped[0].shape
    if any(p.stride(2) != 1 and g > 1 or p.stride(1) != g for p in grouped):
        return None
    channels = sum(p.shape[1] for p in parts)
    out = empty_channels_last((b, channels, g, rows, cols))
    strides = _geometry(*(v for p in grouped for v in (p.shape[1] * g, p.stride(0), p.stride(3), p.stride(4))))
    scale, shift = (t.float().repeat_interleave(g).contiguous() for t in (scale, shift))  # per value of a pixel
    pointers = (ctypes.c_void_p * len(parts))(*(p.data_ptr() for p in grouped))
    _call("bf16_relu_bn", _geometry(b, rows, cols, len(parts)), _pointer(strides), pointers, _pointer(scale),
          _pointer(shift), _pointer(out))
    return out[:, :, 0] if planar else out


@dataclass(frozen=True)
class SpatialFilter:
    """alpha_F's spatial filter over the group, laid out once for the kernels (a layer keeps it while its weights
    stay as they are).

    Attributes:
        bank: ``(G_out, 2 G, k, k)`` float32 (``G`` = 1 for an image, whose ``G_out`` responses are then maxed over:
            ``lifting``).
        dilation: the filter's; its padding keeps the size.
        tiles, tiles_lo: ``(k * k, 2 G, G_out, 2)`` bfloat16, each tap's weights as AMX's pairs of input channels,
            for the statistics as ``[hi | lo]``: ``[w_hi | w_hi]`` and ``[w_lo | 0]`` (w_hi + w_lo the float32
            weight to 16 bits of mantissa), so that the tiles' sums are those of float32 statistics and weights.
        loop: ``(k, k, 2 G, G_out)`` float32, for the AVX-512 loop.
    """

    bank: torch.Tensor
    dilation: int
    lifting: bool
    tiles: torch.Tensor
    tiles_lo: torch.Tensor
    loop: torch.Tensor

    @classmethod
    def of(cls, bank: torch.Tensor, dilation: int, lifting: bool) -> SpatialFilter:
        bank = bank.detach().float()
        out_channels, inputs, k, _ = bank.shape
        loop = bank.permute(2, 3, 1, 0).contiguous()  # (k, k, 2 G, G_out)
        hi = loop.to(torch.bfloat16)
        lo = (loop - hi.float()).to(torch.bfloat16)

        def pairs(weights: torch.Tensor) -> torch.Tensor:  # (k, k, 4 G, G_out) -> (k * k, 2 G, G_out, 2)
            return weights.reshape(k * k, inputs, 2, out_channels).transpose(2, 3).contiguous()

        return cls(bank, dilation, lifting, pairs(torch.cat((hi, hi), dim=2)),
                   pairs(torch.cat((lo, torch.zeros_like(lo)), dim=2)), loop)


def attend(f: torch.Tensor, channel_mlp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           spatial: SpatialFilter, pool: int = 1, copies: int = 1
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """alpha_F of ``f`` in bfloat16 channels last: ``f - alpha_s (alpha_c f)``, pooled over ``pool`` x ``pool`` tiles
    where ``pool`` > 1 (the sides multiples of it); with ``copies`` 2 its channels twice over, ``[out | out]``, the
    input of a convolution by split weights (:func:`models.gconv.split_bank`), written in the gate's own pass.

    Args:
        f: ``(B, C, X, Y)`` (an image: ``spatial.lifting``) or ``(B, C, G, X, Y)`` bfloat16.
        channel_mlp: alpha_c from the spatial mean and max, float32 ``(B, C * G)`` each -> ``(B, C * G)``.
        spatial: the spatial filter.

    Returns:
        The attended ``f`` (same shape, or its planes pooled; ``copies`` times its channels) channels last, and the
        channel ``(B, C, [G,] 1, 1)`` and spatial ``(B, 1, [G,] X, Y)`` parts in float32, as the PyTorch path gives
        them; None where the orientation count has no compiled kernel.
    """
    h = 1 if f.dim() == 4 else f.shape[2]
    out_channels = spatial.bank.shape[0]
    if h not in ORIENTATIONS or out_channels not in ORIENTATIONS or spatial.bank.shape[1] != 2 * h:
        return None
    f = channels_last(f)
    b, c, (rows, cols) = f.shape[0], f.shape[1], f.shape[-2:]
    mean, peak = torch.empty(b, c * h), torch.empty(b, c * h)
    _call("bf16_spatial_stats", _geometry(b, rows * cols, c * h), _pointer(f), _pointer(mean), _pointer(peak))
    alpha_c = channel_mlp(mean, peak).float().contiguous()  # (B, C * G)
    response = _spatial_filter(f, alpha_c, spatial)  # (B, X, Y, G_out)
    if spatial.lifting:
        response = response.amax(dim=-1, keepdim=True)  # (B, X, Y, 1): invariant to the filter's orientation
    alpha_s = torch.sigmoid(response)  # (B, X, Y, G)
    if pool > 1:
        out = empty_channels_last((b, copies * c, *f.shape[2:-2], rows // pool, cols // pool))
        _call("bf16_gate_pool", _geometry(b, rows, cols, c, h, pool, copies), _pointer(f), _pointer(alpha_c),
              _pointer(alpha_s), _pointer(out))
    else:
        out = empty_channels_last((b, copies * c, *f.shape[2:]))
        _call("bf16_gate", _geometry(b, rows * cols, c, h, copies), _pointer(f), _pointer(alpha_c),
              _pointer(alpha_s), _pointer(out))
    channel = alpha_c.view(b, c, *(() if f.dim() == 4 else (h,)), 1, 1)
    maps = alpha_s.permute(0, 3, 1, 2)  # (B, G, X, Y)
    return out, channel, maps if f.dim() == 4 else maps.unsqueeze(1)


def tiles() -> bool:
    """Whether the spatial filter runs as AMX tile products here: built for AMX, Linux grants the tiles, and
    neither ``AAGC_AMX=0`` nor a ``ONEDNN_MAX_CPU_ISA`` below AMX asks for the AVX-512 loop (what a CPU with
    AVX512-BF16 and no AMX runs, measurable on an AMX machine)."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if os.environ.get("AAGC_AMX") == "0" or ("AMX" not in limit and limit != "ALL"):
        return False
    library = build_library(SOURCE)
    return library is not None and bool(library.bf16_amx())


def _spatial_filter(f: torch.Tensor, alpha_c: torch.Tensor, spatial: SpatialFilter) -> torch.Tensor:
    """The spatial filter's response to the channel statistics of ``alpha_c f``, before its sigmoid: on AMX as tile
    products of the statistics and weights split in bfloat16 halves (float32's to 16 bits), elsewhere in float32.

    Shape: f ``(B, C, [G,] X, Y)`` channels last -> ``(B, X, Y, G_out)`` float32.
    """
    h = 1 if f.dim() == 4 else f.shape[2]
    b, c, (rows, cols) = f.shape[0], f.shape[1], f.shape[-2:]
    out_channels, k = spatial.bank.shape[0], spatial.bank.shape[-1]
    pad = spatial.dilation * (k // 2)
    geometry = _geometry(b, rows, cols, c, h, pad)
    filter_geometry = _geometry(b, rows, cols, 2 * h, k, spatial.dilation)
    response = torch.empty(b, rows, cols, out_channels)
    padded = (rows + 2 * pad) * (cols + 2 * pad) * 2 * h  # values of one image's padded statistics
    # On AMX for a group map's 16 (p4m) or 8 (p4) statistics; an image's 2 fill a tenth of a tile's row, and the
    # loop ran its filter in 0.15 against 1.4 ms (8 patches, one Sapphire Rapids core).
    if tiles() and h > 1:  # (B, X + 2 pad, Y + 2 pad, 4 G): each statistic as [hi | lo]
        pixels = torch.zeros(2 * (b * padded + 3 * _SLACK * 2 * h), dtype=torch.bfloat16)
        _call("bf16_channel_stats", geometry, _pointer(f), _pointer(alpha_c), _pointer(pixels), ctypes.c_int(1))
        if _call("spatial_conv_amx", _geometry(b, rows, cols, 4 * h, k, spatial.dilation),
                 ctypes.c_int64(out_channels), _pointer(pixels), _pointer(spatial.tiles), _pointer(spatial.tiles_lo),
                 _pointer(response)):
            return response
    planes = torch.zeros(b * padded + _SLACK)  # (B, 2 G, X + 2 pad, Y + 2 pad)
    _call("bf16_channel_stats", geometry, _pointer(f), _pointer(alpha_c), _pointer(planes), ctypes.c_int(0))
    _call("spatial_conv", filter_geometry, ctypes.c_int64(out_channels), _pointer(planes), _pointer(spatial.loop),
          _pointer(response))
    return response
