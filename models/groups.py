"""The roto-translation groups p4 and p4m, as pure functions on tensors.

An element of p4m is written (k, m): rotate by k * 90 degrees counter-clockwise
(``torch.rot90(x, k, dims=(-2, -1))``), then, if m, flip the rows
(``torch.flip(x, dims=(-2,))``). p4 is the subgroup m = False. Elements are
numbered as in the paper's code (``grid_global``): index i = k + 4 * m, i.e.
the four rotations first, then the four mirrored ones. With F the row flip and
R the rotation, element (k, m) is F^m R^k and F R F = R^-1, so

    (k1, m1) . (k2, m2) = F^m1 R^k1 F^m2 R^k2 = (k2 + (-1)^m2 k1, m1 xor m2).

A group element g acts on an image by moving its pixels (the plane action
above) and on a group feature map f(x, h) as [g.f](x, h) = f(g^-1 x, g^-1 h):
the planes move with the image and the orientation axis is re-indexed by
``permutation(g)[j] = index(g^-1 h_j)``. A horizontal mirror of an image
(``torch.flip(x, dims=(-1,))``) is the element (2, True).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

__all__ = ["Group", "P4", "P4M", "get_group", "GROUPS"]


@dataclass(frozen=True)
class Group:
    """A finite group of 90-degree rotations, optionally with mirrors.

    Args:
        name: ``"p4"`` or ``"p4m"``.
        mirrors: whether the row flip belongs to the group.
    """

    name: str
    mirrors: bool

    @property
    def order(self) -> int:
        """Number of elements (4 for p4, 8 for p4m)."""
        return 8 if self.mirrors else 4

    @property
    def haar_measure(self) -> float:
        """Weight of one element in the sum over the group, as in the paper's code.

        The paper's group convolutions multiply their output by this constant:
        2 pi / 4 for p4 and 2 * (2 pi / 4) for p4m.
        """
        return (2 if self.mirrors else 1) * (2 * math.pi / 4)

    def elements(self) -> range:
        return range(self.order)

    def parts(self, g: int) -> tuple[int, bool]:
        """The (rotation steps k, mirror m) of element index g."""
        self._check(g)
        return g % 4, g >= 4

    def index(self, k: int, mirror: bool = False) -> int:
        """Element index of (k, mirror)."""
        if mirror and not self.mirrors:
            raise ValueError(f"{self.name} has no mirrored elements")
        return k % 4 + 4 * int(mirror)

    def compose(self, a: int, b: int) -> int:
        """Index of the product a . b (apply b first, then a)."""
        ka, ma = self.parts(a)
        kb, mb = self.parts(b)
        return self.index(kb + (-ka if mb else ka), ma != mb)

    def inverse(self, g: int) -> int:
        k, m = self.parts(g)
        # A mirrored element is its own inverse: F R^k F R^k = R^-k R^k.
        return g if m else self.index(-k)

    def describe(self, g: int) -> str:
        """Human-readable name, e.g. ``"rot 90°"`` or ``"rot 180° + flip"``."""
        k, m = self.parts(g)
        return f"rot {90 * k}°" + (" + flip" if m else "")

    @cached_property
    def permutations(self) -> torch.Tensor:
        """``[G, G]`` long tensor; row g is ``permutation(g)``."""
        rows = [
            [self.compose(self.inverse(g), h) for h in self.elements()] for g in self.elements()
        ]
        # Cached for the life of the process: made outside inference mode even when first asked for
        # inside it (the app), or autograd would later refuse it (training in the same process).
        with torch.inference_mode(False):
            return torch.tensor(rows, dtype=torch.long)

    def permutation(self, g: int) -> torch.Tensor:
        """Re-indexing of the orientation axis under g: entry j is index(g^-1 h_j)."""
        self._check(g)
        return self.permutations[g]

    def act_on_plane(self, x: torch.Tensor, g: int) -> torch.Tensor:
        """Move the pixels of the last two axes of x by element g."""
        k, m = self.parts(g)
        out = torch.rot90(x, k, dims=(-2, -1)) if k else x
        return torch.flip(out, dims=(-2,)) if m else out

    def act(self, x: torch.Tensor, g: int, group_axes: tuple[int, ...] = ()) -> torch.Tensor:
        """Apply g to a tensor whose last two axes are the plane.

        Args:
            x: any tensor ``(..., X, Y)``.
            g: element index.
            group_axes: the axes of x indexed by group elements; each is
                re-indexed by ``permutation(g)``. ``()`` for images, ``(2,)``
                for feature maps ``(B, C, G, X, Y)``.
        """
        out = self.act_on_plane(x, g)
        perm = self.permutation(g).to(x.device)
        for axis in group_axes:
            if out.shape[axis] != self.order:
                raise ValueError(
                    f"axis {axis} of a tensor of shape {tuple(x.shape)} has size "
                    f"{out.shape[axis]}, expected {self.order} ({self.name} elements)"
                )
            out = out.index_select(axis, perm)
        return out

    def _check(self, g: int) -> None:
        if not 0 <= g < self.order:
            raise ValueError(f"{self.name} element index must be in [0, {self.order}), got {g}")


P4 = Group("p4", mirrors=False)
P4M = Group("p4m", mirrors=True)
GROUPS = {group.name: group for group in (P4, P4M)}


def get_group(name: str | Group) -> Group:
    """The group called ``name`` (``"p4"`` or ``"p4m"``)."""
    if isinstance(name, Group):
        return name
    try:
        return GROUPS[name]
    except KeyError:
        raise ValueError(f"unknown group {name!r}; choose from {sorted(GROUPS)}") from None
