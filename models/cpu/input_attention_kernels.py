"""alpha_F's big-tensor steps in compiled CPU kernels (``input_attention_kernels.cpp``), with their autograd.

alpha_F attends to a layer's input f: alpha_c from each channel's spatial mean and max, a = alpha_c f,
alpha_s from the mean and max of a over channels, and ``f - alpha_s a``. Everything f-sized (the statistics,
the gate and their gradients) runs in the kernels, three passes forward and three backward; the small
networks in between (the channel MLP, the spatial convolution) stay in PyTorch, built forward as small graphs
of their own and differentiated inside this function's backward pass. The result equals
``AttentiveLayer.attend`` up to the order of the additions in the statistics (tested in float64), and
gradients reach the same maxima (ties go to the first, as torch.max).

Used where the kernels build (see :mod:`models.cpu.native_build`) and the tensors are float32 or float64 on the
CPU; elsewhere the layers run their PyTorch path. Which layers the kernels cover (alpha_F with both parts and
statistics-based spatial attention) the layers decide (``models.attention.input_attentive_conv.kernels_cover``):
this package imports nothing of the attention modules.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

import torch

from .native_build import build_library

__all__ = ["supported", "attend", "wants_graph"]

SOURCE = Path(__file__).with_name("input_attention_kernels.cpp")
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def supported(f: torch.Tensor) -> bool:
    """Whether :func:`attend` covers this input (for a layer the kernels cover, see the module's docstring): at
    most 256 channels (the winning channel is kept in a byte), float32/64 on the CPU (bfloat16, as training under
    CPU autocast hands it, is attended in float32), and the kernels built."""
    return (f.device.type == "cpu" and f.dtype in (*_SUFFIX, torch.bfloat16) and f.shape[1] <= 256
            and build_library(SOURCE) is not None)


def _run(name: str, geometry: torch.Tensor, *tensors: torch.Tensor) -> None:
    function = getattr(build_library(SOURCE), f"{name}_{_SUFFIX[tensors[0].dtype]}")
    function(ctypes.c_void_p(geometry.data_ptr()), ctypes.c_int64(torch.get_num_threads()),
             *(ctypes.c_void_p(t.data_ptr()) for t in tensors))


def wants_graph(layer, f: torch.Tensor) -> bool:
    """Whether :func:`attend` must record what its backward pass needs: gradients are on and reach ``f`` or a
    parameter of the layer's attention."""
    params = [*layer.channel_attention.parameters(), *layer.spatial_attention.parameters()]
    return torch.is_grad_enabled() and (f.requires_grad or any(p.requires_grad for p in params))


def attend(layer, f: torch.Tensor, pool: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer.attend(f)`` through the kernels (see :func:`supported`).

    ``pool`` > 1 (only where no gradient is wanted, :func:`wants_graph`; the plane's sides multiples of it): the
    attended f averaged over ``pool`` x ``pool`` tiles of its planes, with :func:`models.pooling.spatial_avg_pool`'s
    additions, written in the gate's own pass: what a pointwise convolution with pooling after it reads
    (:func:`models.gconv.convolve_and_pool`), without the full-size attended f and the pooling's passes over it.

    Shape: f planar ``(B, C, X, Y)`` or group ``(B, C, G, X, Y)`` -> the attended f, same shape (``(..., X / pool,
    Y / pool)`` when pooled), and the channel ``(B, C[, G], 1, 1)`` and spatial ``(B, 1[, G], X, Y)`` parts as the
    PyTorch path gives them (the layer wraps them in its ``AttentionParts``).
    """
    if f.dtype == torch.bfloat16:
        f = f.float()  # the kernels' dtype; the convolution after casts back under autocast
    planar = f.dim() == 4
    b, c, plane = f.shape[0], f.shape[1], f.shape[-2:]
    h = 1 if planar else f.shape[2]
    params = [*layer.channel_attention.parameters(), *layer.spatial_attention.parameters()]
    graph = wants_graph(layer, f)
    if pool > 1 and (graph or plane[0] % pool or plane[1] % pool):
        raise ValueError(f"pooling in the gate needs no gradient and sides that are multiples of {pool}")
    flat = f.contiguous().view(b, c, h, -1)  # (B, C, H, P)
    out, channel, spatial = _InputAttention.apply(flat, layer, graph, tuple(plane), pool, *params)
    pooled = tuple(side // pool for side in plane)
    return (out.view(*f.shape[:-2], *pooled), channel.view(b, c, *(() if planar else (h,)), 1, 1),
            spatial.view(b, 1, *(() if planar else (h,)), *plane))


@contextlib.contextmanager
def _small_graph(graph: bool):
    """Where the channel MLP and the spatial convolution run: recording a graph when gradients are wanted, and in
    the input's own precision whatever autocast says (their outputs feed the kernels)."""
    with torch.enable_grad() if graph else contextlib.nullcontext(), torch.autocast("cpu", enabled=False):
        yield


class _InputAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, f, layer, graph, plane, pool, *params):
        b, c, h, p = f.shape
        planar = layer.channel_attention.group is None
        geometry = torch.tensor([b, c, h, p], dtype=torch.int64)
        mean, peak = f.new_empty(b, c, h), f.new_empty(b, c, h)
        where = torch.empty(b, c, h, dtype=torch.int64)
        _run("input_spatial_stats", geometry, f, mean, peak, where)
        with _small_graph(graph):
            # Leaves of the small graphs, differentiated in backward.
            mean, peak = (t.view(b, c) if planar else t for t in (mean, peak))  # (B, C[, H])
            mean.requires_grad_(graph)
            peak.requires_grad_(graph)
            alpha_c = layer.channel_attention.from_statistics(mean, peak)
        channel = alpha_c.detach().reshape(b, c, h).contiguous()  # einsum may hand out a permuted view
        mean_c, peak_c = f.new_empty(b, h, p), f.new_empty(b, h, p)  # the mean and max of a over c
        winner = torch.empty(b, h, p, dtype=torch.uint8)
        _run("input_channel_stats", geometry, f, channel, mean_c, peak_c, winner)
        with _small_graph(graph):
            stacked = torch.stack((mean_c, peak_c), dim=1).view(b, 2, *(() if planar else (h,)), *plane)
            stacked.requires_grad_(graph)
            alpha_s = layer.spatial_attention.from_statistics(stacked)  # (B, 1[, H], X, Y)
        spatial = alpha_s.detach().reshape(b, h, p).contiguous()
        if pool > 1:
            out = f.new_empty(b, c, h, p // pool**2)  # (B, C, H, X / pool * Y / pool)
            gate_pool = getattr(build_library(SOURCE), f"input_gate_pool_{_SUFFIX[f.dtype]}")
            gate_pool(ctypes.c_void_p(geometry.data_ptr()), ctypes.c_int64(torch.get_num_threads()),
                      ctypes.c_int64(plane[0]), ctypes.c_int64(pool),
                      *(ctypes.c_void_p(t.data_ptr()) for t in (f, channel, spatial, out)))
        else:
            out = torch.empty_like(f)
            _run("input_gate", geometry, f, channel, spatial, out)
        if graph:
            ctx.save_for_backward(f, channel, spatial, where, winner)
            ctx.small = (mean, peak, alpha_c, stacked, alpha_s)
            ctx.n_channel = len(list(layer.channel_attention.parameters()))  # params: the channel part's first
            ctx.params = params
        ctx.mark_non_differentiable(channel, spatial)
        return out, channel, spatial

    @staticmethod
    def backward(ctx, grad_out, _channel, _spatial):
        f, channel, spatial, where, winner = ctx.saved_tensors
        mean, peak, alpha_c, stacked, alpha_s = ctx.small
        n_channel = ctx.n_channel
        b, c, h, p = f.shape
        geometry = torch.tensor([b, c, h, p], dtype=torch.int64)
        grad_f, grad_spatial, grad_channel = torch.empty_like(f), f.new_empty(b, h, p), f.new_empty(b, c, h)
        _run("input_gate_backward", geometry, f, channel, spatial, grad_out.contiguous(), grad_f, grad_spatial,
             grad_channel)
        spatial_params = ctx.params[n_channel:]
        grad_stacked, *grad_spatial_params = torch.autograd.grad(
            alpha_s, [stacked, *spatial_params], grad_spatial.view_as(alpha_s), allow_unused=True)
        grad_stacked = grad_stacked.reshape(b, 2, h, p)
        _run("input_channel_stats_backward", geometry, f, channel, winner, grad_stacked[:, 0].contiguous(),
             grad_stacked[:, 1].contiguous(), grad_f, grad_channel)
        grad_mean, grad_peak, *grad_channel_params = torch.autograd.grad(
            alpha_c, [mean, peak, *ctx.params[:n_channel]], grad_channel.view_as(alpha_c), allow_unused=True)
        _run("input_spatial_stats_backward", geometry, grad_mean.contiguous(), grad_peak.contiguous(), where, grad_f)
        return (grad_f, None, None, None, None, *grad_channel_params, *grad_spatial_params)
