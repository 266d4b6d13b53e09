"""Activation recomputation: run a function without keeping its intermediates, rebuild them in backward.

The same idea as ``torch.utils.checkpoint``, kept to what the attentive layers need.
``torch.utils.checkpoint`` imports some 800 modules on first use (about 75 MiB of
resident memory in this process), which would count as memory of the first
training step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["recomputed"]


def recomputed(fn: Callable, *tensors: torch.Tensor | None, params: Sequence[torch.Tensor] = ()):
    """``fn(*tensors)``, keeping only ``tensors`` for the backward pass, where ``fn`` runs again.

    Args:
        fn: a deterministic function of ``tensors`` (bind other arguments beforehand),
            returning a tensor or a tuple of tensors.
        tensors: its tensor arguments (None allowed).
        params: tensors ``fn`` uses without taking them as arguments (module parameters),
            which need gradients too.
    """
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (*tensors, *params)):
        with torch.no_grad():
            return fn(*tensors)
    return _Recomputed.apply(fn, len(params), *tensors, *params)


def _leaf(t):
    return None if t is None else t.detach().requires_grad_(t.requires_grad)


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, n_params, *tensors):
        inputs = tensors[: len(tensors) - n_params]
        ctx.fn, ctx.params = fn, tensors[len(tensors) - n_params :]
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [_leaf(t) for t in ctx.saved_tensors]
        with torch.enable_grad():
            outputs = ctx.fn(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None and o.requires_grad]
        # The parameters themselves are leaves of the rebuilt graph: differentiate with respect to them.
        wanted = [t is not None and t.requires_grad for t in (*inputs, *ctx.params)]
        targets = [t for t, w in zip((*inputs, *ctx.params), wanted, strict=True) if w]
        found = iter(
            torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
            if pairs and targets
            else [None] * len(targets)
        )
        results = [next(found) if w else None for w in wanted]
        return None, None, *results
