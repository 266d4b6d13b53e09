"""``recomputed`` gives the gradients of the plain call, keeping only its inputs."""

import functools

import torch
from torch import nn

from models.attention.recompute import recomputed


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
