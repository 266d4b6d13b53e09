"""The model's input convention, and the way from the network's frame back to the user's image frame.

A model card's ``input`` says the network takes ``(pixels - mean) / std``,
with the image transposed first when ``transposed`` (the paper's rot-MNIST
models learnt from digits stored transposed). Everything the app shows is in
the user's frame, so maps come back through the inverse of that transposition.

Transposing planes alone would not do for group feature maps: the transpose t
is itself a reflection, so a rotation r seen by the network is ``t r t = r^-1``
in the user's frame. The map back therefore also relabels every group axis by
conjugation, ``h -> t h t`` (an automorphism of p4 and of p4m). With
``T(f)(x, h) = f(t x, t h t)`` one has ``T(g'.f) = g.T(f)`` for ``g' = t g t``,
which is exactly what makes the network's equivariance read as
``maps(g.x) = g.maps(x)`` in the user's frame, with the user's g.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from models import Group
from models.attention.parts import AttentionParts

__all__ = ["InputFrame", "transpose_conjugation"]


def transpose_conjugation(group: Group) -> torch.Tensor:
    """``[G]`` long tensor; entry h is the index of ``t h t`` (t = transpose of the plane).

    Found from the actions themselves: the element whose plane action equals
    transpose, act by h, transpose, on an image with distinct pixels.
    """
    probe = torch.arange(9.0).reshape(3, 3)
    actions = [group.act_on_plane(probe, h) for h in group.elements()]
    rows = []
    for h in group.elements():
        conjugated = group.act_on_plane(probe.T, h).T
        rows.append(next(i for i, moved in enumerate(actions) if torch.equal(moved, conjugated)))
    return torch.tensor(rows, dtype=torch.long)


@dataclass(frozen=True)
class InputFrame:
    """How images enter one network and how its maps come back to the user's frame.

    Attributes:
        group: the group whose axes the maps carry (None for planar networks).
        mean, std: per channel, for pixels in [0, 1].
        transposed: the network sees images transposed.
    """

    group: Group | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    transposed: bool

    @classmethod
    def from_card(cls, card: dict, group: Group | None) -> InputFrame:
        spec = card["input"]
        return cls(group, tuple(float(m) for m in spec["mean"]), tuple(float(s) for s in spec["std"]),
                   bool(spec["transposed"]))

    def to_network(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] in the user's frame -> what the network takes. Shape ``(B, C, X, Y)``."""
        mean = torch.tensor(self.mean, dtype=images.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype).view(1, -1, 1, 1)
        out = (images - mean) / std
        return out.transpose(-2, -1) if self.transposed else out

    def to_user(self, tensor: torch.Tensor, group_axes: tuple[int, ...] = ()) -> torch.Tensor:
        """A network map ``(..., X, Y)`` -> the user's frame: planes transposed back, group axes relabelled."""
        if not self.transposed:
            return tensor
        out = tensor.transpose(-2, -1)
        for axis in group_axes:
            out = out.index_select(axis, self._conjugation)
        return out

    def attention_to_user(self, parts: AttentionParts) -> AttentionParts:
        """A layer's attention parts (channel, spatial; either may be None) in the user's frame."""
        axes = tuple(parts.group_axes)
        return AttentionParts(*(None if t is None else self.to_user(t, axes) for t in (parts.channel, parts.spatial)),
                              group_axes=axes)

    @cached_property
    def _conjugation(self) -> torch.Tensor:
        return transpose_conjugation(self.group)

