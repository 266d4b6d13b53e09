"""``relu(bn(cat(parts)))`` of the DenseNets, in one pass over memory in inference (``relu_bn_kernels.cpp``).

A dense block's output is its input (cropped) concatenated with its new channels, and the next layer reads it
only through batch norm and ReLU. PyTorch runs the three as three passes, each reading and writing the whole
tensor; in region mode the first transition's input (16 contexts: 16 x 18 x 8 x 92 x 92 floats, 78 MB) is
larger than the L3 cache, and the three passes took 15-20 ms each of a 250 ms forward pass. In inference (no
gradient wanted, batch norm in eval mode, float32/64 on the CPU, the kernels built) a compiled loop reads each
part once and writes the result once, with the running statistics folded into one scale and shift per channel
(as PyTorch's own inference kernel does): the same function, to round-off. Elsewhere, and always in training,
the PyTorch operations run as before. A bfloat16 map in inference (the networks' bfloat16 path) goes through
:func:`models.cpu.bfloat16_kernels.relu_bn`, channels last, or the folded scale and shift in float32 where those
kernels do not take it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import nn

from . import bfloat16_kernels
from .native_build import build_library

__all__ = ["relu_bn"]

SOURCE = Path(__file__).with_name("relu_bn_kernels.cpp")
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _inference(bn: nn.modules.batchnorm._BatchNorm, parts: tuple[torch.Tensor, ...]) -> bool:
    """Batch norm in eval mode, with running statistics, and no gradient wanted."""
    return (not bn.training and bn.running_mean is not None
            and not (torch.is_grad_enabled() and any(p.requires_grad for p in (*parts, *bn.parameters()))))


def _folded(bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """The running statistics and the affine map as one scale and shift per channel, in the parameters' dtype."""
    scale = (bn.weight.detach() if bn.affine else 1) * torch.rsqrt(bn.running_var + bn.eps)
    return scale, (bn.bias.detach() if bn.affine else 0) - bn.running_mean * scale


def _fused(bn: nn.modules.batchnorm._BatchNorm, parts: tuple[torch.Tensor, ...]) -> bool:
    first = parts[0]
    return (_inference(bn, parts) and first.device.type == "cpu" and first.dtype in _SUFFIX
            and all(p.dtype == first.dtype and p.shape[0] == first.shape[0] and p.shape[2:] == first.shape[2:]
                    and p.stride(-1) == 1 for p in parts)
            and build_library(SOURCE) is not None)


def relu_bn(bn: nn.modules.batchnorm._BatchNorm, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``torch.relu(bn(torch.cat(parts, dim=1)))``.

    Args:
        bn: a batch norm over the concatenation's channels (``GroupBatchNorm`` or ``nn.BatchNorm2d``).
        parts: tensors with the same batch and trailing sizes, concatenated along axis 1 in this order; views
            (such as a cropped input) are read in place.

    Shape: parts ``(B, C_i, [G,] X, Y)`` -> ``(B, sum C_i, [G,] X, Y)``.
    """
    if bfloat16_inference := parts[0].dtype == torch.bfloat16 and _inference(bn, parts):
        scale, shift = _folded(bn)
        if bfloat16_kernels.applies(*parts) and (out := bfloat16_kernels.relu_bn(parts, scale, shift)) is not None:
            return out
    if not _fused(bn, parts):
        whole = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if bfloat16_inference:  # the folded statistics on the bfloat16 map, in float32, rounded once
            view = (1, -1) + (1,) * (whole.dim() - 2)
            return torch.relu(whole.float() * scale.view(view) + shift.view(view)).to(whole.dtype)
        return torch.relu(bn(whole))
    first = parts[0]
    channels = sum(p.shape[1] for p in parts)
    planar = first.dim() == 4
    out = first.new_empty(first.shape[0], channels, *first.shape[2:])
    grouped = [p.unsqueeze(2) if planar else p for p in parts]  # (B, C_i, G, X, Y), G = 1 if planar
    strides = torch.tensor([[p.shape[1], *(p.stride(i) for i in (0, 1, 2, 3))] for p in grouped], dtype=torch.int64)
    geometry = torch.tensor([first.shape[0], channels, *grouped[0].shape[2:]], dtype=torch.int64)
    scale, shift = (t.to(first.dtype).contiguous() for t in _folded(bn))
    pointers = (ctypes.c_void_p * len(parts))(*(p.data_ptr() for p in parts))
    kernel = getattr(build_library(SOURCE), f"relu_bn_{_SUFFIX[first.dtype]}")
    kernel(ctypes.c_void_p(geometry.data_ptr()), ctypes.c_int64(torch.get_num_threads()),
           ctypes.c_void_p(strides.data_ptr()), pointers, ctypes.c_void_p(scale.data_ptr()),
           ctypes.c_void_p(shift.data_ptr()), ctypes.c_void_p(out.data_ptr()))
    return out
