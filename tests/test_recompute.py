"""``recomputed`` and ``recomputed_in_chunks`` give the gradients of the plain call, keeping only its inputs."""

import functools

import pytest
import torch
from torch import nn

from models.attention.recompute import recomputed, recomputed_in_chunks


def test_gradients_of_inputs_and_parameters_equal_the_plain_call():
    torch.manual_seed(0)
    layer = nn.Linear(5, 4).double()
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    frozen = torch.randn(3, 4, dtype=torch.float64)

    def fn(x, scale, frozen, missing, power):
        assert missing is None
        return torch.tanh(layer(x * scale)) ** power + frozen, x.sum()

    grads = []
    for wrap in (False, True):
        layer.zero_grad()
        args = (x, scale, frozen, None)
        call = functools.partial(fn, power=3)
        out, total = recomputed(call, *args, params=list(layer.parameters())) if wrap else call(*args)
        (out.square().sum() + 2 * total).backward()
        grads.append([t.grad.clone() for t in (x, scale, layer.weight, layer.bias)])
        x.grad = scale.grad = None
    for mine, plain in zip(*grads, strict=True):
        torch.testing.assert_close(mine, plain, rtol=1e-12, atol=1e-12)


def test_nothing_but_the_inputs_is_kept():
    x = torch.randn(1000, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = recomputed(lambda t: torch.sin(torch.exp(t)) * 2, x)
    assert len(saved) == 1 and saved[0] is x
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(torch.exp(x.detach())) * torch.exp(x.detach()) * 2)


def test_without_gradients_it_is_the_plain_call():
    with torch.no_grad():
        x = torch.randn(4, requires_grad=True)
        y = recomputed(torch.sin, x)
    assert y.grad_fn is None
    torch.testing.assert_close(y, torch.sin(x.detach()))


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])  # one sample, a ragged last chunk, one chunk, more than the batch
def test_chunked_gradients_equal_the_plain_call(chunk):
    torch.manual_seed(1)
    layer = nn.Linear(5, 4).double()
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    rows = torch.randn(7, 1, dtype=torch.float64, requires_grad=True)
    shared = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def fn(x, missing, rows, shared):
        assert missing is None
        return torch.tanh(layer(x * shared)) * rows

    grads = []
    for wrap in (False, True):
        layer.zero_grad()
        if wrap:
            out = recomputed_in_chunks(fn, (x, None, rows), (shared,), chunk, params=list(layer.parameters()))
        else:
            out = fn(x, None, rows, shared)
        out.sin().sum().backward()
        grads.append([t.grad.clone() for t in (x, rows, shared, layer.weight, layer.bias)])
        x.grad = rows.grad = shared.grad = None
    for mine, plain in zip(*grads, strict=True):
        torch.testing.assert_close(mine, plain, rtol=1e-12, atol=1e-12)


def test_chunked_needs_a_batched_tensor():
    with pytest.raises(ValueError, match="at least one batched tensor"):
        recomputed_in_chunks(torch.sin, (None,), (torch.zeros(2),), 1)
