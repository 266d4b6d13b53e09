"""Single layers against the paper's code, float64: ``layers_synthetic.npz`` to 1e-10."""

import pytest
import torch

from models.attention import (
    AttentiveGroupConv,
    AttentiveLiftingConv,
    FullChannelAttention,
    FullSpatialAttention,
    InputAttentiveGroupConv,
    InputAttentiveLiftingConv,
    InputChannelAttention,
    InputSpatialAttention,
)
from models.gconv import GroupConv, LiftingConv, group_filters, lifting_filters
from models.groups import P4, P4M

TOL = 1e-10


def full_lifting(g):
    return AttentiveLiftingConv(g, 3, 4, 3, padding=1,
                                channel_attention=FullChannelAttention(4, 3, 1, group=g, lifting=True),
                                spatial_attention=FullSpatialAttention(4, g, 7, lifting=True))


def full_group(g):
    return AttentiveGroupConv(g, 4, 4, 3, padding=1,
                              channel_attention=FullChannelAttention(4, 4, 2, group=g, lifting=False),
                              spatial_attention=FullSpatialAttention(4, g, 7, lifting=False))


def input_lifting(g):
    return InputAttentiveLiftingConv(g, 3, 4, 3, padding=1, channel_attention=InputChannelAttention(3, 1),
                                     spatial_attention=InputSpatialAttention(g, 7, lifting=True))


def input_group(g):
    return InputAttentiveGroupConv(g, 4, 4, 3, padding=1, channel_attention=InputChannelAttention(4, 2, group=g),
                                   spatial_attention=InputSpatialAttention(g, 7, lifting=False))


def rotation_group(g):
    spatial = InputSpatialAttention(g, 1, lifting=False, statistics=False, in_channels=4)
    return InputAttentiveGroupConv(g, 4, 4, 3, padding=1, channel_attention=None, spatial_attention=spatial)


LAYERS = {
    "se2_ConvRnG": lambda: LiftingConv(P4, 3, 4, 3, padding=1),
    "se2_ConvGG": lambda: GroupConv(P4, 3, 4, 3, padding=1),
    "e2_ConvRnG": lambda: LiftingConv(P4M, 3, 4, 3, padding=1),
    "e2_ConvGG": lambda: GroupConv(P4M, 3, 4, 3, padding=1),
    "se2_fAttConvRnG": lambda: input_lifting(P4),
    "se2_fAttConvGG": lambda: input_group(P4),
    "e2_fAttConvRnG": lambda: input_lifting(P4M),
    "e2_fAttConvGG": lambda: input_group(P4M),
    "se2_AttConvRnG": lambda: full_lifting(P4),
    "se2_AttConvGG": lambda: full_group(P4),
    "se2_RomHog_fAttConvGG": lambda: rotation_group(P4),
}


def arrays(data, key):
    return {name: torch.from_numpy(data[name]) for name in data.files if name.startswith(key + "__")}


@pytest.mark.parametrize("key", sorted(LAYERS))
def test_layer_matches_paper_code(key, layers_synthetic):
    ref = arrays(layers_synthetic, key)
    layer = LAYERS[key]().double().eval()
    prefix = f"{key}__param__"
    layer.load_state_dict({k[len(prefix):]: v for k, v in ref.items() if k.startswith(prefix)}, strict=True)
    x = ref[f"{key}__input"]
    with torch.no_grad():
        if hasattr(layer, "attend"):
            out, parts = layer(x, return_attention=True)
        else:
            out, parts = layer(x), None
    assert (out - ref[f"{key}__output"]).abs().max() <= TOL, "layer output"
    filters = lifting_filters if layer.weight.dim() == 4 else group_filters
    assert torch.equal(filters(layer.weight, layer.group).transpose(0, 1), ref[f"{key}__kernel_stack"])
    for label in ("channel", "spatial"):
        name = f"{key}__{label}_attention_map"
        if name in ref:
            assert (getattr(parts, label) - ref[name]).abs().max() <= TOL, f"{label} attention map"


def test_group_grids_match(layers_synthetic):
    grid = layers_synthetic["grid_p4m"]  # (theta, m) per element
    for g in P4M.elements():
        k, mirrored = P4M.parts(g)
        assert abs(grid[g, 0] - k * torch.pi / 2) < 1e-6 and grid[g, 1] == (-1 if mirrored else 1)
