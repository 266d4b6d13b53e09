"""What an attentive layer returns besides its output: the attention it applied."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["AttentionParts", "AttentiveLayer", "READINGS"]

# The three ways to read one layer's attention (:meth:`AttentionParts.reading`):
#   "kept":    alpha+ = 1 - alpha_c * alpha_s, what the layer multiplies its input by (bright: kept);
#   "removed": alpha- = alpha_c * alpha_s, the share it subtracts on the residual branch (bright: removed);
#   "spatial": alpha_s alone, the spatial sigmoid the paper's own pictures draw (its code plots ``att_map`` of
#              fSpatialAttention / fSpatialAttentionGG, the factor of the subtracted part).
READINGS = ("kept", "removed", "spatial")


@dataclass(frozen=True)
class AttentionParts:
    """The two sigmoid maps of one attentive layer, as the paper's code computes them.

    The paper's layers compute a sigmoid "alpha-minus" and multiply the
    attended tensor f by ``1 - channel * spatial`` (the residual attention
    branch: ``f - spatial(channel * f) * channel * f``). ``effective`` is that
    multiplier, the attention the network really applies, in [0, 1].

    Either part may be None (channel-only or spatial-only layers); a missing
    part counts as 1. Shapes broadcast against the attended tensor; each
    layer documents its own. ``group_axes`` lists the axes indexed by group
    elements (the same for both parts and the effective map), so that the
    maps can be transformed with ``Group.act``.
    """

    channel: torch.Tensor | None
    spatial: torch.Tensor | None
    group_axes: tuple[int, ...] = ()

    def effective(self) -> torch.Tensor:
        """``1 - channel * spatial`` (alpha+), broadcast to the shape both parts span."""
        return 1 - self.removed()

    def removed(self) -> torch.Tensor:
        """``channel * spatial`` (alpha-): the share of f the residual branch subtracts."""
        present = [part for part in (self.channel, self.spatial) if part is not None]
        return present[0] if len(present) == 1 else present[0] * present[1]

    def reading(self, name: str) -> torch.Tensor | None:
        """One of :data:`READINGS`, un-reduced; None for ``"spatial"`` of a layer without spatial attention."""
        if name == "kept":
            return self.effective()
        if name == "removed":
            return self.removed()
        if name == "spatial":
            return self.spatial
        raise ValueError(f"unknown reading {name!r}; expected one of {READINGS}")


class AttentiveLayer(nn.Module):
    """Base of every attentive convolution: ``forward(x, return_attention=True)`` returns ``(y, AttentionParts)``.

    Used as a mixin before a convolution class: the attention modules are taken
    by keyword and every other argument goes to the convolution.
    """

    attention_group_axes: tuple[int, ...] = ()

    def __init__(
        self, *conv_args, channel_attention: nn.Module | None,
        spatial_attention: nn.Module | None, **conv_kwargs,
    ):
        super().__init__(*conv_args, **conv_kwargs)
        self.channel_attention = channel_attention
        self.spatial_attention = spatial_attention

    def attend(self, f: torch.Tensor) -> tuple[torch.Tensor, AttentionParts]:
        """Apply channel then spatial attention to f on the residual branch.

        Returns ``f - spatial(channel * f) * (channel * f)`` and the two maps,
        evaluated in the paper's order so that results agree to round-off.
        """
        channel = self.channel_attention(f) if self.channel_attention is not None else None
        attended = channel * f if channel is not None else f
        spatial = self.spatial_attention(attended) if self.spatial_attention is not None else None
        parts = AttentionParts(channel, spatial, self.attention_group_axes)
        if spatial is None:
            return f - attended, parts
        # f - spatial * attended in one pass over memory instead of two.
        return torch.addcmul(f, spatial, attended, value=-1), parts
