"""alpha_F: attention on the input of a lifting or group convolution.

The paper's cheap variant (used for CIFAR-10 and PCam): instead of attending to
the un-summed responses of the convolution, attend to its input once, shared by
all output channels, then convolve:

    y = conv(x - spatial(channel * x) * channel * x).
"""

from __future__ import annotations

import torch

from ..cpu import bfloat16_kernels, input_attention_kernels
from ..gconv import GroupConv, LiftingConv, convolve_and_pool
from .channel import InputChannelAttention
from .parts import AttentionParts, AttentiveLayer
from .spatial import InputSpatialAttention

__all__ = ["InputAttentiveLiftingConv", "InputAttentiveGroupConv", "kernels_cover"]


def kernels_cover(layer, f: torch.Tensor) -> bool:
    """Whether the compiled kernels (:mod:`models.cpu.input_attention_kernels`) cover this layer and input:
    alpha_F with both parts, statistics-based spatial attention, and an input the kernels take
    (``input_attention_kernels.supported``: at most 256 channels, float32/64 or bfloat16 on the CPU)."""
    return (isinstance(layer.channel_attention, InputChannelAttention)
            and isinstance(layer.spatial_attention, InputSpatialAttention) and layer.spatial_attention.statistics
            and input_attention_kernels.supported(f))


def _bfloat16_attend(layer, f: torch.Tensor, pool: int = 1, copies: int = 1):
    """alpha_F of a bfloat16 ``f`` in inference through :func:`models.cpu.bfloat16_kernels.attend` (channels last,
    statistics and spatial filter in float32; ``copies`` 2 writes its channels twice, for split weights):
    ``(out, AttentionParts)``, or None where those kernels do not cover the layer or ``f`` (then a bfloat16 input is
    attended in float32 by the paths below)."""
    if not (kernels_cover(layer, f) and bfloat16_kernels.applies(f)) or input_attention_kernels.wants_graph(layer, f):
        return None
    first, second, spatial = _bfloat16_parts(layer)

    def channel_mlp(mean: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
        logits = torch.relu(torch.cat((mean, peak)) @ first) @ second  # (2 B, C * G): both statistics at once
        return torch.sigmoid(logits[:len(mean)] + logits[len(mean):])

    done = bfloat16_kernels.attend(f, channel_mlp, spatial, pool, copies)
    if done is None:
        return None
    out, channel, alpha_s = done
    return out, AttentionParts(channel, alpha_s, layer.attention_group_axes)


def _bfloat16_parts(layer) -> tuple[torch.Tensor, torch.Tensor, bfloat16_kernels.SpatialFilter]:
    """The layer's channel MLP as matrices and its spatial filter laid out for the kernels, made once and kept
    until a weight of its attention changes (its storage or version counter, as ``GroupConv.filter_bank``'s)."""
    weights = [*layer.channel_attention.parameters(), *layer.spatial_attention.parameters()]
    key = tuple((w.data_ptr(), w._version) for w in weights)
    cached = getattr(layer, "_bfloat16_cache", None)
    if cached is None or cached[0] != key:
        spatial = layer.spatial_attention
        first, second = (m.detach().float().contiguous() for m in layer.channel_attention.matrices())
        cached = (key, (first, second, bfloat16_kernels.SpatialFilter.of(spatial.filter_bank(), spatial.dilation,
                                                                          spatial.lifting)))
        layer._bfloat16_cache = cached  # one assignment: sessions sharing the model read a whole pair
    return cached[1]


class _InputAttention(AttentiveLayer):
    """Mixin: attend to the input, then run the parent convolution.

    A bfloat16 input in inference is attended in bfloat16 channels last (:func:`_bfloat16_attend`), and the
    convolution then runs in bfloat16 too (:func:`models.gconv.conv2d`): the network's bfloat16 path.
    """

    def attend(self, f: torch.Tensor):
        if f.dtype == torch.bfloat16 and (done := _bfloat16_attend(self, f)) is not None:
            return done
        # The compiled kernels where they apply (same function, a fraction of the memory traffic).
        if kernels_cover(self, f):
            out, channel, spatial = input_attention_kernels.attend(self, f)
            return out, AttentionParts(channel, spatial, self.attention_group_axes)
        return super().attend(f)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        if x.dtype == torch.bfloat16 and (done := self._bfloat16_forward(x)) is not None:
            out, parts = done
        elif self._pools_in_the_gate(x):
            # A pointwise convolution runs on the pooled input (gconv.convolve_and_pool): the kernels' gate writes
            # the attended input pooled, in one pass over it instead of three (the DenseNets' transitions).
            self.check_input(x)
            pooled, channel, spatial = input_attention_kernels.attend(self, x, pool=self.pool)
            out, parts = self._convolve(pooled), AttentionParts(channel, spatial, self.attention_group_axes)
        else:
            attended, parts = self.attend(x)
            out = super().forward(attended)
        return (out, parts) if return_attention else out

    def _bfloat16_forward(self, x: torch.Tensor):
        """The layer on a bfloat16 ``x`` in inference through the bfloat16 kernels: ``(out, parts)``, or None where
        they do not cover it. A pooled pointwise convolution runs on the gate's pooled output; a convolution by split
        weights (:func:`models.gconv.split_bank`: twice the input's channels) on the gate's output written twice."""
        self.check_input(x)
        pooled = self.pool > 1 and self.pointwise and self._tiles(x)
        planes = x.shape[1] * (1 if x.dim() == 4 else x.shape[2])  # the convolution's input channels
        copies = self.filter_bank(torch.bfloat16).shape[1] // planes
        done = _bfloat16_attend(self, x, self.pool if pooled else 1, copies)
        if done is None:
            return None
        attended, parts = done
        if pooled or self.pool == 1:
            return self._convolve(attended), parts
        return convolve_and_pool(self._convolve, attended, self.pool, self.pointwise), parts

    def _pools_in_the_gate(self, x: torch.Tensor) -> bool:
        """Inference (no gradient wanted) of a pooled pointwise convolution the kernels cover, on planes that the
        pooling tiles exactly (as pooling.spatial_avg_pool's tiles)."""
        return (self.pool > 1 and self.pointwise and self._tiles(x)
                and kernels_cover(self, x) and not input_attention_kernels.wants_graph(self, x))

    def _tiles(self, x: torch.Tensor) -> bool:
        """Whether the pooling tiles ``x``'s planes exactly (as pooling.spatial_avg_pool's tiles)."""
        return x.shape[-1] > self.pool and x.shape[-2] % self.pool == 0 and x.shape[-1] % self.pool == 0


class InputAttentiveLiftingConv(_InputAttention, LiftingConv):
    """alpha_F lifting convolution. Arguments as :class:`LiftingConv` plus the two attention modules.

    Shape: ``(B, C_in, X, Y)`` -> ``(B, C_out, G, X', Y')``. Attention parts:
    channel ``(B, C_in, 1, 1)``, spatial ``(B, 1, X, Y)``; effective map
    ``(B, C_in, X, Y)``.
    """


class InputAttentiveGroupConv(_InputAttention, GroupConv):
    """alpha_F group convolution. Arguments as :class:`GroupConv` plus the two attention modules.

    Shape: ``(B, C_in, G, X, Y)`` -> ``(B, C_out, G, X', Y')``. Attention parts:
    channel ``(B, C_in, G, 1, 1)``, spatial ``(B, 1, G, X, Y)``; effective map
    ``(B, C_in, G, X, Y)``.
    """

    attention_group_axes = (2,)
