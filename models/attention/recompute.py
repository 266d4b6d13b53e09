"""Activation recomputation: run a function without keeping its intermediates, rebuild them in backward.

The same idea as ``torch.utils.checkpoint``, kept to what the attentive layers need,
plus splitting the batch: :func:`recomputed_in_chunks` rebuilds one chunk at a time,
so the backward pass holds one chunk's intermediates at once. ``torch.utils.checkpoint``
imports some 800 modules on first use (about 75 MiB of resident memory in this
process), which would count as memory of the first training step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["recomputed", "recomputed_in_chunks"]


def recomputed(fn: Callable, *tensors: torch.Tensor | None, params: Sequence[torch.Tensor] = ()):
    """``fn(*tensors)``, keeping only ``tensors`` for the backward pass, where ``fn`` runs again.

    Args:
        fn: a deterministic function of ``tensors`` (bind other arguments beforehand),
            returning a tensor or a tuple of tensors.
        tensors: its tensor arguments (None allowed).
        params: tensors ``fn`` uses without taking them as arguments (module parameters),
            which need gradients too.
    """
    return _apply(fn, (), tensors, 1, params)


def recomputed_in_chunks(
    fn: Callable, batched: Sequence[torch.Tensor | None], shared: Sequence[torch.Tensor | None], chunk: int,
    params: Sequence[torch.Tensor] = (),
) -> torch.Tensor:
    """``torch.cat([fn(*(t[i:i + chunk] for t in batched), *shared) for i in ...])``, recomputed chunk by chunk.

    Like :func:`recomputed`, for a ``fn`` that treats the samples (axis 0) of the
    ``batched`` tensors independently and returns one tensor with a sample axis. The
    backward pass rebuilds and differentiates one chunk at a time, and writes each
    chunk's share of the batched inputs' gradients in place (a gradient through a slice
    would be a zero tensor the size of the whole input, per chunk).
    """
    if not any(t is not None for t in batched):
        raise ValueError("recomputed_in_chunks needs at least one batched tensor")
    return _apply(fn, batched, shared, chunk, params)


def _apply(fn, batched, shared, chunk, params):
    tensors = (*batched, *shared)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (*tensors, *params)):
        with torch.no_grad():
            return _call(fn, batched, shared, chunk)
    return _Recomputed.apply(fn, chunk, len(batched), len(params), *tensors, *params)


def _chunks(batched, chunk):
    """(rows, the batched tensors' rows) per chunk; one chunk of everything where nothing is batched."""
    if not batched:
        yield slice(None), []
        return
    size = next(t.shape[0] for t in batched if t is not None)
    for start in range(0, size, chunk):
        rows = slice(start, start + chunk)
        yield rows, [None if t is None else t[rows] for t in batched]


def _call(fn, batched, shared, chunk):
    if not batched:
        return fn(*shared)
    pieces = [fn(*part, *shared) for _, part in _chunks(batched, chunk)]
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def _leaf(t):
    return None if t is None else t.detach().requires_grad_(t.requires_grad)


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, chunk, n_batched, n_params, *tensors):
        inputs = tensors[: len(tensors) - n_params]
        ctx.fn, ctx.chunk, ctx.n_batched, ctx.params = fn, chunk, n_batched, tensors[len(tensors) - n_params :]
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return _call(fn, inputs[:n_batched], inputs[n_batched:], chunk)

    @staticmethod
    def backward(ctx, *grads):
        batched, shared = ctx.saved_tensors[: ctx.n_batched], [_leaf(t) for t in ctx.saved_tensors[ctx.n_batched :]]
        wanted = [t is not None and t.requires_grad for t in (*batched, *shared, *ctx.params)]
        # Batched inputs: each chunk writes its rows. Shared inputs and parameters: summed over chunks.
        results = [torch.empty_like(t) if w else None for t, w in zip(batched, wanted, strict=False)]
        results += [None] * (len(shared) + len(ctx.params))
        for rows, part in _chunks(batched, ctx.chunk):
            inputs = [_leaf(t) for t in part]
            with torch.enable_grad():
                outputs = ctx.fn(*inputs, *shared)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            grads_here = [g if not batched or g is None else g[rows] for g in grads]
            pairs = [(o, g) for o, g in zip(outputs, grads_here, strict=True) if g is not None and o.requires_grad]
            # The parameters themselves are leaves of the rebuilt graph: differentiate with respect to them.
            targets = [t for t, w in zip((*inputs, *shared, *ctx.params), wanted, strict=True) if w]
            found = iter(
                torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
                if pairs and targets
                else [None] * len(targets)
            )
            for i, w in enumerate(wanted):
                if not w:
                    continue
                grad = next(found)
                if i < len(batched):
                    results[i][rows] = 0 if grad is None else grad
                elif grad is not None:
                    results[i] = grad if results[i] is None else results[i].add_(grad)
        return None, None, None, None, *results
