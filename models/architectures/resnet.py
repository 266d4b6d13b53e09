"""ResNet-44 for CIFAR-10 (He et al. 2016, pre-activation blocks), planar and p4m (Cohen & Welling 2016).

Three stages of 7 blocks on 32, 16 and 8 pixel maps. Where a stage starts, the
stride-2 convolutions of the original become stride-1 convolutions followed by
2x2 max pooling (on the residual and the shortcut), keeping exact equivariance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..network import Network, Trace, call
from ..pooling import spatial_avg_pool, spatial_max_pool
from .layer_factory import LayerFactory, he_normal_init_

__all__ = ["ResNetConfig", "ResNet44"]


@dataclass(frozen=True)
class ResNetConfig:
    """Args:
        group: None or "p4m" (p4 works too).
        attention: "none" or "input" (alpha_F), see ``LayerFactory``.
        widths: channels of the three stages (planar 32/64/128, p4m 11/23/45).
        blocks: residual blocks per stage (7 gives 44 layers).
        in_channels, num_classes: input channels and classes.
        attention_kernel: spatial-attention filter size.
    """

    group: str | None = "p4m"
    attention: str = "none"
    widths: tuple[int, int, int] = (11, 23, 45)
    blocks: int = 7
    in_channels: int = 3
    num_classes: int = 10
    attention_kernel: int = 7

    def __post_init__(self):
        # JSON round trips give lists; keep the config hashable and comparable.
        object.__setattr__(self, "widths", tuple(self.widths))


class ResBlock(nn.Module):
    """Pre-activation block: x -> conv(relu(bn(conv(relu(bn(x)))))) + shortcut(x).

    With ``downsample`` the first convolution and the shortcut are followed by
    2x2 max pooling; ``shortcut`` is a 1x1 convolution where the width changes.
    In attentive networks every convolution carries alpha_F attention with a
    two-unit MLP (reduction C // 2, as the paper's code).
    """

    def __init__(self, make: LayerFactory, in_ch: int, out_ch: int, downsample: bool, att_kernel: int):
        super().__init__()
        self.downsample = downsample
        self.bn1 = make.batch_norm(in_ch)
        self.c1 = make.conv(in_ch, out_ch, 3, 1, reduction=max(in_ch // 2, 1), att_kernel=att_kernel)
        self.bn2 = make.batch_norm(out_ch)
        self.c2 = make.conv(out_ch, out_ch, 3, 1, reduction=max(out_ch // 2, 1), att_kernel=att_kernel)
        self.fiber_map = (
            make.conv(in_ch, out_ch, 1, 0, reduction=max(in_ch // 2, 1), att_kernel=att_kernel)
            if in_ch != out_ch or downsample
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        h = call(self.c1, torch.relu(self.bn1(x)), trace)
        if self.downsample:
            h = spatial_max_pool(h, 2)
        h = call(self.c2, torch.relu(self.bn2(h)), trace)
        shortcut = x if isinstance(self.fiber_map, nn.Identity) else call(self.fiber_map, x, trace)
        if self.downsample:
            shortcut = spatial_max_pool(shortcut, 2)
        return shortcut + h


class ResNet44(Network):
    """Shape: ``(B, in_channels, 32, 32)`` -> ``(B, num_classes)``.

    Attention maps are named by module, e.g. ``"layers_nc16.0.c1"``. (The
    paper's alpha_F ResNet flips every input left-right before the first layer,
    a leftover debugging line; the p4m network is mirror invariant so its
    logits do not change, and we leave it out.)
    """

    def __init__(self, config: ResNetConfig):
        super().__init__(config)
        make = LayerFactory(config.group, config.attention, wscale=math.sqrt(2.0))
        w32, w16, w8 = config.widths
        k = config.attention_kernel
        self.c1 = make.lift(config.in_channels, w32, 3, 1, reduction=1, att_kernel=k)
        stages = []
        for stage, (cin, cout) in enumerate([(w32, w32), (w32, w16), (w16, w8)]):
            blocks = [
                ResBlock(make, cin if i == 0 else cout, cout, downsample=stage > 0 and i == 0, att_kernel=k)
                for i in range(config.blocks)
            ]
            stages.append(nn.ModuleList(blocks))
        self.layers_nc32, self.layers_nc16, self.layers_nc8 = stages
        self.bn_out = make.batch_norm(w8)
        self.c_out = make.conv(w8, config.num_classes, 1, 0, reduction=max(w8 // 2, 1), att_kernel=k)
        if config.group is None:
            he_normal_init_(self)

    def _forward(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        h = call(self.c1, x, trace)
        for stage in (self.layers_nc32, self.layers_nc16, self.layers_nc8):
            for block in stage:
                h = block(h, trace)
        h = torch.relu(self.bn_out(h))
        h = spatial_avg_pool(h, h.shape[-1])  # (B, C, [G,] 1, 1)
        h = call(self.c_out, h, trace)
        return h.flatten(2).mean(dim=2)  # mean over orientations: (B, classes)
