"""All-CNN-C (Springenberg et al. 2015) for CIFAR-10, planar, p4 and p4m (Cohen & Welling 2016).

The original's two stride-2 convolutions break exact equivariance on 32x32
inputs; as in the paper's appendix each is replaced by a stride-1 convolution
followed by 2x2 max pooling (32 -> 16 -> 8), which is exactly equivariant.
Logits are the mean over orientations and positions of the last layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..dropout import Dropout
from ..network import Network, Trace, call
from ..pooling import spatial_max_pool
from .layer_factory import LayerFactory

__all__ = ["AllCNNCConfig", "AllCNNC"]


@dataclass(frozen=True)
class AllCNNCConfig:
    """Args:
        group: None, "p4" or "p4m".
        attention: see ``LayerFactory`` ("none", "input", "full", ...).
        channels: base width (planar 96, p4 48, p4m 32; doubled after the first pool).
        in_channels, num_classes: input channels and classes.
        input_dropout, dropout: dropout on the image and after each pool.
        attention_reduction: MLP reduction of the channel attention in group layers (the paper: 16).
        attention_kernel: spatial-attention filter size (the paper: 7).
    """

    group: str | None = "p4"
    attention: str = "none"
    channels: int = 48
    in_channels: int = 3
    num_classes: int = 10
    input_dropout: float = 0.2
    dropout: float = 0.5
    attention_reduction: int = 16
    attention_kernel: int = 7


class AllCNNC(Network):
    """Shape: ``(B, in_channels, 32, 32)`` -> ``(B, num_classes)``. Attention maps ``"c1"`` ... ``"c9"``."""

    def __init__(self, config: AllCNNCConfig):
        super().__init__(config)
        # Initialisation of Cohen & Welling's code: N(0, 0.05) planar, U(+-0.035 / sqrt(fan_in)) group.
        make = LayerFactory(config.group, config.attention, wscale=0.035)
        c1, c2 = config.channels, 2 * config.channels
        att = dict(att_kernel=config.attention_kernel, reduction=config.attention_reduction)
        self.c1 = make.lift(config.in_channels, c1, 3, 1, att_kernel=config.attention_kernel, reduction=1)
        widths = [(c1, c1, 3), (c1, c1, 3), (c1, c2, 3), (c2, c2, 3), (c2, c2, 3), (c2, c2, 3), (c2, c2, 1)]
        for i, (cin, cout, k) in enumerate(widths, start=2):
            setattr(self, f"c{i}", make.conv(cin, cout, k, k // 2, **att))
        self.c9 = make.conv(c2, config.num_classes, 1, 0, **att)
        self.dp_init = Dropout(config.input_dropout)
        self.dp = Dropout(config.dropout)
        for i, width in enumerate([c1, c1, c1, c2, c2, c2, c2, c2, config.num_classes], start=1):
            setattr(self, f"bn{i}", make.batch_norm(width))
        if config.group is None:
            for i in range(1, 10):
                nn.init.normal_(getattr(self, f"c{i}").weight, 0.0, 0.05)

    def _forward(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        out = self.dp_init(x)
        for i in range(1, 10):
            out = call(getattr(self, f"c{i}"), out, trace)
            if i in (3, 6):
                out = spatial_max_pool(out, 2)
            out = torch.relu(getattr(self, f"bn{i}")(out))
            if i in (3, 6):
                out = self.dp(out)
        # Average over everything but batch and channel: (B, classes)
        return out.flatten(2).mean(dim=2)
