"""The PCam DenseNet of Veeling et al. (2018), planar, p4 and p4m, as in the paper's code.

96x96 patches, valid 3x3 convolutions. Five dense blocks (BN-ReLU-conv 3x3,
output concatenated with the input cropped by one pixel) with transition blocks
(BN-ReLU-conv 1x1, 2x2 average pooling) between them:
96 -> 94 -> 92 -> 46 -> 44 -> 22 -> 20 -> 10 -> 8 -> 4 -> 2. Every pooled size
is even, so equivariance is exact. Two logits: a 1x1 convolution, then the
mean over positions and orientations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..cpu.relu_bn import relu_bn
from ..network import Network, Trace, call
from ..pooling import spatial_avg_pool
from .layer_factory import LayerFactory, he_normal_init_

__all__ = ["DenseNetConfig", "DenseNet"]

# Dilation of the alpha_F spatial-attention filters in the paper's code: larger
# early, where the maps are large ("dilatedkernelseverywhere").
_BLOCK_DILATIONS = (4, 4, 3, 2)
_TRANSITION_DILATIONS = (4, 4, 3, 1)


@dataclass(frozen=True)
class DenseNetConfig:
    """Args:
        group: None, "p4" or "p4m".
        attention: "none" or "input" (alpha_F), see ``LayerFactory``.
        channels: growth rate and width of the first layer (planar 26, p4 13, p4m 9).
        blocks: dense blocks.
        in_channels, num_classes: input channels and classes.
        input_attention_dilation: dilation of the alpha_F spatial filter on the image.
        attention_reduction: MLP reduction of full channel attention (alpha_F uses
            a two-unit MLP everywhere, as the paper's code).
        attention_kernel: spatial filter size of full attention.

    The dilated and smaller spatial filters of the paper's alpha_F DenseNet are
    kept for ``attention="input"``; full attention uses ``attention_kernel``
    undilated everywhere, the paper's default.
    """

    group: str | None = "p4m"
    attention: str = "none"
    channels: int = 9
    blocks: int = 5
    in_channels: int = 3
    num_classes: int = 2
    input_attention_dilation: int = 4
    attention_reduction: int = 16
    attention_kernel: int = 7


class DenseBlock(nn.Module):
    def __init__(self, make: LayerFactory, in_ch: int, growth: int, attention: dict):
        super().__init__()
        self.bn = make.batch_norm(in_ch)
        self.conv = make.conv(in_ch, growth, 3, 0, **attention)

    def forward(self, x: torch.Tensor, trace: Trace | None, concatenate: bool = True):
        """The new channels, then ``x`` cropped to their size: concatenated, or as the pair of parts, which
        :func:`relu_bn` reads in place (one pass over memory in inference instead of three)."""
        h = call(self.conv, relu_bn(self.bn, (x,)), trace)
        parts = (h, x[..., 1:-1, 1:-1])
        return torch.cat(parts, dim=1) if concatenate else parts


class TransitionBlock(nn.Module):
    """BN-ReLU-conv 1x1-average pooling 2x2, the pooling inside the convolution layer.

    The 1x1 convolution then runs on the pooled (and, for alpha_F, attended) input:
    a quarter of the products, the same result up to round-off. Its traced
    output is the pooled one.
    """

    def __init__(self, make: LayerFactory, channels: int, attention: dict):
        super().__init__()
        self.bn = make.batch_norm(channels)
        self.conv = make.conv(channels, channels, 1, 0, pool=2, **attention)

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, ...], trace: Trace | None) -> torch.Tensor:
        """``x``: the dense block's output, or its parts (``DenseBlock(..., concatenate=False)``)."""
        return call(self.conv, relu_bn(self.bn, x if isinstance(x, tuple) else (x,)), trace)


class DenseNet(Network):
    """Shape: ``(B, in_channels, 96, 96)`` -> ``(B, num_classes)``.

    Attention maps: ``"c1"``, ``"block_layers.i.conv"``, ``"trans_layers.i.conv"``, ``"c_out"``.
    """

    def __init__(self, config: DenseNetConfig):
        super().__init__(config)
        make = LayerFactory(config.group, config.attention, wscale=math.sqrt(2.0))
        width = growth = config.channels
        paper_input = config.attention == "input"
        full = dict(reduction=config.attention_reduction, att_kernel=config.attention_kernel)
        self.c1 = make.lift(config.in_channels, width, 3, 0, reduction=1,
                            att_kernel=config.attention_kernel,
                            att_dilation=config.input_attention_dilation if paper_input else 1)
        blocks, transitions = [], []
        for i in range(config.blocks):
            last = i == config.blocks - 1
            if paper_input:
                # The last block's spatial attention uses a 5x5 filter on its small maps.
                kernel, dilation = (5, 1) if last else (7, _BLOCK_DILATIONS[min(i, 3)])
                block_att = dict(reduction=max(width // 2, 1), att_kernel=kernel, att_dilation=dilation)
                trans_att = dict(reduction=max((width + growth) // 2, 1), att_dilation=_TRANSITION_DILATIONS[min(i, 3)])
            else:
                block_att = trans_att = full
            blocks.append(DenseBlock(make, width, growth, block_att))
            width += growth
            if not last:
                transitions.append(TransitionBlock(make, width, trans_att))
        self.block_layers = nn.ModuleList(blocks)
        self.trans_layers = nn.ModuleList(transitions)
        self.bn_out = make.batch_norm(width)
        out_att = dict(reduction=max(width // 2, 1), att_kernel=3) if paper_input else full
        self.c_out = make.conv(width, config.num_classes, 1, 0, **out_att)
        if config.group is None:
            he_normal_init_(self)

    @property
    def output_stride(self) -> int:
        # Valid convolutions and one 2 x 2 pooling per transition: one output per 2^transitions pixels.
        return 2 ** (self.config.blocks - 1)

    def _position_logits(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        h = call(self.c1, x, trace)
        for block, transition in zip(self.block_layers[:-1], self.trans_layers, strict=True):
            h = transition(block(h, trace, concatenate=False), trace)
        h = relu_bn(self.bn_out, self.block_layers[-1](h, trace, concatenate=False))
        return call(self.c_out, h, trace)  # (B, classes, [G,] X', Y')

    def _forward(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        h = self._position_logits(x, trace)
        h = spatial_avg_pool(h, h.shape[-1])  # (B, classes, [G,] 1, 1)
        return h.flatten(2).mean(dim=2)  # (B, classes)
