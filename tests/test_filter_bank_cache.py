"""Group convolutions keep their expanded filter bank between calls without gradients, and renew it whenever the
weight changes; with gradients they expand it every call."""

from __future__ import annotations

import pytest
import torch

from models.gconv import GroupConv, LiftingConv, forget_filter_banks, group_conv, lifting_conv


@pytest.fixture(params=["lifting", "group"])
def layer_and_input(request):
    torch.manual_seed(0)
    if request.param == "lifting":
        return LiftingConv("p4m", 3, 5, 3), torch.randn(2, 3, 9, 9), lifting_conv
    return GroupConv("p4m", 3, 5, 3), torch.randn(2, 3, 8, 9, 9), group_conv


def fresh(layer, x, conv):
    """The output computed from the weight as it is now, through the functional path (no cache)."""
    with torch.no_grad():
        return conv(x, layer.weight, layer.group)


def test_reused_without_gradients_and_equal_to_a_fresh_expansion(layer_and_input):
    layer, x, conv = layer_and_input
    with torch.inference_mode():
        first = layer(x)
        bank = layer.filter_bank()
        assert layer.filter_bank() is bank, "the second call reuses the bank"
    with torch.no_grad():
        assert layer.filter_bank() is bank
        assert torch.equal(layer(x), first)
    assert torch.equal(first, fresh(layer, x, conv))


def test_renewed_after_an_optimiser_step_a_state_load_and_a_dtype_change(layer_and_input):
    layer, x, conv = layer_and_input
    with torch.no_grad():
        layer(x)
        stale = layer.filter_bank()
    optimiser = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(x).square().sum().backward()
    optimiser.step()
    with torch.no_grad():
        assert layer.filter_bank() is not stale
        assert torch.equal(layer(x), fresh(layer, x, conv))
        stale = layer.filter_bank()
    layer.load_state_dict({"weight": torch.randn_like(layer.weight)})
    with torch.no_grad():
        assert layer.filter_bank() is not stale
        assert torch.equal(layer(x), fresh(layer, x, conv))
    layer.double()
    with torch.no_grad():
        assert layer.filter_bank().dtype == torch.float64
        assert torch.equal(layer(x.double()), fresh(layer, x.double(), conv))


def test_expanded_every_call_with_gradients(layer_and_input):
    layer, x, _ = layer_and_input
    assert layer.filter_bank() is not layer.filter_bank()
    layer(x).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_a_write_behind_the_version_counter_needs_forget_filter_banks(layer_and_input):
    """Writes through ``.data`` (and CUDA's ``_foreach_lerp_``, PyTorch 2.11) leave the version counter alone."""
    layer, x, conv = layer_and_input
    model = torch.nn.Sequential(layer)
    with torch.no_grad():
        layer(x)
        layer.weight.data.mul_(2)
        assert not torch.equal(layer(x), fresh(layer, x, conv)), "the kept bank is stale, as documented"
    assert forget_filter_banks(model) == 1
    with torch.no_grad():
        assert torch.equal(layer(x), fresh(layer, x, conv))
