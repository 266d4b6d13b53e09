"""The memory-efficient full attentive convolutions compute what the straightforward ones compute.

Outputs, attention maps and gradients (input and every parameter) are compared
in float64 against ``full_attentive_conv_reference.py``, which materialises the
un-summed responses as the paper's code does. Every test runs twice: with the
compiled CPU kernels (``models/cpu/attention_kernels.py``) and with the PyTorch path that replaces them
where they cannot run.
"""

import itertools
import os
import shutil

import pytest
import torch

import models.attention.full_attentive_conv as efficient
from models.attention import (
    AttentiveGroupConv,
    AttentiveLiftingConv,
    FullChannelAttention,
    FullSpatialAttention,
    ReferenceAttentiveGroupConv,
    ReferenceAttentiveLiftingConv,
)
from models.cpu import attention_kernels
from models.groups import P4, P4M

TOL = 1e-6
CASES = list(itertools.product(
    [P4, P4M],
    ["lifting", "group"],
    ["full", "channel", "spatial"],
    [(9, 1, 1, 1), (8, 1, 1, 1), (9, 2, 0, 1), (11, 1, 2, 2)],  # (size, stride, padding, dilation)
))


@pytest.fixture(autouse=True, params=["compiled", "pytorch"])
def kernels(request, monkeypatch):
    """Run each test with the compiled kernels, then without them."""
    if request.param == "pytorch":
        monkeypatch.setattr(attention_kernels, "_library", lambda: None)
    elif shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler here to build the attention kernels")
    else:
        assert attention_kernels._library() is not None, \
            "a C++ compiler is here but the attention kernels did not build"
    return request.param


def build(cls, group, lifting, variant, stride, padding, dilation):
    torch.manual_seed(0)
    cin, cout = 3, 4
    channel = spatial = None
    if variant != "spatial":
        channel = FullChannelAttention(cout, cin, 1 if lifting else 2, group=group, lifting=lifting)
    if variant != "channel":
        spatial = FullSpatialAttention(cout, group, 5, lifting=lifting, dilation=dilation)
    return cls(group, cin, cout, 3, stride=stride, padding=padding, dilation=dilation,
               channel_attention=channel, spatial_attention=spatial).double()


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("maps", [True, False], ids=["with maps", "recomputed"])
@pytest.mark.parametrize("group,kind,variant,geometry", CASES,
                         ids=lambda v: getattr(v, "name", None) or str(v))
def test_efficient_equals_straightforward(group, kind, variant, geometry, maps, monkeypatch):
    size, stride, padding, dilation = geometry
    # Small chunks so that the batch is split (PyTorch path); without the maps, the compiled
    # attention branch recomputes its intermediates in backward (with them it keeps them).
    monkeypatch.setattr(efficient, "CHUNK_VALUES", 1)
    monkeypatch.setattr(efficient, "RECOMPUTE_ABOVE_VALUES", 0)
    lifting = kind == "lifting"
    fast_cls, ref_cls = (
        (AttentiveLiftingConv, ReferenceAttentiveLiftingConv) if lifting
        else (AttentiveGroupConv, ReferenceAttentiveGroupConv)
    )
    fast = build(fast_cls, group, lifting, variant, stride, padding, dilation)
    ref = build(ref_cls, group, lifting, variant, stride, padding, dilation)
    shape = (3, 3, size, size) if lifting else (3, 3, group.order, size, size)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_fast, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, parts_ref = ref(x_ref, return_attention=True)
    if maps:
        y_fast, parts_fast = fast(x_fast, return_attention=True)
        for label in ("channel", "spatial"):
            a, b = getattr(parts_fast, label), getattr(parts_ref, label)
            assert (a is None) == (b is None)
            if a is not None:
                assert a.shape == b.shape and relative(a, b) <= TOL, f"{label} attention"
    else:
        y_fast = fast(x_fast)
    assert relative(y_fast, y_ref) <= TOL, "output"
    upstream = torch.randn(y_ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (y_fast * upstream).sum().backward()
    (y_ref * upstream).sum().backward()
    assert relative(x_fast.grad, x_ref.grad) <= TOL, "input gradient"
    for (name, p_fast), p_ref in zip(fast.named_parameters(), ref.parameters(), strict=True):
        assert relative(p_fast.grad, p_ref.grad) <= TOL, f"gradient of {name}"


def test_same_parameters_as_the_reference():
    fast = build(AttentiveGroupConv, P4M, False, "full", 1, 1, 1)
    ref = build(ReferenceAttentiveGroupConv, P4M, False, "full", 1, 1, 1)
    assert fast.state_dict().keys() == ref.state_dict().keys()


@pytest.mark.parametrize("group", [P4, P4M], ids=lambda g: g.name)
def test_ties_at_zero_follow_torch_max(group, monkeypatch):
    # Zero input regions make f~ = 0 for every input channel there: the max over
    # channels ties, and the gradient must go to the first channel, as torch.max does.
    monkeypatch.setattr(efficient, "CHUNK_VALUES", 1)
    fast = build(AttentiveGroupConv, group, False, "full", 1, 1, 1)
    ref = build(ReferenceAttentiveGroupConv, group, False, "full", 1, 1, 1)
    generator = torch.Generator().manual_seed(3)
    x = torch.relu(torch.randn(2, 3, group.order, 9, 9, dtype=torch.float64, generator=generator))
    x[..., 2:7, 2:7] = 0
    x_fast, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    fast(x_fast).sum().backward()
    ref(x_ref).sum().backward()
    assert relative(x_fast.grad, x_ref.grad) <= TOL
    for p_fast, p_ref in zip(fast.parameters(), ref.parameters(), strict=True):
        assert relative(p_fast.grad, p_ref.grad) <= TOL


@pytest.mark.parametrize("chunk_values", [1, 10**6])
@pytest.mark.parametrize("group,kind", list(itertools.product([P4, P4M], ["lifting", "group"])),
                         ids=lambda v: getattr(v, "name", None) or str(v))
def test_inference_in_one_pass_equals_straightforward(group, kind, chunk_values, monkeypatch):
    # Without gradients both max statistics come from a single pass over f~.
    monkeypatch.setattr(efficient, "CHUNK_VALUES", chunk_values)
    lifting = kind == "lifting"
    fast_cls, ref_cls = (
        (AttentiveLiftingConv, ReferenceAttentiveLiftingConv) if lifting
        else (AttentiveGroupConv, ReferenceAttentiveGroupConv)
    )
    fast, ref = (build(cls, group, lifting, "full", 1, 1, 1) for cls in (fast_cls, ref_cls))
    shape = (3, 3, 9, 9) if lifting else (3, 3, group.order, 9, 9)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        y_fast, parts_fast = fast(x, return_attention=True)
        y_ref, parts_ref = ref(x, return_attention=True)
    assert relative(y_fast, y_ref) <= TOL
    assert relative(parts_fast.channel, parts_ref.channel) <= TOL
    assert relative(parts_fast.spatial, parts_ref.spatial) <= TOL
