"""Compiled CPU kernels for the full attentive convolution (``attention_kernels.cpp``), and their autograd.

The kernels compute the max statistics of f~ and the channel-attended sum S
without writing f~ to memory (see the C++ file for the loops). They are built
with the C++ compiler on first use (``$CXX``, else ``g++``; about five seconds),
cached under ``$AAGC_CACHE`` (default ``~/.cache/aagc``) by a hash of the
source, flags and CPU, and loaded with ctypes. Where there is no compiler, the
tensors are not on the CPU or not float32/float64, the CPU's instruction set is not
one where they were measured faster (``models.cpu.native_build``), or ``AAGC_NATIVE=0``, the
callers use their PyTorch path, which computes the same function.

The kernels run on ``torch.get_num_threads()`` OpenMP threads, those of PyTorch's
own runtime where it is GNU OpenMP (Linux wheels), so that the two never compete
for the cores.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from .native_build import build_library

__all__ = [
    "available", "lanes", "spatial_max", "attention_branch", "branch_supported", "depthwise_pair",
    "depthwise_pair_supported",
]

SOURCE = Path(__file__).with_name("attention_kernels.cpp")
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CTYPE = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}


def available(*tensors: torch.Tensor, channels: int = 1) -> bool:
    """Whether the kernels can run on these tensors (CPU, float32/64; for the max over c, at most 255 channels)."""
    return (
        channels <= 255  # the winning channel is stored in one byte
        and all(t.device.type == "cpu" and t.dtype in _SUFFIX for t in tensors)
        and len({t.dtype for t in tensors}) == 1
        and _library() is not None
    )


def _library() -> ctypes.CDLL | None:
    return build_library(SOURCE)


def lanes() -> int:
    """Filters per vector in the kernels as built for this CPU (LANES in the C++ file: 16 on AVX-512, 8 on AVX2)."""
    function = _library().lanes
    function.restype = ctypes.c_int64
    return function()


def _pointer(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _workers(batch: int) -> int:
    return max(1, min(torch.get_num_threads(), batch))


def _run(name, dtype, batch, geometry, *tensors, private: torch.Tensor | None = None) -> None:
    """Call kernel ``name``, its OpenMP threads sharing the range ``[0, batch)``.

    ``private``, if given, is a ``(workers, ...)`` output of which each thread gets its
    own slice, appended to the arguments (for sums over the batch).
    """
    function = getattr(_library(), f"{name}_{_SUFFIX[dtype]}")
    g = torch.tensor(geometry, dtype=torch.int64)
    args = [_pointer(t) for t in tensors]
    if private is not None:
        args += [_pointer(private), ctypes.c_int64(private[0].numel())]
    function(_pointer(g), ctypes.c_int64(_workers(batch)), ctypes.c_int64(batch), *args)


def _geometry(padded: torch.Tensor, c: int, h: int, out: tuple[int, int], k: int, stride: int, dilation: int, q: int):
    return [c, h, padded.shape[-2], padded.shape[-1], out[0], out[1], k, stride, dilation, q]


def _lanes_last(t: torch.Tensor, axis: int) -> torch.Tensor:
    """The filter axis ``axis`` (length Q) moved last, contiguous, zero-padded to Q' = max(Q, lanes())."""
    moved = t.movedim(axis, -1)
    width = lanes()
    return F.pad(moved, (0, width - moved.shape[-1])).contiguous() if moved.shape[-1] < width else moved.contiguous()


def spatial_max(padded: torch.Tensor, kernels: torch.Tensor, h: int, out, stride: int, dilation: int, dense=None):
    """The max over output positions of f~ and where it lies (the first maximum).

    Args:
        padded: the padded input planes ``(B, C * H, Xp, Yp)``.
        kernels: the filters ``(Q, C * H, k * k)``.
        dense: optionally, another statistic of ``padded`` to compute alongside, as the pair
            ``(forward(padded), backward(grad, shape))``, the latter returning a new tensor: the
            gradient of ``padded`` that the max's sparse one is then added into, so that the
            backward pass holds one tensor the size of the input rather than two.

    Returns: value ``(B, C * H, Q)``, differentiable with respect to both arguments (its
    gradient reaches the one input patch where the max lies), and ``(B, C * H, Q)`` int32
    flat indices into the ``(X', Y')`` output grid; with ``dense``, its value (differentiable) first.
    """
    q, c, k = kernels.shape[0], padded.shape[1] // h, round(kernels.shape[-1] ** 0.5)
    last = _lanes_last(kernels.view(q, c, h, -1), 0)  # differentiable: the gradient flows back through the copy
    geometry = _geometry(padded, c, h, out, k, stride, dilation, last.shape[-1])
    *value_of_dense, value, where = _SpatialMax.apply(padded, last, geometry, dense)
    return *value_of_dense, value[..., :q], where[..., :q]


class _SpatialMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded, filters, geometry, dense):
        padded = padded.contiguous()
        shape = (padded.shape[0], padded.shape[1], filters.shape[-1])
        value, where = padded.new_empty(shape), padded.new_empty(shape, dtype=torch.int32)
        _run("spatial_max", padded.dtype, shape[0], geometry, padded, filters, value, where)
        ctx.save_for_backward(padded, filters, where)
        ctx.mark_non_differentiable(where)
        ctx.geometry, ctx.dense = geometry, dense
        return (value, where) if dense is None else (dense[0](padded), value, where)

    @staticmethod
    def backward(ctx, *grads):
        padded, filters, where = ctx.saved_tensors
        grad = grads[-2]  # the value's (the last is that of where)
        grad_padded = torch.zeros_like(padded) if ctx.dense is None else ctx.dense[1](grads[0], padded.shape)
        sums = filters.new_zeros(_workers(padded.shape[0]), *filters.shape)  # one per thread, added below
        _run("spatial_max_backward", padded.dtype, padded.shape[0], ctx.geometry,
             padded, filters, where, grad.contiguous(), grad_padded, private=sums)
        return grad_padded, sums.sum(dim=0), None, None


def branch_supported(spatial_kernel_size: int) -> bool:
    """Whether :func:`attention_branch` covers a spatial attention of this filter size."""
    return spatial_kernel_size in (3, 5, 7)


def attention_branch(padded, kernels, channel, pairs, mean_scale: float, h: int, out, stride: int, dilation: int,
                     spatial_padding: int, spatial_dilation: int, keep: bool):
    """The residual attention branch of a full attentive convolution, sum over h of alpha_s S, in one kernel.

    S and M are the sum and max over c of alpha_c f~; alpha_s = sigmoid(z) with z the depthwise
    convolutions of S (times ``mean_scale``: the mean over c) and of M with each map's filter pair.

    Args:
        padded: the padded input planes ``(B, C * H, Xp, Yp)``.
        kernels: the filters ``(Q, C, H, k * k)``.
        channel: the channel attention alpha_c ``(B, Q, C, H)``, or None (alpha_c = 1).
        pairs: the spatial attention's filter pairs ``(H * Q, 2, k_s, k_s)``, maps ordered (h, q)
            (see :func:`branch_supported`); its padding and dilation keep the size. None: no
            spatial attention (alpha_s = 1, the branch is sum_h S).
        keep: keep S, M and alpha_s for the backward pass rather than recompute them there, and
            return alpha_s (ignored without spatial attention).

    Returns: the branch ``(B, Q, X', Y')``, and alpha_s ``(B, X', Y', H, Q)`` (channels last) if
    ``keep`` else None; differentiable with respect to all tensor arguments.
    """
    q, c = kernels.shape[:2]
    k, k_s = round(kernels.shape[-1] ** 0.5), 0 if pairs is None else pairs.shape[-1]
    # Differentiable: the gradients flow back through the copies.
    last = _lanes_last(kernels, -4)  # (C, H, k * k, Q')
    alpha = None if channel is None else _lanes_last(channel, 1)  # (B, C, H, Q')
    w1 = w2 = None
    if pairs is not None:
        # Each filter of the pair as (k_s * k_s, H * Q'): (H, Q, k_s^2) -> (H, k_s^2, Q') -> (k_s^2, H, Q').
        w1, w2 = (_lanes_last(f.reshape(h, q, k_s * k_s), 1).transpose(0, 1).reshape(k_s * k_s, -1).contiguous()
                  for f in (pairs[:, 0] * mean_scale, pairs[:, 1]))
    keep = keep and pairs is not None
    geometry = [*_geometry(padded, c, h, out, k, stride, dilation, last.shape[-1]), k_s, spatial_padding,
                spatial_dilation]
    shape = (padded.shape[0], *out, h, last.shape[-1])
    results = _AttentionBranch.apply(padded, last, alpha, w1, w2, geometry, shape, keep)
    branch, gate = results if keep else (results, None)
    branch = branch.view(shape[0], -1, *out)
    if last.shape[-1] == q:
        return branch, gate
    return branch[:, :q], None if gate is None else gate[..., :q]  # without the zero filters


class _AttentionBranch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded, kernels, channel, w1, w2, geometry, shape, keep):
        padded = padded.contiguous()
        b, q = shape[0], shape[-1]
        branch = padded.new_empty(b, q, shape[1] * shape[2])
        # S, M, the winning channels and alpha_s: kept whole, or per thread and sample only.
        kept = [padded.new_empty(shape), padded.new_empty(shape), torch.empty(shape, dtype=torch.uint8),
                padded.new_empty(shape)] if keep else [None] * 4
        _run("branch_forward", padded.dtype, b, geometry, padded, kernels, channel, w1, w2, branch, *kept)
        ctx.save_for_backward(padded, kernels, channel, w1, w2, *kept)
        ctx.geometry = geometry
        if not keep:
            return branch
        return branch, kept[3]

    @staticmethod
    def backward(ctx, grad, grad_gate=None):
        padded, kernels, channel, w1, w2, *kept = ctx.saved_tensors
        # Written whole by the kernel.
        grad_padded = torch.empty_like(padded)
        grad_channel = None if channel is None else torch.empty_like(channel)
        sizes = (kernels.numel(), *(0 if w is None else w.numel() for w in (w1, w2)))
        sums = kernels.new_zeros(_workers(padded.shape[0]), sum(sizes))  # one per thread, added below
        grad_gate = None if grad_gate is None else grad_gate.contiguous()
        _run("branch_backward", padded.dtype, padded.shape[0], ctx.geometry, padded, kernels, channel, w1, w2,
             grad.contiguous(), grad_gate, *kept, grad_padded, grad_channel, private=sums)
        grad_kernels, grad_w1, grad_w2 = sums.sum(dim=0).split(sizes)
        grad_w1, grad_w2 = (None if w is None else grad.view_as(w) for grad, w in ((grad_w1, w1), (grad_w2, w2)))
        return grad_padded, grad_kernels.view_as(kernels), grad_channel, grad_w1, grad_w2, None, None, None


def depthwise_pair_supported(channels: int, k: int) -> bool:
    """Whether :func:`depthwise_pair` covers this channel count and filter size."""
    return channels >= lanes() and k in (3, 5, 7)


def depthwise_pair(first, second, first_weight, second_weight, padding: int, dilation: int) -> torch.Tensor:
    """Two depthwise convolutions, summed: ``conv(first, first_weight) + conv(second, second_weight)``.

    The same function as ``F.conv2d(x, w[:, None], padding=padding, dilation=dilation,
    groups=channels)`` for each pair, in one pass over both inputs; the backward pass
    takes both input gradients in one pass over the incoming gradient. Stride 1; the
    padding keeps the size. See :func:`depthwise_pair_supported`.

    Shape: ``(B, CH, X, Y)`` each (best channels last), ``(CH, k, k)`` each -> ``(B, CH, X, Y)``, channels last.
    """
    return _DepthwisePair.apply(first, second, first_weight, second_weight, padding, dilation)


def _taps_last(weight: torch.Tensor, flip: bool = False) -> torch.Tensor:
    """``(CH, k, k)`` -> ``(k * k, CH)``, contiguous; ``flip``: the filter turned by 180 degrees."""
    weight = weight.flip(-2, -1) if flip else weight
    return weight.reshape(weight.shape[0], -1).t().contiguous()


class _DepthwisePair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, first, second, first_weight, second_weight, padding, dilation):
        last = torch.channels_last
        first, second = first.contiguous(memory_format=last), second.contiguous(memory_format=last)
        b, channels, x, y = first.shape
        ctx.geometry = [x, y, channels, first_weight.shape[-1], padding, dilation]
        out = torch.empty_like(first)
        # The kernels split rows (b, x) over threads: a chunk of few samples still splits evenly.
        _run("depthwise_pair_forward", first.dtype, b * x, ctx.geometry,
             first, second, _taps_last(first_weight), _taps_last(second_weight), out)
        ctx.save_for_backward(first, second, first_weight, second_weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        first, second, first_weight, second_weight = ctx.saved_tensors
        grad = grad.contiguous(memory_format=torch.channels_last)
        rows, channels, k = first.shape[0] * first.shape[2], first.shape[1], first_weight.shape[-1]
        grads = [None] * 6
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            # The input gradient of a size-keeping convolution is the same convolution of the
            # incoming gradient with the filter turned by 180 degrees (odd k).
            grads[0], grads[1] = torch.empty_like(first), torch.empty_like(second)
            _run("depthwise_pair_input_grad", first.dtype, rows, ctx.geometry,
                 grad, _taps_last(first_weight, flip=True), _taps_last(second_weight, flip=True), *grads[:2])
        for i, planes in enumerate((first, second)):
            if ctx.needs_input_grad[2 + i]:
                sums = planes.new_zeros(_workers(rows), k * k, channels)  # one per thread, added below
                _run("depthwise_weight_grad", planes.dtype, rows, ctx.geometry, planes, grad, private=sums)
                grads[2 + i] = sums.sum(dim=0).t().reshape(first_weight.shape)
        return tuple(grads)
