"""models.Dropout: nn.Dropout's function (keep probability, scaling, eval identity) with a faster CPU mask."""

import math

import pytest
import torch
from torch import nn

from models import build_model
from models.dropout import Dropout


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_keeps_each_element_with_probability_one_minus_p_and_scales_the_kept(p):
    torch.manual_seed(0)
    x = torch.rand(1_000_000) + 1.0  # no zeros, so a zero in the output is a dropped element
    out = Dropout(p).train()(x)
    kept = out != 0
    n = x.numel()
    # Binomial(n, 1 - p): within 5 standard deviations.
    assert abs(kept.sum().item() - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p))
    torch.testing.assert_close(out[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(1)
    x = (torch.rand(64, 10, 7, 7) + 1.0).requires_grad_()
    out = Dropout(0.3).train()(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out != 0).float() / 0.7)


def test_identity_in_eval_and_at_p_zero_and_zero_at_p_one():
    x = torch.randn(4, 5)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_same_seed_same_mask():
    x = torch.randn(8, 100)
    torch.manual_seed(7)
    first = Dropout(0.3).train()(x)
    torch.manual_seed(7)
    assert torch.equal(Dropout(0.3).train()(x), first)


def test_rejects_a_probability_outside_0_1():
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\], got 1.5"):
        Dropout(1.5)


@pytest.mark.parametrize("arch", ["p4cnn", "a_p4cnn", "p4m_allcnnc"])
def test_networks_use_it_and_their_checkpoints_are_unchanged(arch):
    model = build_model(arch)
    assert not any(type(m) is nn.Dropout for m in model.modules())
    assert any(isinstance(m, Dropout) for m in model.modules())
    assert not any("dp" in key for key in model.state_dict())
