"""Lifting (image -> group) and group (group -> group) convolutions.

Both follow one path: transform the filter bank by every group element, then
run a single ``F.conv2d``.

Lifting: [f * psi](x, g) = sum_c sum_y f_c(y) (g.psi)_c(y - x), so the filter
for output orientation g is the plane action of g on psi.

Group: [f * psi](x, g) = sum_c sum_h sum_y f_c(y, h) (L_g psi)_c(y - x, h), with
(L_g psi)(y, h) = psi(g^-1 y, g^-1 h): the planes of psi move by g and its
input-orientation axis is re-indexed by ``group.permutation(g)``. Treating
(channel, input orientation) as one axis of size C * G turns this into a plain
2-D convolution. As in the paper's code the group sum carries the Haar weight
``group.haar_measure``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cpu import nnpack
from .groups import Group, get_group
from .pooling import spatial_avg_pool

__all__ = [
    "forget_filter_banks",
    "PooledConv2d",
    "conv2d",
    "lifting_filters",
    "group_filters",
    "lifting_conv",
    "lifting_bank",
    "lifting_conv_bank",
    "group_conv",
    "group_bank",
    "group_conv_bank",
    "LiftingConv",
    "GroupConv",
]


def lifting_filters(weight: torch.Tensor, group: Group) -> torch.Tensor:
    """Every transformed copy of a planar filter bank.

    Shape: weight ``(C_out, C_in, k, k)`` -> ``(C_out, G, C_in, k, k)``.
    """
    return torch.stack([group.act_on_plane(weight, g) for g in group.elements()], dim=1)


def group_filters(weight: torch.Tensor, group: Group) -> torch.Tensor:
    """Every transformed copy L_g psi of a group filter bank.

    The input-orientation axis must be axis 2 and the plane the last two axes;
    leading/extra axes are carried along (the attention layers use this for
    weights without a plane too, with k = 1).

    Shape: weight ``(C_out, C_in, G, k, k)`` -> ``(C_out, G, C_in, G, k, k)``.
    """
    return torch.stack([group.act(weight, g, group_axes=(2,)) for g in group.elements()], dim=1)


def conv2d(x: torch.Tensor, filters: torch.Tensor, stride: int = 1, padding: int = 0, dilation: int = 1):
    """``F.conv2d`` without bias; a 1x1 convolution as a matrix product, a large 3x3 one in inference by FFT.

    On NCHW float32 tensors the matrix product runs 1.5-2x faster than oneDNN's
    1x1 convolution here, forward and backward (``python -m benchmarks.fast_paths``);
    the DenseNet's transition layers are such convolutions. Its first dense layer
    runs through NNPACK in inference (see :mod:`models.cpu.nnpack`).
    """
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not (
            torch.is_grad_enabled() and (x.requires_grad or filters.requires_grad)):
        return _conv2d_channels_last(x, filters.to(x.dtype), stride, padding, dilation)
    if filters.shape[-2:] == (1, 1) and stride == 1 and padding == 0:
        b, c, rows, cols = x.shape
        out = torch.matmul(filters.flatten(1), x.reshape(b, c, rows * cols))  # (B, C_out, X * Y)
        return out.view(b, -1, rows, cols)
    if nnpack.applies(x, filters, stride, padding, dilation):
        return nnpack.conv3x3(x, filters, padding)
    if dilation > 1 and x.dtype == torch.float32 and x.device.type == "cpu":
        # oneDNN's NCHW kernels for dilated filters ran 4x slower than its channels-last ones on AVX2 (the alpha_F
        # spatial attention's 7x7 filters, dilation 2-4), conversions included; on AVX-512 the two were equal in
        # inference and channels-last 1.1-1.5x faster in training (benchmarks.fast_paths).
        last = x.contiguous(memory_format=torch.channels_last)
        return F.conv2d(last, filters, stride=stride, padding=padding, dilation=dilation).contiguous()
    return F.conv2d(x, filters, stride=stride, padding=padding, dilation=dilation)


def _conv2d_channels_last(x: torch.Tensor, filters: torch.Tensor, stride: int, padding: int, dilation: int):
    """A bfloat16 convolution on the CPU, channels last in and out: where oneDNN runs it through AMX or AVX512-BF16
    (a 3x3 conv of 72 to 72 channels on 94 x 94 planes: 344 G multiply-adds/s channels last against 183 on NCHW
    tensors, one Sapphire Rapids core; ``benchmarks.bfloat16_engine``), and what the bfloat16 kernels between the
    convolutions read and write (:mod:`models.cpu.bfloat16_kernels`). A 1x1 convolution is one matrix product over
    the pixels' rows, which channels last are."""
    x = x.contiguous(memory_format=torch.channels_last)
    split = filters.shape[1] == 2 * x.shape[1]  # a split bank [hi | lo] (split_bank): each input channel twice
    if filters.shape[-2:] == (1, 1) and stride == 1 and padding == 0:
        b, c, rows, cols = x.shape
        pixels = x.permute(0, 2, 3, 1).reshape(b * rows * cols, c)  # (B * X * Y, C_in), a view
        if filters.shape[0] <= LOGITS:  # the classifier: the network's outputs in float32, not rounded to 8 bits
            weights = filters[:, :c].float() + (filters[:, c:].float() if split else 0)
            out = torch.mm(pixels.float(), weights.flatten(1).t())  # (B * X * Y, C_out)
            return out.view(b, rows, cols, -1).permute(0, 3, 1, 2)
        if split:
            pixels = torch.cat((pixels, pixels), dim=1)  # (B * X * Y, 2 C_in)
        out = torch.mm(pixels, filters.flatten(1).t())  # (B * X * Y, C_out)
        return out.view(b, rows, cols, -1).permute(0, 3, 1, 2)  # (B, C_out, X, Y) channels last
    if split:
        x = torch.cat((x, x), dim=1).contiguous(memory_format=torch.channels_last)
    # Filters channels last too: with one image the input's strides alone can leave oneDNN writing NCHW.
    filters = filters.contiguous(memory_format=torch.channels_last)
    out = F.conv2d(x, filters, stride=stride, padding=padding, dilation=dilation)
    return out.contiguous(memory_format=torch.channels_last)


def split_bank(bank: torch.Tensor) -> torch.Tensor:
    """A float32 filter bank as two bfloat16 halves along its input channels, ``[hi | lo]`` with hi + lo the bank to
    16 bits of mantissa: convolving ``[x | x]`` with it sums both halves in the convolution's float32 accumulator,
    the weights then all but exact while the products stay bfloat16 (:func:`conv2d` doubles the input).

    Rounding the weights moved P(tumour) most of all bfloat16's roundings, measured on 512 PCam test patches by
    rounding one kind of value at a time in float32 (99th percentile of |dP|): the lifting layer's 27 weights per
    output 0.0069, the 1x1 convolutions' 0.0059, the first dense layer's 3x3 weights 0.0033; the convolutions'
    inputs, outputs and the batch norms' outputs 0.0015-0.0022 each. The whole bfloat16 network: 0.0062 with only
    the lifting and 1x1 weights split, 0.0040 with the first dense layer's too (84 against 89 patches/s, two
    threads of a Sapphire Rapids Xeon), 0.0041 with every layer's (75 patches/s).

    Shape: ``(C_out, C_in, k, k)`` -> ``(C_out, 2 C_in, k, k)`` bfloat16.
    """
    hi = bank.to(torch.bfloat16)
    return torch.cat((hi, (bank - hi.float()).to(torch.bfloat16)), dim=1)


def splits(bank: torch.Tensor) -> bool:
    """Whether a bfloat16 convolution by ``bank`` ``(C_out, C_in, k, k)`` runs with split weights (:func:`split_bank`):
    a pointwise one, or one on at most :data:`SPLIT_INPUTS` channels (the image's, and the PCam DenseNets' first
    dense layer's: 9 channels x 8 orientations)."""
    return bank.shape[-1] == 1 or bank.shape[1] <= SPLIT_INPUTS


SPLIT_INPUTS = 72
# A pointwise convolution with at most this many outputs is a classifier (the DenseNets' last layer: 2 classes x 8
# orientations): its float32 product of the bfloat16 input keeps the logits in float32, where bfloat16 would round
# a logit of 5 by up to 0.016 (P(tumour) by 0.004), on a few pixels' worth of products.
LOGITS = 16


def lifting_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    group: Group,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
) -> torch.Tensor:
    """Lifting convolution.

    Shape: x ``(B, C_in, X, Y)``, weight ``(C_out, C_in, k, k)`` ->
    ``(B, C_out, G, X', Y')``.
    """
    return lifting_conv_bank(x, lifting_bank(weight, group), group.order, stride, padding, dilation)


def lifting_bank(weight: torch.Tensor, group: Group) -> torch.Tensor:
    """The planar filter bank a lifting convolution runs.

    Shape: ``(C_out, C_in, k, k)`` -> ``(C_out * G, C_in, k, k)``.
    """
    c_out, c_in, k, _ = weight.shape
    return lifting_filters(weight, group).reshape(c_out * group.order, c_in, k, k)


def lifting_conv_bank(x: torch.Tensor, bank: torch.Tensor, order: int, stride: int = 1, padding: int = 0,
                      dilation: int = 1) -> torch.Tensor:
    """A lifting convolution with its filter bank already expanded (:func:`lifting_bank`) over a group of ``order``
    elements.

    Shape: x ``(B, C_in, X, Y)``, bank ``(C_out * G, C_in, k, k)`` -> ``(B, C_out, G, X', Y')``.
    """
    out = conv2d(x, bank, stride, padding, dilation)
    return out.view(x.shape[0], bank.shape[0] // order, order, *out.shape[-2:])  # (B, C_out, G, X', Y')


def group_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    group: Group,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
) -> torch.Tensor:
    """Group convolution, times the Haar weight of the group.

    Shape: x ``(B, C_in, G, X, Y)``, weight ``(C_out, C_in, G, k, k)`` ->
    ``(B, C_out, G, X', Y')``.
    """
    return group_conv_bank(x, group_bank(weight, group), stride, padding, dilation)


def group_bank(weight: torch.Tensor, group: Group) -> torch.Tensor:
    """The planar filter bank a group convolution runs, times the Haar weight.

    Shape: ``(C_out, C_in, G, k, k)`` -> ``(C_out * G, C_in * G, k, k)``.
    """
    c_out, c_in, n, k, _ = weight.shape
    # The Haar weight scales the filters, which are far smaller than the output.
    return group_filters(weight * group.haar_measure, group).reshape(c_out * n, c_in * n, k, k)


def group_conv_bank(x: torch.Tensor, bank: torch.Tensor, stride: int = 1, padding: int = 0,
                    dilation: int = 1) -> torch.Tensor:
    """A group convolution with its filter bank already expanded (:func:`group_bank`).

    Shape: x ``(B, C_in, G, X, Y)``, bank ``(C_out * G, C_in * G, k, k)`` -> ``(B, C_out, G, X', Y')``.
    """
    n = x.shape[2]
    planar = x.reshape(x.shape[0], -1, *x.shape[-2:])  # (B, C_in * G, X, Y)
    out = conv2d(planar, bank, stride, padding, dilation)
    return out.view(x.shape[0], bank.shape[0] // n, n, *out.shape[-2:])  # (B, C_out, G, X', Y')


def uniform_init_(weight: torch.Tensor, fan_in: int, wscale: float) -> None:
    """The paper's initialisation: U(-s, s) with s = wscale / sqrt(fan_in).

    Its group layers count fan_in as C_in * k * k (the input orientations are
    not counted); we keep that so training reproduces its recipes.
    """
    bound = wscale / math.sqrt(fan_in)
    with torch.no_grad():
        weight.uniform_(-bound, bound)


def convolve_and_pool(conv, x: torch.Tensor, pool: int, pointwise: bool) -> torch.Tensor:
    """``conv(x)`` average-pooled in ``pool`` x ``pool`` tiles (no pooling for 1).

    A pointwise (1x1, stride 1, no padding) convolution is linear and acts on each
    position alone, so it commutes with the pooling: it then runs on the pooled
    input, pool**2 times fewer products for the same result up to round-off.
    """
    if pool == 1:
        return conv(x)
    if pointwise:
        return conv(spatial_avg_pool(x, pool))
    return spatial_avg_pool(conv(x), pool)


class PooledConv2d(nn.Conv2d):
    """A planar convolution without bias whose output is average-pooled by ``pool`` (see :func:`convolve_and_pool`).

    Its parameters are those of ``nn.Conv2d``, so state dicts are the same.
    """

    def __init__(self, in_channels, out_channels, kernel_size, padding=0, pool=1):
        super().__init__(in_channels, out_channels, kernel_size, padding=padding, bias=False)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pointwise = self.kernel_size == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)
        return convolve_and_pool(super().forward, x, self.pool, pointwise)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", pool={self.pool}"


def _bank_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype a layer's filter bank is kept in for input ``x``: bfloat16 for a bfloat16 input (the network's
    bfloat16 path), else the weight's own (None)."""
    return torch.bfloat16 if x.dtype == torch.bfloat16 else None


class _GConvBase(nn.Module):
    def __init__(self, group, in_channels, out_channels, kernel_size, stride, padding, dilation, pool):
        super().__init__()
        self._bank_cache = None  # (key, filter bank) of the last expansion without gradients
        self.group = get_group(group)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.pool = pool

    def filter_bank(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight expanded over the group into one planar filter bank (``lifting_bank``/``group_bank``), in
        ``dtype`` (default: the weight's; a bfloat16 input is convolved with the float32 bank rounded once).

        Without gradients (eval, inference) the bank is kept and reused until the weight changes: the key is the
        weight's storage, version counter (bumped by in-place changes: optimiser steps, ``load_state_dict``),
        dtype and device. With gradients it is expanded on every call, so that they flow back to the weight.

        Some in-place writes leave the version counter alone: through ``.data``, and (measured on an H200, PyTorch
        2.11) CUDA's ``torch._foreach_lerp_``, with which ``torch.optim.swa_utils``' exponential moving average
        updates its weights. After such a change call :func:`forget_filter_banks`; ``training`` does so before
        every evaluation.
        """
        if torch.is_grad_enabled():
            return self._expand(self.weight).to(dtype or self.weight.dtype)
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device, dtype)
        cached = self._bank_cache
        if cached is None or cached[0] != key:
            bank = self._expand(w)
            if dtype == torch.bfloat16:  # as _conv2d_channels_last convolves it
                bank = (split_bank(bank) if splits(bank) else bank.to(dtype)).contiguous(
                    memory_format=torch.channels_last)
            else:
                bank = bank.to(dtype or w.dtype)
            cached = (key, bank)
            self._bank_cache = cached  # one assignment: sessions sharing the model read a whole pair
        return cached[1]

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution with stride 1 and no padding: it commutes with spatial pooling."""
        return self.kernel_size == 1 and self.stride == 1 and self.padding == 0

    def extra_repr(self) -> str:
        return (
            f"{self.group.name}, {self.in_channels}, {self.out_channels}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}" + (f", pool={self.pool}" if self.pool > 1 else "")
        )


class LiftingConv(_GConvBase):
    """Image -> group feature map. ``(B, C_in, X, Y)`` -> ``(B, C_out, G, X', Y')``.

    Args:
        group: ``"p4"``/``"p4m"`` or a :class:`Group`.
        in_channels, out_channels, kernel_size, stride, padding, dilation: as
            ``nn.Conv2d`` (square kernels, no bias: the paper uses none).
        wscale: initialisation scale (see :func:`uniform_init_`).
        pool: average-pool the output in ``pool`` x ``pool`` tiles (see :func:`convolve_and_pool`).
    """

    def __init__(
        self, group, in_channels, out_channels, kernel_size,
        stride=1, padding=0, dilation=1, wscale=1.0, pool=1,
    ):
        super().__init__(group, in_channels, out_channels, kernel_size, stride, padding, dilation, pool)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        uniform_init_(self.weight, in_channels * kernel_size**2, wscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return convolve_and_pool(self._convolve, x, self.pool, self.pointwise)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a clear error unless x is ``(B, C_in, X, Y)``."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"LiftingConv expects (B, {self.in_channels}, X, Y), got {tuple(x.shape)}"
            )

    def _expand(self, weight: torch.Tensor) -> torch.Tensor:
        return lifting_bank(weight, self.group)

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        return lifting_conv_bank(x, self.filter_bank(_bank_dtype(x)), self.group.order, self.stride, self.padding,
                                 self.dilation)


class GroupConv(_GConvBase):
    """Group -> group feature map. ``(B, C_in, G, X, Y)`` -> ``(B, C_out, G, X', Y')``.

    Arguments as :class:`LiftingConv`.
    """

    def __init__(
        self, group, in_channels, out_channels, kernel_size,
        stride=1, padding=0, dilation=1, wscale=1.0, pool=1,
    ):
        super().__init__(group, in_channels, out_channels, kernel_size, stride, padding, dilation, pool)
        n = self.group.order
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, n, kernel_size, kernel_size))
        uniform_init_(self.weight, in_channels * kernel_size**2, wscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return convolve_and_pool(self._convolve, x, self.pool, self.pointwise)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a clear error unless x is ``(B, C_in, G, X, Y)``."""
        check_group_input(x, self.in_channels, self.group, type(self).__name__)

    def _expand(self, weight: torch.Tensor) -> torch.Tensor:
        return group_bank(weight, self.group)

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        return group_conv_bank(x, self.filter_bank(_bank_dtype(x)), self.stride, self.padding, self.dilation)


def check_group_input(x: torch.Tensor, channels: int, group: Group, who: str) -> None:
    """Raise a clear error unless x is ``(B, channels, G, X, Y)``."""
    if x.dim() != 5 or x.shape[1] != channels or x.shape[2] != group.order:
        raise ValueError(
            f"{who} expects a {group.name} feature map (B, {channels}, {group.order}, X, Y), "
            f"got {tuple(x.shape)}"
        )


def forget_filter_banks(module: nn.Module) -> int:
    """Drop the kept filter bank of every group convolution in ``module`` (for weights changed behind the version
    counter's back: :meth:`_GConvBase.filter_bank`); returns how many convolutions there are."""
    layers = [layer for layer in module.modules() if isinstance(layer, _GConvBase)]
    for layer in layers:
        layer._bank_cache = None  # the next call without gradients expands the weight as it is now
    return len(layers)
