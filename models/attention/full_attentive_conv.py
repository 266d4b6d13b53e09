"""The full attentive group convolution (Romero et al. 2020, eq. 10-12), without storing f~.

A (lifting or group) convolution sums, for every output channel o and output
orientation g, the responses of every input channel c and input orientation h:

    y(x, o, g) = sum_{c, h} f~(x, o, g, c, h),   f~(., o, g, c, h) = f_{c, h} * K_{o, g, c, h},

with K the group-transformed filters. The attentive convolution weighs the terms
on the residual branch (``full_attentive_conv_reference.py`` spells it out):

    y = sum_{c, h} f~ - alpha_s(x, o, g, h) alpha_c(o, g, c, h) f~.

f~ has C_in * G_in times as many values as y. The paper's code materialises it
and keeps it for the backward pass; here it is never stored whole:

* alpha_c is constant in space, so the channel-attended sum over c is one
  convolution with per-sample filters alpha_c K:
  S(x, o, g, h) = sum_c alpha_c f~ = sum_c f_{c, h} * (alpha_c K)_{o, g, c, h};
  then y = (plain convolution) - sum_h alpha_s S.
* The spatial mean of f~ is the filter applied to the mean of each input patch
  (means commute with the convolution); the channel mean of alpha_c f~ is S / C_in.
* The spatial max of f~ is found a few samples at a time without gradients;
  its value is then recomputed from the one input patch where it lies, so the
  backward pass touches those patches only.
* The max over c of alpha_c f~ is computed a few samples at a time and
  recomputed in the backward pass (activation checkpointing), so memory holds
  f~ of one chunk at a time.
* On the CPU, compiled kernels (:mod:`models.cpu.attention_kernels`) find both maxima and S without
  writing f~ at all (weighting the filters by alpha_c as they go). Everything
  after alpha_c (S, the max over c, the spatial attention's convolutions, its
  sigmoid and the weighted sum over h) is one kernel that goes sample by
  sample, in the forward pass and again in the backward pass, so a layer keeps
  only its input and alpha_c (layers small enough keep their intermediates
  instead, see RECOMPUTE_ABOVE_VALUES).

The result equals the straightforward version up to round-off (summation order).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..cpu import attention_kernels
from ..gconv import GroupConv, LiftingConv, check_group_input, group_filters, lifting_filters
from ..pooling import spatial_avg_pool
from .parts import AttentionParts, AttentiveLayer
from .recompute import recomputed

__all__ = ["AttentiveLiftingConv", "AttentiveGroupConv"]

# The most values of f~ held at once (4 bytes each in float32).
CHUNK_VALUES = 4 * 2**20
# In training with the compiled kernels, layers whose S holds at most this many values for the
# whole batch keep S, its max over c and alpha_s for the backward pass (13 bytes per value);
# larger ones recompute them there. On the smallest maps the recomputation costs more time than
# the memory is worth (a_p4cnn at batch 64: its last layer keeps 0.5 MiB; keeping layers 3-6
# too, 2**20, held 27 MiB more, over a quarter of its step's peak, for about 2 % of the step's time).
RECOMPUTE_ABOVE_VALUES = 2**17


class _Geometry:
    """Sizes and convolution settings of one call, shared by the helpers below."""

    def __init__(self, layer, planes, filters):
        self.o, self.n, self.c, self.h, self.k = filters.shape[:5]
        self.b = planes.shape[0]
        self.stride, self.padding, self.dilation = layer.stride, layer.padding, layer.dilation
        span = self.dilation * (self.k - 1) + 1
        self.out = tuple((size + 2 * self.padding - span) // self.stride + 1 for size in planes.shape[-2:])
        per_sample = self.o * self.n * self.c * self.h * self.out[0] * self.out[1]
        self.chunk = max(1, CHUNK_VALUES // per_sample)
        # Where one sample's f~ is already too large, also split the (o, g) filters.
        self.block = max(1, (self.o * self.n * CHUNK_VALUES) // per_sample) if self.chunk == 1 else self.o * self.n

    def pieces(self):
        """(sample slice, filter slice) pairs covering the batch and the O * G filters."""
        for start in range(0, self.b, self.chunk):
            for first in range(0, self.o * self.n, self.block):
                yield slice(start, start + self.chunk), slice(first, first + self.block)

    @property
    def conv(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation)


class _EfficientFullAttention(AttentiveLayer):
    """Mixin: the attentive convolution on planes ``(B, C * H, X, Y)`` and filters ``(O, G, C, H, k, k)``.

    H = G_in for group layers and 1 for lifting layers, so both share one path.
    Internally S, the max statistic and alpha_s are ``(B, H, O, G, X', Y')`` views of
    channels-last memory ``(B, X', Y', H, O, G)``.
    """

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        planes, filters = self._planes_and_filters(x)
        geo = _Geometry(self, planes, filters)
        b, o, n, c, h, k = geo.b, geo.o, geo.n, geo.c, geo.h, geo.k
        plain = F.conv2d(planes, filters.reshape(o * n, c * h, k, k), **geo.conv)  # (B, O * G, X', Y')

        if self._compiled(planes, filters, c):
            attended, channel, spatial = self._compiled_attention(planes, filters, geo, keep_spatial=return_attention)
        else:
            attended, channel, spatial = self._pytorch_attention(planes, filters, geo)
        # In place: the convolution keeps its input, not its output, for the backward pass; a
        # fresh output and a fresh scaled copy would be two more tensors of the output's size.
        # On the output itself, not a view of it, which autograd would copy back in backward.
        out = self._scale_(plain.sub_(attended.reshape(plain.shape))).view(b, o, n, *geo.out)
        if self.pool > 1:  # attention acts on f~ before the sum, so the pooling cannot move in front
            out = spatial_avg_pool(out, self.pool)
        if not return_attention:
            return out
        return out, self._parts(channel, spatial)

    def _compiled_attention(self, planes, filters, geo, keep_spatial):
        """sum_h alpha_s S ``(B, O, G, X', Y')``, alpha_c and alpha_s (or None) from the compiled kernels.

        alpha_c comes from statistics of f~ computed first; the branch after it is one kernel
        (``attention_kernels.attention_branch``) that works sample by sample and, in training, keeps
        nothing the size of f~'s sum but recomputes it in the backward pass, except in layers
        small enough (RECOMPUTE_ABOVE_VALUES).
        """
        p, attention = geo.padding, self.spatial_attention
        padded = F.pad(planes, (p, p, p, p)) if p else planes
        channel = None
        if self.channel_attention is not None:
            channel = self._channel_from_statistics(*_spatial_statistics(planes, filters, geo, padded))
        b, o, n, c, h, kk = geo.b, geo.o, geo.n, geo.c, geo.h, geo.k * geo.k
        alpha = None if channel is None else channel.reshape(b, o * n, c, h)
        if attention is None:  # channel attention only: the branch is sum_h S
            attended, _ = attention_kernels.attention_branch(padded, filters.reshape(o * n, c, h, kk), alpha, None,
                                                             1.0, h, geo.out, geo.stride, geo.dilation, 0, 1,
                                                             keep=False)
            return attended.view(b, o, n, *geo.out), channel, None
        small = b * h * o * n * geo.out[0] * geo.out[1] <= RECOMPUTE_ABOVE_VALUES
        keep = keep_spatial or (small and _needs_grad(padded, filters, channel, *attention.parameters()))
        attended, gate = attention_kernels.attention_branch(
            padded, filters.reshape(o * n, c, h, kk), alpha, attention.filter_pairs(), 1.0 / c, h, geo.out,
            geo.stride, geo.dilation, attention.padding, attention.dilation, keep,
        )
        spatial = _channels_last_view(gate.reshape(b, -1, h * o * n), geo) if keep_spatial else None
        return attended.view(b, o, n, *geo.out), channel, spatial

    def _compiled(self, planes, filters, channels) -> bool:
        attention = self.spatial_attention
        return attention_kernels.available(planes, filters, channels=channels) and (
            attention is None or attention_kernels.branch_supported(attention.weight.shape[-1])
        )

    def _pytorch_attention(self, planes, filters, geo):
        """sum_h alpha_s S ``(B, O, G, X', Y')``, alpha_c and alpha_s (each or None) with PyTorch ops."""
        channel = peak = None
        both = self.channel_attention is not None and self.spatial_attention is not None
        if both and not _needs_grad(planes, filters):
            # Inference: both max statistics from one pass over f~, piece by piece.
            channel, peak = self._statistics_in_one_pass(planes, filters, geo)
        elif self.channel_attention is not None:
            mean, peak_xy = _spatial_statistics(planes, filters, geo)  # (B, O, G, C, H) each
            channel = self._channel_from_statistics(mean, peak_xy)

        # S = sum_c alpha_c f~: one grouped convolution over (sample, h). Its per-sample
        # filters are as large as f~'s share of one position, so they are rebuilt in backward.
        s = _maybe_checkpoint(_attended_sum, planes, filters, channel, geo=geo)  # (B, H, O, G, X', Y')
        spatial = None
        if self.spatial_attention is not None:
            if peak is None:
                peak = _weighted_channel_max(planes, filters, channel, geo)  # (B, H, O, G, X', Y')
            spatial = torch.sigmoid(self._spatial_logits(s, peak, geo))
        attended = s if spatial is None else spatial * s
        return attended.sum(dim=1), channel, spatial

    def _spatial_logits(self, s, peak, geo):
        """alpha_s before its sigmoid ``(B, H, O, G, X', Y')`` from S and the max over c, both in that shape."""
        attention = self.spatial_attention
        if self._lifting:
            return attention.logits_from_statistics(s[:, 0], peak[:, 0], 1.0 / geo.c).unsqueeze(1)
        # Logical (B, O, G, H, X', Y') views.
        spatial = attention.logits_from_statistics(
            s.permute(0, 2, 3, 1, 4, 5), peak.permute(0, 2, 3, 1, 4, 5), 1.0 / geo.c
        )
        return spatial.permute(0, 3, 1, 2, 4, 5)  # back to (B, H, O, G, X', Y')

    def _channel_from_statistics(self, mean, peak):
        """alpha_c ``(B, O, G, C, H)`` from the spatial mean and max of f~, each ``(B, O, G, C, H)``."""
        if self._lifting:
            return self.channel_attention.from_statistics(mean.squeeze(4), peak.squeeze(4)).unsqueeze(4)
        return self.channel_attention.from_statistics(mean, peak)

    def _statistics_in_one_pass(self, planes, filters, geo):
        """alpha_c ``(B, O, G, C, H)`` and max over c of alpha_c f~ ``(B, H, O, G, X', Y')``, without gradients."""
        o, n, c, h, kk = geo.o, geo.n, geo.c, geo.h, geo.k * geo.k
        kernels = filters.reshape(o * n, c * h, kk)
        channel = planes.new_empty(geo.b, o * n, c, h)
        peak = planes.new_empty(geo.b, geo.out[0] * geo.out[1], h, o * n)  # channels last
        for samples, block in geo.pieces():
            f = _unsummed(planes[samples], kernels[block], geo)  # (C * H, q, b, L)
            q, b = f.shape[1], f.shape[2]
            # Spatial mean and max, (C * H, q, b) -> (b, q, C, H)
            mean, top = (t.permute(2, 1, 0).reshape(b, q, c, h) for t in (f.mean(dim=-1), f.amax(dim=-1)))
            if self._lifting:
                alpha = self.channel_attention.rows_from_statistics(mean[..., 0], top[..., 0], block)[..., None]
            else:
                alpha = self.channel_attention.rows_from_statistics(mean, top, block)  # (b, q, C, H)
            channel[samples, block] = alpha
            weights = alpha.reshape(b, q, c * h).permute(2, 1, 0)[..., None]  # (C * H, q, b, 1)
            top_c = (weights * f).view(c, h, q, b, -1).amax(dim=0)  # (H, q, b, L)
            peak[samples, :, :, block] = top_c.permute(2, 3, 0, 1)
        return channel.view(geo.b, o, n, c, h), _channels_last_view(peak, geo)

    def _parts(self, channel, spatial) -> AttentionParts:
        # The documented layouts, those of the straightforward version.
        if channel is not None:
            channel = channel[..., None, None]  # (B, O, G, C, H, 1, 1)
            channel = channel.squeeze(4) if self._lifting else channel
        if spatial is not None:
            spatial = spatial.permute(0, 2, 3, 1, 4, 5).unsqueeze(3)  # (B, O, G, 1, H, X', Y')
            spatial = spatial.squeeze(4) if self._lifting else spatial
        return AttentionParts(channel, spatial, self.attention_group_axes)


class AttentiveLiftingConv(_EfficientFullAttention, LiftingConv):
    """Full attentive lifting convolution. Arguments as :class:`LiftingConv` plus the attention modules.

    Shape: ``(B, C_in, X, Y)`` -> ``(B, C_out, G, X', Y')``. Attention parts:
    channel ``(B, C_out, G, C_in, 1, 1)``, spatial ``(B, C_out, G, 1, X', Y')``.
    """

    attention_group_axes = (2,)
    _lifting = True

    def _planes_and_filters(self, x):
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"{type(self).__name__} expects (B, {self.in_channels}, X, Y), got {tuple(x.shape)}")
        return x, lifting_filters(self.weight, self.group).unsqueeze(3)  # (O, G, C, 1, k, k)

    def _scale_(self, out):
        return out


class AttentiveGroupConv(_EfficientFullAttention, GroupConv):
    """Full attentive group convolution. Arguments as :class:`GroupConv` plus the attention modules.

    Shape: ``(B, C_in, G, X, Y)`` -> ``(B, C_out, G, X', Y')``. Attention parts:
    channel ``(B, C_out, G, C_in, G_in, 1, 1)``, spatial ``(B, C_out, G, 1, G_in, X', Y')``.
    The sum carries the group's Haar weight like :class:`GroupConv` (see the
    straightforward version for how this differs from the paper's code on p4m).
    """

    attention_group_axes = (2, 4)
    _lifting = False

    def _planes_and_filters(self, x):
        check_group_input(x, self.in_channels, self.group, type(self).__name__)
        planes = x.reshape(x.shape[0], -1, *x.shape[-2:])  # (B, C * G_in, X, Y)
        return planes, group_filters(self.weight, self.group)  # (O, G, C, G_in, k, k)

    def _scale_(self, out):
        return out.mul_(self.group.haar_measure)


def _patches(planes, geo) -> torch.Tensor:
    """Every input patch a filter sees: ``(b, C * H, X, Y)`` -> ``(C * H, k * k, b, L)``."""
    cols = F.unfold(planes, geo.k, **geo.conv)  # (b, C * H * k * k, L)
    return cols.view(planes.shape[0], geo.c * geo.h, geo.k * geo.k, -1).permute(1, 2, 0, 3)


def _tap_ranges(geo, axis):
    """For each filter tap along ``axis`` (0: rows, 1: columns), the strided slice of the padded input it meets."""
    d, s, size = geo.dilation, geo.stride, geo.out[axis]
    return [slice(t * d, t * d + s * (size - 1) + 1, s) for t in range(geo.k)]


def _spatial_statistics(planes, filters, geo, padded=None):
    """Mean and max over positions of f~, each ``(B, O, G, C, H)``; ``padded``: the padded planes, if at hand."""
    o, n, c, h, kk = geo.o, geo.n, geo.c, geo.h, geo.k * geo.k
    p = geo.padding
    padded = F.pad(planes, (p, p, p, p)) if padded is None else padded  # (B, C * H, Xp, Yp)
    kernels = filters.reshape(o * n, c * h, kk)
    # Mean: the filter applied to the mean patch (B, C * H, k * k).
    if attention_kernels.available(planes, kernels, channels=c):
        # Max and its gradient from the one patch where it lies.
        # With the max, so that the backward pass adds the max's sparse gradient into the mean
        # patch's: one tensor the size of the input rather than two, and one sum fewer.
        pair = functools.partial(_mean_patch, geo=geo), functools.partial(_mean_patch_grad, geo=geo)
        mean_patch, peak, _ = attention_kernels.spatial_max(padded, kernels, h, geo.out, geo.stride, geo.dilation, pair)
        mean = torch.einsum("bpu,qpu->bqp", mean_patch, kernels)  # (B, O * G, C * H)
        return mean.view(geo.b, o, n, c, h), peak.transpose(1, 2).reshape(geo.b, o, n, c, h)
    mean = torch.einsum("bpu,qpu->bqp", _MeanPatch.apply(padded, geo), kernels)
    # Max: locate it without gradients ...
    with torch.no_grad():  # chunk by chunk
        where = torch.empty(geo.b, c * h, o * n, dtype=torch.long, device=planes.device)
        for samples, block in geo.pieces():
            f = _unsummed(planes[samples], kernels[block], geo)  # (C * H, block, b, L)
            where[samples, :, block] = f.argmax(dim=-1).permute(2, 0, 1)  # position index in the output grid
    # ... then recompute its value from the input patch at that position (again in backward,
    # rather than keeping the patches).
    peak = _maybe_checkpoint(_values_at, padded, kernels, where, geo=geo)  # (B, O * G, C * H)
    return mean.view(geo.b, o, n, c, h), peak.view(geo.b, o, n, c, h)


def _mean_patch(padded, geo):
    """The mean over output positions of the input patch: ``(B, C * H, Xp, Yp)`` -> ``(B, C * H, k * k)``.

    Each tap's mean is that of a window of the plane; the window sums factor into
    sums over the window's columns, then over its rows, so each pass reads the
    planes k times rather than k * k.
    """
    columns = torch.stack([padded[..., cols].sum(dim=-1) for cols in _tap_ranges(geo, 1)], dim=-1)  # (.., Xp, k)
    windows = torch.stack([columns[..., rows, :].sum(dim=-2) for rows in _tap_ranges(geo, 0)], dim=-2)
    return windows.flatten(-2) / (geo.out[0] * geo.out[1])  # (..., k, k) -> (..., k * k)


def _mean_patch_grad(grad, shape, geo):
    """The gradient of :func:`_mean_patch` with respect to its input of ``shape``, a new tensor.

    Autograd would give each slice a zero gradient the size of the whole input; here all taps add into one.
    """
    grad = (grad / (geo.out[0] * geo.out[1])).unflatten(-1, (geo.k, geo.k))
    columns = grad.new_zeros(*shape[:-1], geo.k)
    for u, rows in enumerate(_tap_ranges(geo, 0)):
        columns[..., rows, :] += grad[..., u, None, :]
    out = grad.new_zeros(shape)
    for v, cols in enumerate(_tap_ranges(geo, 1)):
        out[..., cols] += columns[..., v, None]
    return out


class _MeanPatch(torch.autograd.Function):
    """:func:`_mean_patch` with its gradient."""

    @staticmethod
    def forward(ctx, padded, geo):
        ctx.geo, ctx.shape = geo, padded.shape
        return _mean_patch(padded, geo)

    @staticmethod
    def backward(ctx, grad):
        return _mean_patch_grad(grad, ctx.shape, ctx.geo), None


def _values_at(padded, kernels, where, geo):
    """f~ at the output positions ``where`` (B, C * H, O * G), from the padded input: ``(B, O * G, C * H)``."""
    width = padded.shape[-1]
    taps = torch.arange(geo.k, device=padded.device) * geo.dilation
    offsets = (taps[:, None] * width + taps).flatten()  # of each tap from the patch's first one
    # Offset of each output position's patch in the padded plane, looked up (faster than dividing).
    position = torch.arange(geo.out[0] * geo.out[1], device=padded.device)
    corner = ((position // geo.out[1] * width + position % geo.out[1]) * geo.stride)[where]  # (B, C * H, O * G)
    flat = (corner[..., None] + offsets).view(geo.b, geo.c * geo.h, -1)  # (B, C * H, O * G * k * k)
    values = padded.flatten(-2).gather(-1, flat).view(geo.b, geo.c * geo.h, geo.o * geo.n, -1)
    return torch.einsum("bpqu,qpu->bqp", values, kernels)


def _attended_sum(planes, filters, channel, geo):
    weights = filters.unsqueeze(0) if channel is None else channel[..., None, None] * filters
    return _per_sample_conv(planes, weights, geo)


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _maybe_checkpoint(fn, *tensors, geo):
    """``fn(*tensors, geo)``, recomputed in the backward pass instead of keeping its intermediates."""
    return recomputed(functools.partial(fn, geo=geo), *tensors)


def _unsummed(planes, kernels, geo) -> torch.Tensor:
    """f~ of a few samples, one batched matmul over the (c, h) planes: ``(C * H, O * G, b, L)``."""
    cols = _patches(planes, geo)  # (C * H, k * k, b, L)
    f = torch.bmm(kernels.transpose(0, 1), cols.reshape(cols.shape[0], cols.shape[1], -1))
    return f.view(kernels.shape[1], kernels.shape[0], planes.shape[0], -1)


def _weighted_channel_max(planes, filters, channel, geo):
    """max over c of alpha_c f~, ``(B, H, O, G, X', Y')``; alpha_c = 1 where ``channel`` is None."""
    o, n, c, h, kk = geo.o, geo.n, geo.c, geo.h, geo.k * geo.k
    kernels = filters.reshape(o * n, c * h, kk)

    def chunk_max(part, block_kernels, alpha, geo):
        b, q = part.shape[0], block_kernels.shape[0]
        if alpha is None:
            f = _unsummed(part, block_kernels, geo).view(c, h, q, b, -1)
            peak = _MaxOverFirst.apply(f).permute(2, 0, 1, 3)  # (b, H, q, L)
        else:
            # alpha_c folded into per-sample filters: one matmul per (c, h, sample).
            weighted = alpha.permute(2, 3, 0, 1).reshape(c * h, b, q, 1) * block_kernels.transpose(0, 1)[:, None]
            f = torch.matmul(weighted, _patches(part, geo).transpose(1, 2))  # (C * H, b, q, L)
            peak = _MaxOverFirst.apply(f.view(c, h, b, q, -1)).transpose(0, 1)  # (b, H, q, L)
        return peak.permute(0, 3, 1, 2).contiguous()  # (b, L, H, q): channels last

    alphas = None if channel is None else channel.reshape(geo.b, o * n, c, h)
    rows = []
    for samples, block in geo.pieces():
        args = [planes[samples], kernels[block], None if alphas is None else alphas[samples, block]]
        piece = _maybe_checkpoint(chunk_max, *args, geo=geo)
        if block.start == 0:
            rows.append([])
        rows[-1].append(piece)
    peak = torch.cat([torch.cat(row, dim=3) if len(row) > 1 else row[0] for row in rows])  # (B, L, H, O * G)
    return _channels_last_view(peak, geo)


class _MaxOverFirst(torch.autograd.Function):
    """``x.max(dim=0).values`` with its gradient, faster where dim 0 is the outermost axis.

    ``torch.max`` with indices reduces a leading axis about twenty times slower
    than ``amax``; ``amax``'s own gradient shares ties out, unlike ``torch.max``,
    which gives it all to the first maximum. This does the same as ``torch.max``.
    """

    @staticmethod
    def forward(ctx, x):
        peak = x.amax(dim=0)
        ctx.save_for_backward(x, peak)
        return peak

    @staticmethod
    def backward(ctx, grad):
        x, peak = ctx.saved_tensors
        # The first entry along dim 0 equal to the max takes the gradient. A loop over dim 0
        # (the input channels: few) of elementwise passes runs 3-4x faster than a cumsum of
        # the tie mask, or than max with indices.
        out = torch.empty_like(x)
        free = torch.ones_like(peak, dtype=torch.bool)  # no earlier entry has taken it
        for i in range(x.shape[0]):
            take = torch.eq(x[i], peak).logical_and_(free)
            torch.mul(take, grad, out=out[i])
            free.logical_and_(take.logical_not_())
        return out


def _per_sample_conv(planes, weights, geo):
    """sum over c of f_{c, h} * W_{o, g, c, h} for every h, with filters W shared or per sample.

    Shape: ``(B, C * H, X, Y)``, ``(B or 1, O, G, C, H, k, k)`` -> ``(B, H, O, G, X', Y')``.
    """
    b, c, h, k = geo.b, geo.c, geo.h, geo.k
    shared = weights.shape[0] == 1
    # One conv group per (sample, h), holding the C planes of that h.
    x = planes.view(b, c, h, *planes.shape[-2:]).transpose(1, 2)  # (B, H, C, X, Y)
    x = x.reshape(b if shared else 1, -1, *planes.shape[-2:])
    w = weights.permute(0, 4, 1, 2, 3, 5, 6).reshape(-1, c, k, k)  # ((B or 1) * H * O * G, C, k, k)
    out = F.conv2d(x, w, groups=h if shared else b * h, **geo.conv)
    # Laid out channels last, like the max statistic, for the spatial attention's convolutions.
    out = out.view(b, -1, geo.out[0] * geo.out[1]).transpose(1, 2).contiguous()  # (B, L, H * O * G)
    return _channels_last_view(out, geo)


def _channels_last_view(t, geo):
    """``(B, L, H * O * G)`` memory as a ``(B, H, O, G, X', Y')`` view."""
    return t.view(t.shape[0], *geo.out, geo.h, geo.o, geo.n).permute(0, 3, 4, 5, 1, 2)
