"""Compiled CPU kernels for the full attentive convolution (``native_kernels.cpp``), and their autograd.

The kernels compute the max statistics of f~ and the channel-attended sum S
without writing f~ to memory (see the C++ file for the loops). They are built
with the C++ compiler on first use (``$CXX``, else ``g++``; about five seconds),
cached under ``$AAGC_CACHE`` (default ``~/.cache/aagc``) by a hash of the
source, flags and CPU, and loaded with ctypes. Where there is no compiler, the
tensors are not on the CPU or not float32/float64, or ``AAGC_NATIVE=0``, the
callers use their PyTorch path, which computes the same function.

ctypes releases the GIL during a call, so the batch is split over
``torch.get_num_threads()`` Python threads.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["available", "spatial_max", "attended_max", "gated_sum", "depthwise_conv"]

SOURCE = Path(__file__).with_name("native_kernels.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-std=c++20", "-shared", "-fPIC"]
LANES = 16  # filters per vector, as LANES in the C++ file
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


def _cache_dir() -> Path:
    root = os.environ.get("AAGC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "aagc"
    )
    return Path(root)


def _cpu_signature() -> str:
    # -march=native builds for this CPU: a cache shared by another CPU must not load it.
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("AAGC_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *FLAGS, _cpu_signature()]).encode())
    target = _cache_dir() / f"attention_kernels-{digest.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Build beside the target and rename: concurrent first uses never load a half-written file.
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True, capture_output=True)
                os.replace(built, target)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", b"") or b""
            warnings.warn(
                f"could not build the attention kernels ({error}; {detail.decode(errors='replace')[-500:]}); "
                "using the slower PyTorch path",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    return ctypes.CDLL(str(target))


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aagc-kernels")


def _pointer(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _workers(batch: int) -> int:
    return max(1, min(torch.get_num_threads(), batch))


def _run(name, dtype, batch, geometry, *tensors, private: torch.Tensor | None = None) -> None:
    """Call kernel ``name`` over the batch, split into one contiguous range per thread.

    ``private``, if given, is a ``(workers, ...)`` output of which each thread gets its
    own slice, appended to the arguments (for sums over the batch).
    """
    function = getattr(_library(), f"{name}_{_SUFFIX[dtype]}")
    g = torch.tensor(geometry, dtype=torch.int64)
    args = [_pointer(t) for t in tensors]
    workers = _workers(batch)
    bounds = [batch * i // workers for i in range(workers + 1)]

    def call(i):
        own = [] if private is None else [_pointer(private[i])]
        function(_pointer(g), ctypes.c_int64(bounds[i]), ctypes.c_int64(bounds[i + 1]), *args, *own)

    # The calling thread takes the first range itself: handing work to a pool thread and
    # waiting for it costs tens of microseconds, as much as some of these calls take.
    others = [_pool(workers - 1).submit(call, i) for i in range(1, workers)] if workers > 1 else []
    call(0)
    for done in others:
        done.result()


def _geometry(padded: torch.Tensor, c: int, h: int, out: tuple[int, int], k: int, stride: int, dilation: int, q: int):
    return [c, h, padded.shape[-2], padded.shape[-1], out[0], out[1], k, stride, dilation, q]


def _filters_last(filters: torch.Tensor) -> torch.Tensor:
    """``(..., Q, C, H, k * k)`` -> ``(..., C, H, k * k, Q')``, contiguous; Q' = max(Q, LANES), extra filters 0."""
    moved = filters.movedim(-4, -1)
    return F.pad(moved, (0, LANES - moved.shape[-1])).contiguous() if moved.shape[-1] < LANES else moved.contiguous()


def spatial_max(padded: torch.Tensor, kernels: torch.Tensor, h: int, out, stride: int, dilation: int):
    """The max over output positions of f~ and where it lies (the first maximum).

    Args:
        padded: the padded input planes ``(B, C * H, Xp, Yp)``.
        kernels: the filters ``(Q, C * H, k * k)``.

    Returns: value ``(B, C * H, Q)``, differentiable with respect to both arguments (its
    gradient reaches the one input patch where the max lies), and ``(B, C * H, Q)`` int64
    flat indices into the ``(X', Y')`` output grid.
    """
    q, c, k = kernels.shape[0], padded.shape[1] // h, round(kernels.shape[-1] ** 0.5)
    last = _filters_last(kernels.view(q, c, h, -1))  # differentiable: the gradient flows back through the copy
    geometry = _geometry(padded, c, h, out, k, stride, dilation, last.shape[-1])
    value, where = _SpatialMax.apply(padded, last, geometry)
    return value[..., :q], where[..., :q]


class _SpatialMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded, filters, geometry):
        padded = padded.contiguous()
        shape = (padded.shape[0], padded.shape[1], filters.shape[-1])
        value, where = padded.new_empty(shape), padded.new_empty(shape, dtype=torch.int64)
        _run("spatial_max", padded.dtype, shape[0], geometry, padded, filters, value, where)
        ctx.save_for_backward(padded, filters, where)
        ctx.mark_non_differentiable(where)
        ctx.geometry = geometry
        return value, where

    @staticmethod
    def backward(ctx, grad, _):
        padded, filters, where = ctx.saved_tensors
        grad_padded = torch.zeros_like(padded)
        sums = filters.new_zeros(_workers(padded.shape[0]), *filters.shape)  # one per thread, added below
        _run("spatial_max_backward", padded.dtype, padded.shape[0], ctx.geometry,
             padded, filters, where, grad.contiguous(), grad_padded, private=sums)
        return grad_padded, sums.sum(dim=0), None


def attended_max(padded, weights, h: int, out, stride: int, dilation: int):
    """sum over c and max over c of f~ computed with per-sample filters.

    Args:
        padded: the padded input planes ``(B, C * H, Xp, Yp)``.
        weights: per-sample filters ``(B, Q, C, H, k * k)`` (alpha_c K).

    Returns: total and peak, each ``(B, X', Y', H, Q)`` (channels last), differentiable
    with respect to both arguments.
    """
    b, q, c = weights.shape[:3]
    k = round(weights.shape[-1] ** 0.5)
    last = _filters_last(weights)  # differentiable: the gradient flows back through the copy
    geometry = _geometry(padded, c, h, out, k, stride, dilation, last.shape[-1])
    total, peak = _AttendedMax.apply(padded, last, geometry, (b, *out, h, last.shape[-1]))
    if last.shape[-1] == q:
        return total, peak
    return total[..., :q].contiguous(), peak[..., :q].contiguous()  # without the zero filters


class _AttendedMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded, filters, geometry, shape):
        padded = padded.contiguous()
        total, peak = padded.new_empty(shape), padded.new_empty(shape)
        winner = torch.empty(shape, dtype=torch.uint8)
        _run("attended_max_forward", padded.dtype, shape[0], geometry, padded, filters, total, peak, winner)
        ctx.save_for_backward(padded, filters, winner)
        ctx.geometry = geometry
        return total, peak

    @staticmethod
    def backward(ctx, grad_total, grad_peak):
        padded, filters, winner = ctx.saved_tensors
        zeros = padded.new_zeros(winner.shape)
        grad_total = zeros if grad_total is None else grad_total.contiguous()
        grad_peak = zeros if grad_peak is None else grad_peak.contiguous()
        grad_padded, grad_filters = torch.zeros_like(padded), torch.zeros_like(filters)
        _run(
            "attended_max_backward", padded.dtype, padded.shape[0], ctx.geometry,
            padded, filters, grad_total, grad_peak, winner, grad_padded, grad_filters,
        )
        return grad_padded, grad_filters, None, None


def gated_sum(logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``(torch.sigmoid(logits) * values).sum(dim=2)``, transposed, in one pass and with one pass for its gradients.

    Shape: ``(B, P, H, Q)`` each -> ``(B, Q, P)``.
    """
    return _GatedSum.apply(logits, values)


class _GatedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, values):
        gate, values = torch.sigmoid(logits).contiguous(), values.contiguous()
        b, p, h, q = values.shape
        out = values.new_empty(b, q, p)
        _run("gated_sum_forward", values.dtype, b, [p, h, q], gate, values, out)
        ctx.save_for_backward(gate, values)
        return out

    @staticmethod
    def backward(ctx, grad):
        gate, values = ctx.saved_tensors
        grad_logits, grad_values = torch.empty_like(gate), torch.empty_like(values)
        _run("gated_sum_backward", gate.dtype, gate.shape[0], list(gate.shape[1:]),
             gate, values, grad.contiguous(), grad_logits, grad_values)
        return grad_logits, grad_values


def depthwise_conv(planes: torch.Tensor, weight: torch.Tensor, padding: int, dilation: int) -> torch.Tensor:
    """``F.conv2d(planes, weight, padding=padding, dilation=dilation, groups=channels)``, size kept.

    The same forward and input gradient (oneDNN); the weight gradient from the kernels,
    several times faster on channels-last float32 tensors.

    Shape: ``(B, CH, X, Y)``, ``(CH, 1, k, k)`` -> ``(B, CH, X, Y)``.
    """
    return _DepthwiseConv.apply(planes, weight, padding, dilation)


class _DepthwiseConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, planes, weight, padding, dilation):
        ctx.save_for_backward(planes, weight)
        ctx.padding, ctx.dilation = padding, dilation
        return F.conv2d(planes, weight, padding=padding, dilation=dilation, groups=weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        planes, weight = ctx.saved_tensors
        channels, k = weight.shape[0], weight.shape[-1]
        grad_planes = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_planes = torch.ops.aten.convolution_backward(
                grad, planes, weight, None, [1, 1], [ctx.padding] * 2, [ctx.dilation] * 2,
                False, [0, 0], channels, [True, False, False],
            )[0]
        if ctx.needs_input_grad[1]:
            last = torch.channels_last
            b, _, x, y = planes.shape
            sums = planes.new_zeros(_workers(b), k * k, channels)  # one per thread, added below
            _run(
                "depthwise_weight_grad", planes.dtype, b, [x, y, channels, k, ctx.padding, ctx.dilation],
                planes.contiguous(memory_format=last), grad.contiguous(memory_format=last), private=sums,
            )
            grad_weight = sums.sum(dim=0).t().reshape(weight.shape)
        return grad_planes, grad_weight, None, None
