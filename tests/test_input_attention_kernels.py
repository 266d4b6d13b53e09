"""alpha_F through the compiled kernels (models/cpu/input_attention_kernels.py) equals the PyTorch path in float64:
outputs, attention parts and every gradient, with ties (ReLU zeros) sent to the same maxima."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from models import build_model
from models.attention.channel import InputChannelAttention
from models.attention.input_attentive_conv import InputAttentiveGroupConv, InputAttentiveLiftingConv, kernels_cover
from models.attention.spatial import InputSpatialAttention
from models.cpu import input_attention_kernels

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                                reason="no C++ compiler here to build the alpha_F kernels")


def pytorch_path(monkeypatch):
    monkeypatch.setattr(input_attention_kernels, "supported", lambda *args: False)


def layer(group: str, lifting: bool, channels: int = 6, dilation: int = 2) -> torch.nn.Module:
    channel = InputChannelAttention(channels, 2, group=None if lifting else group)
    spatial = InputSpatialAttention(group, 5, lifting=lifting, dilation=dilation)
    cls = InputAttentiveLiftingConv if lifting else InputAttentiveGroupConv
    return cls(group, channels, 4, 3, channel_attention=channel, spatial_attention=spatial).double()


def run(module, x):
    """Output, parts and the gradients of a fixed random functional of the output wrt x and every parameter."""
    module.zero_grad()
    x = x.clone().requires_grad_()
    out, parts = module.attend(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    return out.detach(), parts, x.grad, {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("group", ["p4", "p4m"])
@pytest.mark.parametrize("lifting", [True, False], ids=["lifting", "group"])
@pytest.mark.parametrize("ties", [False, True], ids=["random", "relu_zeros"])
@pytest.mark.parametrize("channels", [3, 6])  # 3: a one-unit MLP, whose einsum hands out a permuted view
def test_kernels_equal_the_pytorch_path(group, lifting, ties, channels, monkeypatch):
    torch.manual_seed(0)
    module = layer(group, lifting, channels)
    shape = (3, channels, 11, 13) if lifting else (3, channels, 8 if group == "p4m" else 4, 11, 13)
    x = torch.randn(shape, dtype=torch.float64)
    if ties:  # a post-ReLU input: many zeros, whole planes of them, so that maxima tie
        x = torch.relu(x)
        x[0, 1] = 0
    assert kernels_cover(module, x)
    out, parts, grad_x, grads = run(module, x)
    pytorch_path(monkeypatch)
    out_ref, parts_ref, grad_x_ref, grads_ref = run(module, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(parts.channel, parts_ref.channel, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(parts.spatial, parts_ref.spatial, rtol=1e-12, atol=1e-14)
    assert parts.group_axes == parts_ref.group_axes
    torch.testing.assert_close(grad_x, grad_x_ref, rtol=1e-10, atol=1e-12, msg="input gradient")
    assert grads.keys() == grads_ref.keys() and len(grads) == 3  # both MLP weights and the spatial filter
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-10, atol=1e-12, msg=name)


def test_the_alpha_f_densenet_equals_the_pytorch_path(monkeypatch):
    """The issue's criterion: logits (and every gradient) of fa_p4m_densenet in float64, kernels against PyTorch."""
    torch.manual_seed(0)
    model = build_model("fa_p4m_densenet").double().train()
    x = torch.randn(2, 3, 96, 96, dtype=torch.float64)

    def step():
        model.zero_grad()
        torch.manual_seed(1)
        logits = model(x)
        logits.pow(2).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits, grads = step()
    pytorch_path(monkeypatch)
    logits_ref, grads_ref = step()
    assert ((logits - logits_ref).abs().max() / logits_ref.abs().max()).item() < 1e-12
    for name, grad in grads.items():
        error = ((grad - grads_ref[name]).abs().max() / grads_ref[name].abs().max().clamp_min(1e-300)).item()
        assert error < 1e-9, f"{name}: relative gradient error {error:.2g}"


def test_inference_without_gradients_gives_the_same_maps():
    torch.manual_seed(0)
    module = layer("p4m", False)
    x = torch.randn(2, 6, 8, 9, 9, dtype=torch.float64)
    with torch.inference_mode():
        out, parts = module.attend(x)
    assert not out.requires_grad
    with torch.no_grad():
        out_ref, parts_ref = super(InputAttentiveGroupConv, module).attend(x)  # AttentiveLayer's PyTorch path
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(parts.effective(), parts_ref.effective(), rtol=1e-12, atol=1e-14)


def test_not_supported_outside_its_cases():
    module = layer("p4m", False)
    x = torch.zeros(1, 6, 8, 5, 5, dtype=torch.float64)
    assert kernels_cover(module, x)
    assert not kernels_cover(module, x.half())
    assert not kernels_cover(module, x.to("meta"))
    assert not kernels_cover(layer("p4m", False, channels=300), torch.zeros(1, 300, 8, 5, 5))
    rotation = build_model("arh_p4cnn").c1  # alpha_RH: spatial attention from all channels, no channel part
    assert rotation.channel_attention is None and not kernels_cover(rotation, torch.zeros(1, 1, 9, 9))


def test_under_bfloat16_autocast_the_attention_runs_in_float32():
    """Training with --precision bf16 hands alpha_F bfloat16 inputs: attended in float32 through the kernels, with
    the small networks in float32, it matches the float32 path on the same (bf16-rounded) input."""
    torch.manual_seed(0)
    module = layer("p4m", False).float()
    x = torch.randn(2, 6, 8, 9, 9).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, parts = module.attend(x.requires_grad_())
    assert out.dtype == torch.float32 and parts.channel.dtype == torch.float32
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and module.channel_attention.weight_fc2.grad is not None
    expected, expected_parts = super(InputAttentiveGroupConv, module).attend(x.detach().float())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parts.spatial, expected_parts.spatial, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spatial_argmax_is_the_first_maximum_wherever_it_lies(dtype):
    # The kernel tests whole blocks of 32 pixels for the max before scanning one: maxima at the first pixel, inside
    # and at the edges of blocks, in the tail after the last whole block, at the last pixel, tied across blocks.
    pixels = 101
    places = [(0,), (31,), (32,), (45, 90), (95,), (100,), (33, 64, 96), (70, 71)]
    f = torch.rand(1, len(places), 1, pixels, dtype=dtype)
    for plane, at in enumerate(places):
        f[0, plane, 0, list(at)] = 2.0
    mean, peak = f.new_empty(1, len(places), 1), f.new_empty(1, len(places), 1)
    where = torch.empty(1, len(places), 1, dtype=torch.int64)
    geometry = torch.tensor([1, len(places), 1, pixels], dtype=torch.int64)
    input_attention_kernels._run("input_spatial_stats", geometry, f, mean, peak, where)
    assert where.flatten().tolist() == [at[0] for at in places]
    torch.testing.assert_close(peak, f.amax(dim=-1, keepdim=True).view_as(peak))


def pooled_layer(group: str | None, channels: int = 6, pool: int = 2) -> torch.nn.Module:
    """A pointwise alpha_F layer whose output is average-pooled, as the DenseNets' transitions."""
    lifting = group is None
    channel = InputChannelAttention(channels, 2, group=None if lifting else "p4m")
    spatial = InputSpatialAttention("p4m", 5, lifting=lifting, dilation=2)
    cls = InputAttentiveLiftingConv if lifting else InputAttentiveGroupConv
    return cls("p4m", channels, 4, 1, pool=pool, channel_attention=channel, spatial_attention=spatial)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("group", [None, "p4m"], ids=["lifting", "group"])
@pytest.mark.parametrize("pool, side", [(2, 12), (2, 94), (3, 15)])
def test_the_gate_that_pools_gives_the_layer_its_output_bit_for_bit(dtype, group, pool, side, monkeypatch):
    """In inference a pooled pointwise layer reads the attended input pooled by the kernels' gate: the same numbers,
    bit for bit, as the gate's full output pooled by pooling.spatial_avg_pool and then convolved."""
    torch.manual_seed(0)
    module = pooled_layer(group, pool=pool).to(dtype).eval()
    x = torch.relu(torch.randn(3, 6, *(() if group is None else (8,)), side, side, dtype=dtype))
    with torch.inference_mode():
        assert module._pools_in_the_gate(x)
        out, parts = module(x, return_attention=True)
        monkeypatch.setattr(type(module), "_pools_in_the_gate", lambda self, x: False)
        expected, expected_parts = module(x, return_attention=True)
    assert out.shape == expected.shape == (3, 4, 8, side // pool, side // pool)
    assert torch.equal(out, expected)
    assert torch.equal(parts.effective(), expected_parts.effective())


def test_the_gate_pools_only_without_gradients_and_on_planes_the_tiles_cover():
    module = pooled_layer("p4m")
    x = torch.randn(1, 6, 8, 10, 10)
    assert not module._pools_in_the_gate(x)  # the weights want gradients
    with torch.no_grad():
        assert module._pools_in_the_gate(x)
        assert not module._pools_in_the_gate(torch.randn(1, 6, 8, 9, 10))  # avg_pool2d's floor, not tiles
        assert not pooled_layer("p4m", pool=1)._pools_in_the_gate(x)
    with pytest.raises(ValueError, match="no gradient"):
        input_attention_kernels.attend(module, x, pool=2)
