"""Every attentive layer type, on p4 and p4m: outputs and attention maps are equivariant."""

import pytest
import torch
from equivariance_helpers import assert_equivariant

from models.architectures.layer_factory import ATTENTION_VARIANTS, LayerFactory
from models.attention import AttentionParts
from models.groups import P4, P4M

VARIANTS = [v for v in ATTENTION_VARIANTS if v != "none"]


def make_layer(group, variant, lifting, dtype, dilation=1):
    torch.manual_seed(0)
    factory = LayerFactory(group.name, variant)
    build = factory.lift if lifting else factory.conv
    layer = build(3, 4, 3, 1, reduction=1 if lifting else 2, att_kernel=5, att_dilation=dilation)
    return layer.to(dtype).eval()


def layer_input(group, lifting, dtype, size=9):
    shape = (2, 3, size, size) if lifting else (2, 3, group.order, size, size)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("lifting", [True, False], ids=["lifting", "group"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("group", [P4, P4M], ids=lambda g: g.name)
def test_attentive_layers_are_equivariant(group, variant, lifting, dtype):
    layer = make_layer(group, variant, lifting, dtype)
    x = layer_input(group, lifting, dtype)
    in_axes = () if lifting else (2,)
    what = f"{variant} attentive {'lifting' if lifting else 'group'} conv"
    assert_equivariant(layer, x, group, in_axes, what=what)
    _, parts = layer(x, return_attention=True)
    for label in ("channel", "spatial"):
        if getattr(parts, label) is not None:
            def part_of(t, label=label):
                return getattr(layer(t, return_attention=True)[1], label)
            assert_equivariant(part_of, x, group, in_axes, parts.group_axes, what=f"{what}: {label} map")
    effective = parts.effective()
    assert_equivariant(lambda t: layer(t, return_attention=True)[1].effective(), x, group, in_axes,
                       parts.group_axes, what=f"{what}: effective map")
    assert effective.min() >= 0 and effective.max() <= 1


@pytest.mark.parametrize("group", [P4, P4M], ids=lambda g: g.name)
@pytest.mark.parametrize("size", [8, 10])
def test_even_sizes_and_dilated_attention(group, size):
    for variant in ("full", "input"):
        layer = make_layer(group, variant, False, torch.float64, dilation=2)
        assert_equivariant(layer, layer_input(group, False, torch.float64, size), group, (2,),
                           what=f"{variant} attention, dilation 2, size {size}")


def test_attention_shapes_as_documented():
    b, cin, cout, n, x = 2, 3, 4, 8, 9
    shapes = {
        ("full", True): ((b, cout, n, cin, 1, 1), (b, cout, n, 1, x, x)),
        ("full", False): ((b, cout, n, cin, n, 1, 1), (b, cout, n, 1, n, x, x)),
        ("input", True): ((b, cin, 1, 1), (b, 1, x, x)),
        ("input", False): ((b, cin, n, 1, 1), (b, 1, n, x, x)),
        ("rotation", True): (None, (b, 1, x, x)),
        ("rotation", False): (None, (b, 1, n, x, x)),
    }
    for (variant, lifting), (channel, spatial) in shapes.items():
        layer = make_layer(P4M, variant, lifting, torch.float64)
        out, parts = layer(layer_input(P4M, lifting, torch.float64), return_attention=True)
        assert out.shape == (b, cout, n, x, x)
        assert (None if parts.channel is None else tuple(parts.channel.shape)) == channel, (variant, lifting)
        assert tuple(parts.spatial.shape) == spatial, (variant, lifting)


def test_no_state_is_kept_between_calls():
    layer = make_layer(P4, "full", False, torch.float64)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    x1, x2 = layer_input(P4, False, torch.float64), layer_input(P4, False, torch.float64, 7)
    first = layer(x1, return_attention=True)
    layer(x2, return_attention=True)
    again = layer(x1, return_attention=True)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1].spatial, again[1].spatial)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_effective_map_is_one_minus_product():
    c, s = torch.rand(2, 3, 1, 1), torch.rand(2, 1, 5, 5)
    assert torch.allclose(AttentionParts(c, s).effective(), 1 - c * s)
    assert torch.equal(AttentionParts(None, s).effective(), 1 - s)
    assert torch.equal(AttentionParts(c, None).effective(), 1 - c)


def test_planar_networks_refuse_attention():
    with pytest.raises(ValueError, match="attention needs a group"):
        LayerFactory(None, "input")
    with pytest.raises(ValueError, match="attention must be one of"):
        LayerFactory("p4", "cbam")
