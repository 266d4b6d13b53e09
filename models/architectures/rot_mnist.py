"""The rotated-MNIST networks of the paper (Z2CNN / P4CNN of Cohen & Welling 2016, with attention).

Seven 3x3 convolutions (the last 4x4) on 28x28 digits, valid padding, one 2x2
max pool after the second; 28 -> 26 -> 24 -> 12 -> 10 -> 8 -> 6 -> 4 -> 1.
Every size the pool sees is even and the pool tiles it, so the p4 networks are
exactly rotation invariant. The group networks end with a max over orientations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..dropout import Dropout
from ..network import Network, Trace, call
from ..pooling import group_max_pool, spatial_max_pool
from .layer_factory import LayerFactory

__all__ = ["RotMNISTConfig", "RotMNISTCNN"]


@dataclass(frozen=True)
class RotMNISTConfig:
    """Args:
        group: None (Z2CNN), "p4" or "p4m".
        attention: see ``LayerFactory``.
        channels: width of every hidden layer (Z2CNN 20, P4CNN 10).
        in_channels, num_classes: input channels and classes.
        dropout: dropout after layers 1, 3, 4, 5 and 6.
        attention_reduction: MLP reduction of the channel attention in group layers.
        attention_kernel: spatial-attention filter size.
        input_attention_dilation: dilation of the alpha_F spatial filter on the image.
    """

    group: str | None = "p4"
    attention: str = "none"
    channels: int = 10
    in_channels: int = 1
    num_classes: int = 10
    dropout: float = 0.3
    attention_reduction: int = 2
    attention_kernel: int = 7
    input_attention_dilation: int = 4


class RotMNISTCNN(Network):
    """Z2CNN / P4CNN and their attentive versions.

    Shape: ``(B, in_channels, 28, 28)`` -> logits ``(B, num_classes)``.
    Attention maps are named ``"c1"`` ... ``"c7"``.
    """

    def __init__(self, config: RotMNISTConfig):
        super().__init__(config)
        make = LayerFactory(config.group, config.attention)
        c, k = config.channels, 3
        att = dict(att_kernel=config.attention_kernel)
        # alpha_F attends to the image with a dilated filter; full attention on the
        # lifting layer uses no MLP reduction (a single input channel).
        lift_att = dict(att, reduction=1)
        if config.attention == "input":
            lift_att["att_dilation"] = config.input_attention_dilation
        hidden_att = dict(att, reduction=config.attention_reduction)
        self.c1 = make.lift(config.in_channels, c, k, **lift_att)
        for i in range(2, 7):
            setattr(self, f"c{i}", make.conv(c, c, k, **hidden_att))
        self.c7 = make.conv(c, config.num_classes, 4, **hidden_att)
        self.dp = Dropout(config.dropout)
        for i in range(1, 7):
            setattr(self, f"bn{i}", make.batch_norm(c))
        if config.group is None:
            # Z2CNN's init: N(0, 1/fan_in)
            for conv in self.convolutions():
                nn.init.normal_(conv.weight, 0.0, conv.weight[0].numel() ** -0.5)

    def convolutions(self) -> list[nn.Module]:
        return [getattr(self, f"c{i}") for i in range(1, 8)]

    def _forward(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        out = self.dp(torch.relu(self.bn1(call(self.c1, x, trace))))
        out = torch.relu(self.bn2(call(self.c2, out, trace)))
        out = spatial_max_pool(out, 2)
        for i in range(3, 7):
            conv, bn = getattr(self, f"c{i}"), getattr(self, f"bn{i}")
            out = self.dp(torch.relu(bn(call(conv, out, trace))))
        out = call(self.c7, out, trace)
        if out.shape[-2:] != (1, 1):
            # Any other size would flatten into the wrong number of logits.
            raise ValueError(f"{self.arch or type(self).__name__} expects 28x28 inputs, got {tuple(x.shape[-2:])} "
                             f"(its last layer gave {tuple(out.shape[-2:])} positions, not 1 x 1)")
        if self.group is not None:
            out = group_max_pool(out)
        return out.flatten(1)  # (B, classes)
