"""Base class of every registered architecture: logits, attention maps and features from one forward pass."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from .attention.parts import AttentionParts, AttentiveLayer
from .groups import Group, get_group

__all__ = ["Network", "Trace", "call"]


@dataclass
class Trace:
    """What one forward pass saw, keyed by the module's name in the network (e.g. ``"c2"``).

    Attributes:
        attention: the :class:`AttentionParts` of every attentive layer.
        features: the output of every convolution, before normalisation:
            ``(B, C, G, X, Y)`` for group layers, ``(B, C, X, Y)`` for planar ones.
    """

    names: dict[nn.Module, str]
    attention: dict[str, AttentionParts] = field(default_factory=dict)
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    only: frozenset[str] | None = None  # record only these layers (None: every layer)

    def run(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        name = self.names[layer]
        if self.only is not None and name not in self.only:
            return layer(x)
        if isinstance(layer, AttentiveLayer):
            out, self.attention[name] = layer(x, return_attention=True)
        else:
            out = layer(x)
        self.features[name] = out
        return out


def call(layer: nn.Module, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
    """Run a convolution, recording its output and attention when tracing."""
    return layer(x) if trace is None else trace.run(layer, x)


class Network(nn.Module):
    """An architecture built from a frozen config.

    Subclasses implement ``_forward(x, trace)`` and route every convolution
    through :func:`call`. Nothing is stored on the module during a forward
    pass, so one instance can serve concurrent callers.

    Attributes:
        config: the frozen dataclass it was built from.
        arch: its registry name (set by :func:`models.build_model`).
    """

    arch: str = ""

    def __init__(self, config):
        super().__init__()
        self.config = config

    @property
    def group(self) -> Group | None:
        name = getattr(self.config, "group", None)
        return get_group(name) if name else None

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """Logits ``(B, classes)``; with ``return_attention`` also the effective attention maps.

        Returns:
            ``logits``, or ``(logits, maps)`` where ``maps[name]`` is
            ``AttentionParts.effective()`` of that layer (``1 - alpha_c * alpha_s``,
            the multiplier the network applies; shapes in each layer's docstring).
        """
        if not return_attention:
            return self._forward(x, None)
        logits, trace = self.trace(x)
        return logits, {name: parts.effective() for name, parts in trace.attention.items()}

    def trace(self, x: torch.Tensor, record: Iterable[str] | None = None) -> tuple[torch.Tensor, Trace]:
        """Logits and a :class:`Trace` of every convolution's output and attention parts.

        Args:
            record: names of the only layers to keep (None: every layer), so that a batch run for one layer's
                attention does not hold every layer's output.
        """
        trace = Trace({module: name for name, module in self.named_modules()},
                      only=None if record is None else frozenset(record))
        return self._forward(x, trace), trace

    def position_logits(self, x: torch.Tensor, record: Iterable[str] = ()) -> tuple[torch.Tensor, Trace]:
        """Logits at every output position, before the network's final mean over positions (and orientations).

        Only fully convolutional architectures (:attr:`output_stride` > 0) have them: on an input larger than the
        training size they give one logit vector per ``output_stride`` pixels, which region mode averages per cell.

        Args:
            x: ``(B, C, X, Y)``.
            record: names of the layers whose attention and features the returned trace keeps (the rest are not
                kept, so that a large input does not hold every layer's output).

        Returns:
            ``(B, classes, [G,] X', Y')`` and the :class:`Trace` of the recorded layers.
        """
        if not self.output_stride:
            raise NotImplementedError(f"{self.arch or type(self).__name__} has no per-position logits: it is not "
                                      "fully convolutional")
        trace = Trace({module: name for name, module in self.named_modules()}, only=frozenset(record))
        return self._position_logits(x, trace), trace

    @property
    def output_stride(self) -> int:
        """Input pixels per output position of :meth:`position_logits`; 0 where the network has none."""
        return 0

    def _position_logits(self, x: torch.Tensor, trace: Trace) -> torch.Tensor:
        raise NotImplementedError

    def _forward(self, x: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        raise NotImplementedError
